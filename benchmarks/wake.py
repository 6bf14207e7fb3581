"""wake: from an enqueue's commit to its handler starting, in this process and across processes.

local (``wake.p50``, ``wake.p99``): a runtime with ``poll_interval`` = 60 s waits idle; ``uow.run``
        in this process enqueues one run. The clock starts in an ``after_commit`` callback
        registered before the enqueue (callbacks run in order, after the commit, so it runs
        before the backend's wake) and stops when the handler starts. One run at a time.
        Baseline: a raw INSERT commits, an in-process event wakes a waiting task, which claims
        the row on its own connection (one autocommitted SKIP LOCKED statement).

remote (``wake.remote.*``, K1): the enqueuer is ANOTHER PROCESS (a subprocess with its own
        engine and backend, ``listen=False``), the runtime here has ``poll_interval`` = 5 s and
        its listener (``listen=True``). Times are ``time.monotonic()`` in both processes (Linux's
        CLOCK_MONOTONIC is one clock per machine): from the subprocess's commit (an
        ``after_commit`` callback of its ``uow.run``) to the handler's start here.
        - ``wake.remote.p50`` / ``.p99``: isolated enqueues, one at a time, each at least the
          announce window (250 ms) after the previous one, so each is announced. Baseline: the
          floor of LISTEN/NOTIFY on this server: the subprocess commits a raw INSERT and
          ``pg_notify`` in one transaction; a raw asyncpg listener here gets it and claims the
          row with one SKIP LOCKED statement.
        - ``wake.remote.burst.p99``: bursts of BURST enqueues back to back (each its own
          ``uow.run``): the sender's throttle announces the first only; the rest start at the
          listener's rechecks (50 ms, 250 ms after the announcement), never at the poll.
        - ``wake.killed.p99``: before each enqueue the listener's connection is killed
          (``pg_terminate_backend``); it reconnects with the one backoff and looks at once, so a
          run committed in the gap starts then. Target: the poll interval + 1 s (K1's bound).
        - ``wake.down.p99``: a listener that can never connect (its URL refuses): only the poll
          starts runs, uniformly within the poll interval. Target: the poll interval + 1 s.

trickle (issue 31: pickup latency at every enqueue rate). Producer processes
        (``benchmarks/_producer.py``, driven by ``benchmarks/_trickle.py``) enqueue on a FIXED
        schedule, one every N ms by absolute deadlines (each enqueue a task of its own, so a slow
        one does not delay the next), each reporting the ``time.monotonic()`` read right after
        its awaited enqueue returned (its commit). Whoever picks them up here is at the
        library's defaults: ``create_job_backend(database=engine)`` (poll interval 1 s,
        ``listen=True``) and ``start_job_runtime``; ``create_outbox(database=engine)`` and
        ``start_outbox_relay``. The first WARMUP_SECONDS (0.25 s) of each producer's schedule
        (at least one item, at most a quarter) are not measured. Each round measures every
        figure once; the figure is the median of the rounds' percentiles.
        - ``wake.remote.trickle.<N>ms.p50`` / ``.p99``, N in 1000, 300, 100, 20, 5, 1: ONE
          producer enqueues single runs with ``await backend.enqueue(job, payload)`` outside any
          unit of work (one autocommitted statement each); commit -> the handler's first line.
          Targets p50 <= 3 ms, p99 <= 15 ms. Baseline: the raw floor at the same N: the
          producer INSERTs the row and ``pg_notify`` in one autocommitted statement, a raw
          asyncpg LISTEN here wakes a loop that claims with one SKIP LOCKED statement.
        - ``wake.remote.trickle4.<N>ms.*``, N in 4, 1: FOUR producers, each N ms apart, their
          schedules staggered by a quarter of N. Target p99 <= 25 ms. Baseline: four raw
          producers the same way. At 4 ms the four send 1,000 enqueues a second in all (the
          single 1 ms trickle's rate); at 1 ms 4,000, more than two cores hold beside a worker
          and the server (each progress line says how many commits a second were kept).
        - ``wake.relay.trickle.<N>ms.*``, N in 100, 20, 1: one producer enqueues outbox messages
          (``await outbox.enqueue(...)`` outside any unit of work); commit -> the relay's sink
          called with it. Targets as the runs'. Baseline: the raw floor of the same round at N.
        - ``wake.workflow.event.*``: workflow runs here suspended on ``ctx.wait_for_event`` (one
          key each); one producer publishes their events (``backend.publish_event`` outside a
          unit of work) WORKFLOW_SPACING_MS apart; the event's commit -> the run's replay
          starting (its handler's first line, the second time). Target p50 <= 10 ms.
        - ``wake.workflow.child.*``: workflow runs here that each spawned one child and suspended
          on ``ctx.wait_for_children``; the children run in the producer process (a runtime at
          the defaults there) and finish on the same fixed schedule; the child's completion
          commit (read in the producer right after its settle statement returned) -> the
          parent's replay starting here. Target p50 <= 10 ms. Baseline of both: the raw floor of
          the same round at WORKFLOW_SPACING_MS.

notify16 (issue 31, item 2): SIXTEEN producer processes, each FLOOD_TASKS concurrent loops of
        ``await backend.enqueue(job, {})`` outside any unit of work, as fast as they can for
        FLOOD_SECONDS (one window, on the one monotonic clock); one idle worker runtime here at
        its defaults (another job id) listens on the runs table's wake channel. Announcements ON
        (the default backend) and OFF (``create_job_backend(..., announce=False)``, or before
        that keyword existed the backend's throttle removed) alternate per round.
        - ``wake.notify16.throughput``: total enqueues/s ON; baseline: OFF; target ratio >= 0.95.
        - ``wake.notify16.notifying_commits_per_s``: the producers' notifying commits (folds:
          an enqueue that notified in its own transaction; sends: one notify-only transaction
          for any number of jobs) in the window, counted by each producer's announce rule,
          per second, ON. Target: ``NOTIFY_BUDGET`` of ``ship_sqla.kernel._plans.announce``.
          The runtime's listener is the only one on the channel (PostgreSQL's cost of a
          notification grows with its listeners).
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import MetaData, text

from benchmarks._harness import (
    Bench,
    BenchDatabase,
    BenchmarkError,
    Figure,
    Target,
    asyncpg_dsn,
    latency_figures,
    latency_percentiles,
    measure_pair,
    ordered_ids,
    paired_rounds,
    percentile,
    rate,
)
from benchmarks._raw_sql import job_sql
from benchmarks._trickle import (
    LEAD,
    PICKED_UP_WITHIN,
    SPACINGS_MS,
    Producer,
    Starts,
    Trickle,
    close_producers,
    describe,
    latencies,
    raw_pickup,
    relay_pickup,
    ship_pickup,
    start_producers,
    trickle,
    trickle_count,
    wait_live,
    warmup,
)
from ship_sqla import (
    JobContext,
    TransactionScope,
    create_unit_of_work,
    define_job,
    ship_outbox_table,
    start_job_runtime,
)
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla.jobs import EnqueueRequest, JobDefinition
from ship_sqla.kernel._plans import announce as announce_rule
from ship_sqla.kernel._plans.announce import ANNOUNCE_WINDOW

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from ship_sqla._jobs._backend import PostgresJobBackend

__all__ = ["NAME", "run"]

NAME = "wake"
JOB_ID = "bench.wake"
REMOTE_JOB_ID = "bench.wake.remote"
RAW_TABLE = "raw_job_runs"
RAW_CHANNEL = "bench_raw_wake"
POLL_INTERVAL = 60.0
REMOTE_POLL_INTERVAL = 5.0
MISS_AFTER = 5.0
"""Seconds: a start later than this is a missed wake (the poll is 60 s away), an invalid round."""
SPACING = ANNOUNCE_WINDOW + 0.03
"""Seconds between isolated remote enqueues: past the sender's announce window."""
BURST = 5
REFUSED_URL = "postgresql://postgres@127.0.0.1:1/nothing"
"""A listener URL nothing answers on (the 'down' figure)."""


