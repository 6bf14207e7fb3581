"""peers (opt-in): ship_sqla beside two established PostgreSQL job queues for Python.

Needs, beside the project's own dependencies (NOT in pyproject.toml; install them yourself)::

    pip install pgqueuer==1.6.0 procrastinate==3.10.0 "psycopg[binary]>=3.2" "psycopg_pool>=3.2"

(measured with pgqueuer 1.6.0 over asyncpg 0.32.0; procrastinate 3.10.0 over psycopg 3.3.9 and
psycopg_pool 3.3.3). A peer that does not import is skipped with the reason on stderr; with
neither installed the benchmark produces no figures and the run still exits 0.

Every figure is ship_sqla's value beside the peer's (the "baseline" column), measured in the same
run on the same server, alternating which goes first per round; ratio = median of the per-round
ship/peer ratios. Each library gets its own scratch database (its tables made by its own schema
tool: ``metadata.create_all`` of ship's table factories, ``Queries.install()``,
``SchemaManager.apply_schema_async()``), truncated (and VACUUM ANALYZEd) before every round.
No targets: this is a comparison, not a gate.

1. ``peers.<peer>.process``: N noop jobs pre-enqueued (not timed); one worker in this event
   loop through each library's own worker API; time from the worker's start until it stopped
   after the N-th handler (so the last completion write is included). Every job must then be in
   the library's done state (counted in its tables) or the round is invalid.
   ``peers.<peer>.process_defaults``: the same with each library at its defaults (ship: no
   options at all; pgqueuer: ``run()``; procrastinate: ``run_worker_async()``).
2. ``peers.<peer>.enqueue_bulk``: 10,000 jobs in one call of the library's batch API.
3. ``peers.<peer>.enqueue_single``: 1,000 sequential single enqueues, each its own transaction.

4. ``peers.<peer>.trickle.<N>ms.p50`` / ``.p99`` (pgqueuer only), N in 1000, 300, 100, 20, 5
   and 1: pickup latency of a trickle (issue 31). ONE producer process
   (``benchmarks/_producer.py``) enqueues on a FIXED schedule, one single enqueue every N ms,
   each its own autocommitted statement, and reports each commit's ``time.monotonic()``; a
   consumer in this process at its defaults picks them up; latency = commit -> the handler's
   first line. ship: ``backend.enqueue(job, payload)`` outside a unit of work; a worker runtime
   at the defaults (``create_job_backend(database=engine)``: poll 1 s, listening) (the same
   measurement as ``wake.remote.trickle.*``); pgqueuer:
   ``Queries(AsyncpgPoolDriver(pool)).enqueue(entrypoint, payload)``; a ``QueueManager(Queries(
   AsyncpgPoolDriver(pool of PGQ_POOL)))`` with one entrypoint, ``run()`` at its defaults. The
   first 0.25 s of each trickle are not measured (``benchmarks/_trickle.py``).

Run it by name: ``python -m benchmarks peers [--quick]``; it is not part of the default run.
``SHIP_SQLA_BENCH_PEERS=trickle`` (or ``throughput``; default both) runs only that part, e.g.
``SHIP_SQLA_BENCH_PEERS=trickle python -m benchmarks wake peers`` shows pgqueuer's trickle beside
``wake``'s in one run.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import MetaData

from benchmarks._harness import (
    Bench,
    BenchDatabase,
    BenchmarkError,
    Countdown,
    Figure,
    Stopwatch,
    asyncpg_dsn,
    latency_figures,
    measure_pair,
    paired_rounds,
    percentile,
    rate,
)
from benchmarks._trickle import (
    PICKED_UP_WITHIN,
    SPACINGS_MS,
    Producer,
    Starts,
    close_producers,
    describe,
    latencies,
    ship_pickup,
    trickle,
    trickle_count,
    warmup,
)
from benchmarks.process import drain_jobs
from ship_sqla import JobContext, define_job
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla.jobs import EnqueueRequest, JobDefinition

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["NAME", "run"]

NAME = "peers"
JOB_ID = "bench.noop"
PAYLOAD: dict[str, Any] = {"order_id": 12345, "kind": "bench"}
BULK = 10_000
SINGLE = 1_000
ENQUEUE_CHUNK = 10_000
DRAIN_TIMEOUT = 180.0
SHIP_IN_FLIGHT = 1000
"""As ``benchmarks/process.py``: max_in_flight = concurrency.max = 1000, poll_interval 5 s."""
PGQ_BATCH = 500
"""pgqueuer ``QueueManager.run(batch_size=...)``: jobs per dequeue and per status-log flush.
Tried 10 (its default), 100, 500, 1000 on this machine: 100-1000 within noise, 10 half as fast."""
PGQ_POOL = 10
"""The worker's asyncpg pool (``AsyncpgPoolDriver``), as the ship engine's pool of 10: a little
faster than one connection (``AsyncpgDriver``) here, so the peer gets it."""
PROC_CONCURRENCY = 100
PROC_POOL = 10
"""procrastinate's psycopg pool (min = max): the ship engine's pool is 10 (+10 overflow)."""


def _runs(bench: Bench) -> int:
    return 5_000 if bench.quick else 20_000


def _rounds(bench: Bench) -> int:
    return bench.rounds


async def _noop(_ctx: JobContext, _payload: dict[str, Any]) -> None:
    return None


# --- ship_sqla ----------------------------------------------------------------------------------


class _Ship:
    def __init__(self, bench: Bench, db: BenchDatabase) -> None:
        self.bench = bench
        self.db = db
        self.metadata = MetaData()
        self.table = ship_job_runs_table(self.metadata)
        self.state = ship_job_state_table(self.metadata)
        self.job: JobDefinition[dict[str, Any]] = define_job(JOB_ID, _noop, payload=dict)
        self.backend = create_job_backend(
            database=db.engine, table=self.table, state_table=self.state
        )

    async def setup(self) -> None:
        async with self.db.engine.begin() as connection:
            await connection.run_sync(self.metadata.create_all)

    async def _truncate(self) -> None:
        await self.db.maintain(f"TRUNCATE {self.table.name}, {self.state.name} CASCADE")

    async def process(self, runs: int, *, defaults: bool = False) -> float:
        if defaults:
            return await drain_jobs(
                self.bench, self.db, runs, max_in_flight=None, poll_interval=None
            )
        return await drain_jobs(
            self.bench, self.db, runs, max_in_flight=SHIP_IN_FLIGHT, poll_interval=5.0
        )

    async def enqueue_bulk(self, count: int) -> float:
        await self._truncate()
        requests = [EnqueueRequest(payload=PAYLOAD) for _ in range(count)]
        with Stopwatch() as watch:
            await self.backend.enqueue_many(self.job, requests)
        await self._expect_rows(count, "enqueue_bulk")
        per_s = rate(count, watch.seconds)
        self.bench.log(f"ship  bulk    {count} in {watch.seconds:.3f} s = {per_s:,.0f}/s")
        return per_s

    async def enqueue_single(self, count: int) -> float:
        await self._truncate()
        backend, job = self.backend, self.job
        with Stopwatch() as watch:
            for _ in range(count):
                await backend.enqueue(job, PAYLOAD)
        await self._expect_rows(count, "enqueue_single")
        per_s = rate(count, watch.seconds)
        self.bench.log(f"ship  single  {count} in {watch.seconds:.2f} s = {per_s:,.0f}/s")
        return per_s

    async def _expect_rows(self, count: int, what: str) -> None:
        async with self.db.engine.connect() as connection:
            found = await connection.exec_driver_sql(f"SELECT count(*) FROM {self.table.name}")
            rows = found.scalar_one()
        if rows != count:
            raise BenchmarkError(f"peers ship {what}: {rows} rows for {count} enqueues")


# --- peers --------------------------------------------------------------------------------------


class _Peer(Protocol):
    name: str
    settings: str

    async def setup(self) -> None: ...
    async def close(self) -> None: ...
    async def process(self, runs: int, *, defaults: bool = False) -> float: ...
    async def enqueue_bulk(self, count: int) -> float | None: ...
    async def enqueue_single(self, count: int) -> float: ...


class _PgQueuer:
    """pgqueuer over asyncpg: ``Queries.install()``; a worker ``QueueManager(Queries(
    AsyncpgPoolDriver(pool)))`` with one entrypoint, ``run(batch_size=PGQ_BATCH)``; enqueues
    through ``Queries(AsyncpgDriver(connection))`` as its README shows. A job is done when
    ``pgqueuer_log`` has its ``successful`` row (pgqueuer deletes it from the queue table)."""

    name = "pgqueuer"
    settings = (
        f"QueueManager(Queries(AsyncpgPoolDriver(pool of {PGQ_POOL}))).run(batch_size={PGQ_BATCH},"
        " max_concurrent_tasks=None (unlimited), entrypoint concurrency_limit=0)"
    )

    def __init__(self, bench: Bench, db: BenchDatabase) -> None:
        import asyncpg  # noqa: PLC0415 - keep this module importable without the peers
        from pgqueuer.db import AsyncpgDriver, AsyncpgPoolDriver  # noqa: PLC0415 - optional
        from pgqueuer.qm import QueueManager  # noqa: PLC0415 - optional dependency
        from pgqueuer.queries import Queries  # noqa: PLC0415 - optional dependency

        self.bench = bench
        self.db = db
        self._asyncpg = asyncpg
        self._driver = AsyncpgDriver
        self._pool_driver = AsyncpgPoolDriver
        self._queue_manager = QueueManager
        self._queries = Queries
        self.counter = Countdown()
        self._connection: Any = None
        self._pool: Any = None
        self.queries: Any = None

    async def setup(self) -> None:
        self._connection = await self.db.raw()
        self.queries = self._queries(self._driver(self._connection))
        await self.queries.install()
        self._pool = await self._asyncpg.create_pool(
            asyncpg_dsn(self.db.url), min_size=PGQ_POOL, max_size=PGQ_POOL
        )

    async def close(self) -> None:
        await self._pool.close()  # the harness closes the raw connection with the database

    async def _truncate(self) -> None:
        await self.db.maintain("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")

    async def _count(self, sql: str) -> int:
        return int(await self._connection.fetchval(sql))

    async def process(self, runs: int, *, defaults: bool = False) -> float:
        await self._truncate()
        for start in range(0, runs, ENQUEUE_CHUNK):
            size = min(ENQUEUE_CHUNK, runs - start)
            await self.queries.enqueue([JOB_ID] * size, [b"{}"] * size, [0] * size)
        await self.db.maintain("VACUUM (ANALYZE) pgqueuer")
        self.counter.reset(runs)
        manager = self._queue_manager(self._queries(self._pool_driver(self._pool)))
        counter = self.counter

        @manager.entrypoint(JOB_ID)
        async def noop(_job: object) -> None:
            counter.hit()

        with Stopwatch() as watch:
            worker = asyncio.create_task(
                manager.run() if defaults else manager.run(batch_size=PGQ_BATCH)
            )
            try:
                async with asyncio.timeout(DRAIN_TIMEOUT):
                    await asyncio.wait(
                        [worker, asyncio.ensure_future(counter.done.wait())],
                        return_when=asyncio.FIRST_COMPLETED,
                    )
            finally:
                manager.shutdown.set()
                await worker
        done = await self._count("SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")
        left = await self._count("SELECT count(*) FROM pgqueuer")
        if done != runs or left:
            raise BenchmarkError(
                f"peers pgqueuer process: {done} of {runs} jobs logged successful,"
                f" {left} left in the queue"
            )
        jobs_per_s = rate(runs, watch.seconds)
        self.bench.log(f"pgq   {runs} jobs in {watch.seconds:.2f} s = {jobs_per_s:,.0f} jobs/s")
        return jobs_per_s

    async def enqueue_bulk(self, count: int) -> float:
        entrypoints, priorities = [JOB_ID] * count, [0] * count

        async def batch() -> None:  # the JSON encoding of the payloads is timed too
            payloads: list[bytes | None] = [json.dumps(PAYLOAD).encode() for _ in range(count)]
            await self.queries.enqueue(entrypoints, payloads, priorities)

        return await _timed_enqueues(
            self, "pgqueuer", "bulk", count, table="pgqueuer", enqueue=batch
        )

    async def enqueue_single(self, count: int) -> float:
        queries = self.queries

        async def one_by_one() -> None:
            for _ in range(count):
                await queries.enqueue(JOB_ID, json.dumps(PAYLOAD).encode())

        return await _timed_enqueues(
            self, "pgqueuer", "single", count, table="pgqueuer", enqueue=one_by_one
        )


class _Procrastinate:
    """procrastinate over psycopg 3: ``SchemaManager.apply_schema_async()``; one ``App`` with a
    ``PsycopgConnector`` pool, ``run_worker_async(concurrency=PROC_CONCURRENCY)`` stopped by
    cancelling its task (its documented graceful stop); done = ``status = 'succeeded'``."""

    name = "procrastinate"
    settings = (
        f"app.run_worker_async(concurrency={PROC_CONCURRENCY}, listen_notify=True,"
        " fetch_job_polling_interval=5, delete_jobs='never'), PsycopgConnector pool"
        f" min=max={PROC_POOL}"
    )

    def __init__(self, bench: Bench, db: BenchDatabase) -> None:
        import procrastinate  # noqa: PLC0415 - keep this module importable without the peers

        self.bench = bench
        self.db = db
        self.counter = Countdown()
        counter = self.counter
        self.app: Any = procrastinate.App(
            connector=procrastinate.PsycopgConnector(
                conninfo=asyncpg_dsn(db.url), min_size=PROC_POOL, max_size=PROC_POOL
            )
        )

        @self.app.task(name=JOB_ID)
        async def noop(**_kwargs: object) -> None:
            counter.hit()

        self.task: Any = noop

    async def setup(self) -> None:
        await self.app.open_async()
        await self.app.schema_manager.apply_schema_async()

    async def close(self) -> None:
        await self.app.close_async()

    async def _truncate(self) -> None:
        await self.db.maintain(
            "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_periodic_defers,"
            " procrastinate_workers CASCADE"
        )

    async def _count(self, sql: str) -> int:
        connection = await self.db.raw()
        try:
            return int(await connection.fetchval(sql))
        finally:
            await connection.close()

    async def process(self, runs: int, *, defaults: bool = False) -> float:
        await self._truncate()
        for start in range(0, runs, ENQUEUE_CHUNK):
            size = min(ENQUEUE_CHUNK, runs - start)
            await self.task.batch_defer_async(*({} for _ in range(size)))
        await self.db.maintain("VACUUM (ANALYZE) procrastinate_jobs")
        self.counter.reset(runs)
        counter = self.counter
        with Stopwatch() as watch:
            worker = asyncio.create_task(
                self.app.run_worker_async(install_signal_handlers=False)
                if defaults
                else self.app.run_worker_async(
                    concurrency=PROC_CONCURRENCY,
                    fetch_job_polling_interval=5.0,
                    install_signal_handlers=False,
                )
            )
            try:
                async with asyncio.timeout(DRAIN_TIMEOUT):
                    await asyncio.wait(
                        [worker, asyncio.ensure_future(counter.done.wait())],
                        return_when=asyncio.FIRST_COMPLETED,
                    )
            finally:
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker
        done = await self._count(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        )
        if done != runs:
            raise BenchmarkError(f"peers procrastinate process: {done} of {runs} jobs succeeded")
        jobs_per_s = rate(runs, watch.seconds)
        self.bench.log(f"proc  {runs} jobs in {watch.seconds:.2f} s = {jobs_per_s:,.0f} jobs/s")
        return jobs_per_s

    async def enqueue_bulk(self, count: int) -> float:
        kwargs = [dict(PAYLOAD) for _ in range(count)]

        async def batch() -> None:
            await self.task.batch_defer_async(*kwargs)

        return await _timed_enqueues(
            self, "procrastinate", "bulk", count, table="procrastinate_jobs", enqueue=batch
        )

    async def enqueue_single(self, count: int) -> float:
        task = self.task

        async def one_by_one() -> None:
            for _ in range(count):
                await task.defer_async(**PAYLOAD)

        return await _timed_enqueues(
            self, "procrastinate", "single", count, table="procrastinate_jobs", enqueue=one_by_one
        )


class _Enqueuer(Protocol):
    bench: Bench

    async def _truncate(self) -> None: ...
    async def _count(self, sql: str) -> int: ...


async def _timed_enqueues(
    peer: _Enqueuer,
    name: str,
    kind: str,
    count: int,
    *,
    table: str,
    enqueue: Callable[[], Awaitable[None]],
) -> float:
    """Empty the peer's tables, time ``enqueue()``, check that ``count`` rows landed in
    ``table``; jobs per second."""
    await peer._truncate()  # noqa: SLF001 - the peers' own helpers
    with Stopwatch() as watch:
        await enqueue()
    rows = await peer._count(f"SELECT count(*) FROM {table}")  # noqa: SLF001 - our table
    if rows != count:
        raise BenchmarkError(f"peers {name} enqueue_{kind}: {rows} rows for {count}")
    per_s = rate(count, watch.seconds)
    peer.bench.log(f"{name[:4]:5} {kind:7} {count} in {watch.seconds:.3f} s = {per_s:,.0f}/s")
    return per_s


@dataclass(frozen=True, slots=True)
class _PeerSpec:
    name: str
    modules: tuple[str, ...]
    install: str
    make: Callable[[Bench, BenchDatabase], _Peer]


PEERS = (
    _PeerSpec("pgqueuer", ("pgqueuer",), "pip install pgqueuer==1.6.0", _PgQueuer),
    _PeerSpec(
        "procrastinate",
        ("procrastinate", "psycopg", "psycopg_pool"),
        "pip install procrastinate==3.10.0 'psycopg[binary]' psycopg_pool",
        _Procrastinate,
    ),
)


def _missing(spec: _PeerSpec) -> str | None:
    """Why ``spec``'s peer cannot run here, or None when it imports."""
    for module in spec.modules:
        try:
            importlib.import_module(module)
        except ImportError as error:
            return f"cannot import {module!r} ({error})"
    return None


