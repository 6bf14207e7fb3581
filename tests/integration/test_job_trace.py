"""Trace propagation across processes (K7): runs enqueued here, each inside its own span, are
executed by two worker processes (tests/support/trace_worker.py) that export their spans to
files; every attempt's span, first and retry alike, in whichever process ran it, is a child of
the span that enqueued its run."""

from __future__ import annotations

import json
import signal
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla import define_job
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table

WORKER = Path(__file__).parents[1] / "support" / "trace_worker.py"
TRACED = 40
UNTRACED = 5
PROCESSES = 2

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)
request_tracer = TracerProvider().get_tracer("test.request")


async def _never_here(ctx: object, payload: object) -> None:
    raise AssertionError("runs are executed by the worker processes")


class Worker:
    """One worker process and the attempts its stdout reported."""

    def __init__(self, process: anyio.abc.Process, spans: Path) -> None:
        self.process = process
        self.spans = spans
        self.ready = anyio.Event()
        self.stopped: dict[str, Any] | None = None

    async def read(self, attempts: dict[str, list[int]], changed: list[anyio.Event]) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for raw in lines:
                line = json.loads(raw)
                if line["event"] == "ready":
                    self.ready.set()
                elif line["event"] == "stopped":
                    self.stopped = line
                else:
                    attempts[line["id"]].append(line["attempt"])
                event, changed[0] = changed[0], anyio.Event()
                event.set()


async def _run_until_retried(url: str, tmp_path: Path, runs: int) -> list[Worker]:
    """Start the worker processes, wait until ``runs`` runs reached their second attempt, stop
    them gracefully (every span exported) and return them."""
    attempts: dict[str, list[int]] = defaultdict(list)
    changed = [anyio.Event()]
    workers = []
    for index in range(PROCESSES):
        spans = tmp_path / f"spans-{index}.jsonl"
        with (tmp_path / f"worker-{index}.stderr").open("wb") as stderr:
            process = await anyio.open_process(
                [sys.executable, str(WORKER), url, str(spans)], stderr=stderr
            )
        workers.append(Worker(process, spans))
    try:
        async with anyio.create_task_group() as readers:
            for worker in workers:
                readers.start_soon(worker.read, attempts, changed)
            with anyio.fail_after(60):
                for worker in workers:
                    await worker.ready.wait()
                while sum(1 for tried in attempts.values() if 2 in tried) < runs:
                    await changed[0].wait()
            for worker in workers:
                worker.process.send_signal(signal.SIGTERM)
            with anyio.fail_after(30):
                for worker in workers:
                    assert await worker.process.wait() == 0
    finally:
        for worker in workers:
            if worker.process.returncode is None:
                worker.process.kill()
                await worker.process.wait()
            await worker.process.aclose()
    return workers


@pytest.mark.timeout(120)
async def test_every_run_span_in_every_process_is_a_child_of_its_enqueue(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """K7 across processes and retries: 100% of the run spans the worker processes export (two
    attempts per run: the first fails, the retry completes) have the span that enqueued their
    run, in this process, as parent (same trace, that span's id); the runs enqueued outside any
    span get root spans in their own traces."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(database=ship_engine, table=runs, state_table=state)
    job = define_job("trace.work", _never_here, payload=dict)
    parents: dict[str, tuple[str, str]] = {}
    for n in range(TRACED):
        with request_tracer.start_as_current_span(f"request {n}") as span:
            result = await backend.enqueue(job, {"n": n})
        context = span.get_span_context()
        assert result.run_id is not None
        parents[result.run_id] = (f"{context.trace_id:032x}", f"{context.span_id:016x}")
    untraced = {(await backend.enqueue(job, {"n": -n})).run_id for n in range(UNTRACED)}
    workers = await _run_until_retried(ship_engine_url, tmp_path, TRACED + UNTRACED)
    spans = [
        json.loads(line)
        for worker in workers
        if worker.spans.exists()
        for line in worker.spans.read_text().splitlines()
    ]
    run_spans = [span for span in spans if span["name"] == "process trace.work"]
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for span in run_spans:
        by_run[span["attributes"]["ship.job.run_id"]].append(span)
    assert set(by_run) == set(parents) | untraced
    for run_id, (trace_id, span_id) in parents.items():
        mine = sorted(by_run[run_id], key=lambda span: span["attributes"]["ship.job.attempt"])
        assert [span["attributes"]["ship.job.attempt"] for span in mine] == [1, 2]
        assert [span["attributes"]["ship.job.outcome"] for span in mine] == [
            "retrying",
            "completed",
        ]
        for span in mine:
            assert (span["trace_id"], span["parent_trace_id"]) == (trace_id, trace_id)
            assert span["parent_span_id"] == span_id
    for run_id in untraced:
        assert [span["parent_span_id"] for span in by_run[run_id]] == [None, None]
        assert not {span["trace_id"] for span in by_run[run_id]} & {t for t, _ in parents.values()}
    for worker in workers:
        assert worker.stopped is not None
        assert worker.stopped["errors"] == []
