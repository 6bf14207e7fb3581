"""What every benchmark shares: settings, figures, rounds, and a fresh database per benchmark."""

from __future__ import annotations

import asyncio
import itertools
import math
import secrets
import statistics
import sys
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Self, TypeVar

import asyncpg
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ship_sqla._jobs import (
    ship_job_events_table,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
    ship_job_workers_table,
)
from ship_sqla.testing import DatabaseFactory, ResolvedServer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence

    from sqlalchemy.engine import URL

__all__ = [
    "Bench",
    "BenchDatabase",
    "BenchmarkError",
    "Countdown",
    "Figure",
    "Settings",
    "Stopwatch",
    "Target",
    "latency_figures",
    "latency_percentiles",
    "measure_pair",
    "median",
    "ordered_ids",
    "paired_rounds",
    "percentile",
    "rate",
]

T = TypeVar("T")

DATABASE_PREFIX = "ship_sqla_bench_"


class BenchmarkError(RuntimeError):
    """A benchmark could not produce a valid figure (e.g. a drain left runs unfinished)."""


@dataclass(frozen=True, slots=True)
class Settings:
    """``quick``: smaller sizes so the whole suite takes under a minute; ``rounds``: how many
    paired rounds each figure is the median of."""

    quick: bool
    rounds: int

    @property
    def mode(self) -> str:
        return "quick" if self.quick else "full"


@dataclass(frozen=True, slots=True)
class Target:
    """A bound on a figure's ``value`` or on its ``ratio`` to the baseline."""

    on: Literal["value", "ratio"]
    op: Literal[">=", "<="]
    bound: float

    def met_by(self, figure: Figure) -> bool:
        observed = figure.value if self.on == "value" else figure.ratio
        if observed is None or math.isnan(observed):
            return False
        return observed >= self.bound if self.op == ">=" else observed <= self.bound

    def describe(self, unit: str) -> str:
        suffix = f" {unit}" if self.on == "value" else "x"
        return f"{self.on} {self.op} {self.bound:g}{suffix}"


def ordered_ids() -> Iterator[str]:
    """36-character text ids that increase in generation order, like ship's UUIDv7 run ids, so a
    baseline's primary-key inserts land on the right edge of the index as the library's do."""
    prefix = f"{time.time_ns():016x}-{secrets.token_hex(4)}-"
    for n in itertools.count():
        yield f"{prefix}{n:010x}"


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else math.nan


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (``fraction`` in 0..1) of a non-empty sample."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def latency_percentiles(bench: Bench, what: str, latencies: Sequence[float]) -> tuple[float, float]:
    """``(p50, p99)`` of one round's latencies in ms, logged as ``what``."""
    p50, p99 = percentile(latencies, 0.50), percentile(latencies, 0.99)
    bench.log(f"{what}: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    return p50, p99


def latency_figures(
    name: str,
    ours: Sequence[tuple[float, float]],
    theirs: Sequence[tuple[float, float]],
    *,
    baseline_label: str,
    p50_targets: tuple[Target, ...] = (),
    p99_targets: tuple[Target, ...] = (),
    note: str = "",
) -> list[Figure]:
    """``name.p50`` and ``name.p99`` (ms) from paired rounds of :func:`latency_percentiles`."""
    return [
        Figure.from_rounds(
            f"{name}.p{percent}",
            "ms",
            [pair[index] for pair in ours],
            [pair[index] for pair in theirs],
            baseline_label=baseline_label,
            targets=targets,
            note=note if index == 0 else "",
        )
        for index, (percent, targets) in enumerate(((50, p50_targets), (99, p99_targets)))
    ]


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else math.inf


@dataclass(frozen=True, slots=True)
class Figure:
    """One measured figure: the median of its rounds, beside the baseline's median.

    ``ratio`` is the median of the per-round ratios value/baseline (each round measured both back
    to back), which resists the drift of a shared machine better than a ratio of medians.
    """

    name: str
    value: float
    unit: str
    baseline: float | None
    baseline_label: str
    ratio: float | None
    targets: tuple[Target, ...] = ()
    rounds: tuple[float, ...] = ()
    baseline_rounds: tuple[float, ...] = ()
    note: str = ""

    @classmethod
    def from_rounds(
        cls,
        name: str,
        unit: str,
        values: Sequence[float],
        baselines: Sequence[float] | None,
        *,
        baseline_label: str,
        targets: tuple[Target, ...] = (),
        note: str = "",
    ) -> Figure:
        ratio: float | None = None
        if baselines:
            ratio = median([v / b for v, b in zip(values, baselines, strict=True) if b])
        return cls(
            name=name,
            value=median(values),
            unit=unit,
            baseline=median(baselines) if baselines else None,
            baseline_label=baseline_label,
            ratio=ratio,
            targets=targets,
            rounds=tuple(values),
            baseline_rounds=tuple(baselines or ()),
            note=note,
        )

    @property
    def target(self) -> str | None:
        if not self.targets:
            return None
        return " and ".join(t.describe(self.unit) for t in self.targets)

    @property
    def met(self) -> bool | None:
        """None when the figure has no target."""
        if not self.targets:
            return None
        return all(t.met_by(self) for t in self.targets)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "figure",
            "name": self.name,
            "value": _finite(self.value),
            "unit": self.unit,
            "baseline": _finite(self.baseline),
            "baseline_label": self.baseline_label,
            "ratio": _finite(self.ratio),
            "target": self.target,
            "met": self.met,
            "rounds": [_finite(v) for v in self.rounds],
            "baseline_rounds": [_finite(v) for v in self.baseline_rounds],
            "note": self.note,
        }