def _version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 - rarely used

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "?"


async def _pairs(
    bench: Bench, ours: Callable[[], Awaitable[float]], theirs: Callable[[], Awaitable[float]]
) -> tuple[list[float], list[float]]:
    return await paired_rounds(_rounds(bench), ours, theirs)


async def _compare(bench: Bench, ship: _Ship, peer: _Peer) -> list[Figure]:
    runs = _runs(bench)
    label = f"{peer.name} {_version(peer.name)}"
    # Warm-up (not measured): pools, prepared statements, each library's code paths.
    await ship.process(1_000)
    await peer.process(1_000)
    await ship.enqueue_single(50)
    await peer.enqueue_single(50)
    figures = []
    ours, theirs = await _pairs(bench, lambda: ship.process(runs), lambda: peer.process(runs))
    figures.append(
        Figure.from_rounds(
            f"peers.{peer.name}.process",
            "jobs/s",
            ours,
            theirs,
            baseline_label=label,
            note=f"N={runs:,} noop jobs pre-enqueued (not timed), one in-process worker, start"
            f" until stopped after the N-th; ship: start_job_runtime, max_in_flight ="
            f" concurrency.max = {SHIP_IN_FLIGHT}, poll_interval 5 s; {peer.name}:"
            f" {peer.settings}",
        )
    )
    ours, theirs = await _pairs(
        bench,
        lambda: ship.process(runs, defaults=True),
        lambda: peer.process(runs, defaults=True),
    )
    figures.append(
        Figure.from_rounds(
            f"peers.{peer.name}.process_defaults",
            "jobs/s",
            ours,
            theirs,
            baseline_label=label,
            note=f"as .process, each library at its defaults: ship: define_job(id, handler,"
            f" payload=dict) and create_job_backend(database=engine, tables), nothing else;"
            f" {peer.name}: {_DEFAULTS[peer.name]}",
        )
    )
    bulk_probe = await peer.enqueue_bulk(BULK)
    if bulk_probe is None:
        print(
            f"  peers: {peer.name} has no batch enqueue API: no enqueue_bulk figure",
            file=sys.stderr,
        )
    else:
        await ship.enqueue_bulk(BULK)

        async def peer_bulk() -> float:
            value = await peer.enqueue_bulk(BULK)
            assert value is not None  # noqa: S101 - probed above
            return value

        ours, theirs = await _pairs(bench, lambda: ship.enqueue_bulk(BULK), peer_bulk)
        figures.append(
            Figure.from_rounds(
                f"peers.{peer.name}.enqueue_bulk",
                "jobs/s",
                ours,
                theirs,
                baseline_label=label,
                note=f"{BULK:,} jobs in one batch call, payload {PAYLOAD}; ship:"
                f" backend.enqueue_many; {peer.name}: {_BULK_API[peer.name]}",
            )
        )
    ours, theirs = await _pairs(
        bench, lambda: ship.enqueue_single(SINGLE), lambda: peer.enqueue_single(SINGLE)
    )
    figures.append(
        Figure.from_rounds(
            f"peers.{peer.name}.enqueue_single",
            "jobs/s",
            ours,
            theirs,
            baseline_label=label,
            note=f"{SINGLE:,} sequential single enqueues, each its own transaction; ship:"
            f" backend.enqueue outside a unit of work; {peer.name}: {_SINGLE_API[peer.name]}",
        )
    )
    return figures


