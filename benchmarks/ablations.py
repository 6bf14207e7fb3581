"""ablations (opt-in): what each optimisation of the real code path buys, ON vs OFF.

Every figure measures the library as shipped (ON, the figure's value) beside the same code with
one optimisation turned off (OFF, the "baseline" column), in the same run, alternating which
goes first per round; ratio = median of the per-round ON/OFF ratios. OFF is made from here only,
by the narrowest patch of one object (an instance attribute, or one instance's class swapped for
a subclass overriding one or two methods), undone in ``finally``; ``src/`` is never touched.

1. enqueue fast path: ``PostgresJobBackend.insert`` takes ``ENQUEUE_PLAIN`` for runs with
   generated ids, no dedupe key and no depth limit. OFF: that backend's inserter (its
   ``RunInserter``) swapped for a subclass whose ``unchecked`` answers False (every call takes
   the checked ``ENQUEUE_MANY``).
2. tuned claim commit: on its own connections the backend's claim (one statement, F1) commits
   without waiting for its WAL flush (``:tuned``). OFF: that backend's ``statements`` with both
   claims' ``:tuned`` replaced by ``false`` (the server's synchronous_commit).
3. runtime claim room: ``JobRuntime._room_for`` subtracts the job's unflushed completions from
   ``concurrency.max``. OFF: that runtime's completer answers 0 from ``unflushed_of`` (its only
   caller is ``_room_for``), patched before its first claim.
4. relay: (a) pipelining, the next claim started while the batch is completed, gated only by
   ``outbox.connections.concurrent``; OFF: the outbox's ``StoreConnections`` class swapped for
   a subclass answering False there. (b) autocommitted claim and settles; OFF: a subclass whose
   ``statement`` (claim) and unjoined ``joined(..., one_statement=True)`` (settles) run each
   statement in BEGIN ... COMMIT (pipelining stays on).

Run it by name: ``python -m benchmarks ablations [--quick]``; it is not part of the default run.
"""

from __future__ import annotations

from contextlib import (
    AbstractContextManager,
    contextmanager,
    nullcontext,
)
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import MetaData, TextClause, text
from sqlalchemy.ext.asyncio import AsyncEngine

from benchmarks._harness import (
    Bench,
    BenchDatabase,
    BenchmarkError,
    Figure,
    Stopwatch,
    measure_pair,
    median,
    paired_rounds,
    rate,
)
from benchmarks._raw_sql import job_sql
from benchmarks.process import MAX_IN_FLIGHT as DRAIN_IN_FLIGHT
from benchmarks.process import drain_jobs, drain_size
from benchmarks.relay import BATCH as RELAY_BATCH
from benchmarks.relay import relay_messages
from ship_sqla import (
    JobContext,
    TransactionScope,
    create_unit_of_work,
    define_job,
    ship_outbox_table,
)
from ship_sqla._jobs import (
    PostgresJobBackend,
    create_job_backend,
    ship_job_runs_table,
    ship_job_state_table,
)
from ship_sqla._jobs._insert import RunInserter
from ship_sqla._jobs._sql.claim import CLAIM_GATED, CLAIM_UNCAPPED
from ship_sqla._scope import StoreConnections, _answered
from ship_sqla.jobs import Concurrency, EnqueueRequest, JobDefinition
from ship_sqla.kernel import completed
from ship_sqla.kernel._ports import ClaimRequest

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence

    from sqlalchemy.sql.base import Executable

    from ship_sqla._scope import Within
    from ship_sqla.jobs import JobRuntime
    from ship_sqla.kernel._plans.prepare import PreparedRun
    from ship_sqla.outbox import Outbox

__all__ = ["NAME", "run"]

NAME = "ablations"
JOB_ID = "bench.ablation"
PAYLOAD: dict[str, Any] = {"order_id": 12345, "kind": "bench"}
BULK_BATCH = 10_000
CLAIM_BATCH = 50
ROOM_IN_FLIGHT = 1500
"""Above the completer's batch of 1000, where the unflushed term decides the claim's room."""
ROOM_POLL = 1.0
"""The claim-room drain's poll_interval (``process``: 5 s): bounds what a parked OFF loop costs."""
ON, OFF = "shipped", "off"


