"""Trickles: enqueues from other processes on a fixed schedule, and how soon each is picked up.

The parent's half of ``benchmarks/_producer.py`` (the producer processes and their protocol),
shared by ``benchmarks/wake.py`` (ship_sqla and the raw LISTEN/NOTIFY floor) and
``benchmarks/peers.py`` (pgqueuer beside ship_sqla):

- :class:`Producer`: one producer process; :func:`start_producers` starts several at once.
- :func:`trickle`: every producer enqueues ``count`` items ``spacing`` apart on a fixed schedule
  (absolute deadlines; producer ``k`` of ``P`` offset by ``k * spacing / P``), each reporting
  its commit's ``time.monotonic()`` (one clock per machine).
- :class:`Starts`: the ``time.monotonic()`` at which each numbered item's handler (or sink, or
  claim) started in this process; :func:`latencies` pairs them with the commits, dropping the
  first :func:`warmup` items of each producer.
- :func:`ship_pickup`, :func:`raw_pickup`, :func:`relay_pickup`: one trickle picked up by a
  ship_sqla worker runtime at its defaults, by the raw floor, by an outbox relay at its
  defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg

from benchmarks._harness import BenchmarkError, asyncpg_dsn
from benchmarks._raw_sql import job_sql
from ship_sqla import JobContext, create_outbox, define_job, start_job_runtime, start_outbox_relay
from ship_sqla._jobs import create_job_backend

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from sqlalchemy.ext.asyncio import AsyncEngine

    from benchmarks._harness import BenchDatabase
    from ship_sqla._notify import Listener
    from ship_sqla._outbox import OutboxMessage
    from ship_sqla.jobs import JobDefinition

__all__ = [
    "SPACINGS_MS",
    "Producer",
    "Starts",
    "Trickle",
    "latencies",
    "raw_pickup",
    "relay_pickup",
    "ship_pickup",
    "start_producers",
    "trickle",
    "trickle_count",
    "warmup",
]

ROOT = Path(__file__).resolve().parent.parent
SPACINGS_MS = (1000, 300, 100, 20, 5, 1)
"""Milliseconds between one producer's enqueues (issue 31)."""
QUICK_COUNTS = {1000: 8, 300: 20, 100: 20, 20: 100, 5: 300, 1: 1000}
"""Enqueues per producer per trickle at ``--quick``: about 2 s of trickle each, 8 s at 1 s."""
FULL_COUNTS = {1000: 15, 300: 40, 100: 50, 20: 200, 5: 600, 1: 2000}
WARMUP_SECONDS = 0.25
"""The first items of each trickle (this much of its schedule, at least one, at most a quarter
of it) are not measured: connections, caches and the sender's first announcement."""
LEAD = 0.3
"""Seconds from sending a trickle command to its first deadline: every producer has it by then."""
READY_TIMEOUT = 60.0
PICKED_UP_WITHIN = 15.0
"""Seconds after the last commit by which every item must have started (the library's default
poll interval is 1 s), or the round is invalid."""
RAW_CLAIM = 10
N_BLOCK = 1_000_000_000
"""Producer ``k`` numbers its items from ``(k + 1) * N_BLOCK``: unique across producers."""


def trickle_count(spacing_ms: int, *, quick: bool) -> int:
    """Enqueues per producer in one trickle at ``spacing_ms``."""
    table = QUICK_COUNTS if quick else FULL_COUNTS
    if spacing_ms in table:
        return table[spacing_ms]
    return max(8, round((2.0 if quick else 4.0) * 1000 / spacing_ms))


