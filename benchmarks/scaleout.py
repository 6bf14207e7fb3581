"""scaleout (opt-in): the throughput of 1, 2, 4 and 8 worker processes on one hot job, with 0 and
1 ms of round trip added between the workers and PostgreSQL (issue #13, item 2).

Method. One scratch database with the ship job tables. Each drain: N runs of ONE job
pre-enqueued with ``enqueue_many`` and the table VACUUM ANALYZEd (not timed); P worker
processes started (``benchmarks/_scaleout_worker.py``: each its own ``create_async_engine``,
``create_job_backend`` and ``define_job`` of a noop handler, or one awaiting the config's
``handler_ms``, run by ``start_job_runtime``), each
opening its pooled connections and then reporting ``ready`` on its stdout. When every process
is ready the parent releases them all (``go`` on their stdin: each then starts its runtime) and
counts the ``completed`` runs every 50 ms on its own autocommit connection, directly to
PostgreSQL, never through the proxy, until it sees all N. The drain's time is read on the
database's clock, so the poll's 50 ms step is not in it: from ``clock_timestamp()`` read on that
connection just before ``go`` to the latest ``finished_at`` (the ``now()`` of the last settle's
transaction: it is short of that commit by one statement and its commit). The poll's own time is
logged beside it. Then the workers stop and report how many handlers each ran: its share of the
work (``claimed_by`` is cleared when a run settles, so the table cannot tell). A drain is
invalid unless every run is ``completed`` and the handler calls add up to N. Throughput = N /
that time. Each drain also logs the workers' CPU time, the proxy's, and how busy the machine's
CPUs were (Linux ``/proc``), to tell a latency bound from a CPU bound.

Routes between the workers and PostgreSQL:

- ``rtt1``: through ``benchmarks/_proxy.py`` (its own process, on 127.0.0.1) adding 0.5 ms per
  direction to every chunk, 1 ms per round trip, without limiting bandwidth;
- ``rtt0``: the same proxy adding nothing, so the proxy's own cost is in both proxied columns;
- ``direct``: no proxy, for reference.

``scaleout.rtt.<route>`` is the round trip actually measured on each route (median of 200
``SELECT 1`` on one asyncpg connection, per round), since a proxy's timers are not exact.

Configurations (``CONFIGS``): a config is the keyword arguments given to ``start_job_runtime``
and to ``define_job`` in each worker (a ``concurrency`` entry is ``Concurrency``'s arguments):
``defaults`` gives none (the library's defaults), ``tuned`` gives ``max_in_flight=1000`` and
``concurrency=Concurrency(max=1000)``, ``narrow`` gives ``max_in_flight=10``: each process then
has few runs per round trip, so its throughput is bound by the network rather than by a CPU,
which is where more processes should add throughput even on a small machine; ``io`` is
``narrow`` with handlers that await 5 ms (I/O-bound work, such as a call to another service):
each process then uses little CPU, so the curve shows whether claims of one job interfere
across processes rather than how many cores the machine has.

Figures: ``scaleout.<config>.<route>.p<P>`` in jobs/s (median over rounds) with the 1-process
figure of the same config and route as its baseline, so its ratio is the scaling (median of the
per-round ratios); ``...p<P>.min_share`` (P > 1): the smallest share of the runs one process
ran, in %, beside the even split (100/P %). Markdown tables (rows: processes; columns: config x
route) go to stderr at the end.

Sizes: N = 20,000, P in 1, 2, 4, 8, 2 rounds; ``--quick``: N = 4,000, P in 1, 2, 4, 1 round
(``--rounds`` can lower the number of rounds, not raise it). Each round runs the cells in a
fixed order, reversed on odd rounds. Worker processes run in sessions of their own and are
killed (their whole process group) if anything fails; the scratch database is dropped.

Run it by name: ``python -m benchmarks scaleout [--quick]``; it is not part of the default run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
from sqlalchemy import MetaData

from benchmarks._harness import (
    Bench,
    BenchDatabase,
    BenchmarkError,
    Figure,
    asyncpg_dsn,
    median,
    rate,
)
from ship_sqla import JobContext, define_job
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla.jobs import EnqueueRequest, JobDefinition

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

    from sqlalchemy.engine import URL

__all__ = ["CONFIGS", "NAME", "ROUTES", "Config", "Route", "run"]

NAME = "scaleout"
JOB_ID = "bench.scaleout"
ENQUEUE_BATCH = 10_000
POLL_INTERVAL = 0.05
"""Seconds between the parent's counts of completed runs."""
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
DRAIN_TIMEOUT = 300.0
RTT_SAMPLES = 200
WARM_UP_RUNS = 1_000
ROOT = Path(__file__).resolve().parent.parent
"""The checkout: the working directory of the children, so ``-m benchmarks...`` imports."""