_DEFAULTS = {
    "pgqueuer": "QueueManager.run() (batch_size 10), the same pool",
    "procrastinate": "app.run_worker_async() (concurrency 1), the same pool",
}
_BULK_API = {
    "pgqueuer": "Queries.enqueue(list of entrypoints, payloads (json bytes), priorities)",
    "procrastinate": "task.batch_defer_async(*kwargs)",
}
_SINGLE_API = {
    "pgqueuer": "Queries.enqueue(entrypoint, json bytes) on one asyncpg connection",
    "procrastinate": "task.defer_async(**kwargs) through the connector's pool",
}


# --- trickle (issue 31): pickup latency at a fixed enqueue rate ----------------------------------

TRICKLE_JOB = "bench.trickle"
PARTS_VARIABLE = "SHIP_SQLA_BENCH_PEERS"
PARTS = ("throughput", "trickle")
_TRICKLED = frozenset({"pgqueuer"})
"""The peers with a trickle figure (a producer mode in ``benchmarks/_producer.py``)."""
_TRICKLE_SETTINGS = (
    "Queries(AsyncpgPoolDriver(pool)).enqueue(entrypoint, json bytes);"
    f" QueueManager(Queries(AsyncpgPoolDriver(pool of {PGQ_POOL}))).run() at its defaults"
)
LIVE_WITHIN = 30.0