def warmup(spacing: float, count: int) -> int:
    """How many of a producer's first items a trickle of ``count`` at ``spacing`` s leaves out."""
    return min(max(1, math.ceil(WARMUP_SECONDS / spacing)), count // 4)


# --- producer processes --------------------------------------------------------------------------


class Producer:
    """A ``python -m benchmarks._producer`` process, one JSON line per command and answer."""

    def __init__(
        self, process: asyncio.subprocess.Process, index: int, ready: dict[str, Any]
    ) -> None:
        self.process = process
        self.index = index
        self.silenced_by = str(ready.get("silenced_by", "?"))
        """How the process's announcement-off backend was made (``announce=False`` or, before
        that keyword existed, ``_throttle=None``)."""
        self._next = (index + 1) * N_BLOCK

    @classmethod
    async def start(cls, db: BenchDatabase, index: int) -> Producer:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "benchmarks._producer",
            db.url.render_as_string(hide_password=False),
            asyncpg_dsn(db.url),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=ROOT,
            start_new_session=True,
            limit=1 << 24,
        )
        try:
            ready = await cls._read(process, index, READY_TIMEOUT)
        except BaseException:
            await _kill(process)
            raise
        if not ready.get("ready"):
            await _kill(process)
            raise BenchmarkError(f"producer {index} did not start: {ready}")
        return cls(process, index, ready)

    @staticmethod
    async def _read(process: asyncio.subprocess.Process, index: int, within: float) -> Any:  # noqa: ANN401 - JSON
        stdout = process.stdout
        if stdout is None:  # pragma: no cover - created with a pipe
            raise BenchmarkError(f"producer {index} has no stdout")
        try:
            async with asyncio.timeout(within):
                line = await stdout.readline()
        except TimeoutError as exc:
            raise BenchmarkError(f"producer {index} did not answer within {within:.0f} s") from exc
        if not line:
            code = await process.wait()
            raise BenchmarkError(f"producer {index} exited (status {code})")
        return json.loads(line)

    def reserve(self, count: int) -> int:
        """The first of ``count`` fresh item numbers of this producer."""
        first, self._next = self._next, self._next + count
        return first

    def send(self, **command: Any) -> None:  # noqa: ANN401 - JSON
        stdin = self.process.stdin
        if stdin is None:  # pragma: no cover - created with a pipe
            raise BenchmarkError(f"producer {self.index} has no stdin")
        stdin.write((json.dumps(command) + "\n").encode())

    async def reply(self, within: float) -> dict[str, Any]:
        answer: dict[str, Any] = await self._read(self.process, self.index, within)
        if "failed" in answer:
            raise BenchmarkError(f"producer {self.index}: {answer['failed']}")
        errors = answer.get("errors")
        if errors:
            raise BenchmarkError(f"producer {self.index}: enqueues failed: {errors}")
        return answer

    async def request(self, within: float, **command: Any) -> dict[str, Any]:  # noqa: ANN401 - JSON
        self.send(**command)
        return await self.reply(within)

    async def close(self) -> None:
        """EOF on its stdin (it stops what it runs and exits); killed after 30 s."""
        if self.process.stdin is not None and not self.process.stdin.is_closing():
            self.process.stdin.close()
        try:
            async with asyncio.timeout(30):
                code = await self.process.wait()
        except TimeoutError:
            await _kill(self.process)
            raise BenchmarkError(f"producer {self.index} did not exit; killed") from None
        if code != 0:
            raise BenchmarkError(f"producer {self.index} exited with status {code}")


