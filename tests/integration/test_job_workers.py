"""The worker registry (F6) and the fleet's one queue sampler (F5) on real PostgreSQL: a fleet of
two runtimes in this process and one real worker process that is killed (no deregistration),
a backend whose workers table is absent, ``ship-sqla workers``, the schema check, and each
statement's index. The port's rules on every backend are
tests/conformance/test_job_workers_conformance.py."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cli_runner import ship_sqla
from explain_helpers import check_plan, explain, nodes
from job_helpers import settle_loop
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from spy_backend import SpyBackend
from sqlalchemy import MetaData, text

from ship_sqla import define_job, start_job_runtime
from ship_sqla._jobs import (
    create_job_backend,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_workers_table,
)
from ship_sqla._jobs._sql import JobStatements
from ship_sqla._jobs._sql import workers as worker_sql
from ship_sqla._naming import quoted_table
from ship_sqla.jobs import WorkerRecord
from ship_sqla.kernel import WorkerEntry
from ship_sqla.kernel._metrics import job_metrics_for
from ship_sqla.kernel._workers import WORKER_STALE_AFTER
from ship_sqla.schema import check_schema, schema_sql
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncEngine

metadata = MetaData()
runs = ship_job_runs_table(metadata)
history = ship_job_history_table(metadata)  # J16: the default shape create_job_backend() reads
state = ship_job_state_table(metadata)
workers = ship_job_workers_table(metadata)

PROCESS_JOB = "fleet.process"
WORKER = textwrap.dedent(
    f"""
    import asyncio, signal, sys
    from sqlalchemy.ext.asyncio import create_async_engine
    from ship_sqla._jobs import create_job_backend
    from ship_sqla import define_job, start_job_runtime

    async def noop(ctx, payload):
        return None

    async def main(url):
        engine = create_async_engine(url)
        backend = create_job_backend(database=engine, listen=False)
        job = define_job({PROCESS_JOB!r}, noop, payload=dict)
        runtime = await start_job_runtime([job], backend=backend, worker_id="w-process")
        print("ready", flush=True)
        await asyncio.Event().wait()  # until SIGKILL: it never stops, never deregisters

    asyncio.run(main(sys.argv[1]))
    """
)


async def _noop(ctx: Any, payload: Any) -> None:
    return None


MAIL = define_job("fleet.mail", _noop, payload=dict)
PDF = define_job("fleet.pdf", _noop, payload=dict)


@pytest.fixture
async def tables(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return ship_engine


async def db_now(engine: AsyncEngine) -> Any:
    async with engine.connect() as connection:
        return (await connection.execute(text("SELECT now()"))).scalar_one()


class Member:
    """One in-process runtime of the fleet: its own backend (its own connections, as another
    process would have), its own metrics (collected: it wants to sample) and a spy on its queue
    samples."""

    def __init__(self, engine: AsyncEngine, clock: FrozenClock) -> None:
        self.backend = create_job_backend(
            database=engine,
            table=runs,
            state_table=state,
            workers_table=workers,
            clock=clock,
            listen=False,
        )
        reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[reader])
        job_metrics_for(self.provider)  # the runtime's instruments, made before the collection
        reader.get_metrics_data()
        self.spy = SpyBackend(self.backend)

    def sampled(self) -> list[list[str]]:
        return [call.args[0] for call in self.spy.calls.get("queue_depths", [])]

    async def start(self, job: Any, worker_id: str) -> Any:
        return await start_job_runtime(
            [job],
            backend=self.spy,
            worker_id=worker_id,
            meter_provider=self.provider,
            queue_sample_interval=5.0,
        )


async def until(
    clock: FrozenClock | None,
    backend: Any,
    predicate: Callable[[dict[str, WorkerRecord]], bool],
    *,
    limit: float = 30.0,
) -> dict[str, WorkerRecord]:
    """The registry (by worker id) once ``predicate`` accepts it; with a clock, frozen time moves
    a second per look (real processes beat on the wall clock: the wait has a deadline)."""
    with anyio.fail_after(limit):
        while True:
            records = {r.worker_id: r for r in await backend.workers.list_workers(limit=100)}
            if predicate(records):
                return records
            if clock is not None:
                clock.advance(1.0)
            await settle_loop(5)
            await anyio.sleep(0.01)


def sampler(records: dict[str, WorkerRecord]) -> list[str]:
    return sorted(worker_id for worker_id, record in records.items() if record.sampler)


@pytest.mark.timeout(120)
async def test_f6_f5_a_fleet_of_runtimes_and_a_killed_worker_process(
    tables: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """F6 and F5 across a fleet: a real worker process and two runtimes of this process register
    (each its jobs); one runtime of this process holds the sampler lease and samples every job
    of the fleet, the process's included, while the other samples nothing and the process (no
    metrics SDK) never competes; the holder stopping is deregistered and the other takes over;
    the process, SIGKILLed, never deregisters, and the live runtime's heartbeat prunes it once
    it has not been seen for WORKER_STALE_AFTER seconds (the database's time: the live runtimes'
    clock is frozen at it and moved by the test)."""
    engine = tables
    script = tmp_path / "registered_worker.py"
    script.write_text(WORKER)
    process = subprocess.Popen(  # noqa: ASYNC220 - a real process is the point of this test
        [sys.executable, str(script), ship_engine_url], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
        clock = FrozenClock(await db_now(engine))
        a, b = Member(engine, clock), Member(engine, clock)
        await until(None, a.backend, lambda r: "w-process" in r)
        ra = await a.start(MAIL, "w-a")
        rb = await b.start(PDF, "w-b")
        try:
            records = await until(None, a.backend, lambda r: len(r) == 3 and len(sampler(r)) == 1)
            assert records["w-process"].job_ids == (PROCESS_JOB,)
            assert records["w-process"].pid == process.pid
            assert sampler(records) != ["w-process"]
            holder, other = (a, b) if sampler(records) == ["w-a"] else (b, a)
            # From the holder's next heartbeat on, its samples cover the whole fleet's jobs.
            fleet = [MAIL.id, PDF.id, PROCESS_JOB]

            def everything(_: dict[str, WorkerRecord]) -> bool:
                return bool(holder.sampled()) and sorted(holder.sampled()[-1]) == sorted(fleet)

            await until(clock, a.backend, everything)
            assert other.sampled() == []

            # The holder stops: deregistered at once, and the other takes the lease over.
            holder_id, other_id = ("w-a", "w-b") if holder is a else ("w-b", "w-a")
            await (ra if holder is a else rb).stop()
            records = await until(clock, a.backend, lambda r: sampler(r) == [other_id])
            assert holder_id not in records
            await other.spy.wait_calls("queue_depths", 1)

            # The process is killed: it never deregisters; the live runtime prunes it after the
            # bound, by the database's clock, at its first heartbeat past it.
            process.kill()
            process.wait(timeout=10)
            seen = (await until(clock, other.backend, lambda r: "w-process" in r))["w-process"]
            last_seen = seen.last_seen_at
            stale = timedelta(seconds=WORKER_STALE_AFTER)
            beats: list[Any] = []

            def pruned(records: dict[str, WorkerRecord]) -> bool:
                if clock.now() - last_seen < stale:
                    assert "w-process" in records, "pruned before the bound"
                live = records[other_id].last_seen_at
                if not beats or beats[-1] != live:
                    beats.append(live)
                return "w-process" not in records

            await until(clock, other.backend, pruned, limit=60)
            assert len([beat for beat in beats if beat - last_seen >= stale]) <= 1
        finally:
            await ra.stop()
            await rb.stop()
        async with engine.connect() as connection:
            assert (
                await connection.execute(text("SELECT count(*) FROM ship_job_workers"))
            ).scalar_one() == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


async def test_f6_without_the_workers_table_a_runtime_runs_unregistered(
    ship_engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """F6, F5: a database without the workers table (an application that has not migrated):
    the runtime logs once that it runs unregistered, naming the table and the fix, runs its
    jobs, and samples its own queue gauges as before the registry existed."""
    partial = MetaData()
    ship_job_runs_table(partial)
    ship_job_history_table(partial)  # J16: the default shape create_job_backend() reads
    ship_job_state_table(partial)
    async with ship_engine.begin() as connection:
        await connection.run_sync(partial.create_all)
    clock = FrozenClock(await db_now(ship_engine))
    backend = create_job_backend(database=ship_engine, clock=clock, listen=False)
    assert "ship_job_workers" in (await backend.workers.probe() or "")
    ran = anyio.Event()

    async def handler(ctx: Any, payload: Any) -> None:
        ran.set()

    job = define_job("unregistered.job", handler, payload=dict)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    job_metrics_for(provider)  # the runtime's instruments, made before the collection
    reader.get_metrics_data()
    spy = SpyBackend(backend)
    with caplog.at_level(logging.WARNING, logger="ship_sqla.jobs"):
        async with await start_job_runtime(
            [job],
            backend=spy,
            worker_id="w-alone",
            meter_provider=provider,
            queue_sample_interval=5,
        ):
            await backend.enqueue(job, {})
            with anyio.fail_after(10):
                await ran.wait()
            with anyio.fail_after(20):
                while len(spy.calls.get("queue_depths", [])) < 2:
                    clock.advance(1.0)
                    await settle_loop(5)
                    await anyio.sleep(0.01)
    assert {tuple(call.args[0]) for call in spy.calls["queue_depths"]} == {(job.id,)}
    [record] = [r for r in caplog.records if "runs unregistered" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "table ship_job_workers does not exist" in record.getMessage()
    assert "ship_job_workers_table(metadata)" in record.getMessage()


async def test_f6_ship_sqla_workers_lists_the_registry(
    tables: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """F6: `ship-sqla workers` prints the registry as a table (draining and the sampler marked)
    or `--json`; an empty registry says so; a table that is not there exits 1 naming it and the
    fix; a bad table name exits 2."""
    url = ("--database-url", ship_engine_url)
    code, out, err = await ship_sqla("workers", *url, cwd=tmp_path)
    assert (code, out.strip(), err) == (0, "no workers registered.", "")
    backend = create_job_backend(database=tables, listen=False)
    started = await db_now(tables)
    for worker_id, draining in (("w-2", True), ("w-1", False)):
        await backend.workers.heartbeat(
            WorkerEntry(worker_id, "host-9", 77, started, (MAIL.id, PDF.id), 4, draining)
        )
    assert await backend.workers.hold_sampler("w-1", lease=30)

    code, out, err = await ship_sqla("workers", *url, "--json", cwd=tmp_path)
    assert (code, err) == (0, ""), err
    document = json.loads(out)
    assert [w["worker_id"] for w in document["workers"]] == ["w-1", "w-2"]
    first = document["workers"][0]
    assert {k: v for k, v in first.items() if k != "last_seen_at"} == {
        "worker_id": "w-1",
        "host": "host-9",
        "pid": 77,
        "started_at": started.isoformat(),
        "job_ids": [MAIL.id, PDF.id],
        "in_flight": 4,
        "draining": False,
        "sampler": True,
        "job_versions": [],
    }
    code, out, err = await ship_sqla("workers", *url, cwd=tmp_path)
    assert (code, err) == (0, ""), err
    header, one, two, footer = out.strip().splitlines()
    assert header.split() == [
        "WORKER",
        "HOST",
        "PID",
        "STARTED_AT",
        "LAST_SEEN_AT",
        "IN_FLIGHT",
        "STATE",
        "SAMPLER",
        "JOBS",
    ]
    assert one.split()[:3] == ["w-1", "host-9", "77"]
    assert one.split()[5:8] == ["4", "running", "yes"]
    assert two.split()[5:8] == ["4", "draining", "-"]
    assert f"{MAIL.id}, {PDF.id}" in one
    assert footer == "2 worker(s)."

    code, out, err = await ship_sqla(
        "workers", *url, "--workers-table", "other_workers", cwd=tmp_path
    )
    assert code == 1
    assert "cannot read the worker registry" in err
    assert "other_workers" in err
    assert "ship_job_workers_table" in err
    code, _, err = await ship_sqla("workers", *url, "--workers-table", "", cwd=tmp_path)
    assert code == 2
    assert "--workers-table" in err


async def test_f6_the_schema_check_knows_the_workers_table(ship_engine: AsyncEngine) -> None:
    """F6, T3: `ship-sqla schema check` (check_schema) compares the workers table like every
    ship table: clean when migrated, the table reported when it is missing, its partial index's
    predicate compared; `schema sql` prints its DDL."""
    ddl = schema_sql(metadata, tables=[workers])
    assert "CREATE TABLE ship_job_workers" in ddl
    assert "WHERE sampler_until IS NOT NULL" in ddl
    async with ship_engine.begin() as connection:
        await connection.run_sync(
            lambda sync: metadata.create_all(sync, tables=[runs, history, state])
        )
    report = await check_schema(ship_engine, metadata, extra_tables=False)
    assert [(d.kind, d.table) for d in report.differences] == [
        ("table_missing", "ship_job_workers")
    ]
    async with ship_engine.begin() as connection:
        await connection.run_sync(lambda sync: metadata.create_all(sync, tables=[workers]))
    assert (await check_schema(ship_engine, metadata)).ok
    async with ship_engine.begin() as connection:
        await connection.execute(text("DROP INDEX ship_job_workers_sampler_idx"))
        await connection.execute(
            text("CREATE INDEX ship_job_workers_sampler_idx ON ship_job_workers (sampler_until)")
        )
    report = await check_schema(ship_engine, metadata)
    assert not report.ok
    assert any("ship_job_workers_sampler_idx" in d.description for d in report.differences)


async def test_f6_each_registry_statement_reads_its_index(tables: AsyncEngine) -> None:
    """F6, F5: at 50,000 entries (a large fleet with a backlog of stale ones), the prune reads
    ``<workers>_seen_idx``, the lease's check ``<workers>_sampler_idx``, a deregistration the
    primary key, a lease release one of the two; none, nor a heartbeat, scans the table
    sequentially."""
    async with tables.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO ship_job_workers"
                " (id, host, pid, started_at, last_seen_at, job_ids, in_flight, draining)"
                " SELECT 'w' || lpad(g::text, 6, '0'), 'h', g, now(),"
                "  now() - (g % 100) * interval '1 second', ARRAY['j'], 0, false"
                " FROM generate_series(1, 50000) g"
            )
        )
        await connection.execute(
            text("UPDATE ship_job_workers SET sampler_until = now() WHERE id = 'w000007'")
        )
    async with tables.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        await connection.execute(text("VACUUM (ANALYZE) ship_job_workers"))
    statements = JobStatements(
        runs="ship_job_runs", state="ship_job_state", workers=quoted_table(workers)
    )
    cases = [
        (
            statements[worker_sql.PRUNE_STALE_WORKERS],
            {"stale_after": 98.5, "limit": 100, "now": None},
            {"seen_idx"},
        ),
        (
            statements[worker_sql.HOLD_SAMPLER_IF_FREE],
            {"id": "w000042", "lease": 30.0, "now": None},
            {"pkey"},
        ),
        # The primary key, or the partial sampler index (its predicate is implied; it holds a
        # row or two): either serves it, a sequential scan never does.
        (statements[worker_sql.RELEASE_SAMPLER], {"id": "w000042"}, set()),
        (statements[worker_sql.DEREGISTER_WORKER], {"id": "w000042"}, {"pkey"}),
    ]
    for statement, params, uses in cases:
        for generic in (False, True):
            async with tables.connect() as connection, connection.begin() as transaction:
                plan = await explain(connection, statement, params, generic=generic)
                await transaction.rollback()
            check_plan(plan, workers, uses=uses)
    async with tables.connect() as connection, connection.begin() as transaction:
        plan = await explain(
            connection,
            statements[worker_sql.HOLD_SAMPLER_IF_FREE],
            {"id": "w000042", "lease": 30.0, "now": None},
            generic=False,
        )
        await transaction.rollback()
    assert "ship_job_workers_sampler_idx" in {n.get("Index Name") for n in nodes(plan)}
    async with tables.connect() as connection, connection.begin() as transaction:
        plan = await explain(
            connection,
            statements[worker_sql.HEARTBEAT_WORKER],
            {
                "id": "w000042",
                "host": "h",
                "pid": 1,
                "started_at": "2030-01-01T00:00:00+00",
                "job_ids": ["j"],
                "in_flight": 0,
                "draining": False,
                "job_versions": [],
                "now": None,
            },
            generic=False,
        )
        await transaction.rollback()
    assert not [n for n in nodes(plan) if n["Node Type"] == "Seq Scan"]