@dataclass(frozen=True, slots=True)
class Config:
    """Keyword arguments for ``start_job_runtime`` (``runtime``) and ``define_job`` (``job``)
    in every worker; ``job["concurrency"]``, if any, is a dict of ``Concurrency`` arguments."""

    name: str
    runtime: Mapping[str, Any] = field(default_factory=dict)
    job: Mapping[str, Any] = field(default_factory=dict)
    handler_ms: float = 0.0
    """How long each handler awaits (``asyncio.sleep``): 0 for a noop handler."""

    def to_json(self) -> str:
        return json.dumps(
            {"runtime": dict(self.runtime), "job": dict(self.job), "handler_ms": self.handler_ms}
        )

    def describe(self) -> str:
        given = [f"{k}={v!r}" for k, v in {**self.runtime, **self.job}.items()]
        if self.handler_ms:
            given.append(f"handlers awaiting {self.handler_ms:g} ms")
        return ", ".join(given) or "library defaults"


CONFIGS: tuple[Config, ...] = (
    Config("defaults"),
    Config("tuned", runtime={"max_in_flight": 1000}, job={"concurrency": {"max": 1000}}),
    Config("narrow", runtime={"max_in_flight": 10}),
    Config("io", runtime={"max_in_flight": 10}, handler_ms=5.0),
)


@dataclass(frozen=True, slots=True)
class Route:
    """How the workers reach PostgreSQL: directly (``added_rtt_ms`` None) or through the proxy."""

    name: str
    added_rtt_ms: float | None

    def describe(self) -> str:
        if self.added_rtt_ms is None:
            return "directly"
        return f"through the proxy, +{self.added_rtt_ms:g} ms per round trip"


ROUTES: tuple[Route, ...] = (Route("direct", None), Route("rtt0", 0.0), Route("rtt1", 1.0))


def _sizes(bench: Bench) -> tuple[int, tuple[int, ...], int]:
    """(runs per drain, process counts, rounds)."""
    if bench.quick:
        return 4_000, (1, 2, 4), min(bench.rounds, 1)
    return 20_000, (1, 2, 4, 8), min(bench.rounds, 2)


async def _noop(_ctx: JobContext, _payload: dict[str, Any]) -> None:
    return None


# --- child processes ---------------------------------------------------------------------------