async def _noop(_ctx: JobContext, _payload: dict[str, Any]) -> None:
    return None


def _scope_itself(scope: TransactionScope) -> TransactionScope:
    return scope


def _log_pair(bench: Bench, what: str, ours: list[float], theirs: list[float], unit: str) -> None:
    ratios = [a / b for a, b in zip(ours, theirs, strict=True) if b]
    bench.log(
        f"{what}: ON {median(ours):,.2f} {unit}, OFF {median(theirs):,.2f} {unit},"
        f" ratio {median(ratios):.2f}x"
    )


# --- 1. enqueue fast path ---------------------------------------------------------------------


class _CheckedInserter(RunInserter):
    __slots__ = ()

    def unchecked(self, runs: Sequence[PreparedRun]) -> bool:  # noqa: ARG002 - OFF
        return False


@contextmanager
def _checked_enqueue_only(backend: PostgresJobBackend) -> Iterator[None]:
    """OFF: this backend's inserts send plain requests through the checked statement."""
    inserter = backend._inserter  # noqa: SLF001 - the ablation's one switch
    inserter.__class__ = _CheckedInserter
    try:
        yield
    finally:
        inserter.__class__ = RunInserter


class _EnqueueAblation:
    def __init__(self, bench: Bench, db: BenchDatabase) -> None:
        self.bench = bench
        self.db = db
        self.metadata = MetaData()
        self.table = ship_job_runs_table(self.metadata)
        ship_job_state_table(self.metadata)
        self.job: JobDefinition[dict[str, Any]] = define_job(JOB_ID, _noop, payload=dict)
        self.backend = create_job_backend(database=db.engine, table=self.table)
        self.uow = create_unit_of_work(db.engine, repositories=_scope_itself)

    async def setup(self) -> None:
        async with self.db.engine.begin() as connection:
            await connection.run_sync(self.metadata.create_all)

    async def single(self, count: int, *, fast: bool) -> float:
        await self.db.maintain(f"TRUNCATE {self.table.name} CASCADE")
        backend, job = self.backend, self.job

        async def enqueue_one(_scope: TransactionScope) -> None:
            await backend.enqueue(job, PAYLOAD)

        with _checked_enqueue_only(backend) if not fast else nullcontext(), Stopwatch() as watch:
            for _ in range(count):
                await self.uow.run(enqueue_one)
        per_s = rate(count, watch.seconds)
        self.bench.log(f"enqueue single {ON if fast else OFF:7} {per_s:,.0f} runs/s")
        return per_s

    async def bulk(self, count: int, *, fast: bool) -> float:
        await self.db.maintain(f"TRUNCATE {self.table.name} CASCADE")
        calls = [
            [EnqueueRequest(payload=PAYLOAD) for _ in range(min(BULK_BATCH, count - start))]
            for start in range(0, count, BULK_BATCH)
        ]
        off = _checked_enqueue_only(self.backend) if not fast else nullcontext()
        with off, Stopwatch() as watch:
            for requests in calls:
                await self.backend.enqueue_many(self.job, requests)
        per_s = rate(count, watch.seconds)
        self.bench.log(f"enqueue bulk   {ON if fast else OFF:7} {per_s:,.0f} runs/s")
        return per_s


async def _enqueue_figures(bench: Bench) -> list[Figure]:
    single, bulk = (200, 2 * BULK_BATCH) if bench.quick else (1_000, 5 * BULK_BATCH)
    async with bench.database(f"{NAME}_enqueue") as db:
        work = _EnqueueAblation(bench, db)
        await work.setup()
        for fast in (True, False):  # warm-up: pool, prepared statements, compiled cache
            await work.single(30, fast=fast)
            await work.bulk(BULK_BATCH, fast=fast)
        s_on, s_off = await paired_rounds(
            bench.rounds,
            lambda: work.single(single, fast=True),
            lambda: work.single(single, fast=False),
        )
        _log_pair(bench, "enqueue single", s_on, s_off, "runs/s")
        b_on, b_off = await paired_rounds(
            bench.rounds,
            lambda: work.bulk(bulk, fast=True),
            lambda: work.bulk(bulk, fast=False),
        )
        _log_pair(bench, "enqueue bulk", b_on, b_off, "runs/s")
    off = "OFF: the backend's inserter answers unchecked() False (ENQUEUE_MANY for every call)"
    return [
        Figure.from_rounds(
            "ablation.enqueue_fast_path.single",
            "runs/s",
            s_on,
            s_off,
            baseline_label="checked ENQUEUE_MANY",
            note=f"{single:,} sequential enqueues per round, each its own uow.run. {off}",
        ),
        Figure.from_rounds(
            "ablation.enqueue_fast_path.bulk",
            "runs/s",
            b_on,
            b_off,
            baseline_label="checked ENQUEUE_MANY",
            note=f"{bulk:,} runs per round in enqueue_many calls of {BULK_BATCH:,}. {off}",
        ),
    ]


