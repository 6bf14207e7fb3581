"""sql_enqueue (opt-in): what the SQL enqueue API (SPEC §18, E1) costs the server.

``sql_enqueue.single_us``: server microseconds per ``<runs>_enqueue_v1`` call of a plain job
(no dedupe key, no cap; a due run, so K8's announce rule runs too), timed inside the server
by a PL/pgSQL loop (``clock_timestamp()`` around N calls: no network, no client). Baseline: the
same loop around a plain ``INSERT`` of the same row into a runs table of the same shape.
Target (issue #40): at most 2.5x.

``sql_enqueue.bulk_us_per_row``: wall microseconds per row of one ``<runs>_enqueue_many_v1``
call of 1,000 requests from asyncpg, against ``enqueue_many`` of the same 1,000 payloads
through the Python backend. Target: at most 1.3x.
"""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import MetaData

from benchmarks._harness import Bench, BenchDatabase, Figure, Target, paired_rounds
from ship_sqla import define_job
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._sql_api import (
    install_sql_enqueue,
    ship_job_definitions_table,
    sync_job_definitions,
)
from ship_sqla.jobs import EnqueueRequest

__all__ = ["NAME", "run"]

NAME = "sql_enqueue"
JOB_ID = "bench.sql"
RAW_TABLE = "raw_job_runs"
BULK = 1000

_LOOPS = f"""
CREATE OR REPLACE FUNCTION bench_sql_loop(n integer) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz := clock_timestamp();
BEGIN
    FOR i IN 1..n LOOP
        PERFORM ship_job_runs_enqueue_v1('{JOB_ID}', '{{"n": 1}}');
    END LOOP;
    RETURN extract(epoch FROM clock_timestamp() - t0) * 1e6 / n;
END $$;
CREATE OR REPLACE FUNCTION bench_raw_loop(n integer) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz := clock_timestamp();
BEGIN
    FOR i IN 1..n LOOP
        INSERT INTO {RAW_TABLE} (id, job_id, state, payload, attempt, max_attempts, run_at,
            created_at, updated_at, history, priority)
        VALUES (gen_random_uuid()::text, '{JOB_ID}', 'waiting', '{{"n": 1}}', 0, 5, now(),
            now(), now(), '[]', 0);
    END LOOP;
    RETURN extract(epoch FROM clock_timestamp() - t0) * 1e6 / n;
END $$;
"""


async def noop(_ctx: Any, _payload: Any) -> None:  # noqa: ANN401 - a benchmark's handler
    return None


JOB = define_job(JOB_ID, noop, payload=dict)


async def _setup(db: BenchDatabase) -> Any:  # noqa: ANN401 - the backend
    await db.create_job_tables(raw=RAW_TABLE)
    metadata = MetaData()
    runs, state = ship_job_runs_table(metadata), ship_job_state_table(metadata)
    defs = ship_job_definitions_table(metadata)
    async with db.engine.begin() as connection:
        await connection.run_sync(defs.create)
        await install_sql_enqueue(connection, runs, state, defs)
        await sync_job_definitions(connection, defs, [JOB])
    raw = await db.raw()
    await raw.execute(_LOOPS)
    return create_job_backend(database=db.engine, table=runs, state_table=state)


async def run(bench: Bench) -> list[Figure]:
    count = 200 if bench.quick else 2000
    async with bench.database(NAME) as db:
        backend = await _setup(db)
        raw = await db.raw()
        requests = [EnqueueRequest({"n": i}) for i in range(BULK)]
        bulk_json = json.dumps([{"job_id": JOB_ID, "payload": {"n": i}} for i in range(BULK)])

        async def sql_single() -> float:
            return float(await raw.fetchval("SELECT bench_sql_loop($1)", count))

        async def raw_single() -> float:
            return float(await raw.fetchval("SELECT bench_raw_loop($1)", count))

        async def sql_bulk() -> float:
            begun = time.perf_counter()
            await raw.fetch("SELECT * FROM ship_job_runs_enqueue_many_v1($1::jsonb)", bulk_json)
            return (time.perf_counter() - begun) * 1e6 / BULK

        async def python_bulk() -> float:
            begun = time.perf_counter()
            await backend.enqueue_many(JOB, requests)
            return (time.perf_counter() - begun) * 1e6 / BULK

        await sql_single(), await raw_single(), await sql_bulk(), await python_bulk()  # warm-up
        single, plain = await paired_rounds(bench.rounds, sql_single, raw_single)
        bulk, python = await paired_rounds(bench.rounds, sql_bulk, python_bulk)
    return [
        Figure.from_rounds(
            "sql_enqueue.single_us",
            "us",
            single,
            plain,
            baseline_label="plain INSERT of the same row (server us, PL/pgSQL loop)",
            targets=(Target("ratio", "<=", 2.5),),
            note=f"{count} calls per round in one server-side loop",
        ),
        Figure.from_rounds(
            "sql_enqueue.bulk_us_per_row",
            "us",
            bulk,
            python,
            baseline_label=f"enqueue_many of {BULK} (Python backend, wall us per row)",
            targets=(Target("ratio", "<=", 1.3),),
            note=f"one enqueue_many_v1 call of {BULK} requests from asyncpg, wall us per row",
        ),
    ]