class _Samples:
    """Pairs each commit time with the next handler start."""

    def __init__(self) -> None:
        self.committed = 0.0
        self.started = asyncio.Event()
        self.latencies: list[float] = []

    def mark_commit(self) -> None:
        self.committed = time.perf_counter()

    def mark_start(self) -> None:
        self.latencies.append((time.perf_counter() - self.committed) * 1000.0)
        self.started.set()

    async def next_start(self, what: str) -> None:
        try:
            async with asyncio.timeout(MISS_AFTER):
                await self.started.wait()
        except TimeoutError as exc:
            raise BenchmarkError(f"wake: {what} did not start within {MISS_AFTER} s") from exc
        self.started.clear()


def _scope_itself(scope: TransactionScope) -> TransactionScope:
    return scope


async def _ship_round(bench: Bench, db: BenchDatabase, count: int) -> tuple[float, float]:
    samples = _Samples()

    async def handler(_ctx: JobContext, _payload: dict[str, Any]) -> None:
        samples.mark_start()

    metadata = MetaData()
    job: JobDefinition[dict[str, Any]] = define_job(JOB_ID, handler, payload=dict)
    backend = create_job_backend(
        database=db.engine,
        table=ship_job_runs_table(metadata),
        state_table=ship_job_state_table(metadata),
    )
    uow = create_unit_of_work(db.engine, repositories=_scope_itself)

    async def enqueue(scope: TransactionScope) -> None:
        scope.after_commit(samples.mark_commit)
        await backend.enqueue(job, {})

    runtime = await start_job_runtime(job, backend=backend, poll_interval=POLL_INTERVAL)
    try:
        for _ in range(count):
            await uow.run(enqueue)
            await samples.next_start("a woken run")
    finally:
        await runtime.stop()
    return latency_percentiles(bench, "ship commit -> start", samples.latencies)


