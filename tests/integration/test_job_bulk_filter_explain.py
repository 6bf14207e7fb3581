"""S2, J8, K2, J16, issue 36 item 5: each bulk-by-filter batch statement
(``_jobs/_sql/bulk.py``) finds its 1,000 runs by key (``<runs>_pkey``, the history partitions'
id indexes), never reading the runs table or a history partition through, as a custom plan and
as a prepared statement's generic plan (EXPLAIN ANALYZE, rolled back). Data: 200,000 dead runs
in history over its four day partitions (J17) and 40,000 waiting runs. (Written against the
statements' first form, which matched the ids as a literal array or joined them: at 400,000 /
80,000 rows their custom plans read the runs table and the history partitions through.)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from explain_helpers import explain, nodes
from sqlalchemy import MetaData, text

from ship_sqla._jobs import ship_job_history_table, ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._sql import JobStatements, bulk

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ship_sqla._sql import Template

DEAD = 200_000
WAITING = 40_000
BATCH = 1000

_HISTORY = f"""
INSERT INTO ship_job_history (id, seq, job_id, state, attempt, max_attempts, run_at, created_at,
    started_at, finished_at, claimed_by, payload)
SELECT 'h' || lpad(g::text, 9, '0'), g, 'job' || (g % 20), 'dead', 1, 1, now(), now(), now(),
    date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
        + ((g % 4) * interval '1 day') + interval '1 hour',
    'w', '{{}}'::jsonb
FROM generate_series(1, {DEAD}) g
"""

_RUNS = f"""
INSERT INTO ship_job_runs (id, job_id, state, payload, max_attempts, run_at, created_at,
    updated_at)
SELECT 'r' || lpad(g::text, 9, '0'), 'job' || (g % 20), 'waiting', '{{}}'::jsonb, 5, now(),
    now(), now()
FROM generate_series(1, {WAITING}) g
"""


def _read_through(plan: dict[str, Any]) -> list[tuple[str, int]]:
    """The sequential scans of the runs table or a history partition that read any row."""
    return [
        (str(n["Relation Name"]), round(n["Actual Rows"] + n.get("Rows Removed by Filter", 0)))
        for n in nodes(plan)
        if n["Node Type"] == "Seq Scan"
        and str(n.get("Relation Name", "")).startswith(("ship_job_runs", "ship_job_history"))
        and n["Actual Rows"] + n.get("Rows Removed by Filter", 0) > 0
    ]


@pytest.fixture
async def loaded(ship_engine: AsyncEngine) -> AsyncEngine:
    metadata = MetaData()
    ship_job_runs_table(metadata)
    ship_job_state_table(metadata)
    ship_job_history_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await connection.execute(text(_HISTORY))
        await connection.execute(text(_RUNS))
    async with ship_engine.begin() as connection:
        await connection.execute(text("ANALYZE ship_job_history"))
        await connection.execute(text("ANALYZE ship_job_runs"))
    return ship_engine


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
async def test_s2_j16_each_batch_statement_probes_its_runs_by_key(
    loaded: AsyncEngine, generic: bool
) -> None:
    """S2, J8, K2, J16: RETRY_DEAD_BATCH_BACK and DISCARD_BATCH_MOVING over 1,000 dead runs in
    history, CANCEL_BATCH_MOVING and DISCARD_BATCH_MOVING over 1,000 waiting runs: each acts
    on the 1,000 runs and reads neither table through."""
    statements = JobStatements(
        runs="ship_job_runs", state="ship_job_state", history="ship_job_history", live_only=True
    )
    dead = [f"h{g:09d}" for g in range(1000, 1000 + BATCH)]
    waiting = [f"r{g:09d}" for g in range(1000, 1000 + BATCH)]
    cases: list[tuple[Template, list[str]]] = [
        (bulk.RETRY_DEAD_BATCH_BACK, dead),
        (bulk.DISCARD_BATCH_MOVING, dead),
        (bulk.CANCEL_BATCH_MOVING, waiting),
        (bulk.DISCARD_BATCH_MOVING, waiting),
    ]
    for template, ids in cases:
        statement = statements[template]
        given = {"ids": ids, "now": None, "channel": "ship_cancel"}
        params = {name: value for name, value in given.items() if f":{name}" in str(statement)}
        async with loaded.connect() as connection:
            plan = await explain(connection, statement, params, generic=generic)
            await connection.rollback()
        assert plan["Actual Rows"] == BATCH, template
        assert not _read_through(plan), (template, _read_through(plan))