# --- 2. tuned claim commit --------------------------------------------------------------------

_TUNED = "CAST(:tuned AS boolean)"


def _untuned(statement: TextClause) -> TextClause:
    if _TUNED not in statement.text:
        raise BenchmarkError("ablations: the claim no longer reads :tuned; update ablation 2")
    return text(statement.text.replace(_TUNED, "false"))


@contextmanager
def _synchronous_claims(backend: PostgresJobBackend) -> Iterator[None]:
    """OFF: this backend's claims commit with the server's synchronous_commit."""
    statements = backend.statements
    rendered = statements._rendered  # noqa: SLF001 - the registry's cache, swapped for the round
    shipped = {template: statements[template] for template in (CLAIM_UNCAPPED, CLAIM_GATED)}
    rendered.update({template: _untuned(sql) for template, sql in shipped.items()})
    try:
        yield
    finally:
        rendered.update(shipped)


async def _claim_latencies(
    backend: PostgresJobBackend,
    job: JobDefinition[Any],
    conn: Any,  # noqa: ANN401 - asyncpg is untyped
    refill: str,
    claims: int,
) -> float:
    """Median ms of ``claims`` claims of CLAIM_BATCH; each batch completed and replaced."""
    latencies: list[float] = []
    for _ in range(claims):
        with Stopwatch() as watch:
            runs = await backend.claim(
                ClaimRequest(
                    job.id, "bench", CLAIM_BATCH, job.concurrency.max, job.concurrency.lease
                )
            )
        if len(runs) != CLAIM_BATCH:
            raise BenchmarkError(f"ablations: claim returned {len(runs)} of {CLAIM_BATCH} runs")
        latencies.append(watch.seconds * 1000.0)
        await backend.settle([completed(run) for run in runs])
        await conn.execute(refill, JOB_ID, len(runs))
    return median(latencies)


async def _claim_figures(bench: Bench) -> list[Figure]:
    backlog = 10_000 if bench.quick else 100_000
    claims = 50 if bench.quick else 100
    label = f"{backlog // 1000}k"
    job: JobDefinition[dict[str, Any]] = define_job(
        JOB_ID, _noop, payload=dict, concurrency=Concurrency(max=2 * CLAIM_BATCH)
    )
    async with bench.database(f"{NAME}_claim") as db:
        metadata = MetaData()
        table = ship_job_runs_table(metadata)
        ship_job_state_table(metadata)
        async with db.engine.begin() as connection:
            await connection.run_sync(metadata.create_all)
        sql = job_sql(table.name)
        conn = await db.raw()
        bench.log(f"loading {backlog:,} waiting runs")
        await conn.execute(sql.load_waiting, JOB_ID, backlog)
        await conn.execute(f"VACUUM (ANALYZE) {table.name}")
        backend = create_job_backend(database=db.engine, table=table)

        async def tuned(count: int = claims) -> float:
            return await _claim_latencies(backend, job, conn, sql.refill_waiting, count)

        async def plain(count: int = claims) -> float:
            with _synchronous_claims(backend):
                return await _claim_latencies(backend, job, conn, sql.refill_waiting, count)

        await tuned(10)  # warm-up: plans, prepared statements
        await plain(10)
        ours: list[float] = []
        theirs: list[float] = []
        for index in range(bench.rounds):
            await conn.execute(f"VACUUM (ANALYZE) {table.name}")
            mine, base = await measure_pair(index, tuned, plain)
            ours.append(mine)
            theirs.append(base)
            bench.log(f"claim @{label} round {index + 1}: ON {mine:.2f} ms, OFF {base:.2f} ms")
        _log_pair(bench, f"claim @{label}", ours, theirs, "ms")
        drain_on, drain_off = await _drain_pairs(
            bench,
            db,
            runs=drain_size(bench),
            max_in_flight=DRAIN_IN_FLIGHT,
            poll_interval=5.0,
            ablate_backend=_synchronous_claims,
            ablate_runtime=None,
        )
    off = "OFF: the backend's claims with :tuned replaced by false (synchronous commit)"
    return [
        Figure.from_rounds(
            f"ablation.claim_tuned_commit.claim@{label}",
            "ms",
            ours,
            theirs,
            baseline_label="synchronous claim commit",
            note=f"median of {claims} claims of {CLAIM_BATCH} per round at {backlog:,} waiting"
            f" (kept at size); lower is better. {off}",
        ),
        Figure.from_rounds(
            "ablation.claim_tuned_commit.drain",
            "jobs/s",
            drain_on,
            drain_off,
            baseline_label="synchronous claim commit",
            note=f"process drain, N={drain_size(bench):,},"
            f" max_in_flight = concurrency.max = {DRAIN_IN_FLIGHT}. {off}",
        ),
    ]