class _Child:
    """A ``python -m <module>`` subprocess in a session (process group) of its own, speaking
    lines on its stdin and stdout."""

    def __init__(self, what: str, process: asyncio.subprocess.Process) -> None:
        self.what = what
        self.process = process

    @classmethod
    async def start(cls, what: str, module: str, *args: str) -> _Child:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=ROOT,
            start_new_session=True,
        )
        return cls(what, process)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def exited(self) -> bool:
        return self.process.returncode is not None

    async def line(self, within: float) -> str:
        stdout = self.process.stdout
        if stdout is None:  # pragma: no cover - created with a pipe
            raise BenchmarkError(f"scaleout: the {self.what} has no stdout")
        try:
            async with asyncio.timeout(within):
                line = await stdout.readline()
        except TimeoutError as exc:
            raise BenchmarkError(f"scaleout: the {self.what} did not answer in {within} s") from exc
        if not line:
            code = await self.process.wait()
            raise BenchmarkError(f"scaleout: the {self.what} exited (status {code})")
        return line.decode().strip()

    async def expect(self, word: str, within: float) -> list[str]:
        """The next line, which must start with ``word``; its other words."""
        words = (await self.line(within)).split()
        if not words or words[0] != word:
            raise BenchmarkError(f"scaleout: the {self.what} said {words!r}, not {word!r}")
        return words[1:]

    def send(self, line: str) -> None:
        stdin = self.process.stdin
        if stdin is None:  # pragma: no cover - created with a pipe
            raise BenchmarkError(f"scaleout: the {self.what} has no stdin")
        stdin.write(f"{line}\n".encode())

    async def finish(self, within: float = STOP_TIMEOUT) -> None:
        """Close its stdin (its signal to exit) and wait; kill its group past ``within``."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            async with asyncio.timeout(within):
                await self.process.wait()
        except TimeoutError:
            await self.kill()

    async def kill(self) -> None:
        """SIGKILL to its process group (it leads its own session), then reap it."""
        if not self.exited:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        await self.process.wait()

    def cpu_seconds(self) -> float | None:
        """User + system CPU seconds it has used so far (Linux ``/proc``; None elsewhere)."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Proxy:
    """``benchmarks/_proxy.py`` in its own process, in front of the database's server."""

    def __init__(self, child: _Child, port: int) -> None:
        self.child = child
        self.port = port

    @classmethod
    async def start(cls, url: URL, added_rtt_ms: float) -> _Proxy:
        socket_dir = url.query.get("host")
        host = socket_dir if isinstance(socket_dir, str) else (url.host or "127.0.0.1")
        child = await _Child.start(
            f"proxy (+{added_rtt_ms:g} ms)",
            "benchmarks._proxy",
            "--upstream-host",
            host,
            "--upstream-port",
            str(url.port or 5432),
            "--delay-ms",
            str(added_rtt_ms / 2),
        )
        try:
            (port,) = await child.expect("ready", READY_TIMEOUT)
        except BaseException:
            await child.kill()
            raise
        return cls(child, int(port))

    def url(self, url: URL) -> URL:
        """``url`` (the database's) through this proxy."""
        return url.set(host="127.0.0.1", port=self.port).difference_update_query(["host", "port"])


@asynccontextmanager
async def _fleet(url: URL, config: Config, processes: int) -> AsyncIterator[list[_Child]]:
    """``processes`` workers on ``url``, every one ready (not started); all killed on exit unless
    they already exited."""
    workers: list[_Child] = []
    try:
        rendered = url.render_as_string(hide_password=False)
        for index in range(processes):
            workers.append(  # noqa: PERF401 - one by one: those started are killed if one fails
                await _Child.start(
                    f"worker {index + 1}/{processes}",
                    "benchmarks._scaleout_worker",
                    rendered,
                    JOB_ID,
                    config.to_json(),
                )
            )
        await asyncio.gather(*(worker.expect("ready", READY_TIMEOUT) for worker in workers))
        yield workers
    finally:
        await asyncio.gather(*(worker.kill() for worker in workers), return_exceptions=True)


# --- one drain ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Drain:
    jobs_per_s: float
    shares: tuple[float, ...]
    """Per process: the fraction of the runs its handlers ran."""