def _finite(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, 6)


async def measure_pair(
    index: int, ship: Callable[[], Awaitable[T]], raw: Callable[[], Awaitable[T]]
) -> tuple[T, T]:
    """Round ``index`` of a (library, baseline) pair: even rounds measure the library first, odd
    rounds the baseline, so neither always gets the warmer (or the noisier) slot."""
    if index % 2 == 0:
        ours = await ship()
        return ours, await raw()
    theirs = await raw()
    return await ship(), theirs


async def paired_rounds(
    rounds: int,
    ship: Callable[[], Awaitable[T]],
    raw: Callable[[], Awaitable[T]],
) -> tuple[list[T], list[T]]:
    """``rounds`` pairs from :func:`measure_pair`: (the library's figures, the baseline's)."""
    ours: list[T] = []
    theirs: list[T] = []
    for index in range(rounds):
        mine, base = await measure_pair(index, ship, raw)
        ours.append(mine)
        theirs.append(base)
    return ours, theirs


class Stopwatch:
    """``with Stopwatch() as watch: ...``; then ``watch.seconds`` (wall time, perf_counter)."""

    __slots__ = ("_start", "seconds")

    def __init__(self) -> None:
        self._start = 0.0
        self.seconds = 0.0

    def __enter__(self) -> Self:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *_: object) -> None:
        self.seconds = time.perf_counter() - self._start


class Countdown:
    """Counts calls of ``tick`` (a job handler or an outbox sink: any arguments); ``done`` is set
    at the ``expected``-th. ``reset`` starts a new count."""

    __slots__ = ("count", "done", "expected")

    def __init__(self, expected: int = 0) -> None:
        self.expected = expected
        self.count = 0
        self.done = asyncio.Event()

    def reset(self, expected: int) -> None:
        self.expected = expected
        self.count = 0
        self.done = asyncio.Event()

    def hit(self) -> None:
        self.count += 1
        if self.count == self.expected:
            self.done.set()

    async def tick(self, *_: object) -> None:
        self.hit()