# --- 3. runtime claim room, and the drain both share ------------------------------------------


def _none_unflushed(job_id: str) -> int:  # noqa: ARG001 - unflushed_of's signature
    return 0


@contextmanager
def _room_ignores_unflushed(runtime: JobRuntime) -> Iterator[None]:
    """OFF: ``_room_for`` without ``- unflushed_of(job.id)``. Patched on this runtime's completer
    right after ``start_job_runtime`` returned: its loop task has not run yet (nothing awaited
    since it was created), and an unpatched first pass would see 0 unflushed anyway."""
    completer = runtime._completer  # noqa: SLF001 - the ablation's one switch
    completer.unflushed_of = _none_unflushed  # type: ignore[method-assign]
    try:
        yield
    finally:
        del completer.unflushed_of


async def _drain_pairs(
    bench: Bench,
    db: BenchDatabase,
    *,
    runs: int,
    max_in_flight: int,
    poll_interval: float,
    ablate_backend: Callable[[PostgresJobBackend], AbstractContextManager[None]] | None,
    ablate_runtime: Callable[[JobRuntime], AbstractContextManager[None]] | None,
) -> tuple[list[float], list[float]]:
    metadata = MetaData()
    ship_job_runs_table(metadata)
    ship_job_state_table(metadata)
    async with db.engine.begin() as connection:
        await connection.run_sync(metadata.create_all)

    def one(size: int, *, ablated: bool) -> Callable[[], Awaitable[float]]:
        return lambda: drain_jobs(
            bench,
            db,
            size,
            max_in_flight=max_in_flight,
            poll_interval=poll_interval,
            ablate_backend=ablate_backend if ablated else None,
            ablate_runtime=ablate_runtime if ablated else None,
        )

    await one(1_000, ablated=False)()  # warm-up, not measured
    await one(1_000, ablated=True)()
    ours, theirs = await paired_rounds(
        bench.rounds, one(runs, ablated=False), one(runs, ablated=True)
    )
    _log_pair(bench, f"drain {runs} @{max_in_flight}", ours, theirs, "jobs/s")
    return ours, theirs


async def _room_figures(bench: Bench) -> list[Figure]:
    # OFF parks only when a completion lands while a claim is on the wire: a race that a
    # 5,000-run drain (three or four claims) often misses, so quick mode drains 10,000.
    runs = 10_000 if bench.quick else 20_000
    async with bench.database(f"{NAME}_room") as db:
        ours, theirs = await _drain_pairs(
            bench,
            db,
            runs=runs,
            max_in_flight=ROOM_IN_FLIGHT,
            poll_interval=ROOM_POLL,
            ablate_backend=None,
            ablate_runtime=_room_ignores_unflushed,
        )
    return [
        Figure.from_rounds(
            "ablation.runtime_claim_room.drain",
            "jobs/s",
            ours,
            theirs,
            baseline_label="room without unflushed",
            note=f"process drain, N={runs:,}, max_in_flight = concurrency.max = {ROOM_IN_FLIGHT},"
            f" poll_interval {ROOM_POLL:g} s in both (process uses 5 s: a parked OFF loop costs"
            " up to 5x more there). OFF: the runtime's completer.unflushed_of answers 0, so"
            " _room_for drops its '- unflushed_of(job.id)' term",
        )
    ]


