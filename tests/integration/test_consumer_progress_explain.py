"""C3, S2: the Consumers page's read (CONSUMER_PROGRESS) at 300,000 runs, of which 60,000 are
consumer runs that recorded progress (20 consumers x 50 keys x 60 runs each: a key's finished
runs pile up until cleanup): a loose scan of ``<runs>_progress_idx`` over the (consumer, key)
pairs, one probe for each key's newest run with progress and one of ``<runs>_dedupe_idx`` for
its live run; never a sequential scan, never more index entries than a few per key listed,
as custom plans and as a prepared statement's generic plan."""

from __future__ import annotations

import pytest
from explain_helpers import check_plan, explain, nodes
from seeded_template import SeedStep
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._jobs import ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._sql import JobStatements, browse

TOTAL = 300_000
CONSUMER_EVERY = 5
"""One run in five is a consumer run with progress."""
LIMIT = 201

metadata = MetaData()
runs = ship_job_runs_table(metadata)
ship_job_state_table(metadata)

_LOAD = f"""
INSERT INTO ship_job_runs (id, job_id, state, payload, key, dedupe_key, max_attempts, run_at,
    created_at, updated_at, finished_at, lease_expires_at, lease_token, progress)
SELECT 'r' || lpad(g::text, 9, '0'),
    CASE WHEN g % {CONSUMER_EVERY} = 0 THEN 'consumer' || (g / {CONSUMER_EVERY}) % 20
         ELSE 'job' || g % 10 END,
    -- the newest run of each key (the last 1,000 consumer runs) is live: waiting or running
    CASE WHEN g % {CONSUMER_EVERY} <> 0 OR g <= {TOTAL} - 1000 * {CONSUMER_EVERY}
         THEN 'completed' WHEN g % 2 = 0 THEN 'running' ELSE 'waiting' END,
    '{{}}'::jsonb,
    CASE WHEN g % {CONSUMER_EVERY} = 0 THEN 'key' || (g / {CONSUMER_EVERY} / 20) % 50 END,
    CASE WHEN g % {CONSUMER_EVERY} = 0 THEN 'key' || (g / {CONSUMER_EVERY} / 20) % 50 END,
    5, now(), now(), now(),
    CASE WHEN g % {CONSUMER_EVERY} <> 0 OR g <= {TOTAL} - 1000 * {CONSUMER_EVERY}
         THEN now() END,
    CASE WHEN g % {CONSUMER_EVERY} = 0 AND g > {TOTAL} - 1000 * {CONSUMER_EVERY} AND g % 2 = 0
         THEN now() + interval '1 minute' END,
    CASE WHEN g % {CONSUMER_EVERY} = 0 AND g > {TOTAL} - 1000 * {CONSUMER_EVERY} AND g % 2 = 0
         THEN g END,
    -- every consumer run but the waiting ones recorded progress
    CASE WHEN g % {CONSUMER_EVERY} = 0
          AND (g <= {TOTAL} - 1000 * {CONSUMER_EVERY} OR g % 2 = 0)
         THEN jsonb_build_object('lag', g, 'last_batch_at', now(), 'batches', 1, 'items', 10)
    END
FROM generate_series(1, {TOTAL}) g
"""


SEED = SeedStep(name="consumer_progress_explain", metadata=metadata, statements=[_LOAD])
"""The module's data set in the session's seeded template (tests/support/seeded_template.py)."""


@pytest.fixture
def loaded(seeded_engine: AsyncEngine) -> AsyncEngine:
    return seeded_engine


async def test_c3_consumer_progress_is_index_served_and_bounded(loaded: AsyncEngine) -> None:
    """C3, S2: CONSUMER_PROGRESS reads ``<runs>_progress_idx`` (the loose scan over the pairs
    and each key's newest run) and ``<runs>_dedupe_idx`` (its live run), never scans the runs
    table, and reads at most a few index entries per key listed (here the first 201 of 1,000
    keys, past 60,000 consumer runs), from the first page and after a cursor, custom and
    generic."""
    statement = JobStatements(runs="ship_job_runs", state="ship_job_state")[
        browse.CONSUMER_PROGRESS
    ]
    for generic in (False, True):
        for after in ((None, None), ("consumer3", "key7")):
            params = {"limit": LIMIT, "after_job": after[0], "after_key": after[1]}
            async with loaded.connect() as connection:
                plan = await explain(connection, statement, params, generic=generic)
                rows = (await connection.execute(statement, params)).all()
                await connection.rollback()
            check_plan(plan, runs, uses={"progress_idx", "dedupe_idx"})
            assert len(rows) == LIMIT, (generic, after)
            assert all(row.live_state in ("running", "waiting") for row in rows)
            read = sum(
                int(n.get("Actual Rows", 0)) * int(n.get("Actual Loops", 1))
                + int(n.get("Rows Removed by Filter", 0)) * int(n.get("Actual Loops", 1))
                for n in nodes(plan)
                if "Index Name" in n
            )
            assert read <= 4 * LIMIT, (generic, after, read)
