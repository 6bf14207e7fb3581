"""workflows: what a stored step costs, and how fast a suspended run wakes (SPEC §13, issue 14).

Step costs (sequential, one claimed run per round, a context bound to the backend's workflow
store as the runtime binds it; the run's stored steps are loaded once, at its first step):

- ``workflows.step``: ``ctx.step(name, fn)``, ``fn`` returning a small dict: the step's result
  stored in one fenced INSERT (D1). Baseline: a raw asyncpg INSERT of the same row into a table
  built by the same steps-table factory (one autocommitted statement, no fence).
- ``workflows.transaction``: ``ctx.transaction(name, uow, fn)``, ``fn`` inserting one app row on
  the unit of work's connection; the step's result commits with it (D2). Baseline: a raw asyncpg
  transaction (BEGIN, the same app-row INSERT, COMMIT).
- ``workflows.transaction_vs_uow``: the same step beside ``uow.run`` of the same app-row INSERT
  (SQLAlchemy, the same pool): what the step's storage and fence add to a unit of work.

Wake of a suspended run (a worker runtime in this process, ``poll_interval`` 60 s: only push
wakes count; RUNS runs suspended on ``wait_for_event`` with distinct keys, then one publish at a
time, each in its own ``uow.run``; the clock starts in an ``after_commit`` callback registered
before the publish and stops when the handler continues past the wait: after the run's claim,
its replay's step load, the event match and the wait's stored result):

- ``workflows.wake.*``: the publisher is the runtime's own backend (the in-process wake).
  Baseline: a fresh run enqueued the same way on the same runtime, commit -> handler start.
- ``workflows.wake.listen.*``: the publisher is a second backend on its own engine; the runtime
  learns of the woken run by LISTEN (K1), publishes spaced past the announce window (250 ms).
  Baseline: a fresh run enqueued through that second backend, the same way.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import create_async_engine

from benchmarks._harness import (
    Bench,
    BenchDatabase,
    BenchmarkError,
    Figure,
    Stopwatch,
    Target,
    latency_figures,
    latency_percentiles,
    ordered_ids,
    paired_rounds,
)
from benchmarks._raw_sql import job_sql
from ship_sqla import (
    JobContext,
    TransactionScope,
    UnitOfWork,
    create_unit_of_work,
    define_job,
    start_job_runtime,
)
from ship_sqla._jobs import (
    create_job_backend,
    ship_job_events_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
)
from ship_sqla.jobs import Concurrency, EnqueueRequest, JobDefinition
from ship_sqla.kernel import ClaimRequest
from ship_sqla.kernel._plans.announce import ANNOUNCE_WINDOW

if TYPE_CHECKING:
    from ship_sqla._jobs._backend import PostgresJobBackend

__all__ = ["NAME", "run"]

NAME = "workflows"
STEP_JOB = "bench.wf.steps"
WAKE_JOB = "bench.wf.wake"
FRESH_JOB = "bench.wf.fresh"
EVENT = "bench.wf.go"
RAW_STEPS = "raw_job_steps"
RAW_RUNS = "raw_job_runs"
APP_TABLE = "bench_wf_app"
POLL_INTERVAL = 60.0
MISS_AFTER = 5.0
SPACING = ANNOUNCE_WINDOW + 0.03
RESULT = {"ok": True, "n": 1}

APP_INSERT_SQLA = text(f"INSERT INTO {APP_TABLE} (run_id, step) VALUES (:run_id, :step)")
APP_INSERT_RAW = f"INSERT INTO {APP_TABLE} (run_id, step) VALUES ($1, $2)"
RAW_STEP_INSERT = (
    f"INSERT INTO {RAW_STEPS} (run_id, name, seq, kind, state, result, created_at, finished_at)"
    " VALUES ($1, $2, $3, 'step', 'done', CAST($4 AS jsonb), now(), now())"
)


def _scope_itself(scope: TransactionScope) -> TransactionScope:
    return scope


async def _nothing(_ctx: JobContext, _payload: dict[str, Any]) -> None:
    return None


def _backend(engine: Any, metadata: MetaData, **options: Any) -> PostgresJobBackend:  # noqa: ANN401
    return create_job_backend(
        database=engine,
        table=ship_job_runs_table(metadata),
        state_table=ship_job_state_table(metadata),
        steps_table=ship_job_steps_table(metadata),
        events_table=ship_job_events_table(metadata),
        **options,
    )


async def _create_tables(db: BenchDatabase) -> None:
    await db.create_job_tables()
    metadata = MetaData()
    ship_job_runs_table(metadata, name=RAW_RUNS)
    ship_job_steps_table(metadata, name=RAW_STEPS, runs_table=RAW_RUNS)
    async with db.engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await connection.execute(
            text(f"CREATE TABLE {APP_TABLE} (id bigserial PRIMARY KEY, run_id text, step text)")
        )


# --- step costs ---------------------------------------------------------------------------------


class _Steps:
    """One claimed workflow run per round, its context bound to the workflow store."""

    def __init__(self, bench: Bench, db: BenchDatabase) -> None:
        self.bench = bench
        self.db = db
        self.backend = _backend(db.engine, MetaData(), listen=False)
        self.job: JobDefinition[dict[str, Any]] = define_job(
            STEP_JOB, _nothing, payload=dict, concurrency=Concurrency(lease=600)
        )
        self.uow = create_unit_of_work(db.engine, repositories=_scope_itself)
        self.ids = ordered_ids()

    async def context(self) -> JobContext:
        await self.backend.enqueue(self.job, {})
        request = ClaimRequest(
            job_id=STEP_JOB, worker="bench", limit=1, max_running=None, lease=600
        )
        [claimed] = await self.backend.claim(request)
        ctx = JobContext.standalone(claimed, worker_id="bench")
        store = self.backend.workflows
        if store is None:
            raise BenchmarkError("workflows: the backend has no workflow store")
        ctx.bind_workflows(store, self.backend, self.backend.clock)
        await ctx.step("first", _result)  # the one load of the run's steps, not measured
        return ctx

    async def ship_step(self, count: int) -> float:
        ctx = await self.context()
        with Stopwatch() as watch:
            for i in range(count):
                await ctx.step(f"s{i}", _result)
        return self._per_op("ship  ctx.step", watch.seconds, count)

    async def raw_step(self, count: int) -> float:
        raw = await self.db.raw()
        run_id = next(self.ids)
        await raw.execute(job_sql(RAW_RUNS).insert_one, run_id, STEP_JOB, "{}")
        encoded = json.dumps(RESULT)
        with Stopwatch() as watch:
            for i in range(count):
                await raw.execute(RAW_STEP_INSERT, run_id, f"s{i}", i, encoded)
        return self._per_op("raw   INSERT step row", watch.seconds, count)

    async def ship_transaction(self, count: int) -> float:
        ctx = await self.context()
        with Stopwatch() as watch:
            for i in range(count):
                name = f"t{i}"
                await ctx.transaction(name, self.uow, _app_write(ctx.run_id, name))
        return self._per_op("ship  ctx.transaction", watch.seconds, count)

    async def raw_transaction(self, count: int) -> float:
        raw = await self.db.raw()
        run_id = next(self.ids)
        with Stopwatch() as watch:
            for i in range(count):
                async with raw.transaction():
                    await raw.execute(APP_INSERT_RAW, run_id, f"t{i}")
        return self._per_op("raw   BEGIN; INSERT; COMMIT", watch.seconds, count)

    async def uow_write(self, count: int) -> float:
        run_id = next(self.ids)
        with Stopwatch() as watch:
            for i in range(count):
                await self.uow.run(_app_write(run_id, f"u{i}"))
        return self._per_op("ship  uow.run INSERT", watch.seconds, count)

    def _per_op(self, what: str, seconds: float, count: int) -> float:
        per_op = seconds / count * 1e6
        self.bench.log(f"{what:28} {per_op:7.1f} us/op")
        return per_op


async def _result() -> dict[str, Any]:
    return RESULT


def _app_write(run_id: str, step: str) -> Any:  # noqa: ANN401 - a unit-of-work handler
    async def write(scope: TransactionScope) -> dict[str, Any]:
        await scope.connection.execute(APP_INSERT_SQLA, {"run_id": run_id, "step": step})
        return RESULT

    return write


async def _step_figures(bench: Bench, db: BenchDatabase) -> list[Figure]:
    count = 300 if bench.quick else 2_000
    steps = _Steps(bench, db)
    await steps.ship_step(100)  # warm-up, not measured
    await steps.raw_step(100)
    await steps.ship_transaction(100)
    await steps.raw_transaction(100)
    await steps.uow_write(100)
    ours, theirs = await paired_rounds(
        bench.rounds, lambda: steps.ship_step(count), lambda: steps.raw_step(count)
    )
    tx_ours, tx_theirs = await paired_rounds(
        bench.rounds,
        lambda: steps.ship_transaction(count),
        lambda: steps.raw_transaction(count),
    )
    vs_ours, vs_uow = await paired_rounds(
        bench.rounds, lambda: steps.ship_transaction(count), lambda: steps.uow_write(count)
    )
    note = f"{count:,} sequential steps of one claimed run per round; time per step"
    return [
        Figure.from_rounds(
            "workflows.step",
            "us",
            ours,
            theirs,
            baseline_label="asyncpg INSERT of the step row",
            note=note,
        ),
        Figure.from_rounds(
            "workflows.transaction",
            "us",
            tx_ours,
            tx_theirs,
            baseline_label="asyncpg BEGIN; INSERT app row; COMMIT",
            note=note + " (each writes one app row)",
        ),
        Figure.from_rounds(
            "workflows.transaction_vs_uow",
            "us",
            vs_ours,
            vs_uow,
            baseline_label="uow.run INSERT app row",
            targets=(Target("ratio", "<=", 2.0),),
        ),
    ]


# --- wake of a suspended run --------------------------------------------------------------------


class _Samples:
    """Pairs each commit time with the next continuation (or start)."""

    def __init__(self) -> None:
        self.committed = 0.0
        self.arrived = asyncio.Event()
        self.latencies: list[float] = []

    def mark_commit(self) -> None:
        self.committed = time.perf_counter()

    def mark_arrival(self) -> None:
        self.latencies.append((time.perf_counter() - self.committed) * 1000.0)
        self.arrived.set()

    async def next_arrival(self, what: str) -> None:
        try:
            async with asyncio.timeout(MISS_AFTER):
                await self.arrived.wait()
        except TimeoutError as exc:
            raise BenchmarkError(f"workflows: {what} did not arrive within {MISS_AFTER} s") from exc
        self.arrived.clear()


class _Wake:
    """A runtime here (push wake: listening, polling every 60 s) executing WAKE_JOB (waits for
    its key's event) and FRESH_JOB (marks its start); a publisher backend, the runtime's own or
    a second one on its own engine."""

    def __init__(self, bench: Bench, db: BenchDatabase) -> None:
        self.bench = bench
        self.db = db
        self.samples = _Samples()
        self.backend = _backend(db.engine, MetaData())
        self.uow = create_unit_of_work(db.engine, repositories=_scope_itself)
        self.keys = ordered_ids()

        async def wait(ctx: JobContext, payload: dict[str, Any]) -> None:
            await ctx.wait_for_event("go", EVENT, key=payload["key"])
            self.samples.mark_arrival()

        async def fresh(_ctx: JobContext, _payload: dict[str, Any]) -> None:
            self.samples.mark_arrival()

        self.wait_job: JobDefinition[dict[str, Any]] = define_job(WAKE_JOB, wait, payload=dict)
        self.fresh_job: JobDefinition[dict[str, Any]] = define_job(FRESH_JOB, fresh, payload=dict)

    async def suspend(self, count: int) -> list[str]:
        """``count`` runs suspended on their own keys (bounded polling for the suspends)."""
        keys = [next(self.keys) for _ in range(count)]
        await self.backend.enqueue_many(self.wait_job, [EnqueueRequest({"key": k}) for k in keys])
        deadline = time.monotonic() + 30
        query = text(
            "SELECT count(*) FROM ship_job_steps s JOIN ship_job_runs r ON r.id = s.run_id"
            " WHERE s.event_key = ANY(:keys) AND s.state = 'waiting' AND r.state = 'waiting'"
        )
        while time.monotonic() < deadline:
            async with self.db.engine.connect() as connection:
                if await connection.scalar(query, {"keys": keys}) == count:
                    return keys
            await asyncio.sleep(0.05)
        raise BenchmarkError(f"workflows: {count} runs did not all suspend within 30 s")

    async def publish_round(
        self,
        publisher: PostgresJobBackend,
        uow: UnitOfWork[TransactionScope],
        count: int,
        spacing: float,
        what: str,
    ) -> tuple[float, float]:
        keys = await self.suspend(count)
        self.samples.latencies.clear()
        for key in keys:

            async def publish(scope: TransactionScope, key: str = key) -> None:
                scope.after_commit(self.samples.mark_commit)
                await publisher.publish_event(EVENT, None, key=key)

            await uow.run(publish)
            await self.samples.next_arrival("a woken workflow run")
            await asyncio.sleep(spacing)
        return latency_percentiles(
            self.bench, f"{what} publish -> continue", self.samples.latencies
        )

    async def fresh_round(
        self,
        publisher: PostgresJobBackend,
        uow: UnitOfWork[TransactionScope],
        count: int,
        spacing: float,
        what: str,
    ) -> tuple[float, float]:
        self.samples.latencies.clear()
        for _ in range(count):

            async def enqueue(scope: TransactionScope) -> None:
                scope.after_commit(self.samples.mark_commit)
                await publisher.enqueue(self.fresh_job, {})

            await uow.run(enqueue)
            await self.samples.next_arrival("a fresh run")
            await asyncio.sleep(spacing)
        return latency_percentiles(self.bench, f"{what} enqueue -> start", self.samples.latencies)


async def _wake_figures(bench: Bench, db: BenchDatabase) -> list[Figure]:
    local = 50 if bench.quick else 200
    listened = 20 if bench.quick else 60
    wake = _Wake(bench, db)
    other_engine = create_async_engine(db.url, pool_size=4)
    other = _backend(other_engine, MetaData(), listen=False)
    other_uow = create_unit_of_work(other_engine, repositories=_scope_itself)
    runtime = await start_job_runtime(
        [wake.wait_job, wake.fresh_job], backend=wake.backend, poll_interval=POLL_INTERVAL
    )
    try:
        await wake.publish_round(wake.backend, wake.uow, 10, 0.0, "warm-up")
        ours, theirs = await paired_rounds(
            bench.rounds,
            lambda: wake.publish_round(wake.backend, wake.uow, local, 0.0, "local"),
            lambda: wake.fresh_round(wake.backend, wake.uow, local, 0.0, "local"),
        )
        far_ours, far_theirs = await paired_rounds(
            bench.rounds,
            lambda: wake.publish_round(other, other_uow, listened, SPACING, "listen"),
            lambda: wake.fresh_round(other, other_uow, listened, SPACING, "listen"),
        )
    finally:
        await runtime.stop()
        await other_engine.dispose()
    return [
        *latency_figures(
            "workflows.wake",
            ours,
            theirs,
            baseline_label="a fresh run's enqueue -> start",
            note=f"{local} runs suspended on distinct keys per round, published one at a time"
            " by the runtime's own backend; publish commit -> handler continues past the wait",
        ),
        *latency_figures(
            "workflows.wake.listen",
            far_ours,
            far_theirs,
            baseline_label="a fresh run's enqueue -> start",
            note=f"{listened} per round, published by a second backend on its own engine (the"
            f" runtime hears of them by LISTEN), {SPACING * 1000:.0f} ms apart",
        ),
    ]


async def run(bench: Bench) -> list[Figure]:
    async with bench.database(NAME) as db:
        await _create_tables(db)
        figures = await _step_figures(bench, db)
        figures.extend(await _wake_figures(bench, db))
    return figures