async def _raw_round(bench: Bench, db: BenchDatabase, count: int) -> tuple[float, float]:
    sql = job_sql(RAW_TABLE)
    producer = await db.raw()
    consumer = await db.raw()
    samples = _Samples()
    wake = asyncio.Event()
    ids = ordered_ids()

    async def worker() -> None:
        while True:
            await wake.wait()
            wake.clear()
            if await consumer.fetch(sql.claim, JOB_ID, "raw", 10):
                samples.mark_start()

    task = asyncio.get_running_loop().create_task(worker())
    try:
        for _ in range(count):
            async with producer.transaction():
                await producer.execute(sql.insert_one, next(ids), JOB_ID, "{}")
            samples.mark_commit()
            wake.set()
            await samples.next_start("a raw claim")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return latency_percentiles(bench, "raw  commit -> start", samples.latencies)


# --- across processes (K1) ---------------------------------------------------------------------

ENQUEUER = textwrap.dedent(
    """
    import asyncio, json, sys, time
    import asyncpg
    from sqlalchemy import MetaData
    from sqlalchemy.ext.asyncio import create_async_engine
    from ship_sqla import create_unit_of_work
    from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
    from ship_sqla import define_job

    async def nothing(ctx, payload):
        return None

    async def main(url, dsn, job_id, raw_insert, raw_channel):
        engine = create_async_engine(url)
        md = MetaData()
        backend = create_job_backend(
            database=engine,
            table=ship_job_runs_table(md),
            state_table=ship_job_state_table(md),
            listen=False,
        )
        job = define_job(job_id, nothing, payload=dict)
        uow = create_unit_of_work(engine, repositories=lambda scope: scope)
        raw = await asyncpg.connect(dsn)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        print("ready", flush=True)
        while line := (await reader.readline()).decode().split():
            mode, first, count = line[0], int(line[1]), int(line[2])
            for n in range(first, first + count):
                committed = []
                if mode == "ship":
                    async def enqueue(scope, n=n):
                        scope.after_commit(lambda: committed.append(time.monotonic()))
                        await backend.enqueue(job, {"n": n})
                    await uow.run(enqueue)
                else:
                    async with raw.transaction():
                        await raw.execute(raw_insert, f"raw-{n:012d}", job_id, json.dumps({"n": n}))
                        await raw.execute("SELECT pg_notify($1, $2)", raw_channel, str(n))
                    committed.append(time.monotonic())
                print(n, repr(committed[0]), flush=True)
        await raw.close()
        await engine.dispose()

    asyncio.run(main(*sys.argv[1:]))
    """
)


