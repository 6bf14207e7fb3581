"""J16/J18 settle cost, a same-sitting A/B (issue 39 item 1's targets; not part of the suite).

A: the in-place settle (``SETTLE_IF_TOKEN_CURRENT``, no history table given); B: live runs
only (``SETTLE_MOVING``: the ended run deleted from the runs table and inserted, slim, into
the partitioned history). Per round and side: ``--runs`` fresh runs enqueued, claimed and
completed in batches of ``--batch`` through the backend's own ports; the settle statement's
WAL bytes, calls and server time come from ``pg_stat_statements`` (a before/after difference
for this database, so other users of the cluster do not count). Rounds alternate A and B.

Then J18's byte budget: ``--bytes-runs`` completed runs into B's history (no payload kept),
``VACUUM ANALYZE``, and the completed partitions' heap + index + TOAST size per run.

    python -m benchmarks.settle_history --url postgresql+asyncpg://postgres@127.0.0.1:55432/postgres

Needs ``pg_stat_statements`` loaded (``shared_preload_libraries``) and creatable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ship_sqla import (
    create_job_backend,
    define_job,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
)
from ship_sqla.jobs import Concurrency, EnqueueRequest
from ship_sqla.kernel import completed
from ship_sqla.kernel._ports import ClaimRequest

DATABASE = "ship_bench_settle_history"
WORKER = "web-1:4242:a1b2c3"
"""A worker id of the registry's shape (host:pid:hex), stored with each ended run (J18)."""


async def noop(ctx: object, payload: object) -> None:  # noqa: ARG001
    return None


JOB = define_job("bench.settle", noop, payload=dict, concurrency=Concurrency(max=100_000))


def _tables(schema: str, *, history: bool) -> tuple[MetaData, dict[str, Any]]:
    metadata = MetaData(schema=schema)
    runs = ship_job_runs_table(metadata, schema=schema)
    tables: dict[str, Any] = {
        "table": runs,
        "state_table": ship_job_state_table(metadata, schema=schema),
        "steps_table": ship_job_steps_table(
            metadata, schema=schema, runs_table=runs.name, runs_fkey=not history
        ),
    }
    if history:
        tables["history_table"] = ship_job_history_table(metadata, schema=schema)
    return metadata, tables


async def _fresh(engine: AsyncEngine, schema: str, *, history: bool) -> dict[str, Any]:
    metadata, tables = _tables(schema, history=history)
    async with engine.begin() as connection:
        await connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        await connection.execute(text(f'CREATE SCHEMA "{schema}"'))
        await connection.run_sync(metadata.create_all)
    return tables


async def _settle_stats(engine: AsyncEngine, schema: str) -> tuple[int, float, int, int]:
    """(calls, total_exec_time ms, wal_bytes, rows) of the settle statements on ``schema``."""
    async with engine.connect() as connection:
        row = (
            await connection.execute(
                text("""
SELECT coalesce(sum(s.calls), 0), coalesce(sum(s.total_exec_time), 0),
       coalesce(sum(s.wal_bytes), 0), coalesce(sum(s.rows), 0)
FROM pg_stat_statements s
WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND s.query LIKE '%WITH settle AS%' AND s.query LIKE :schema
"""),
                {"schema": f"%{schema}.%"},
            )
        ).one()
    return int(row[0]), float(row[1]), int(row[2]), int(row[3])


async def _round(engine: AsyncEngine, schema: str, runs: int, batch: int) -> dict[str, float]:
    tables = await _fresh(engine, schema, history=schema.endswith("b"))
    backend = create_job_backend(database=engine, listen=False, announce=False, **tables)
    await backend.require_support([JOB])
    requests = [EnqueueRequest(payload={"n": i}) for i in range(runs)]
    for start in range(0, runs, 1000):
        await backend.enqueue_many(JOB, requests[start : start + 1000])
    request = ClaimRequest(job_id=JOB.id, worker=WORKER, limit=batch, max_running=None, lease=300.0)
    before = await _settle_stats(engine, schema)
    settled = 0
    while settled < runs:
        claimed = await backend.claim(request)
        if not claimed:
            break
        outcomes = await backend.settle([completed(run) for run in claimed])
        settled += sum(1 for outcome in outcomes if outcome == "completed")
    after = await _settle_stats(engine, schema)
    calls, ms, wal, rows = (a - b for a, b in zip(after, before, strict=True))
    return {
        "settled": settled,
        "calls": calls,
        "wal_per_run": wal / max(settled, 1),
        "server_us_per_settle": 1000 * ms / max(calls, 1),
        "server_us_per_run": 1000 * ms / max(settled, 1),
        "rows": rows,
    }