class _Scaleout:
    """The drains of one benchmark run: its database, its proxies (route name -> proxy) and the
    parent's direct connection that counts completed runs."""

    def __init__(
        self,
        bench: Bench,
        db: BenchDatabase,
        proxies: Mapping[str, _Proxy],
        counter: asyncpg.Connection,
    ) -> None:
        self.bench = bench
        self.db = db
        self.proxies = proxies
        self.counter = counter
        metadata = MetaData()
        self.table = ship_job_runs_table(metadata)
        self.state = ship_job_state_table(metadata)
        self.job: JobDefinition[dict[str, Any]] = define_job(JOB_ID, _noop, payload=dict)
        self.backend = create_job_backend(
            database=db.engine, table=self.table, state_table=self.state, listen=False
        )
        self.completed_sql = f"SELECT count(*) FROM {self.table.name} WHERE state = 'completed'"

    async def _load(self, runs: int) -> None:
        await self.db.maintain(f"TRUNCATE {self.table.name}, {self.state.name} CASCADE")
        for start in range(0, runs, ENQUEUE_BATCH):
            size = min(ENQUEUE_BATCH, runs - start)
            await self.backend.enqueue_many(
                self.job, [EnqueueRequest(payload={}) for _ in range(size)]
            )
        await self.db.maintain(f"VACUUM (ANALYZE) {self.table.name}")

    async def _completed(self) -> int:
        return int(await self.counter.fetchval(self.completed_sql))

    async def _wait_drained(self, runs: int, workers: Sequence[_Child], began: float) -> float:
        """The start of the first poll that counted ``runs`` completed runs."""
        while True:
            polled = time.perf_counter()
            completed = await self._completed()
            if completed >= runs:
                return polled
            for worker in workers:
                if worker.exited:
                    raise BenchmarkError(
                        f"scaleout: {worker.what} exited during the drain"
                        f" ({completed} of {runs} runs completed)"
                    )
            if polled - began > DRAIN_TIMEOUT:
                raise BenchmarkError(
                    f"scaleout: {completed} of {runs} runs completed after {DRAIN_TIMEOUT:g} s"
                )
            await asyncio.sleep(POLL_INTERVAL)

    def url(self, route: Route) -> URL:
        proxy = self.proxies.get(route.name)
        return self.db.url if proxy is None else proxy.url(self.db.url)

    async def drain(self, route: Route, config: Config, processes: int, runs: int) -> _Drain:
        proxy = self.proxies.get(route.name)
        await self._load(runs)
        async with _fleet(self.url(route), config, processes) as workers:
            proxy_cpu = proxy.child.cpu_seconds() if proxy is not None else None
            machine = _machine_cpu()
            go_at = await self.counter.fetchval("SELECT clock_timestamp()")
            began = time.perf_counter()
            for worker in workers:
                worker.send("go")
            polled = await self._wait_drained(runs, workers, began) - began
            machine_busy = _busy_fraction(machine, _machine_cpu())
            if proxy is not None and proxy_cpu is not None:
                proxy_cpu = (proxy.child.cpu_seconds() or 0.0) - proxy_cpu
            for worker in workers:
                worker.send("stop")
            reports = [await worker.expect("done", STOP_TIMEOUT) for worker in workers]
            await asyncio.gather(*(worker.finish() for worker in workers))
        handled = [int(report[0]) for report in reports]
        errors = sum(int(report[1]) for report in reports)
        worker_cpu = sum(float(report[2]) for report in reports)
        completed = await self._completed()
        if completed != runs or sum(handled) != runs:
            raise BenchmarkError(
                f"scaleout: {completed} of {runs} runs completed, {sum(handled)} handler calls"
            )
        last = await self.counter.fetchval(f"SELECT max(finished_at) FROM {self.table.name}")
        seconds = (last - go_at).total_seconds()
        jobs_per_s = rate(runs, seconds)
        shares = tuple(count / runs for count in handled)
        cpu = [f"workers' CPU {worker_cpu:.2f} s"]
        if proxy_cpu is not None:
            cpu.append(f"proxy's {proxy_cpu:.2f} s")
        if machine_busy is not None:
            cpu.append(f"machine {machine_busy * 100:.0f} % busy")
        self.bench.log(
            f"{config.name:<8} {route.name:<6} P={processes}  {runs} runs in {seconds:.3f} s"
            f" (poll saw it at {polled:.3f} s) = {jobs_per_s:,.0f} jobs/s; shares"
            f" {'/'.join(f'{share * 100:.0f}' for share in shares)} %; {', '.join(cpu)};"
            f" {errors} backend errors"
        )
        return _Drain(jobs_per_s, shares)


def _machine_cpu() -> tuple[int, int] | None:
    """(busy, total) jiffies of every CPU since boot, from Linux ``/proc/stat``; None elsewhere."""
    try:
        with Path("/proc/stat").open() as stat:
            ticks = [int(value) for value in stat.readline().split()[1:9]]  # to steal
    except (OSError, ValueError):
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return sum(ticks) - idle, sum(ticks)


