"""A job worker process that exports its spans to a file (tests/integration/test_job_trace.py):
``python trace_worker.py URL SPANS_FILE``.

It installs an OpenTelemetry SDK tracer provider whose exporter writes one JSON line per
finished span to SPANS_FILE, then runs ``start_job_runtime`` on a ``create_job_backend`` over
URL executing job ``trace.work``: the first attempt of every run fails (a retry), the second
completes. Its stdout says what happens, one JSON line each: ``{"event": "ready"}``, then
``{"event": "run", "id": ..., "attempt": ...}`` per attempt; on SIGTERM it stops the runtime
gracefully, shuts the provider down (every span written) and prints ``{"event": "stopped",
"errors": [...]}``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import create_async_engine

from ship_sqla import (
    create_job_backend,
    define_job,
    ship_job_runs_table,
    ship_job_state_table,
    start_job_runtime,
)
from ship_sqla.jobs import Concurrency, RetryPolicy

if TYPE_CHECKING:
    from collections.abc import Sequence

    from opentelemetry.sdk.trace import ReadableSpan

JOB_ID = "trace.work"


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


class FileExporter(SpanExporter):
    """One JSON line per span: name, ids, the parent's ids, attributes."""

    def __init__(self, path: str) -> None:
        self._file = Path(path).open("a", encoding="utf-8")  # noqa: SIM115 - closed at shutdown

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            context = span.get_span_context()
            parent = span.parent
            line = {
                "name": span.name,
                "trace_id": f"{context.trace_id:032x}",
                "span_id": f"{context.span_id:016x}",
                "parent_span_id": None if parent is None else f"{parent.span_id:016x}",
                "parent_trace_id": None if parent is None else f"{parent.trace_id:032x}",
                "attributes": dict(span.attributes or {}),
            }
            self._file.write(json.dumps(line) + "\n")
        self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._file.close()


async def main(url: str, spans_file: str) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(spans_file)))
    trace.set_tracer_provider(provider)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    errors: list[str] = []
    engine = create_async_engine(url)
    metadata = MetaData()
    backend = create_job_backend(
        database=engine,
        table=ship_job_runs_table(metadata),
        state_table=ship_job_state_table(metadata),
        on_error=lambda error: errors.append(f"{type(error).__name__}: {error}"),
    )

    async def work(ctx: Any, payload: Any) -> None:
        emit(event="run", id=ctx.run_id, attempt=ctx.attempt)
        if ctx.attempt == 1:
            raise RuntimeError("the first attempt fails: the retry must keep the parent")

    job = define_job(
        JOB_ID,
        work,
        payload=dict,
        concurrency=Concurrency(max=20, lease=60),
        retry=RetryPolicy(attempts=3, backoff="fixed", base_delay=0.05, jitter="none"),
    )
    async with await start_job_runtime([job], backend=backend, poll_interval=0.05):
        emit(event="ready")
        await stop.wait()
    provider.shutdown()
    await engine.dispose()
    emit(event="stopped", errors=errors)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