async def _history_bytes(engine: AsyncEngine, runs: int, batch: int) -> dict[str, float]:
    """J18: bytes per completed run in history (payload not kept), after VACUUM ANALYZE."""
    schema = "hist_bytes_b"
    await _round(engine, schema, runs, batch)
    async with engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        await connection.execute(text(f'VACUUM ANALYZE "{schema}".ship_job_history'))
        await connection.execute(text(f'VACUUM "{schema}".ship_job_runs'))
        sizes = (
            await connection.execute(
                text(f"""
SELECT coalesce(sum(pg_relation_size(c.oid)), 0) AS heap,
       coalesce(sum(pg_indexes_size(c.oid)), 0) AS indexes,
       coalesce(sum(pg_total_relation_size(c.oid)), 0) AS total,
       (SELECT count(*) FROM "{schema}".ship_job_history WHERE state = 'completed') AS n,
       (SELECT avg(pg_column_size(h.*)) FROM "{schema}".ship_job_history h) AS row_bytes,
       (SELECT pg_total_relation_size('"{schema}".ship_job_runs')) AS runs_table
FROM pg_class c
WHERE c.relkind = 'r' AND c.relnamespace = '"{schema}"'::regnamespace
  AND c.relname LIKE 'ship_job_history%'
""")
            )
        ).one()
    n = max(int(sizes.n), 1)
    return {
        "history_runs": int(sizes.n),
        "heap_bytes_per_run": float(sizes.heap) / n,
        "index_bytes_per_run": float(sizes.indexes) / n,
        "total_bytes_per_run": float(sizes.total) / n,
        "avg_row_bytes": float(sizes.row_bytes or 0),
        "runs_table_bytes_after": int(sizes.runs_table),
    }


async def _ensure_database(url: str) -> str:
    admin = create_async_engine(url, isolation_level="AUTOCOMMIT")
    async with admin.connect() as connection:
        exists = (
            await connection.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": DATABASE}
            )
        ).first()
        if exists is None:
            await connection.execute(text(f'CREATE DATABASE "{DATABASE}"'))
    await admin.dispose()
    return url.rsplit("/", 1)[0] + "/" + DATABASE


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--bytes-runs", type=int, default=100_000)
    args = parser.parse_args()
    engine = create_async_engine(await _ensure_database(args.url), pool_size=4)
    async with engine.begin() as connection:
        await connection.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
    results: dict[str, list[dict[str, float]]] = {"a_in_place": [], "b_moving": []}
    started = time.monotonic()
    for _ in range(args.rounds):  # --rounds 0: J18's bytes only
        results["a_in_place"].append(await _round(engine, "settle_a", args.runs, args.batch))
        results["b_moving"].append(await _round(engine, "settle_b", args.runs, args.batch))
    for side, rounds in results.items() if args.rounds else ():
        summary = {
            key: statistics.median(r[key] for r in rounds)
            for key in ("wal_per_run", "server_us_per_settle", "server_us_per_run")
        }
        spread = {
            key: (min(r[key] for r in rounds), max(r[key] for r in rounds))
            for key in ("wal_per_run", "server_us_per_settle")
        }
        print(json.dumps({"side": side, "median": summary, "range": spread, "rounds": rounds}))
    if args.rounds:
        a, b = (
            statistics.median(r["server_us_per_settle"] for r in results[k])
            for k in ("a_in_place", "b_moving")
        )
        print(json.dumps({"b_over_a_server_us_per_settle": b / a}))
    print(json.dumps({"j18": await _history_bytes(engine, args.bytes_runs, 1000)}))
    print(json.dumps({"seconds": time.monotonic() - started}))
    await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())