@dataclass(slots=True)
class BenchDatabase:
    """A private database for one benchmark: a pooled SQLAlchemy engine and raw asyncpg access."""

    name: str
    url: URL
    engine: AsyncEngine
    _raw: list[asyncpg.Connection] = field(default_factory=list)

    async def raw(self) -> asyncpg.Connection:
        """A plain asyncpg connection (closed with the database): the baselines' driver."""
        connection = await asyncpg.connect(asyncpg_dsn(self.url))
        self._raw.append(connection)
        return connection

    async def create_job_tables(self, *, raw: str | None = None) -> None:
        """The ship job tables with their default names (the worker registry's and the run
        history's too, F6 and J16, as a deployment has them), and a runs table named ``raw``
        for a raw baseline (same columns and indexes) when given."""
        metadata = MetaData()
        ship_job_runs_table(metadata)
        # J16's default shape, as `ship-sqla schema apply` creates it: the history beside the
        # runs table (declared before the steps table, which then has no key to the runs).
        ship_job_history_table(metadata)
        ship_job_state_table(metadata)
        ship_job_workers_table(metadata)
        ship_job_steps_table(metadata)
        ship_job_events_table(metadata)
        if raw is not None:
            ship_job_runs_table(metadata, name=raw)
        async with self.engine.begin() as connection:
            await connection.run_sync(metadata.create_all)

    async def maintain(self, *statements: str) -> None:
        """Run maintenance (VACUUM, ANALYZE, TRUNCATE) outside any transaction."""
        async with self.engine.connect() as connection:
            await connection.execution_options(isolation_level="AUTOCOMMIT")
            for statement in statements:
                await connection.execute(text(statement))

    async def close(self) -> None:
        for connection in self._raw:
            await connection.close()
        self._raw.clear()
        await self.engine.dispose()


def asyncpg_dsn(url: URL) -> str:
    """The asyncpg DSN of a ``postgresql+asyncpg`` URL (a socket ``?host=`` is kept)."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


class Bench:
    """Runs benchmarks on one server: settings, progress output, fresh databases."""

    def __init__(self, server: ResolvedServer, settings: Settings, *, verbose: bool) -> None:
        self.server = server
        self.settings = settings
        self._factory = DatabaseFactory(server)
        self._verbose = verbose

    @property
    def quick(self) -> bool:
        return self.settings.quick

    @property
    def rounds(self) -> int:
        return self.settings.rounds

    def log(self, message: str) -> None:
        """Progress for people, on stderr so stdout stays a table or JSON lines."""
        if self._verbose:
            print(f"  {message}", file=sys.stderr, flush=True)

    @asynccontextmanager
    async def kept_database(self, label: str) -> AsyncIterator[BenchDatabase]:
        """A database of a fixed name (``ship_sqla_bench_<label>``), created when missing and
        kept afterwards: a benchmark that seeds for minutes can be re-timed on the same seed
        (the benchmark itself tells a finished seed from an interrupted one and says how to
        drop it)."""
        name = f"{DATABASE_PREFIX}{label}"
        admin = await asyncpg.connect(asyncpg_dsn(self.server.url))
        try:
            exists = await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        finally:
            await admin.close()
        url = self.server.database_url(name) if exists else await self._factory.create(name)
        database = BenchDatabase(
            name=name, url=url, engine=create_async_engine(url, pool_size=10, max_overflow=10)
        )
        try:
            yield database
        finally:
            await database.close()

    async def drop_database(self, name: str) -> None:
        """Drop a database (a kept one whose seed was interrupted)."""
        await self._factory.drop(name)

    @asynccontextmanager
    async def database(self, label: str) -> AsyncIterator[BenchDatabase]:
        """A fresh database for one benchmark, dropped afterwards whatever happened."""
        name = f"{DATABASE_PREFIX}{label}_{secrets.token_hex(4)}"
        url = await self._factory.create(name)
        database = BenchDatabase(
            name=name, url=url, engine=create_async_engine(url, pool_size=10, max_overflow=10)
        )
        try:
            yield database
        finally:
            await database.close()
            await self._factory.drop(name)