class _Enqueuer:
    """The other process: enqueues on command and reports each commit's monotonic time."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self._next = 0

    @classmethod
    async def start(cls, db: BenchDatabase) -> _Enqueuer:
        url = db.url.render_as_string(hide_password=False)
        insert = job_sql(RAW_TABLE).insert_one
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            ENQUEUER,
            url,
            asyncpg_dsn(db.url),
            REMOTE_JOB_ID,
            insert,
            RAW_CHANNEL,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        enqueuer = cls(process)
        if await enqueuer._line() != "ready":
            raise BenchmarkError("wake: the enqueuer process did not start")
        return enqueuer

    def _pipes(self) -> tuple[asyncio.StreamWriter, asyncio.StreamReader]:
        stdin, stdout = self._process.stdin, self._process.stdout
        if stdin is None or stdout is None:  # pragma: no cover - created with both pipes
            raise BenchmarkError("wake: the enqueuer process has no pipes")
        return stdin, stdout

    async def _line(self) -> str:
        _, stdout = self._pipes()
        try:
            async with asyncio.timeout(30):
                line = await stdout.readline()
        except TimeoutError as exc:
            raise BenchmarkError("wake: the enqueuer process stopped answering") from exc
        if not line:
            raise BenchmarkError(f"wake: the enqueuer process exited ({self._process.returncode})")
        return line.decode().strip()

    async def enqueue(self, mode: str, count: int = 1) -> dict[int, float]:
        """``count`` enqueues (``ship`` or ``raw``), each its own transaction: n -> commit time."""
        stdin, _ = self._pipes()
        first, self._next = self._next, self._next + count
        stdin.write(f"{mode} {first} {count}\n".encode())
        await stdin.drain()
        commits: dict[int, float] = {}
        for _ in range(count):
            n, at = (await self._line()).split()
            commits[int(n)] = float(at)
        return commits

    async def close(self) -> None:
        stdin, _ = self._pipes()
        stdin.close()
        try:
            async with asyncio.timeout(30):
                await self._process.wait()
        except TimeoutError:
            self._process.kill()
            await self._process.wait()


class _Starts:
    """n -> the monotonic time its handler (or raw claim) started, with a wait per n."""

    def __init__(self) -> None:
        self.at: dict[int, float] = {}
        self._changed = asyncio.Event()

    def mark(self, n: int) -> None:
        self.at[n] = time.monotonic()
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_for(self, ns: list[int], within: float) -> None:
        try:
            async with asyncio.timeout(within):
                while not all(n in self.at for n in ns):
                    await self._changed.wait()
        except TimeoutError as exc:
            raise BenchmarkError(f"wake: runs {ns} did not start within {within} s") from exc


def _latencies(commits: dict[int, float], starts: _Starts) -> list[float]:
    return [(starts.at[n] - at) * 1000.0 for n, at in commits.items()]


class _Remote:
    """A runtime in this process (``poll_interval`` 5 s) and the enqueuer process."""

    def __init__(self, bench: Bench, db: BenchDatabase, enqueuer: _Enqueuer) -> None:
        self.bench = bench
        self.db = db
        self.enqueuer = enqueuer
        metadata = MetaData()
        self.runs = ship_job_runs_table(metadata)
        self.state = ship_job_state_table(metadata)

    async def _runtime_round(
        self, label: str, samples: int, *, listen: bool | str = True, kill: bool = False
    ) -> list[float]:
        starts = _Starts()

        async def handler(_ctx: JobContext, payload: dict[str, Any]) -> None:
            starts.mark(payload["n"])

        job: JobDefinition[dict[str, Any]] = define_job(REMOTE_JOB_ID, handler, payload=dict)
        errors: list[BaseException] = []
        backend = create_job_backend(
            database=self.db.engine,
            table=self.runs,
            state_table=self.state,
            listen=listen,
            on_error=errors.append,
        )
        admin = await self.db.raw()
        latencies: list[float] = []
        runtime = await start_job_runtime(job, backend=backend, poll_interval=REMOTE_POLL_INTERVAL)
        try:
            listener = backend.listener
            for _ in range(samples):
                if listen is True and listener is not None:
                    async with asyncio.timeout(30):
                        await listener.wait_live()
                    if kill:
                        await admin.execute("SELECT pg_terminate_backend($1)", listener.backend_pid)
                commits = await self.enqueuer.enqueue("ship", 1 if label != "burst" else BURST)
                await starts.wait_for(list(commits), REMOTE_POLL_INTERVAL + 5)
                latencies += _latencies(commits, starts)
                await asyncio.sleep(SPACING)  # the next enqueue is announced again
        finally:
            await runtime.stop()
        p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
        self.bench.log(
            f"remote {label:<6} commit -> start: p50 {p50:.2f} ms, p99 {p99:.2f} ms"
            f" ({len(latencies)} runs, {len(errors)} listener errors reported)"
        )
        return latencies

    async def ship(self, samples: int) -> tuple[float, float]:
        latencies = await self._runtime_round("ship", samples)
        return percentile(latencies, 0.5), percentile(latencies, 0.99)

    async def raw(self, samples: int) -> tuple[float, float]:
        sql = job_sql(RAW_TABLE)
        listener = await self.db.raw()
        consumer = await self.db.raw()
        starts = _Starts()
        claims: asyncio.Queue[None] = asyncio.Queue()

        def notified(*_args: object) -> None:
            claims.put_nowait(None)

        async def worker() -> None:
            while True:
                await claims.get()
                for row in await consumer.fetch(sql.claim, REMOTE_JOB_ID, "raw", 10):
                    starts.mark(int(row["id"].removeprefix("raw-")))

        await listener.add_listener(RAW_CHANNEL, notified)
        task = asyncio.get_running_loop().create_task(worker())
        latencies: list[float] = []
        try:
            for _ in range(samples):
                commits = await self.enqueuer.enqueue("raw")
                await starts.wait_for(list(commits), MISS_AFTER)
                latencies += _latencies(commits, starts)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await listener.remove_listener(RAW_CHANNEL, notified)
        p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
        self.bench.log(f"remote raw    commit -> start: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
        return p50, p99

    async def burst(self, bursts: int) -> float:
        return percentile(await self._runtime_round("burst", bursts), 0.99)

    async def killed(self, samples: int) -> float:
        return percentile(await self._runtime_round("killed", samples, kill=True), 0.99)

    async def down(self, samples: int) -> float:
        return percentile(await self._runtime_round("down", samples, listen=REFUSED_URL), 0.99)


async def _remote_figures(bench: Bench, db: BenchDatabase) -> list[Figure]:
    isolated, bursts, killed, down = (25, 6, 8, 2) if bench.quick else (100, 20, 20, 4)
    enqueuer = await _Enqueuer.start(db)
    try:
        remote = _Remote(bench, db, enqueuer)
        await remote.ship(5)  # warm-up, not measured
        await remote.raw(5)
        ours, theirs = await paired_rounds(
            bench.rounds, lambda: remote.ship(isolated), lambda: remote.raw(isolated)
        )
        burst = [await remote.burst(bursts) for _ in range(bench.rounds)]
        lost = [await remote.killed(killed) for _ in range(bench.rounds)]
        refused = [await remote.down(down) for _ in range(min(bench.rounds, 3))]
    finally:
        await enqueuer.close()
    bound = (REMOTE_POLL_INTERVAL + 1.0) * 1000.0
    note = (
        f"{isolated} isolated enqueues per round from another process, {SPACING * 1000:.0f} ms"
        f" apart; poll_interval={REMOTE_POLL_INTERVAL:g} s"
    )
    baseline = "raw INSERT + pg_notify in another process -> raw LISTEN -> SKIP LOCKED claim"
    return [
        *latency_figures(
            "wake.remote",
            ours,
            theirs,
            baseline_label=baseline,
            p50_targets=(Target("value", "<=", 10.0),),
            p99_targets=(Target("value", "<=", 50.0),),
            note=note,
        ),
        Figure.from_rounds(
            "wake.remote.burst.p99",
            "ms",
            burst,
            None,
            baseline_label="",
            note=f"{bursts} bursts of {BURST} back-to-back enqueues per round: the first is"
            " announced, the rest wait for the listener's rechecks (50 ms, 250 ms)",
        ),
        Figure.from_rounds(
            "wake.killed.p99",
            "ms",
            lost,
            None,
            baseline_label="",
            targets=(Target("value", "<=", bound),),
            note=f"{killed} enqueues per round, each right after pg_terminate_backend on the"
            " listener: it reconnects (0.1 s doubling to 1 s) and looks at once",
        ),
        Figure.from_rounds(
            "wake.down.p99",
            "ms",
            refused,
            None,
            baseline_label="",
            targets=(Target("value", "<=", bound),),
            note=f"{down} enqueues per round with a listener that cannot connect: the poll"
            f" ({REMOTE_POLL_INTERVAL:g} s) starts them",
        ),
    ]


# --- trickles (issue 31) ------------------------------------------------------------------------

TRICKLE_JOB = "bench.wake.trickle"
TRICKLE_CHANNEL = "bench_raw_trickle"
TRICKLE_OUTBOX = "bench.wake.trickle"
FOUR = 4
FOUR_SPACINGS_MS = (4, 1)
"""Four producers each this far apart: 4 ms (1,000 enqueues a second in all, the single 1 ms
trickle's rate, which a 2-core machine holds) and 1 ms (4,000 a second, the issue's case)."""
RELAY_SPACINGS_MS = (100, 20, 1)
WORKFLOW_SPACING_MS = 20
WAITER_JOB = "bench.wake.wf.waiter"
PARENT_JOB = "bench.wake.wf.parent"
CHILD_JOB = "bench.wake.wf.child"
WF_EVENT = "bench.wake.wf.go"
SUSPEND_WITHIN = 30.0
TRICKLE_P50 = (Target("value", "<=", 3.0),)
TRICKLE_P99 = (Target("value", "<=", 15.0),)
FOUR_P99 = (Target("value", "<=", 25.0),)
WORKFLOW_P50 = (Target("value", "<=", 10.0),)
FLOOD_PRODUCERS = 16
FLOOD_TASKS = 2
IDLE_JOB = "bench.wake.notify16.idle"
FLOOD_JOB = "bench.wake.notify16"
FLOOD_RUNS = "ship_job_runs"
"""The runs table the producers' default backends enqueue into (emptied before each flood)."""