def _parts() -> set[str]:
    """The parts of this benchmark to run (``SHIP_SQLA_BENCH_PEERS``, default all)."""
    chosen = os.environ.get(PARTS_VARIABLE, "")
    parts = {part.strip() for part in chosen.split(",") if part.strip()} or set(PARTS)
    unknown = parts - set(PARTS)
    if unknown:
        raise BenchmarkError(f"{PARTS_VARIABLE}: unknown part(s) {sorted(unknown)}; use {PARTS}")
    return parts


async def _pgq_pickup(
    bench: Bench, db: BenchDatabase, producer: Producer, spacing: float, count: int
) -> list[float]:
    """pgqueuer at its defaults picks up a ``pgq`` trickle: commit -> the entrypoint's first
    line."""
    import asyncpg  # noqa: PLC0415 - keep this module importable without the peers
    from pgqueuer.db import AsyncpgPoolDriver  # noqa: PLC0415 - optional dependency
    from pgqueuer.qm import QueueManager  # noqa: PLC0415 - optional dependency
    from pgqueuer.queries import Queries  # noqa: PLC0415 - optional dependency

    starts = Starts()
    pool = await asyncpg.create_pool(asyncpg_dsn(db.url), min_size=PGQ_POOL, max_size=PGQ_POOL)
    manager = QueueManager(Queries(AsyncpgPoolDriver(pool)))

    @manager.entrypoint(TRICKLE_JOB)
    async def picked(job: Any) -> None:  # noqa: ANN401 - pgqueuer's Job
        starts.mark(json.loads(job.payload)["n"])

    worker = asyncio.create_task(manager.run())
    try:
        await _pgq_live(manager, worker)
        done = await trickle([producer], "pgq", spacing, count, job_id=TRICKLE_JOB)
        await starts.wait_for(done.commits, PICKED_UP_WITHIN)
    finally:
        manager.shutdown.set()
        await worker
        await pool.close()
    values = latencies(done, starts)
    bench.log(describe(f"pgq    {spacing * 1000:>5g} ms x1", done, values))
    return values