async def _kill(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    await process.wait()


async def start_producers(db: BenchDatabase, indexes: Iterable[int]) -> list[Producer]:
    """Producers ``indexes``, started at once; none is left running if one fails."""
    started = await asyncio.gather(
        *(Producer.start(db, index) for index in indexes), return_exceptions=True
    )
    producers = [p for p in started if isinstance(p, Producer)]
    failure = next((p for p in started if isinstance(p, BaseException)), None)
    if failure is not None:
        await close_producers(producers)
        raise failure
    return producers


async def close_producers(producers: Sequence[Producer]) -> None:
    results = await asyncio.gather(*(p.close() for p in producers), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            print(f"  {result}", file=sys.stderr, flush=True)


# --- trickles -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Trickle:
    """What the producers reported: n -> commit time, n -> its place in its producer's schedule,
    and the most any enqueue started after its deadline (seconds)."""

    commits: dict[int, float]
    slots: dict[int, int]
    late: float
    spacing: float
    count: int

    def measured(self) -> list[int]:
        """The items past each producer's warm-up."""
        skip = warmup(self.spacing, self.count)
        return [n for n, slot in self.slots.items() if slot >= skip and n in self.commits]


async def trickle(
    producers: Sequence[Producer],
    mode: str,
    spacing: float,
    count: int,
    *,
    firsts: Sequence[int] | None = None,
    **fields: Any,  # noqa: ANN401 - JSON
) -> Trickle:
    """Each producer enqueues ``count`` items ``spacing`` seconds apart (``mode``: see
    ``benchmarks/_producer.py``), producer ``k`` offset by ``k * spacing / len(producers)``;
    item numbers from ``firsts`` (else fresh ones)."""
    start_at = time.monotonic() + LEAD
    slots: dict[int, int] = {}
    for k, producer in enumerate(producers):
        first = firsts[k] if firsts is not None else producer.reserve(count)
        slots.update((first + i, i) for i in range(count))
        producer.send(
            cmd="trickle",
            mode=mode,
            first=first,
            count=count,
            spacing=spacing,
            start_at=start_at + spacing * k / len(producers),
            **fields,
        )
    within = LEAD + spacing * count + 60.0
    answers = await asyncio.gather(*(p.reply(within) for p in producers))
    commits = {int(n): float(t) for answer in answers for n, t in answer["commits"]}
    if len(commits) != len(slots):
        raise BenchmarkError(f"trickle {mode}: {len(commits)} commits of {len(slots)} enqueues")
    late = max(float(answer["late"]) for answer in answers)
    return Trickle(commits, slots, late, spacing, count)


class Starts:
    """n -> the monotonic times at which its handler (sink, claim) started here."""

    def __init__(self) -> None:
        self.at: dict[int, list[float]] = {}
        self._changed = asyncio.Event()

    def mark(self, n: int) -> None:
        self.at.setdefault(n, []).append(time.monotonic())
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def started(self, n: int, times: int = 1) -> bool:
        return len(self.at.get(n, ())) >= times

    async def wait_for(self, ns: Iterable[int], within: float, *, times: int = 1) -> None:
        """Until every item of ``ns`` started ``times`` times; BenchmarkError after ``within``."""
        pending = list(ns)
        try:
            async with asyncio.timeout(within):
                while pending:
                    pending = [n for n in pending if not self.started(n, times)]
                    if pending:
                        await self._changed.wait()
        except TimeoutError as exc:
            raise BenchmarkError(
                f"{len(pending)} items (e.g. {pending[:3]}) did not start within {within:.0f} s"
            ) from exc


def latencies(done: Trickle, starts: Starts, *, start: int = 0) -> list[float]:
    """Milliseconds from each measured item's commit to its ``start``-th start here."""
    return [(starts.at[n][start] - done.commits[n]) * 1000.0 for n in done.measured()]


def describe(label: str, done: Trickle, values: Sequence[float]) -> str:
    """One progress line: percentiles, sample count and how well the schedule was kept."""
    ordered = sorted(values)
    if not ordered:
        return f"{label}: no samples"

    def at(fraction: float) -> float:
        return ordered[max(1, math.ceil(fraction * len(ordered))) - 1]

    times = sorted(done.commits.values())
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    achieved = (len(times) - 1) / span if span > 0 else math.inf
    producers = max(1, round(len(done.commits) / done.count)) if done.count else 1
    return (
        f"{label}: p50 {at(0.5):.2f} / p90 {at(0.9):.2f} / p99 {at(0.99):.2f} ms"
        f" ({len(ordered)} of {len(done.commits)}; commits {achieved:,.0f}/s of"
        f" {producers / done.spacing:,.0f}/s scheduled, starts late by <= {done.late * 1000:.1f}"
        " ms)"
    )


async def wait_live(listener: Listener | None) -> None:
    """Until ``listener`` heard its probe (a trickle into a listener not yet live would time
    its first poll, not its wake)."""
    if listener is not None:
        async with asyncio.timeout(30):
            await listener.wait_live()


# --- who picks the trickle up --------------------------------------------------------------------


async def ship_pickup(
    engine: AsyncEngine,
    producers: Sequence[Producer],
    spacing: float,
    count: int,
    *,
    job_id: str,
    log: Callable[[str], None],
    label: str = "ship",
) -> list[float]:
    """A worker runtime here at the library's defaults (``create_job_backend(database=engine)``:
    poll interval 1 s, listening) picks up a ``ship`` trickle: commit -> handler's first line."""
    starts = Starts()

    async def handler(_ctx: JobContext, payload: dict[str, Any]) -> None:
        starts.mark(payload["n"])

    job: JobDefinition[dict[str, Any]] = define_job(job_id, handler, payload=dict)
    backend = create_job_backend(database=engine)
    runtime = await start_job_runtime(job, backend=backend)
    try:
        await wait_live(backend.listener)
        done = await trickle(producers, "ship", spacing, count, job_id=job_id)
        await starts.wait_for(done.commits, PICKED_UP_WITHIN)
    finally:
        await runtime.stop()
    values = latencies(done, starts)
    log(describe(f"{label:<6} {_ms(spacing)} x{len(producers)}", done, values))
    return values


async def raw_pickup(
    db: BenchDatabase,
    producers: Sequence[Producer],
    spacing: float,
    count: int,
    *,
    job_id: str,
    table: str,
    channel: str,
    log: Callable[[str], None],
) -> list[float]:
    """The floor: a ``raw`` trickle (INSERT + pg_notify in one autocommitted statement) heard by
    a raw asyncpg LISTEN here, whose notification wakes a loop claiming with one SKIP LOCKED
    statement (again while a claim comes back full): commit -> the claim returned the row."""
    sql = job_sql(table)
    dsn = asyncpg_dsn(db.url)
    listener = await asyncpg.connect(dsn)
    consumer = await asyncpg.connect(dsn)
    starts = Starts()
    wake = asyncio.Event()

    def notified(*_args: object) -> None:
        wake.set()

    async def worker() -> None:
        while True:
            await wake.wait()
            wake.clear()
            while True:
                rows = await consumer.fetch(sql.claim, job_id, "raw", RAW_CLAIM)
                for row in rows:
                    starts.mark(int(row["id"].removeprefix("raw-")))
                if len(rows) < RAW_CLAIM:
                    break

    task: asyncio.Task[None] | None = None
    try:
        await listener.add_listener(channel, notified)
        task = asyncio.get_running_loop().create_task(worker())
        done = await trickle(
            producers, "raw", spacing, count, job_id=job_id, raw_table=table, channel=channel
        )
        await starts.wait_for(done.commits, PICKED_UP_WITHIN)
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await listener.close()
        await consumer.close()
    values = latencies(done, starts)
    log(describe(f"raw    {_ms(spacing)} x{len(producers)}", done, values))
    return values


async def relay_pickup(
    engine: AsyncEngine,
    producers: Sequence[Producer],
    spacing: float,
    count: int,
    *,
    outbox_id: str,
    log: Callable[[str], None],
) -> list[float]:
    """An outbox relay here at its defaults (``create_outbox(database=engine)``,
    ``start_outbox_relay(outbox, outbox_id, sink)``: poll interval 1 s, listening) picks up an
    ``outbox`` trickle: commit -> the sink called with the message."""
    starts = Starts()

    async def sink(message: OutboxMessage) -> None:
        starts.mark(message.payload["n"])

    relay = await start_outbox_relay(create_outbox(database=engine), outbox_id, sink)
    try:
        await wait_live(relay.listener)
        done = await trickle(producers, "outbox", spacing, count, outbox_id=outbox_id)
        await starts.wait_for(done.commits, PICKED_UP_WITHIN)
    finally:
        await relay.stop()
    values = latencies(done, starts)
    log(describe(f"relay  {_ms(spacing)} x{len(producers)}", done, values))
    return values


def _ms(spacing: float) -> str:
    return f"{spacing * 1000:>5g} ms"