Pair = tuple[float, float]
"""(p50, p99) of one round, ms."""


def _pair(values: Sequence[float]) -> Pair:
    return percentile(values, 0.5), percentile(values, 0.99)


async def _nothing(_ctx: JobContext, _payload: dict[str, Any]) -> None:
    return None


def _workflow_count(bench: Bench) -> int:
    return 30 if bench.quick else 100


class _Workflows:
    """A worker runtime here at the defaults executing WAITER_JOB (waits for its key's event)
    and PARENT_JOB (spawns one CHILD_JOB, waits for it); both mark every start of their
    handler (the first line), so the second start of a run is its replay."""

    def __init__(self, bench: Bench, db: BenchDatabase, producer: Producer) -> None:
        self.bench = bench
        self.db = db
        self.producer = producer
        self.starts = Starts()
        starts = self.starts
        child: JobDefinition[dict[str, Any]] = define_job(CHILD_JOB, _nothing, payload=dict)

        async def waiter(ctx: JobContext, payload: dict[str, Any]) -> None:
            starts.mark(payload["n"])
            await ctx.wait_for_event("go", WF_EVENT, key=payload["key"])

        async def parent(ctx: JobContext, payload: dict[str, Any]) -> None:
            starts.mark(payload["n"])
            spawned = {"n": payload["n"], "slot": payload["slot"], "parent": ctx.run_id}
            await ctx.spawn("kid", child, [spawned])
            await ctx.wait_for_children("join")

        self.waiter: JobDefinition[dict[str, Any]] = define_job(WAITER_JOB, waiter, payload=dict)
        self.parent: JobDefinition[dict[str, Any]] = define_job(PARENT_JOB, parent, payload=dict)
        self.backend: PostgresJobBackend = create_job_backend(database=db.engine)
        self.child_source = "settle"
        """How the producer timed a child's completion commit (see ``_producer.py``)."""

    async def _suspended(self, run_ids: list[str]) -> None:
        query = text(
            "SELECT count(*) FROM ship_job_runs WHERE id = ANY(:ids) AND state = 'waiting'"
            " AND wait_for IS NOT NULL"
        )
        deadline = time.monotonic() + SUSPEND_WITHIN
        while time.monotonic() < deadline:
            async with self.db.engine.connect() as connection:
                if await connection.scalar(query, {"ids": run_ids}) == len(run_ids):
                    return
            await asyncio.sleep(0.02)
        raise BenchmarkError(f"wake: {len(run_ids)} workflow runs did not all suspend in time")

    async def _enqueue(self, job: JobDefinition[dict[str, Any]], payloads: list[Any]) -> None:
        results = await self.backend.enqueue_many(job, [EnqueueRequest(p) for p in payloads])
        await self._suspended([r.run_id for r in results if r.run_id is not None])

    async def event(self, count: int, spacing: float) -> list[float]:
        first = self.producer.reserve(count)
        await self._enqueue(
            self.waiter, [{"n": n, "key": str(n)} for n in range(first, first + count)]
        )
        done = await trickle(
            [self.producer], "event", spacing, count, firsts=[first], event=WF_EVENT
        )
        await self.starts.wait_for(done.commits, PICKED_UP_WITHIN, times=2)
        values = latencies(done, self.starts, start=1)
        self.bench.log(describe(f"event  {spacing * 1000:>5g} ms x1", done, values))
        return values

    async def child(self, count: int, spacing: float) -> list[float]:
        first = self.producer.reserve(count)
        self.producer.send(cmd="children", job_id=CHILD_JOB, expect=count)
        await self._enqueue(self.parent, [{"n": first + i, "slot": i} for i in range(count)])
        arrived = (await self.producer.reply(SUSPEND_WITHIN + 5))["arrived"]
        if arrived != count:
            raise BenchmarkError(f"wake: {arrived} of {count} child runs started in the producer")
        answer = await self.producer.request(
            LEAD + spacing * count + 60,
            cmd="release",
            spacing=spacing,
            start_at=time.monotonic() + LEAD,
        )
        commits = {int(n): float(t) for n, t in answer["commits"]}
        self.child_source = str(answer["source"])
        done = Trickle(commits, {first + i: i for i in range(count)}, 0.0, spacing, count)
        if len(commits) != count:
            raise BenchmarkError(f"wake: {len(commits)} of {count} children completed")
        await self.starts.wait_for(commits, PICKED_UP_WITHIN, times=2)
        values = latencies(done, self.starts, start=1)
        self.bench.log(describe(f"child  {spacing * 1000:>5g} ms x1", done, values))
        return values