def _busy_fraction(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """How busy the machine's CPUs were between two :func:`_machine_cpu` readings (0..1)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


async def _round_trip_ms(url: URL) -> float:
    """Median ``SELECT 1`` round trip on one asyncpg connection to ``url``, in ms."""
    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        for _ in range(20):
            await connection.fetchval("SELECT 1")
        samples = []
        for _ in range(RTT_SAMPLES):
            began = time.perf_counter()
            await connection.fetchval("SELECT 1")
            samples.append((time.perf_counter() - began) * 1000.0)
    finally:
        await connection.close()
    return median(samples)


# --- the benchmark -----------------------------------------------------------------------------

Cell = tuple[str, str, int]
"""(config name, route name, processes)."""


def _figures(
    results: Mapping[Cell, list[_Drain]],
    rtts: Mapping[str, list[float]],
    processes: Sequence[int],
    runs: int,
) -> list[Figure]:
    figures = [
        Figure.from_rounds(
            f"scaleout.rtt.{route.name}",
            "ms",
            rtts[route.name],
            rtts["direct"] if route.added_rtt_ms is not None else None,
            baseline_label="direct",
            note=f"median of {RTT_SAMPLES} SELECT 1 round trips {route.describe()}",
        )
        for route in ROUTES
    ]
    for config in CONFIGS:
        for route in ROUTES:
            single = [drain.jobs_per_s for drain in results[config.name, route.name, 1]]
            for count in processes:
                drains = results[config.name, route.name, count]
                throughput = [drain.jobs_per_s for drain in drains]
                name = f"scaleout.{config.name}.{route.name}.p{count}"
                figures.append(
                    Figure.from_rounds(
                        name,
                        "jobs/s",
                        throughput,
                        single if count > 1 else None,
                        baseline_label="1 process",
                        note=f"N={runs:,} runs of one job, {config.describe()}, {route.describe()}"
                        if count == 1
                        else "",
                    )
                )
                if count > 1:
                    figures.append(
                        Figure.from_rounds(
                            f"{name}.min_share",
                            "%",
                            [min(drain.shares) * 100.0 for drain in drains],
                            [100.0 / count] * len(drains),
                            baseline_label="even split",
                        )
                    )
    return figures


def _markdown(figures: Sequence[Figure], processes: Sequence[int]) -> list[str]:
    by_name = {figure.name: figure for figure in figures}
    columns = [(config.name, route.name) for config in CONFIGS for route in ROUTES]
    header = "| processes | " + " | ".join(f"{c} {r}" for c, r in columns) + " |"
    rule = "|---:|" + "---:|" * len(columns)
    lines = ["jobs/s (x the 1-process figure):", "", header, rule]
    shares = ["smallest per-process share of the runs (even split in brackets):", "", header, rule]
    for count in processes:
        cells, share_cells = [], []
        for config, route in columns:
            figure = by_name[f"scaleout.{config}.{route}.p{count}"]
            scale = f" ({figure.ratio:.2f}x)" if figure.ratio is not None else ""
            cells.append(f"{figure.value:,.0f}{scale}")
            share = by_name.get(f"scaleout.{config}.{route}.p{count}.min_share")
            share_cells.append(
                f"{share.value:.0f} % ({100 / count:.0f} %)" if share is not None else "-"
            )
        lines.append(f"| {count} | " + " | ".join(cells) + " |")
        shares.append(f"| {count} | " + " | ".join(share_cells) + " |")
    return [*lines, "", *shares]


async def run(bench: Bench) -> list[Figure]:
    runs, processes, rounds = _sizes(bench)
    cells: list[tuple[Config, Route, int]] = [
        (config, route, count) for config in CONFIGS for route in ROUTES for count in processes
    ]
    results: dict[Cell, list[_Drain]] = {}
    rtts: dict[str, list[float]] = {route.name: [] for route in ROUTES}
    async with bench.database(NAME) as db:
        await db.create_job_tables()
        proxies: dict[str, _Proxy] = {}
        try:
            for route in ROUTES:
                if route.added_rtt_ms is not None:
                    proxies[route.name] = await _Proxy.start(db.url, route.added_rtt_ms)
            scaleout = _Scaleout(bench, db, proxies, await db.raw())
            # Warm-up, not measured: the server's caches, the proxy, the children's imports.
            await scaleout.drain(ROUTES[1], CONFIGS[-1], 1, min(WARM_UP_RUNS, runs))
            for index in range(rounds):
                for route in ROUTES:
                    rtts[route.name].append(await _round_trip_ms(scaleout.url(route)))
                bench.log(
                    f"round {index + 1}/{rounds}: measured round trips "
                    + ", ".join(f"{name} {values[-1]:.2f} ms" for name, values in rtts.items())
                )
                for config, route, count in cells if index % 2 == 0 else reversed(cells):
                    drain = await scaleout.drain(route, config, count, runs)
                    results.setdefault((config.name, route.name, count), []).append(drain)
        finally:
            for proxy in proxies.values():
                await proxy.child.finish()
    figures = _figures(results, rtts, processes, runs)
    for line in _markdown(figures, processes):
        bench.log(line)
    return figures
