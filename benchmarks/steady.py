"""steady (opt-in): steady load with a held snapshot, ship_sqla beside pgqueuer (issue 39, J19).

A producer offers runs at a fixed rate; one worker drains them; one connection holds a
REPEATABLE READ snapshot (an open transaction that has read once, as a forgotten session does)
through the middle half of the load, so no vacuum anywhere in the cluster can remove what the
drain leaves dead. Every ``sample`` seconds the bench records, per library:

- **claim cost**: the claim statement's server time and buffers per claimed run over the
  interval (``pg_stat_statements`` differences for the bench's database; without the
  extension loaded these are NaN and the rest still runs);
- **drain**: runs finished in the interval against the rate offered;
- **queue table size**: ``pg_total_relation_size`` (heap + indexes), the heap alone, its
  indexes (``pg_indexes_size``), dead tuples, and how many autovacuum passes it has had since
  the snapshot was released. When it is first back to its pre-hold size (the median of the
  samples before the hold) is reported in those passes, in seconds after the release (on the
  sampler's grid) and in autovacuum cycles (those seconds over the server's
  ``autovacuum_naptime``), and in cycles again within 25 % of that size
  (``table_near_after_cycles``: under load the size moves by that much between vacuums).
  ship's early index rebuilds (the sampler's, J17 and J22:
  ``SHIP_SQLA_RUNS_INDEXES_REBUILT_EARLY``) are logged with their time.

After the load the worker runs on until every offered run is finished (or a timeout), then
sampling goes on until the queue table is back to its size when the hold began or it has had
three autovacuum passes since the release (``after`` seconds at most). Runs lost = offered minus
finished (a run finished twice counts once) minus those still queued when the worker stopped
(``runs_unfinished``: not drained within ``DRAIN_AFTER`` of the load's end).

ship: ``create_job_backend(history_table=...)`` (J16, live runs only: a finished run leaves
the runs table), one ``start_job_runtime(max_in_flight=1000)``; claim = the claim walk
(``walk (priority, ids, ...)``). pgqueuer (1.6.0; optional: ``pip install pgqueuer==1.6.0``,
skipped with a note when it does not import): ``Queries.install()``, producer
``Queries.enqueue`` batches, ``QueueManager(...).run(batch_size=500)`` over a pool of 10 (as
``peers``); claim = its dequeue (``next_queued``); finished = ``pgqueuer_log`` rows
``successful``. The same producer, hold and sampler drive both, one after the other, each in
its own database of the same server.

Sizes (``--quick`` is the CI smoke): full: 1,200,000 runs at 1,000/s (20 minutes), the hold
from minute 5 to 15, a sample a minute; quick: 200,000 runs at 2,500/s (80 s), a 60 s hold
from 10 s to 70 s, a sample every 10 s (every 5 s from the release on: 15 s in the full
run), at most 30 s after. Override with
``SHIP_SQLA_BENCH_STEADY="minutes=10,rate=1000"`` (the hold is always the middle half;
``peers=0`` skips pgqueuer; ``--quick`` skips it unless ``peers=1``; ``early=0`` turns off
ship's early index rebuild after the release, J17/J22, for an A/B). The issue's targets:
claim cost <= 1.2x its pre-hold level throughout, drain >= 0.95x the offered rate, the table
back to its pre-hold size within two autovacuum cycles of the release, 0 runs lost; ship at
least pgqueuer's on each.

Run: ``python -m benchmarks steady [--quick]`` on a server with ``pg_stat_statements`` in
``shared_preload_libraries`` (BENCHMARKS.md, "Issue 39": the private cluster's settings).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import MetaData, text

from benchmarks._harness import Bench, BenchDatabase, BenchmarkError, Figure, Target, median
from ship_sqla import (
    create_job_backend,
    define_job,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
    ship_job_workers_table,
    start_job_runtime,
)
from ship_sqla.jobs import Concurrency, EnqueueRequest
from ship_sqla.kernel._early_rebuild import EarlyRebuild
from ship_sqla.kernel._runtime import depth
from ship_sqla.kernel._runtime.depth import EARLY_REBUILD

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ship_sqla.jobs import JobDefinition, JobRuntime
    from ship_sqla.kernel._health import StorageHealth

__all__ = ["NAME", "run"]

NAME = "steady"
JOB_ID = "bench.steady"
TICK = 0.1
"""The producer enqueues every TICK seconds what the schedule owes (one batch call)."""
IN_FLIGHT = 1000
PGQ_BATCH = 500
PGQ_POOL = 10
DRAIN_AFTER = 120.0
"""Seconds the worker may take after the load to finish what was offered."""


@dataclass(frozen=True, slots=True)
class Shape:
    runs: int
    rate: float
    hold_from: float
    hold_to: float
    sample: float
    after: float
    peers: bool = True
    early: bool = True
    capped: bool = True
    """ship: the job capped at ``Concurrency(max=1000)`` (as committed); ``cap=0`` runs it
    uncapped (the claim without F1's held count)."""
    after_sample: float = 5.0
    """Seconds between samples from the release on (finer than ``sample``: when the table is
    back is read to this resolution)."""
    """ship: the sampler's early index rebuild (J17, J22) on; ``early=0`` turns it off for an
    A/B (the rebuild then waits for the 10-minute maintenance pass)."""

    @property
    def seconds(self) -> float:
        return self.runs / self.rate


FULL = Shape(
    runs=1_200_000,
    rate=1000.0,
    hold_from=300.0,
    hold_to=900.0,
    sample=60.0,
    after=240.0,
    after_sample=15.0,
)
QUICK = Shape(runs=200_000, rate=2500.0, hold_from=10.0, hold_to=70.0, sample=10.0, after=30.0)


def _shape(bench: Bench) -> Shape:
    shape = QUICK if bench.quick else FULL
    spec = os.environ.get("SHIP_SQLA_BENCH_STEADY", "")
    options = dict(part.split("=", 1) for part in spec.split(",") if "=" in part)
    rate = float(options.get("rate", shape.rate))
    if "minutes" in options:
        seconds = float(options["minutes"]) * 60
        shape = replace(shape, runs=int(seconds * rate), hold_from=seconds / 4)
        shape = replace(shape, hold_to=3 * seconds / 4)
    elif "rate" in options:
        shape = replace(shape, runs=int(shape.seconds * rate))
    # The CI smoke (--quick) runs ship's side only unless asked (peers=1): pgqueuer's side
    # would double its time, and the CI's venv may have pgqueuer installed.
    peers = options.get("peers", "0" if bench.quick else "1") != "0"
    early = options.get("early", "1") != "0"
    capped = options.get("cap", "1") != "0"
    return replace(shape, rate=rate, peers=peers, early=early, capped=capped)


@dataclass(slots=True)
class Sample:
    at: float
    offered: int
    finished: int
    claims: tuple[int, float, int, int]
    """pg_stat_statements sums: calls, exec ms, rows, shared buffers (hit + read)."""
    total_bytes: int
    heap_bytes: int
    dead: int
    autovacuums: int
    held: bool
    index_bytes: int = 0


@dataclass(slots=True)
class Outcome:
    library: str
    shape: Shape
    samples: list[Sample] = field(default_factory=list)
    released_at: float = math.nan
    pre_hold: Sample | None = None
    """Taken just before the snapshot was: the table's size and claim cost to come back to."""
    offered: int = 0
    finished: int = 0
    remaining: int = 0
    """Still queued when the worker stopped (not finished within ``DRAIN_AFTER``, not lost)."""
    started: float = 0.0
    """``time.monotonic()`` at the load's start (the samples' ``at`` is relative to it)."""
    naptime: float = math.nan
    """The server's ``autovacuum_naptime`` in seconds (an autovacuum cycle)."""
    rebuilds: list[tuple[float, str]] = field(default_factory=list)
    """ship: when (bench seconds) the sampler's early rebuild rebuilt which indexes."""


class _Side(Protocol):
    library: str
    table: str
    claim_like: tuple[str, ...]

    async def setup(self) -> None: ...
    async def enqueue(self, count: int) -> None: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def finished(self) -> int: ...
    async def remaining(self) -> int: ...


# --- the two libraries ---------------------------------------------------------------------------


class _EarlyRebuilds(logging.Handler):
    """Collects the sampler's early-rebuild lines (J17, J22): when, and which indexes."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "ship.code", None) == EARLY_REBUILD:
            self.seen.append((time.monotonic(), record.getMessage()))


class _NeverEarly(EarlyRebuild):
    """The A side of ``early=0``: the sampler never rebuilds before the maintenance pass."""

    def due(self, health: StorageHealth) -> None:
        del health


class _ShipSide:
    library = "ship_sqla"
    table = "ship_job_runs"
    claim_like: tuple[str, ...] = ("%walk (priority, ids, run_ats, seqs, taken)%",)

    def __init__(self, db: BenchDatabase, *, capped: bool = True) -> None:
        self.db = db
        self.metadata = MetaData()
        runs = ship_job_runs_table(self.metadata)
        self.history = ship_job_history_table(self.metadata)
        ship_job_workers_table(self.metadata)
        self.backend = create_job_backend(
            database=db.engine,
            table=runs,
            state_table=ship_job_state_table(self.metadata),
            steps_table=ship_job_steps_table(self.metadata, runs_fkey=False),
            history_table=self.history,
        )
        self.job: JobDefinition[dict[str, Any]] = define_job(
            JOB_ID,
            self._handle,
            payload=dict,
            concurrency=Concurrency(max=IN_FLIGHT) if capped else Concurrency(),
        )
        self.runtime: JobRuntime | None = None
        self.early = _EarlyRebuilds()

    async def _handle(self, *_: object) -> None:
        return None

    async def setup(self) -> None:
        async with self.db.engine.begin() as connection:
            await connection.run_sync(self.metadata.create_all)

    async def enqueue(self, count: int) -> None:
        await self.backend.enqueue_many(
            self.job, [EnqueueRequest(payload={}) for _ in range(count)]
        )

    async def start(self) -> None:
        jobs_log = logging.getLogger("ship_sqla.jobs")
        jobs_log.addHandler(self.early)
        if not jobs_log.isEnabledFor(logging.INFO):
            jobs_log.setLevel(logging.INFO)
        self.runtime = await start_job_runtime(
            self.job, backend=self.backend, max_in_flight=IN_FLIGHT
        )

    async def stop(self) -> None:
        if self.runtime is not None:
            await self.runtime.stop()
        logging.getLogger("ship_sqla.jobs").removeHandler(self.early)

    async def finished(self) -> int:
        async with self.db.engine.connect() as connection:
            found = await connection.scalar(
                text(
                    f"SELECT count(DISTINCT id) FROM {self.history.name} WHERE state = 'completed'"
                )
            )
        return int(found or 0)

    async def remaining(self) -> int:
        """Runs still in the runs table (live: waiting or running)."""
        async with self.db.engine.connect() as connection:
            found = await connection.scalar(text("SELECT count(*) FROM ship_job_runs"))
        return int(found or 0)


class _PgQueuerSide:
    library = "pgqueuer"
    table = "pgqueuer"
    claim_like: tuple[str, ...] = ("%next_queued%", "%eligible%")

    def __init__(self, db: BenchDatabase) -> None:
        import asyncpg  # noqa: PLC0415 - keep this module importable without pgqueuer
        from pgqueuer.db import AsyncpgDriver, AsyncpgPoolDriver  # noqa: PLC0415 - optional
        from pgqueuer.qm import QueueManager  # noqa: PLC0415 - optional dependency
        from pgqueuer.queries import Queries  # noqa: PLC0415 - optional dependency

        self.db = db
        self._asyncpg = asyncpg
        self._driver = AsyncpgDriver
        self._pool_driver = AsyncpgPoolDriver
        self._manager_type = QueueManager
        self._queries_type = Queries
        self.queries: Any = None
        self._pool: Any = None
        self._manager: Any = None
        self._worker: asyncio.Task[None] | None = None

    async def setup(self) -> None:
        from benchmarks._harness import asyncpg_dsn  # noqa: PLC0415 - beside its only use

        self.queries = self._queries_type(self._driver(await self.db.raw()))
        await self.queries.install()
        self._pool = await self._asyncpg.create_pool(
            asyncpg_dsn(self.db.url), min_size=PGQ_POOL, max_size=PGQ_POOL + 2
        )

    async def enqueue(self, count: int) -> None:
        await self.queries.enqueue([JOB_ID] * count, [b"{}"] * count, [0] * count)

    async def start(self) -> None:
        manager = self._manager_type(self._queries_type(self._pool_driver(self._pool)))

        @manager.entrypoint(JOB_ID)
        async def noop(_job: object) -> None:
            return None

        self._manager = manager
        self._worker = asyncio.create_task(manager.run(batch_size=PGQ_BATCH))

    async def stop(self) -> None:
        if self._manager is not None and self._worker is not None:
            self._manager.shutdown.set()
            await self._worker
        await self._pool.close()

    async def finished(self) -> int:
        async with self.db.engine.connect() as connection:
            found = await connection.scalar(
                text("SELECT count(DISTINCT job_id) FROM pgqueuer_log WHERE status = 'successful'")
            )
        return int(found or 0)

    async def remaining(self) -> int:
        """Jobs still in the queue table (queued or picked)."""
        async with self.db.engine.connect() as connection:
            found = await connection.scalar(text("SELECT count(*) FROM pgqueuer"))
        return int(found or 0)


# --- the harness ---------------------------------------------------------------------------------


class _Producer:
    """Enqueues on a fixed schedule: at each tick, what ``rate`` owes since the start."""

    def __init__(self, side: _Side, shape: Shape) -> None:
        self.side = side
        self.shape = shape
        self.sent = 0

    async def run(self, started: float) -> None:
        while self.sent < self.shape.runs:
            owed = min(self.shape.runs, int((time.monotonic() - started) * self.shape.rate))
            while self.sent < owed:
                count = min(owed - self.sent, 2_000)
                await self.side.enqueue(count)
                self.sent += count
            await asyncio.sleep(TICK)  # the schedule's pace, not a wait for an event


async def _claim_stats(db: BenchDatabase, like: tuple[str, ...]) -> tuple[int, float, int, int]:
    where = " AND ".join(f"query LIKE :q{i}" for i in range(len(like)))
    async with db.engine.connect() as connection:
        try:
            row = (
                await connection.execute(
                    text(
                        "SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time), 0),"
                        " coalesce(sum(rows), 0),"
                        " coalesce(sum(shared_blks_hit + shared_blks_read), 0)"
                        " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database"
                        f" WHERE datname = current_database()) AND {where}"
                    ),
                    {f"q{i}": pattern for i, pattern in enumerate(like)},
                )
            ).one()
        except Exception:  # noqa: BLE001 - without the extension the claim cost is NaN
            return (0, math.nan, 0, 0)
    return int(row[0]), float(row[1]), int(row[2]), int(row[3])


async def _sample(
    db: BenchDatabase, side: _Side, producer: _Producer, started: float, *, held: bool
) -> Sample:
    claims = await _claim_stats(db, side.claim_like)
    async with db.engine.connect() as connection:
        size = (
            await connection.execute(
                text(
                    "SELECT pg_total_relation_size(c.oid), pg_relation_size(c.oid),"
                    " coalesce(s.n_dead_tup, 0), coalesce(s.autovacuum_count, 0),"
                    " pg_indexes_size(c.oid)"
                    " FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid"
                    " WHERE c.oid = CAST(:t AS regclass)"
                ),
                {"t": side.table},
            )
        ).one()
    return Sample(
        at=time.monotonic() - started,
        offered=producer.sent,
        finished=await side.finished(),
        claims=claims,
        total_bytes=int(size[0]),
        heap_bytes=int(size[1]),
        dead=int(size[2]),
        autovacuums=int(size[3]),
        held=held,
        index_bytes=int(size[4]),
    )


class _Hold:
    """A REPEATABLE READ transaction that has read once: its snapshot holds the cluster's
    horizon until ``release``."""

    def __init__(self, db: BenchDatabase) -> None:
        self.db = db
        self.connection: Any = None

    async def take(self) -> None:
        self.connection = await self.db.raw()
        await self.connection.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await self.connection.fetchval("SELECT count(*) FROM pg_class")

    async def release(self) -> None:
        if self.connection is not None:
            await self.connection.execute("ROLLBACK")
            self.connection = None

    @property
    def held(self) -> bool:
        return self.connection is not None


async def _load(bench: Bench, db: BenchDatabase, side: _Side, shape: Shape) -> Outcome:
    """Offer ``shape.runs``, hold the snapshot, sample; then drain and watch the table."""
    outcome = Outcome(side.library, shape)
    producer, hold = _Producer(side, shape), _Hold(db)
    await side.start()
    started = outcome.started = time.monotonic()
    producing = asyncio.create_task(producer.run(started))
    try:
        next_sample = 0.0
        while not producing.done() or outcome.finished < producer.sent:
            now = time.monotonic() - started
            if not hold.held and shape.hold_from <= now < shape.hold_to:
                outcome.pre_hold = await _sample(db, side, producer, started, held=False)
                outcome.samples.append(outcome.pre_hold)
                bench.log(_describe(outcome, outcome.pre_hold))
                await hold.take()
            elif hold.held and now >= shape.hold_to:
                await hold.release()
                outcome.released_at = now
                outcome.samples.append(await _sample(db, side, producer, started, held=False))
                bench.log(_describe(outcome, outcome.samples[-1]))
            if now >= next_sample:
                sample = await _sample(db, side, producer, started, held=hold.held)
                outcome.samples.append(sample)
                outcome.finished = sample.finished
                bench.log(_describe(outcome, sample))
                next_sample += shape.after_sample if now >= shape.hold_to else shape.sample
            if producing.done() and now > shape.seconds + DRAIN_AFTER:
                break
            await asyncio.sleep(min(1.0, max(0.05, next_sample - now)))
        await producing
        await hold.release()
        await _watch_after(bench, db, side, producer=producer, outcome=outcome, started=started)
    finally:
        producing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await producing
        await hold.release()
        await side.stop()
    outcome.offered = producer.sent
    outcome.finished = await side.finished()
    outcome.remaining = await side.remaining()
    return outcome


async def _watch_after(
    bench: Bench,
    db: BenchDatabase,
    side: _Side,
    *,
    producer: _Producer,
    outcome: Outcome,
    started: float,
) -> None:
    """Sample on until the table is back to its size when the hold began, or three autovacuum
    passes since the release, or ``shape.after`` seconds after the drain."""
    shape = outcome.shape
    until = time.monotonic() + shape.after
    while time.monotonic() < until:
        if _back_after(outcome) is not None or _passes_since_release(outcome) >= 3:
            return
        await asyncio.sleep(min(shape.after_sample, max(0.0, until - time.monotonic())))
        sample = await _sample(db, side, producer, started, held=False)
        outcome.samples.append(sample)
        bench.log(_describe(outcome, sample))


def _passes_since_release(outcome: Outcome) -> int:
    released = [s for s in outcome.samples if s.at >= outcome.released_at]
    if not released:
        return 0
    return released[-1].autovacuums - released[0].autovacuums


def _back_after(outcome: Outcome) -> int | None:
    """Autovacuum passes since the release when the table was first back to its pre-hold
    size (heap + indexes), None if it never was."""
    back = _back_sample(outcome)
    if back is None:
        return None
    released = [s for s in outcome.samples if s.at >= outcome.released_at]
    return back.autovacuums - released[0].autovacuums


NEAR: float = 1.25
"""``table_near_after_cycles``'s slack over the pre-hold size: under a steady load the table
moves by about this much between two autovacuums (7.4-9.3 MiB in a 1,000 runs/s sitting), so
one pre-hold sample is a noisy bar for "back"."""


def _pre_hold_bytes(outcome: Outcome, *, indexes: bool = False) -> float:
    """The table's pre-hold size (heap + indexes; ``indexes``: its indexes alone): the median
    of the samples taken under load before the hold (the one taken just before it included),
    so one sample caught between two vacuums is not the bar ("back" compared with a single
    4.08 MiB sample once read 21 naptimes where the indexes were back within 2)."""
    base = outcome.pre_hold
    if base is None:
        return math.nan
    before = [s for s in outcome.samples if 0 < s.at <= base.at]
    return median([s.index_bytes if indexes else s.total_bytes for s in before])


def _back_sample(outcome: Outcome, slack: float = 1.0) -> Sample | None:
    """The first sample after the release whose table (heap + indexes) is back to its
    pre-hold size (times ``slack``), None if none was."""
    bar = _pre_hold_bytes(outcome) * slack
    return next(
        (s for s in outcome.samples if s.at >= outcome.released_at and s.total_bytes <= bar),
        None,
    )


def _after_release(outcome: Outcome, sample: Sample | None) -> float:
    """Seconds from the release to ``sample`` on the sampler's grid (a sample every
    ``after_sample`` seconds from the release): the few milliseconds a sample starts late are
    the sampler's, not the table's (30.005 s read as "2.0003 naptimes", over a bar of 2)."""
    if sample is None:
        return math.nan
    step = outcome.shape.after_sample
    return round((sample.at - outcome.released_at) / step) * step


def _intervals(outcome: Outcome) -> list[tuple[Sample, float, float, float, float]]:
    """(sample, claim server µs per claimed run, buffers per claimed run, finished / offered,
    offered / the shape's rate) over each interval ending at ``sample``."""
    rows = []
    for before, after in zip(outcome.samples, outcome.samples[1:], strict=False):
        claimed = after.claims[2] - before.claims[2]
        exec_ms = after.claims[1] - before.claims[1]
        buffers = after.claims[3] - before.claims[3]
        seconds = after.at - before.at
        offered = after.offered - before.offered
        drained = (after.finished - before.finished) / offered if offered else math.nan
        us = 1000 * exec_ms / claimed if claimed else math.nan
        per_run = buffers / claimed if claimed else math.nan
        pace = offered / seconds / outcome.shape.rate if seconds > 0 else math.nan
        rows.append((after, us, per_run, drained, pace))
    return rows


def _loaded(outcome: Outcome) -> list[tuple[Sample, float, float, float, float]]:
    """The intervals of :func:`_intervals` of at least 5 s in which the producer offered at
    least half its rate (the steady part: not the tail drain after the load)."""
    samples = outcome.samples
    return [
        row
        for before, row in zip(samples, _intervals(outcome), strict=False)
        if row[4] >= 0.5 and row[0].at - before.at >= 5.0
    ]


def _describe(outcome: Outcome, sample: Sample) -> str:
    rows = _intervals(outcome)
    us, buffers, drain, pace = rows[-1][1:] if rows else (math.nan,) * 4
    before = outcome.samples[-2].claims if len(outcome.samples) > 1 else (0, 0.0, 0, 0)
    calls = sample.claims[0] - before[0]
    per_claim = (sample.claims[2] - before[2]) / calls if calls else math.nan
    return (
        f"{outcome.library:9} t={sample.at:6.0f}s offered {sample.offered:>9,} ({pace:4.2f}x rate)"
        f" finished {sample.finished:>9,} ({drain:5.2f}x offered) claim {us:7.1f} us/run"
        f" {buffers:6.1f} buf/run ({per_claim:5.0f} runs/claim)"
        f" table {sample.total_bytes / 2**20:7.1f} MiB"
        f" (heap {sample.heap_bytes / 2**20:6.1f}, indexes {sample.index_bytes / 2**20:6.1f})"
        f" dead {sample.dead:>9,}"
        f" av {sample.autovacuums}{' HELD' if sample.held else ''}"
    )


@dataclass(frozen=True, slots=True)
class Summary:
    claim_us_pre: float
    claim_ratio_max: float
    buffers_ratio_max: float
    drain_overall: float
    drain_worst: float
    offered_pace: float
    table_pre_mib: float
    table_peak_mib: float
    back_after_passes: float
    back_after_seconds: float
    back_after_cycles: float
    near_after_cycles: float
    indexes_pre_mib: float
    indexes_peak_mib: float
    lost: float
    unfinished: float


def _summarise(outcome: Outcome) -> Summary:
    loaded = _loaded(outcome)
    base = outcome.pre_hold
    hold_from = base.at if base is not None else outcome.shape.hold_from
    pre = [r for r in loaded if r[0].at <= hold_from]
    pre = pre[1:] if len(pre) > 1 else pre  # the first interval warms up
    later = [r for r in loaded if r[0].at > hold_from]
    pre_us, pre_buf = median([r[1] for r in pre]), median([r[2] for r in pre])
    offered = sum(_offered_in(outcome, r[0]) for r in loaded)
    finished = sum(r[3] * _offered_in(outcome, r[0]) for r in loaded)
    back = _back_after(outcome)
    back_s = _after_release(outcome, _back_sample(outcome))
    near_s = _after_release(outcome, _back_sample(outcome, NEAR))
    return Summary(
        claim_us_pre=pre_us,
        claim_ratio_max=max((r[1] / pre_us for r in later), default=math.nan),
        buffers_ratio_max=max((r[2] / pre_buf for r in later), default=math.nan),
        drain_overall=finished / offered if offered else math.nan,
        drain_worst=min((r[3] for r in loaded), default=math.nan),
        offered_pace=median([r[4] for r in loaded]),
        table_pre_mib=_pre_hold_bytes(outcome) / 2**20,
        table_peak_mib=max(s.total_bytes for s in outcome.samples) / 2**20,
        back_after_passes=math.nan if back is None else float(back),
        back_after_seconds=back_s,
        back_after_cycles=back_s / outcome.naptime,
        near_after_cycles=near_s / outcome.naptime,
        indexes_pre_mib=_pre_hold_bytes(outcome, indexes=True) / 2**20,
        indexes_peak_mib=max(s.index_bytes for s in outcome.samples) / 2**20,
        lost=float(outcome.offered - outcome.finished - outcome.remaining),
        unfinished=float(outcome.remaining),
    )


def _offered_in(outcome: Outcome, sample: Sample) -> int:
    index = next(i for i, s in enumerate(outcome.samples) if s is sample)
    return sample.offered - outcome.samples[index - 1].offered


async def _one(bench: Bench, side_type: type[_ShipSide | _PgQueuerSide], shape: Shape) -> Outcome:
    async with bench.database(f"{NAME}_{side_type.library}") as db:
        with contextlib.suppress(Exception):
            await db.maintain("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        side = _ShipSide(db, capped=shape.capped) if side_type is _ShipSide else side_type(db)
        await side.setup()
        with contextlib.suppress(Exception):
            await db.maintain("SELECT pg_stat_statements_reset()")
        with _early_rebuild(on=shape.early):
            outcome = await _load(bench, db, side, shape)
        async with db.engine.connect() as connection:
            outcome.naptime = float(
                await connection.scalar(
                    text("SELECT setting::float FROM pg_settings WHERE name = 'autovacuum_naptime'")
                )
            )
    if isinstance(side, _ShipSide):
        outcome.rebuilds = [(at - outcome.started, line) for at, line in side.early.seen]
        for at, line in outcome.rebuilds:
            bench.log(f"early rebuild at t={at:.0f}s ({at - outcome.released_at:+.0f}s): {line}")
    if outcome.finished < outcome.offered:
        bench.log(f"{side.library}: {outcome.offered - outcome.finished} runs not finished")
    return outcome


@contextlib.contextmanager
def _early_rebuild(*, on: bool) -> Iterator[None]:
    """ship's sampler with its early index rebuild (the default) or without (``early=0``)."""
    if on:
        yield
        return
    names = vars(depth)  # the sampler builds its rule from this module's name
    saved = names["EarlyRebuild"]
    names["EarlyRebuild"] = _NeverEarly
    try:
        yield
    finally:
        names["EarlyRebuild"] = saved


def _figures(ship: Summary, peer: Summary | None, note: str) -> list[Figure]:
    label = "pgqueuer 1.6.0, same harness" if peer is not None else "pgqueuer not installed"
    specs: list[tuple[str, str, str, tuple[Target, ...]]] = [
        ("claim_us_pre_hold", "us/run", "claim_us_pre", ()),
        ("claim_cost_max_ratio", "x pre-hold", "claim_ratio_max", (Target("value", "<=", 1.2),)),
        ("claim_buffers_max_ratio", "x pre-hold", "buffers_ratio_max", ()),
        ("drain_overall", "x offered", "drain_overall", (Target("value", ">=", 0.95),)),
        ("drain_worst_interval", "x offered", "drain_worst", ()),
        ("offered_pace", "x rate", "offered_pace", ()),
        ("table_pre_hold", "MiB", "table_pre_mib", ()),
        ("table_peak", "MiB", "table_peak_mib", ()),
        ("table_back_after", "autovacuums", "back_after_passes", (Target("value", "<=", 2),)),
        ("table_back_after_seconds", "s", "back_after_seconds", ()),
        (
            "table_back_after_cycles",
            "naptimes",
            "back_after_cycles",
            (Target("value", "<=", 2),),
        ),
        ("table_near_after_cycles", "naptimes", "near_after_cycles", ()),
        ("indexes_pre_hold", "MiB", "indexes_pre_mib", ()),
        ("indexes_peak", "MiB", "indexes_peak_mib", ()),
        ("runs_lost", "runs", "lost", (Target("value", "<=", 0),)),
        ("runs_unfinished", "runs", "unfinished", ()),
    ]
    return [
        Figure.from_rounds(
            f"steady.{name}",
            unit,
            [getattr(ship, key)],
            [getattr(peer, key)] if peer is not None else None,
            baseline_label=label,
            targets=targets,
            note=note if name == "claim_cost_max_ratio" else "",
        )
        for name, unit, key, targets in specs
    ]


async def run(bench: Bench) -> list[Figure]:
    shape = _shape(bench)
    bench.log(
        f"{shape.runs:,} runs at {shape.rate:,.0f}/s ({shape.seconds:.0f} s), snapshot held"
        f" {shape.hold_from:.0f}-{shape.hold_to:.0f} s, a sample every {shape.sample:.0f} s"
    )
    outcomes = [await _one(bench, _ShipSide, shape)]
    if shape.peers:
        try:
            import pgqueuer  # noqa: F401, PLC0415 - optional: is it installed?
        except ImportError:
            bench.log("pgqueuer not installed (pip install pgqueuer==1.6.0): ship's side only")
        else:
            outcomes.append(await _one(bench, _PgQueuerSide, shape))
    summaries = [_summarise(outcome) for outcome in outcomes]
    for outcome, summary in zip(outcomes, summaries, strict=True):
        bench.log(f"{outcome.library}: {summary}")
    if any(s.lost > 0 for s in summaries[:1]):
        bench.log("ship lost runs (offered minus finished above)")
    note = (
        f"{shape.runs:,} runs offered at {shape.rate:,.0f}/s, REPEATABLE READ snapshot held"
        f" {shape.hold_from:.0f}-{shape.hold_to:.0f} s; samples every {shape.sample:.0f} s"
    )
    if not outcomes[0].samples:
        raise BenchmarkError("steady: no sample taken")
    return _figures(summaries[0], summaries[1] if len(summaries) > 1 else None, note)