class _Rounds:
    """Per figure, the rounds' (p50, p99) of ship_sqla and of its baseline."""

    def __init__(self) -> None:
        self.ours: dict[str, list[Pair]] = {}
        self.theirs: dict[str, list[Pair]] = {}

    def add(self, name: str, ours: Sequence[float], theirs: Pair | None) -> None:
        self.ours.setdefault(name, []).append(_pair(ours))
        if theirs is not None:
            self.theirs.setdefault(name, []).append(theirs)


async def _trickle_round(
    bench: Bench,
    db: BenchDatabase,
    *,
    producers: list[Producer],
    workflows: _Workflows,
    index: int,
    rounds: _Rounds,
) -> None:
    quick, log = bench.quick, bench.log

    def ship(spacing: float, count: int, who: list[Producer]) -> Callable[[], Awaitable[Pair]]:
        async def measure() -> Pair:
            return _pair(
                await ship_pickup(db.engine, who, spacing, count, job_id=TRICKLE_JOB, log=log)
            )

        return measure

    def raw(spacing: float, count: int, who: list[Producer]) -> Callable[[], Awaitable[Pair]]:
        async def measure() -> Pair:
            return _pair(
                await raw_pickup(
                    db,
                    who,
                    spacing,
                    count,
                    job_id=TRICKLE_JOB,
                    table=RAW_TABLE,
                    channel=TRICKLE_CHANNEL,
                    log=log,
                )
            )

        return measure

    floor: dict[int, Pair] = {}
    for ms in SPACINGS_MS:
        spacing, count = ms / 1000.0, trickle_count(ms, quick=quick)
        ours, theirs = await measure_pair(
            index, ship(spacing, count, producers[:1]), raw(spacing, count, producers[:1])
        )
        rounds.ours.setdefault(f"trickle.{ms}", []).append(ours)
        rounds.theirs.setdefault(f"trickle.{ms}", []).append(theirs)
        floor[ms] = theirs
    for ms in FOUR_SPACINGS_MS:
        spacing, count = ms / 1000.0, trickle_count(ms, quick=quick)
        ours, theirs = await measure_pair(
            index, ship(spacing, count, producers[:FOUR]), raw(spacing, count, producers[:FOUR])
        )
        rounds.ours.setdefault(f"trickle4.{ms}", []).append(ours)
        rounds.theirs.setdefault(f"trickle4.{ms}", []).append(theirs)
    for ms in RELAY_SPACINGS_MS:
        spacing, count = ms / 1000.0, trickle_count(ms, quick=quick)
        values = await relay_pickup(
            db.engine, producers[:1], spacing, count, outbox_id=TRICKLE_OUTBOX, log=log
        )
        rounds.add(f"relay.{ms}", values, floor[ms])
    spacing, count = WORKFLOW_SPACING_MS / 1000.0, _workflow_count(bench)
    rounds.add("event", await workflows.event(count, spacing), floor[WORKFLOW_SPACING_MS])
    rounds.add("child", await workflows.child(count, spacing), floor[WORKFLOW_SPACING_MS])


