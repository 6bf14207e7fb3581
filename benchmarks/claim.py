"""claim: what one claim of 50 costs as the backlog grows, for job runs and outbox messages.

Each backlog is its own table (built by the ship factory), loaded with INSERT ... SELECT
generate_series and VACUUM (ANALYZE)d, then kept at its size: every claimed batch is settled
(complete, for both) and replaced by as many new rows, outside the timed part. A figure is
the median claim latency; its baseline is a raw asyncpg claim of the same size walking the same
partial index with SKIP LOCKED, on the same table, in the same round. The growth figures divide
the largest backlog's latency by the smallest's, per round; the target is on ship_sqla's growth,
the raw claim's growth beside it shows what the server itself does.

ship_sqla's job claim is a transaction (BEGIN, per-job advisory lock, the claim, COMMIT: four
round trips) where the raw claim is one autocommitted statement, so expect a ratio above 2x at
every backlog; what must not happen is the latency growing with the backlog.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import MetaData, Table

from benchmarks._harness import (
    Bench,
    BenchDatabase,
    BenchmarkError,
    Figure,
    Stopwatch,
    Target,
    measure_pair,
    median,
)
from benchmarks._raw_sql import JobSQL, OutboxSQL, job_sql, outbox_sql
from ship_sqla import JobContext, create_outbox, define_job, ship_outbox_table
from ship_sqla._jobs import (
    PostgresJobBackend,
    create_job_backend,
    ship_job_runs_table,
    ship_job_state_table,
)
from ship_sqla.jobs import Concurrency, JobDefinition
from ship_sqla.kernel import completed
from ship_sqla.kernel._ports import ClaimRequest

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from ship_sqla.outbox import Outbox

__all__ = ["NAME", "run"]

NAME = "claim"
JOB_ID = "bench.claim"
OUTBOX_ID = "bench"
BATCH = 50
LEASE = 30.0
FULL_BACKLOGS = (1_000, 100_000, 1_000_000)
QUICK_BACKLOGS = (1_000, 100_000)


def _label(size: int) -> str:
    return f"{size // 1_000_000}M" if size >= 1_000_000 else f"{size // 1_000}k"


async def _noop(_ctx: JobContext, _payload: dict[str, Any]) -> None:
    return None


JOB: JobDefinition[dict[str, Any]] = define_job(
    JOB_ID, _noop, payload=dict, concurrency=Concurrency(max=2 * BATCH)
)
CLAIM = ClaimRequest(JOB.id, "bench", BATCH, JOB.concurrency.max, JOB.concurrency.lease)


@dataclass(slots=True)
class _Backlog:
    size: int
    runs: Table
    messages: Table
    backend: PostgresJobBackend
    outbox: Outbox
    job_sql: JobSQL
    outbox_sql: OutboxSQL

    @property
    def label(self) -> str:
        return _label(self.size)


def _backlog(db: BenchDatabase, metadata: MetaData, size: int) -> _Backlog:
    suffix = _label(size).lower()
    runs = ship_job_runs_table(metadata, name=f"runs_{suffix}")
    messages = ship_outbox_table(metadata, name=f"outbox_{suffix}")
    return _Backlog(
        size=size,
        runs=runs,
        messages=messages,
        backend=create_job_backend(database=db.engine, table=runs),
        outbox=create_outbox(database=db.engine, table=messages),
        job_sql=job_sql(runs.name),
        outbox_sql=outbox_sql(messages.name),
    )


def _ms(seconds: float) -> float:
    return seconds * 1000.0


def _check(got: int, what: str) -> None:
    if got != BATCH:
        raise BenchmarkError(f"claim: {what} returned {got} rows, expected {BATCH}")


async def _timed_claims(
    claims: int,
    claim: Callable[[], Awaitable[Sequence[Any]]],
    settle: Callable[[Sequence[Any]], Awaitable[None]],
    what: str,
) -> list[float]:
    """``claims`` times: time one claim of BATCH, then settle what it took and refill the
    backlog to its size (untimed). Latencies in ms."""
    latencies = []
    for _ in range(claims):
        with Stopwatch() as watch:
            taken = await claim()
        _check(len(taken), what)
        latencies.append(_ms(watch.seconds))
        await settle(taken)
    return latencies


async def _ship_jobs(backlog: _Backlog, conn: Any, claims: int) -> list[float]:  # noqa: ANN401
    async def settle(runs: Sequence[Any]) -> None:
        await backlog.backend.settle([completed(run) for run in runs])
        await conn.execute(backlog.job_sql.refill_waiting, JOB_ID, len(runs))

    return await _timed_claims(
        claims,
        partial(backlog.backend.claim, CLAIM),
        settle,
        f"job claim at {backlog.label}",
    )


async def _raw_jobs(backlog: _Backlog, conn: Any, claims: int) -> list[float]:  # noqa: ANN401
    sql = backlog.job_sql

    async def settle(rows: Sequence[Any]) -> None:
        await conn.execute(sql.complete, [r[0] for r in rows], [r[1] for r in rows])
        await conn.execute(sql.refill_waiting, JOB_ID, len(rows))

    return await _timed_claims(
        claims,
        partial(conn.fetch, sql.claim, JOB_ID, "raw", BATCH),
        settle,
        f"raw job claim at {backlog.label}",
    )


async def _ship_outbox(backlog: _Backlog, conn: Any, claims: int) -> list[float]:  # noqa: ANN401
    async def settle(messages: Sequence[Any]) -> None:
        await backlog.outbox.complete_many(messages)
        await conn.execute(backlog.outbox_sql.refill_pending, OUTBOX_ID, len(messages))

    return await _timed_claims(
        claims,
        partial(backlog.outbox.claim, OUTBOX_ID, BATCH, LEASE, worker="bench"),
        settle,
        f"outbox claim at {backlog.label}",
    )


async def _raw_outbox(backlog: _Backlog, conn: Any, claims: int) -> list[float]:  # noqa: ANN401
    sql = backlog.outbox_sql

    async def settle(rows: Sequence[Any]) -> None:
        await conn.execute(sql.complete, [r[0] for r in rows], [r[1] for r in rows])
        await conn.execute(sql.refill_pending, OUTBOX_ID, len(rows))

    return await _timed_claims(
        claims,
        partial(conn.fetch, sql.claim, OUTBOX_ID, "raw", BATCH),
        settle,
        f"raw outbox claim at {backlog.label}",
    )


_KINDS = {
    "jobs": (_ship_jobs, _raw_jobs),
    "outbox": (_ship_outbox, _raw_outbox),
}


async def _load(
    bench: Bench, db: BenchDatabase, backlogs: list[_Backlog], metadata: MetaData
) -> None:
    # Every claim reads the job's pause row in the state table (K3): the backends share one.
    if "ship_job_state" not in metadata.tables:
        ship_job_state_table(metadata)
    async with db.engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    conn = await db.raw()
    for backlog in backlogs:
        bench.log(f"loading {backlog.size:,} waiting runs and {backlog.size:,} pending messages")
        await conn.execute(backlog.job_sql.load_waiting, JOB_ID, backlog.size)
        await conn.execute(backlog.outbox_sql.load_pending, OUTBOX_ID, backlog.size)
        await conn.execute(f"VACUUM (ANALYZE) {backlog.runs.name}")
        await conn.execute(f"VACUUM (ANALYZE) {backlog.messages.name}")


async def run(bench: Bench) -> list[Figure]:
    sizes = QUICK_BACKLOGS if bench.quick else FULL_BACKLOGS
    claims = 30 if bench.quick else 100
    # per (kind, backlog label): the per-round medians of ship and of raw
    ours: dict[tuple[str, str], list[float]] = {}
    theirs: dict[tuple[str, str], list[float]] = {}
    async with bench.database(NAME) as db:
        metadata = MetaData()
        backlogs = [_backlog(db, metadata, size) for size in sizes]
        await _load(bench, db, backlogs, metadata)
        conn = await db.raw()
        for backlog in backlogs:  # warm-up: plans, prepared statements, caches
            for ship, raw in _KINDS.values():
                await ship(backlog, conn, 5)
                await raw(backlog, conn, 5)
        for index in range(bench.rounds):
            order = backlogs[index % len(backlogs) :] + backlogs[: index % len(backlogs)]
            for backlog in order:
                await conn.execute(f"VACUUM (ANALYZE) {backlog.runs.name}")
                await conn.execute(f"VACUUM (ANALYZE) {backlog.messages.name}")
                for kind, (ship, raw) in _KINDS.items():
                    mine, base = await measure_pair(
                        index,
                        partial(ship, backlog, conn, claims),
                        partial(raw, backlog, conn, claims),
                    )
                    key = (kind, backlog.label)
                    ours.setdefault(key, []).append(median(mine))
                    theirs.setdefault(key, []).append(median(base))
                    bench.log(
                        f"round {index + 1} {kind:6} @{backlog.label:>4}:"
                        f" ship {ours[key][-1]:.2f} ms, raw {theirs[key][-1]:.2f} ms"
                    )
    return _figures(bench, sizes, claims, ours, theirs)


def _figures(
    bench: Bench,
    sizes: tuple[int, ...],
    claims: int,
    ours: dict[tuple[str, str], list[float]],
    theirs: dict[tuple[str, str], list[float]],
) -> list[Figure]:
    small, large = _label(sizes[0]), _label(sizes[-1])
    figures = []
    for kind in _KINDS:
        for size in sizes:
            key = (kind, _label(size))
            figures.append(
                Figure.from_rounds(
                    f"claim.{kind}@{key[1]}",
                    "ms",
                    ours[key],
                    theirs[key],
                    baseline_label=f"raw SKIP LOCKED claim of {BATCH}",
                    note=f"median of {claims} claims of {BATCH} per round"
                    if size == sizes[0]
                    else "",
                )
            )
        growth = [b / a for a, b in zip(ours[kind, small], ours[kind, large], strict=True)]
        raw_growth = [b / a for a, b in zip(theirs[kind, small], theirs[kind, large], strict=True)]
        quick = " (quick mode: 1M not measured)" if bench.quick else ""
        figures.append(
            Figure.from_rounds(
                f"claim.{kind}.growth_{large}_vs_{small}",
                "x",
                growth,
                raw_growth,
                baseline_label=f"raw claim {large}/{small}",
                targets=(Target("value", "<=", 1.5),),
                note=f"claim latency at {large} over latency at {small}, per round{quick}",
            )
        )
    return figures
