"""The workflow statements' plans at 1,000,000 runs, 1,000,000 events and 200,000 steps
(SPEC §13, D4, D5).

An event wait's match (MATCH_EVENT, and SUSPEND_RUN's check), a publish's wake of its waiting
runs (PUBLISH_EVENT), a child's wake of its parent (WAKE_PARENTS) and a parent's live-children
check read their named indexes, never a sequential scan of the runs, steps or events table,
and stay within a few dozen buffers however large the tables: a publish wakes its waiters
through ``<runs>_wait_idx``, not by scanning steps.
"""

from __future__ import annotations

from typing import Any

import pytest
from explain_helpers import buffers, check_plan, explain, nodes
from seeded_template import SeedStep
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._jobs import (
    ship_job_events_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
)
from ship_sqla._jobs._sql import JobStatements
from ship_sqla._jobs._sql import workflows as sql

BIG = 1_000_000
PARENTS = 50
KEYS = 1_000
MAX_BUFFERS = 200
"""A bounded statement reads a few index pages per probe; a scan of a million rows reads
thousands of pages."""

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)
steps = ship_job_steps_table(metadata)
events = ship_job_events_table(metadata)
S = JobStatements.for_tables(runs, state, steps=steps, events=events)

_RUN_COLUMNS = "id, job_id, state, payload, max_attempts, run_at, created_at, updated_at"
LOAD = [
    # Half the runs: children of 50 parents, mostly completed, a few still waiting.
    (
        f"INSERT INTO ship_job_runs ({_RUN_COLUMNS}, parent_id, finished_at)"
        " SELECT 'c' || g, 'child', CASE WHEN g % 1000 = 0 THEN 'waiting' ELSE 'completed' END,"
        f" '{{}}'::jsonb, 5, now(), now(), now(), 'p' || (g % {PARENTS}), now()"
        f" FROM generate_series(1, {BIG // 2}) g"
    ),
    # The other half: suspended workflow runs, each waiting for its own event key.
    (
        f"INSERT INTO ship_job_runs ({_RUN_COLUMNS}, wait_for)"
        " SELECT 's' || g, 'wf', 'waiting', '{}'::jsonb, 5, now() + interval '1 day', now(),"
        f" now(), 'order.shipped' || chr(31) || 'k' || g FROM generate_series(1, {BIG // 2}) g"
    ),
    # The parents, suspended for their children.
    (
        f"INSERT INTO ship_job_runs ({_RUN_COLUMNS}, wait_for)"
        " SELECT 'p' || g, 'wf', 'waiting', '{}'::jsonb, 5, now() + interval '1 minute', now(),"
        f" now(), '#children' FROM generate_series(0, {PARENTS - 1}) g"
    ),
    # A million events over a thousand keys, with (synthetic) transaction ids 1..1M.
    (
        "INSERT INTO ship_job_events (name, key, payload, xid, created_at)"
        f" SELECT 'order.shipped', 'k' || (g % {KEYS}), '{{}}'::jsonb, g, now()"
        f" FROM generate_series(1, {BIG}) g"
    ),
    # Stored steps of 200,000 other runs.
    (
        "INSERT INTO ship_job_steps (run_id, name, seq, kind, state, result, created_at)"
        " SELECT 'c' || g, 'charge', 0, 'step', 'done', '{}'::jsonb, now()"
        " FROM generate_series(1, 200000) g"
    ),
    # One wait step that began at xid 999,000 (events from there on are after it).
    (
        "INSERT INTO ship_job_steps (run_id, name, seq, kind, state, wake_at, event_name,"
        " event_key, snapshot, created_at)"
        " VALUES ('s7', 'shipped', 0, 'event', 'waiting', now() + interval '1 day',"
        " 'order.shipped', 'k7', '999000:999000:', now())"
    ),
]


SEED = SeedStep(name="workflow_explain", metadata=metadata, statements=LOAD)
"""The module's data set in the session's seeded template (tests/support/seeded_template.py)."""


@pytest.fixture
def loaded(seeded_engine: AsyncEngine) -> AsyncEngine:
    return seeded_engine


def suspend_params(run_id: str, wait: str) -> dict[str, Any]:
    """SUSPEND_RUN of a stored wait step (a replayed wait: its checks run)."""
    return {
        "run_id": run_id,
        "token": 1,
        "name": "shipped" if wait == "event" else "join",
        "seq": 0,
        "kind": wait,
        "wake_at": None,
        "wake_after": 60.0,
        "event_name": "order.shipped",
        "event_key": "k7",
        "wait": wait,
        "recheck": 60.0,
        "now": None,
    }


def _no_scan(plan: dict[str, Any], *names: str) -> None:
    scans = [
        n for n in nodes(plan) if n["Node Type"] == "Seq Scan" and n.get("Relation Name") in names
    ]
    assert not scans, f"sequential scan: {scans}"


async def test_workflow_statements_use_their_indexes_at_a_million_rows(
    loaded: AsyncEngine,
) -> None:
    """D4, D5: MATCH_EVENT reads <events>_match_idx from the wait snapshot's xmin (not the key's
    whole history); PUBLISH_EVENT wakes its one waiter through <runs>_wait_idx; WAKE_PARENTS
    and CHILDREN go through <runs>_parent_idx; LOAD_STEPS through the steps' primary key; each
    as a custom and as a generic plan, within a bounded number of buffers."""
    cases = [
        (S[sql.MATCH_EVENT], {"run_id": "s7", "name": "shipped"}, events, {"match_idx"}),
        (
            S[sql.PUBLISH_EVENT],
            {
                "name": "order.shipped",
                "key": "k8",
                "payload": "{}",
                "wait_key": "order.shipped\x1fk8",
                "now": None,
            },
            runs,
            {"wait_idx"},
        ),
        (S[sql.WAKE_PARENTS], {"parents": ["p3", "p4"], "now": None}, runs, {"parent_idx"}),
        (S[sql.LOAD_STEPS], {"run_id": "s7", "now": None}, steps, {"pkey"}),
        (S[sql.SUSPEND_RUN], suspend_params("p3", "children"), runs, {"parent_idx"}),
        (S[sql.SUSPEND_RUN], suspend_params("s7", "event"), events, {"match_idx"}),
    ]
    async with loaded.connect() as connection:
        for statement, params, table, uses in cases:
            for generic in (False, True):
                async with connection.begin():
                    plan = await explain(connection, statement, params, generic=generic)
                check_plan(plan, table, uses=uses)
                _no_scan(plan, "ship_job_runs", "ship_job_events", "ship_job_steps")
                assert buffers(plan) < MAX_BUFFERS, (statement.text[:60], generic, buffers(plan))