async def _trickle_figures(
    bench: Bench, db: BenchDatabase, producers: list[Producer]
) -> list[Figure]:
    log = bench.log
    # Warm-up, not measured: every producer's pools and statements, the runtime's and relay's
    # code paths, the raw floor's.
    await ship_pickup(db.engine, producers[:FOUR], 0.005, 40, job_id=TRICKLE_JOB, log=log)
    await raw_pickup(
        db,
        producers[:FOUR],
        0.005,
        40,
        job_id=TRICKLE_JOB,
        table=RAW_TABLE,
        channel=TRICKLE_CHANNEL,
        log=log,
    )
    await relay_pickup(db.engine, producers[:1], 0.005, 40, outbox_id=TRICKLE_OUTBOX, log=log)
    rounds = _Rounds()
    workflows = _Workflows(bench, db, producers[0])
    runtime = await start_job_runtime(
        [workflows.waiter, workflows.parent], backend=workflows.backend
    )
    try:
        await wait_live(workflows.backend.listener)
        await workflows.event(10, 0.02)  # warm-up, not measured
        await workflows.child(10, 0.02)
        for index in range(bench.rounds):
            await _trickle_round(
                bench, db, producers=producers, workflows=workflows, index=index, rounds=rounds
            )
    finally:
        await runtime.stop()
    floor = (
        "raw INSERT + pg_notify (one statement) in another process -> raw LISTEN -> SKIP"
        " LOCKED claim"
    )
    defaults = "poll 1 s, listen=True"
    figures: list[Figure] = []
    for ms in SPACINGS_MS:
        count = trickle_count(ms, quick=bench.quick)
        figures += latency_figures(
            f"wake.remote.trickle.{ms}ms",
            rounds.ours[f"trickle.{ms}"],
            rounds.theirs[f"trickle.{ms}"],
            baseline_label=f"{floor}, {ms} ms apart",
            p50_targets=TRICKLE_P50,
            p99_targets=TRICKLE_P99,
            note=f"one producer process, backend.enqueue outside a unit of work every {ms} ms"
            f" (fixed schedule), {count} per round, the first {warmup(ms / 1000, count)} not"
            f" measured; runtime here at the defaults ({defaults}); commit -> handler start",
        )
    for ms in FOUR_SPACINGS_MS:
        count = trickle_count(ms, quick=bench.quick)
        figures += latency_figures(
            f"wake.remote.trickle{FOUR}.{ms}ms",
            rounds.ours[f"trickle4.{ms}"],
            rounds.theirs[f"trickle4.{ms}"],
            baseline_label=f"{FOUR} raw producers, {floor}",
            p99_targets=FOUR_P99,
            note=f"{FOUR} producer processes, each one enqueue every {ms} ms (staggered),"
            f" {count} each per round; runtime here at the defaults ({defaults})",
        )
    for ms in RELAY_SPACINGS_MS:
        count = trickle_count(ms, quick=bench.quick)
        figures += latency_figures(
            f"wake.relay.trickle.{ms}ms",
            rounds.ours[f"relay.{ms}"],
            rounds.theirs[f"relay.{ms}"],
            baseline_label=f"the same round's job floor at {ms} ms",
            p50_targets=TRICKLE_P50,
            p99_targets=TRICKLE_P99,
            note=f"one producer process, outbox.enqueue outside a unit of work every {ms} ms,"
            f" {count} per round; start_outbox_relay here at the defaults ({defaults});"
            " commit -> the sink called",
        )
    count = _workflow_count(bench)
    wf_floor = f"the same round's job floor at {WORKFLOW_SPACING_MS} ms"
    figures += latency_figures(
        "wake.workflow.event",
        rounds.ours["event"],
        rounds.theirs["event"],
        baseline_label=wf_floor,
        p50_targets=WORKFLOW_P50,
        note=f"{count} runs per round suspended on wait_for_event; another process publishes"
        f" their events {WORKFLOW_SPACING_MS} ms apart (publish_event outside a unit of work);"
        " commit -> the run's replay starts (its handler's first line, again)",
    )
    when = (
        "its settle statement returned (in the producer)"
        if workflows.child_source == "settle"
        else "its handler returned (the producer's backend has no _wake_parents to time the"
        " settle's commit by)"
    )
    figures += latency_figures(
        "wake.workflow.child",
        rounds.ours["child"],
        rounds.theirs["child"],
        baseline_label=wf_floor,
        p50_targets=WORKFLOW_P50,
        note=f"{count} parents per round here, each waiting on one child run in another process"
        f" (a runtime there at the defaults) that completes on a fixed schedule"
        f" {WORKFLOW_SPACING_MS} ms apart; the child's completion commit (read when {when}) ->"
        " the parent's replay starts",
    )
    return figures


# --- notify16: the notifying-commit rate at full speed -------------------------------------------


def _flood_seconds(bench: Bench) -> float:
    return 3.0 if bench.quick else 8.0


def _flood_rounds(bench: Bench) -> int:
    return max(bench.rounds, 2 if bench.quick else 5)


