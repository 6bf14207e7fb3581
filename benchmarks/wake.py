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
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
import time
from typing import Any

from sqlalchemy import MetaData

from benchmarks._harness import (
    Bench,
    BenchDatabase,
    BenchmarkError,
    Figure,
    Target,
    asyncpg_dsn,
    latency_figures,
    latency_percentiles,
    ordered_ids,
    paired_rounds,
    percentile,
)
from benchmarks._raw_sql import job_sql
from ship_sqla import TransactionScope, create_unit_of_work
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla.kernel import JobContext, JobDefinition, define_job, start_job_runtime
from ship_sqla.kernel._plans.announce import ANNOUNCE_WINDOW

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
        poll_interval=POLL_INTERVAL,
    )
    uow = create_unit_of_work(db.engine, repositories=_scope_itself)

    async def enqueue(scope: TransactionScope) -> None:
        scope.after_commit(samples.mark_commit)
        await backend.enqueue(job, {})

    runtime = await start_job_runtime(job, backend=backend)
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
    from ship_sqla.kernel import define_job

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
            poll_interval=REMOTE_POLL_INTERVAL,
            listen=listen,
            on_error=errors.append,
        )
        admin = await self.db.raw()
        latencies: list[float] = []
        runtime = await start_job_runtime(job, backend=backend)
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
    ]