async def _pgq_live(manager: Any, worker: asyncio.Task[None]) -> None:  # noqa: ANN401 - a QueueManager
    """Until the worker's listener answers its own health probe (it is listening)."""
    deadline = time.monotonic() + LIVE_WITHIN
    while time.monotonic() < deadline:
        if worker.done():
            await worker  # raises what stopped it
            raise BenchmarkError("peers pgqueuer: the worker stopped before it listened")
        try:
            await manager.listener_healthy(timeout=timedelta(seconds=1))
        except Exception:  # noqa: BLE001 - not listening yet (or the probe was early): again
            await asyncio.sleep(0.05)
        else:
            return
    raise BenchmarkError(f"peers pgqueuer: the worker did not listen within {LIVE_WITHIN} s")


async def _trickle(bench: Bench, ship_db: BenchDatabase, peer_db: BenchDatabase) -> list[Figure]:
    """``peers.pgqueuer.trickle.<N>ms.*``: ship_sqla's pickup latency beside pgqueuer's."""
    label = f"pgqueuer {_version('pgqueuer')} at its defaults"
    await ship_db.create_job_tables()  # the registry, steps and events too: the defaults' tables
    producers: list[Producer] = []
    try:
        producers.append(await Producer.start(ship_db, 0))
        producers.append(await Producer.start(peer_db, 0))
        ship_producer, pgq_producer = producers

        async def ship(spacing: float, count: int) -> list[float]:
            return await ship_pickup(
                ship_db.engine, [ship_producer], spacing, count, job_id=TRICKLE_JOB, log=bench.log
            )

        async def pgq(spacing: float, count: int) -> list[float]:
            return await _pgq_pickup(bench, peer_db, pgq_producer, spacing, count)

        await ship(0.005, 40)  # warm-up, not measured
        await pgq(0.005, 40)
        ours: dict[int, list[tuple[float, float]]] = {ms: [] for ms in SPACINGS_MS}
        theirs: dict[int, list[tuple[float, float]]] = {ms: [] for ms in SPACINGS_MS}
        for index in range(_rounds(bench)):
            for ms in SPACINGS_MS:
                spacing, count = ms / 1000.0, trickle_count(ms, quick=bench.quick)

                async def ship_round(spacing: float = spacing, count: int = count) -> list[float]:
                    return await ship(spacing, count)

                async def pgq_round(spacing: float = spacing, count: int = count) -> list[float]:
                    return await pgq(spacing, count)

                mine, peer = await measure_pair(index, ship_round, pgq_round)
                ours[ms].append((percentile(mine, 0.5), percentile(mine, 0.99)))
                theirs[ms].append((percentile(peer, 0.5), percentile(peer, 0.99)))
    finally:
        await close_producers(producers)
    figures: list[Figure] = []
    for ms in SPACINGS_MS:
        count = trickle_count(ms, quick=bench.quick)
        figures += latency_figures(
            f"peers.pgqueuer.trickle.{ms}ms",
            ours[ms],
            theirs[ms],
            baseline_label=label,
            note=f"one producer process, one single enqueue every {ms} ms (fixed schedule),"
            f" {count} per round, the first {warmup(ms / 1000, count)} not measured; commit ->"
            f" handler start. ship: backend.enqueue outside a unit of work, a runtime at the"
            f" defaults (poll 1 s, listening); pgqueuer: {_TRICKLE_SETTINGS}",
        )
    return figures


async def run(bench: Bench) -> list[Figure]:
    available: list[_PeerSpec] = []
    for spec in PEERS:
        reason = _missing(spec)
        if reason is None:
            available.append(spec)
        else:
            print(
                f"  peers: skipping {spec.name}: {reason}; to include it: `{spec.install}`",
                file=sys.stderr,
                flush=True,
            )
    if not available:
        print("  peers: no peer library is importable: no figures", file=sys.stderr, flush=True)
        return []
    parts = _parts()
    figures: list[Figure] = []
    async with bench.database(f"{NAME}_ship") as ship_db:
        ship = _Ship(bench, ship_db)
        await ship.setup()
        for spec in available:
            if "throughput" not in parts and spec.name not in _TRICKLED:
                continue
            bench.log(f"-- {spec.name} {_version(spec.name)}")
            async with bench.database(f"{NAME}_{spec.name}") as peer_db:
                peer = spec.make(bench, peer_db)
                await peer.setup()
                try:
                    if "throughput" in parts:
                        figures.extend(await _compare(bench, ship, peer))
                    if "trickle" in parts and spec.name in _TRICKLED:
                        figures.extend(await _trickle(bench, ship_db, peer_db))
                finally:
                    await peer.close()
    return figures