async def _flood(
    db: BenchDatabase,
    producers: list[Producer],
    heard: list[float],
    *,
    announce: bool,
    seconds: float,
    log: Callable[[str], None] | None,
) -> tuple[float, float]:
    """(enqueues/s, notifications/s) of one flood."""
    await db.maintain(f"TRUNCATE {FLOOD_RUNS} CASCADE")
    start_at = time.monotonic() + LEAD
    end_at = start_at + seconds
    for producer in producers:
        producer.send(
            cmd="flood",
            announce=announce,
            job_id=FLOOD_JOB,
            start_at=start_at,
            end_at=end_at,
            tasks=FLOOD_TASKS,
        )
    answers = await asyncio.gather(*(p.reply(LEAD + seconds + 60) for p in producers))
    enqueued = sum(int(answer["count"]) for answer in answers)
    # The producers count their announcer's notifying commits (folds and sends).
    committed = sum(int(answer.get("notifying_commits", 0)) for answer in answers)
    del heard  # kept in the signature for the callers; nothing listens but the runtime
    per_s, notifies = rate(enqueued, seconds), rate(committed, seconds)
    if log is not None:
        log(
            f"notify16 announce {'on ' if announce else 'off'}: {enqueued} enqueues ="
            f" {per_s:,.0f}/s, {committed} notifying commits = {notifies:.1f}/s"
        )
    return per_s, notifies


async def _notify16_figures(
    bench: Bench, db: BenchDatabase, producers: list[Producer]
) -> list[Figure]:
    seconds = _flood_seconds(bench)
    idle: JobDefinition[dict[str, Any]] = define_job(IDLE_JOB, _nothing, payload=dict)
    backend = create_job_backend(database=db.engine)
    heard: list[float] = []  # nothing else listens: the runtime's listener is the one
    runtime = await start_job_runtime(idle, backend=backend)
    on: list[float] = []
    off: list[float] = []
    notifies: list[float] = []
    try:
        await wait_live(backend.listener)
        for announce in (True, False):  # warm-up, not measured
            await _flood(db, producers, heard, announce=announce, seconds=0.5, log=None)
        for index in range(_flood_rounds(bench)):

            async def flood_on() -> tuple[float, float]:
                return await _flood(
                    db, producers, heard, announce=True, seconds=seconds, log=bench.log
                )

            async def flood_off() -> tuple[float, float]:
                return await _flood(
                    db, producers, heard, announce=False, seconds=seconds, log=bench.log
                )

            (on_rate, on_notifies), (off_rate, _) = await measure_pair(index, flood_on, flood_off)
            on.append(on_rate)
            off.append(off_rate)
            notifies.append(on_notifies)
            heard.clear()
    finally:
        await runtime.stop()
    budget = getattr(announce_rule, "NOTIFY_BUDGET", None)
    silenced_by = producers[0].silenced_by
    who = (
        f"{len(producers)} producer processes x {FLOOD_TASKS} concurrent loops of"
        f" backend.enqueue (singles, outside a unit of work) for {seconds:g} s per round; one"
        " idle runtime here (listening)"
    )
    return [
        Figure.from_rounds(
            "wake.notify16.throughput",
            "enqueues/s",
            on,
            off,
            baseline_label=f"announcements off ({silenced_by})",
            targets=(Target("ratio", ">=", 0.95),),
            note=f"{who}; announcements on (the default) vs off, alternating per round,"
            f" {len(on)} rounds",
        ),
        Figure.from_rounds(
            "wake.notify16.notifying_commits_per_s",
            "/s",
            notifies,
            None,
            baseline_label="",
            targets=(Target("value", "<=", float(budget)),) if budget is not None else (),
            note="the producers' notifying commits (folds and sends) in the window, announcements"
            " on;"
            + (
                f" bound: announce.NOTIFY_BUDGET = {budget}"
                if budget is not None
                else " no NOTIFY_BUDGET in ship_sqla.kernel._plans.announce: no target"
            ),
        ),
    ]


async def _trickle_and_flood(bench: Bench, db: BenchDatabase) -> list[Figure]:
    producers = await start_producers(db, range(FOUR))
    try:
        figures = await _trickle_figures(bench, db, producers)
        # 16 producers share max_connections with everything else: each keeps only what its
        # flood uses (FLOOD_TASKS connections).
        await asyncio.gather(*(p.request(60, cmd="rest") for p in producers))
        producers += await start_producers(db, range(FOUR, FLOOD_PRODUCERS))
        figures += await _notify16_figures(bench, db, producers)
    finally:
        await close_producers(producers)
    return figures


async def run(bench: Bench) -> list[Figure]:
    count = 50 if bench.quick else 300
    async with bench.database(NAME) as db:
        await db.create_job_tables(raw=RAW_TABLE)
        await _ship_round(bench, db, 20)  # warm-up, not measured
        await _raw_round(bench, db, 20)
        ours, theirs = await paired_rounds(
            bench.rounds,
            lambda: _ship_round(bench, db, count),
            lambda: _raw_round(bench, db, count),
        )
        remote = await _remote_figures(bench, db)
        async with db.engine.begin() as connection:
            await connection.run_sync(ship_outbox_table(MetaData()).metadata.create_all)
        trickles = await _trickle_and_flood(bench, db)
    note = f"{count} enqueues per round, one at a time; poll_interval={POLL_INTERVAL:g} s"
    baseline = "raw commit -> event -> SKIP LOCKED claim"
    return [
        *latency_figures(
            "wake",
            ours,
            theirs,
            baseline_label=baseline,
            p50_targets=(Target("value", "<=", 5.0),),
            note=note,
        ),
        *remote,
        *trickles,
    ]