# --- 4. relay ---------------------------------------------------------------------------------


class _UnpipelinedConnections(StoreConnections):
    """OFF (a): the relay never claims ahead; everything else as shipped."""

    __slots__ = ()

    @property
    def concurrent(self) -> bool:
        return False


class _TransactionalConnections(StoreConnections):
    """OFF (b): the outbox's own statements and unjoined settles in BEGIN ... COMMIT on the
    engine (three round trips each instead of one); claim-ahead pipelining stays on."""

    __slots__ = ()

    async def _one(
        self,
        what: str,
        statement: Executable,
        params: Mapping[str, Any] | None,
        scope: Within,
        answer: Any,  # noqa: ANN401 - the entry's private answer kind
    ) -> Any:  # noqa: ANN401 - per answer
        if not isinstance(self.database, AsyncEngine):
            raise BenchmarkError("ablations: the relay ablation needs an engine-backed outbox")
        async with self.transaction(what, scope=scope) as tx:
            return _answered(await tx.connection.execute(statement, params), answer)


@contextmanager
def _outbox_as(outbox: Outbox, ablated: type[StoreConnections]) -> Iterator[None]:
    """Swap this one outbox's connections' class for a subclass overriding only the ablated
    switch."""
    outbox.connections.__class__ = ablated
    try:
        yield
    finally:
        outbox.connections.__class__ = StoreConnections


async def _relay_round(
    bench: Bench, db: BenchDatabase, count: int, ablated: type[StoreConnections] | None
) -> float:
    """One ``relay`` round (benchmarks/relay.py), with the outbox's class swapped for
    ``ablated`` while it runs."""
    return await relay_messages(
        bench, db, count, ablate=partial(_outbox_as, ablated=ablated) if ablated else None
    )


async def _relay_figures(bench: Bench) -> list[Figure]:
    count = 5_000 if bench.quick else 20_000
    figures: list[Figure] = []
    async with bench.database(f"{NAME}_relay") as db:
        metadata = MetaData()
        ship_outbox_table(metadata)
        async with db.engine.begin() as connection:
            await connection.run_sync(metadata.create_all)
        for ablated in (None, _UnpipelinedConnections, _TransactionalConnections):  # warm-up
            await _relay_round(bench, db, 1_000, ablated)
        variants = (
            (
                "ablation.relay_pipelining.noop_sink",
                _UnpipelinedConnections,
                "no claim ahead",
                (
                    "OFF: the outbox's StoreConnections class swapped for a subclass whose"
                    " concurrent is False (the relay's only use of it: claim batch n+1 while"
                    " completing n)"
                ),
            ),
            (
                "ablation.relay_autocommit.noop_sink",
                _TransactionalConnections,
                "BEGIN/COMMIT statements",
                (
                    "OFF: the outbox's StoreConnections class swapped for a subclass whose"
                    " one-statement calls of its own (claim, settle) run in BEGIN/COMMIT"
                    " transactions; pipelining stays on"
                ),
            ),
        )
        for name, ablated, label, off in variants:
            ours, theirs = await paired_rounds(
                bench.rounds,
                partial(_relay_round, bench, db, count, None),
                partial(_relay_round, bench, db, count, ablated),
            )
            _log_pair(bench, name, ours, theirs, "msg/s")
            figures.append(
                Figure.from_rounds(
                    name,
                    "msg/s",
                    ours,
                    theirs,
                    baseline_label=label,
                    note=f"{count:,} messages, one relay, batch_size={RELAY_BATCH}, noop sink."
                    f" {off}",
                )
            )
    return figures


async def run(bench: Bench) -> list[Figure]:
    figures: list[Figure] = []
    for section in (_enqueue_figures, _claim_figures, _room_figures, _relay_figures):
        figures.extend(await section(bench))
    return figures
