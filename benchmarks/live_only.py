"""J16 live runs only: the runs table's size over millions of runs, and the drain beside a
large history (issue 39's targets; not part of the suite, like ``settle_history``).

1. **Runs table size.** ``--runs`` (1,000,000) runs enqueued (``enqueue_many`` of 1,000),
   claimed (1,000 a claim) and completed through the backend's own ports, on a backend built
   with ``history_table`` (J16: a finished run leaves the runs table); then ``VACUUM`` and the
   runs table's ``pg_total_relation_size`` (heap + indexes + TOAST). Then ``--more``
   (2,000,000) runs the same way, ``VACUUM``, and the size again. Targets: <= 32 MiB after the
   first, within +-10 % after the rest.
2. **Drain beside history.** After the first ``--runs``: ``--drain`` (20,000) noop runs
   pre-enqueued and drained by one ``start_job_runtime`` (``max_in_flight`` 1,000), once in
   this schema (``--runs`` finished runs in history) and once in a fresh one (empty), rounds
   alternating; the figure is every statement's server time on that schema during the drain
   (``pg_stat_statements``) per drained run. Target: <= 1.10x the empty schema's.

    python -m benchmarks.live_only --url postgresql+asyncpg://postgres@127.0.0.1:55434/postgres

Needs ``pg_stat_statements`` loaded (``shared_preload_libraries``) and creatable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from benchmarks._harness import Countdown
from benchmarks.settle_history import WORKER, _ensure_database, _fresh, _tables
from ship_sqla import create_job_backend, define_job, ship_job_workers_table, start_job_runtime
from ship_sqla.jobs import Concurrency, EnqueueRequest
from ship_sqla.kernel import completed
from ship_sqla.kernel._ports import ClaimRequest

if TYPE_CHECKING:
    from ship_sqla._jobs._backend import PostgresJobBackend

FULL = "live_full"
EMPTY = "live_empty"
IN_FLIGHT = 1000


async def noop(ctx: object, payload: object) -> None:  # noqa: ARG001
    return None


FILL_JOB = define_job("bench.fill", noop, payload=dict, concurrency=Concurrency(max=100_000))


async def _fill(
    engine: AsyncEngine, tables: dict[str, Any], runs: int, maintain_every: int = 0
) -> tuple[float, dict[str, Any]]:
    """``runs`` runs through enqueue, claim and settle, with a maintenance pass (J17: the
    runs table's bloated indexes rebuilt) every ``maintain_every`` runs and at the end (0:
    none); returns the seconds it took and what the passes did (the runs table's largest total
    size seen before a pass, the indexes rebuilt)."""
    backend = create_job_backend(database=engine, listen=False, announce=False, **tables)
    await backend.require_support([FILL_JOB])
    request = ClaimRequest(
        job_id=FILL_JOB.id, worker=WORKER, limit=1000, max_running=None, lease=300.0
    )
    passes: dict[str, Any] = {"passes": 0, "largest_before_pass": 0, "rebuilt": 0}
    started = time.monotonic()
    done = 0
    while done < runs:
        size = min(10_000, runs - done)
        for start in range(0, size, 1000):
            count = min(1000, size - start)
            await backend.enqueue_many(FILL_JOB, [EnqueueRequest(payload={})] * count)
        settled = 0
        while settled < size:
            claimed = await backend.claim(request)
            if not claimed:
                break
            outcomes = await backend.settle([completed(run) for run in claimed])
            settled += sum(1 for outcome in outcomes if outcome == "completed")
        done += size
        if maintain_every and (done % maintain_every == 0 or done == runs):
            await _maintain(engine, backend, tables, passes)
    return time.monotonic() - started, passes


async def _maintain(
    engine: AsyncEngine, backend: PostgresJobBackend, tables: dict[str, Any], passes: dict[str, Any]
) -> None:
    table = tables["table"]
    async with engine.connect() as connection:
        total = await connection.scalar(
            text("SELECT pg_total_relation_size(CAST(:t AS regclass))"),
            {"t": f'"{table.schema}".{table.name}'},
        )
    done = await backend.maintain_history()
    passes["passes"] += 1
    passes["largest_before_pass"] = max(passes["largest_before_pass"], int(total or 0))
    passes["rebuilt"] += len(done.rebuilt)
    passes["last"] = done.to_dict()


async def _runs_table(engine: AsyncEngine, schema: str) -> dict[str, int]:
    async with engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        await connection.execute(text(f'VACUUM "{schema}".ship_job_runs'))
        row = (
            await connection.execute(
                text(
                    "SELECT pg_total_relation_size(CAST(:t AS regclass)),"
                    " pg_relation_size(CAST(:t AS regclass)),"
                    " pg_indexes_size(CAST(:t AS regclass)),"
                    f' (SELECT count(*) FROM "{schema}".ship_job_history)'
                ),
                {"t": f'"{schema}".ship_job_runs'},
            )
        ).one()
    return {
        "total": int(row[0]),
        "heap": int(row[1]),
        "indexes": int(row[2]),
        "history": int(row[3]),
    }


async def _server_ms(engine: AsyncEngine, schema: str) -> tuple[float, int]:
    async with engine.connect() as connection:
        row = (
            await connection.execute(
                text(
                    "SELECT coalesce(sum(total_exec_time), 0), coalesce(sum(calls), 0)"
                    " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database"
                    " WHERE datname = current_database()) AND query LIKE :schema"
                    # maintenance's DDL (a runtime's first pass creates days ahead; the J17
                    # rebuild of the runs table's indexes, REINDEX ... CONCURRENTLY, after the
                    # fill's churn) is not the drain's cost
                    " AND query !~* '^\\s*(CREATE|DROP|ALTER|ANALYZE|VACUUM|LOCK|REINDEX)'"
                ),
                {"schema": f"%{schema}.%"},
            )
        ).one()
    return float(row[0]), int(row[1])


async def _drain(
    engine: AsyncEngine, tables: dict[str, Any], schema: str, runs: int
) -> dict[str, float]:
    """``runs`` noop runs pre-enqueued, drained by one runtime: server µs per run, jobs/s."""
    counter = Countdown(runs)
    job = define_job(
        "bench.drain", counter.tick, payload=dict, concurrency=Concurrency(max=IN_FLIGHT)
    )
    workers = ship_job_workers_table(MetaData(schema=schema), schema=schema)
    async with engine.begin() as connection:
        await connection.run_sync(workers.create, checkfirst=True)
    backend = create_job_backend(database=engine, workers_table=workers, **tables)
    for start in range(0, runs, 1000):
        await backend.enqueue_many(job, [EnqueueRequest(payload={})] * min(1000, runs - start))
    async with engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        await connection.execute(text(f'VACUUM ANALYZE "{schema}".ship_job_runs'))
    before = await _server_ms(engine, schema)
    started = time.monotonic()
    runtime = await start_job_runtime(job, backend=backend, max_in_flight=IN_FLIGHT)
    try:
        async with asyncio.timeout(300):
            await counter.done.wait()
    finally:
        await runtime.stop()
    seconds = time.monotonic() - started
    after = await _server_ms(engine, schema)
    return {
        "server_us_per_run": 1000 * (after[0] - before[0]) / runs,
        "statements_per_run": (after[1] - before[1]) / runs,
        "jobs_per_s": runs / seconds,
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--more", type=int, default=2_000_000)
    parser.add_argument("--drain", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep the filled schema of an earlier run (its history rows) and only drain",
    )
    parser.add_argument(
        "--maintain-every",
        type=int,
        default=0,
        help="a maintenance pass (J17, the runs table's index rebuild) every N runs; 0: none",
    )
    args = parser.parse_args()
    engine = create_async_engine(await _ensure_database(args.url), pool_size=10, max_overflow=10)
    async with engine.begin() as connection:
        await connection.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
    if args.reuse:
        full = _tables(FULL, history=True)[1]
        first = await _runs_table(engine, FULL)
        print(json.dumps({"reused": FULL, **first}), flush=True)
    else:
        full = await _fresh(engine, FULL, history=True)
        seconds, passes = await _fill(engine, full, args.runs, args.maintain_every)
        first = await _runs_table(engine, FULL)
        print(
            json.dumps({"after_runs": args.runs, "fill_seconds": seconds, **first, **passes}),
            flush=True,
        )
    sides: dict[str, list[dict[str, float]]] = {"empty": [], "history": []}
    for _ in range(args.rounds):
        empty = await _fresh(engine, EMPTY, history=True)
        sides["empty"].append(await _drain(engine, empty, EMPTY, args.drain))
        sides["history"].append(await _drain(engine, full, FULL, args.drain))
        print(json.dumps({"round": {k: v[-1] for k, v in sides.items()}}), flush=True)
    ratios = [
        h["server_us_per_run"] / e["server_us_per_run"]
        for h, e in zip(sides["history"], sides["empty"], strict=True)
    ]
    if ratios:
        median = statistics.median(ratios)
        print(json.dumps({"drain_server_us_ratio_median": median, "ratios": ratios}))
    if args.more:
        seconds, passes = await _fill(engine, full, args.more, args.maintain_every)
        second = await _runs_table(engine, FULL)
        after = args.runs + args.more
        print(json.dumps({"after_runs": after, "fill_seconds": seconds, **second, **passes}))
        print(json.dumps({"size_ratio": second["total"] / first["total"]}))
    await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())
