"""The D8 patch figures' plans at 1,000,000 runs and 700,000 stored steps (SPEC §13, D8).

PATCH_IDS walks ``<steps>_patch_idx`` one probe per patch id; PATCH_HOLDING and PATCH_LACKING
read only the job's live runs (``<runs>_due_idx``, ``<runs>_lease_idx``) and probe each run's
marker by the steps' primary key; PATCH_LACKING's first marker is one walk of
``<steps>_patch_idx``. None scans the runs or steps table, and each reads a number of buffers
bounded by the job's live runs, not by the tables' size (half a million finished runs hold the
marker here, and are never read).
"""

from __future__ import annotations

from typing import Any

import pytest
from explain_helpers import buffers, check_plan, explain, nodes
from seeded_template import SeedStep
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._jobs import ship_job_runs_table, ship_job_state_table, ship_job_steps_table
from ship_sqla._jobs._sql import JobStatements
from ship_sqla._jobs._sql import workflows as sql
from ship_sqla.kernel._evolution import MAX_PATCH_READ, MAX_PATCHES_LISTED

BIG = 1_000_000
WAITING = 2_000
RUNNING = 1_000
LIVE = WAITING + RUNNING
MAX_BUFFERS = 4 * LIVE + 200
"""About three pages per live run of the job (its index entry, its heap row, its marker probe:
PATCH_HOLDING reads some 10,000 here, PATCH_LACKING some 3,000, PATCH_IDS 69); the runs table
alone is some 20,000 pages."""

metadata = MetaData()
runs = ship_job_runs_table(metadata)
ship_job_state_table(metadata)
steps = ship_job_steps_table(metadata)
S = JobStatements.for_tables(runs, metadata.tables["ship_job_state"], steps=steps)

_RUN_COLUMNS = "id, job_id, state, payload, max_attempts, run_at, created_at, updated_at"
LOAD = [
    # The workflow's finished runs, most of the table.
    (
        f"INSERT INTO ship_job_runs ({_RUN_COLUMNS}, finished_at)"
        " SELECT 'f' || g, 'wf', 'completed', '{}'::jsonb, 5, now(),"
        "  now() - interval '2 days' + g * interval '1 millisecond', now(), now()"
        f" FROM generate_series(1, {BIG - LIVE - 10_000}) g"
    ),
    # Its live runs: waiting ones created after the first marker, running ones before it.
    (
        f"INSERT INTO ship_job_runs ({_RUN_COLUMNS})"
        " SELECT 'w' || g, 'wf', 'waiting', '{}'::jsonb, 5, now() + interval '1 hour',"
        "  now() - interval '1 day' + g * interval '1 second', now()"
        f" FROM generate_series(1, {WAITING}) g"
    ),
    (
        f"INSERT INTO ship_job_runs ({_RUN_COLUMNS}, lease_expires_at, lease_token, attempt)"
        " SELECT 'r' || g, 'wf', 'running', '{}'::jsonb, 5, now(),"
        "  now() - interval '3 days' + g * interval '1 second', now(),"
        "  now() + interval '1 hour', g, 1"
        f" FROM generate_series(1, {RUNNING}) g"
    ),
    # Another job's backlog.
    (
        f"INSERT INTO ship_job_runs ({_RUN_COLUMNS})"
        " SELECT 'o' || g, 'other', 'waiting', '{}'::jsonb, 5, now(), now(), now()"
        " FROM generate_series(1, 10000) g"
    ),
    # Half a million finished runs hold the marker; so do half the waiting ones.
    (
        "INSERT INTO ship_job_steps (run_id, name, seq, kind, state, result, created_at)"
        " SELECT 'f' || g, 'patch:v2', 1, 'patch', 'done', 'true'::jsonb,"
        "  now() - interval '2 days' + g * interval '1 millisecond'"
        " FROM generate_series(1, 500000) g"
    ),
    (
        "INSERT INTO ship_job_steps (run_id, name, seq, kind, state, result, created_at)"
        " SELECT 'w' || g, 'patch:v2', 1, 'patch', 'done', 'true'::jsonb, now()"
        f" FROM generate_series(1, {WAITING // 2}) g"
    ),
    # Plain steps of 200,000 runs, and a few other patches.
    (
        "INSERT INTO ship_job_steps (run_id, name, seq, kind, state, result, created_at)"
        " SELECT 'f' || g, 'charge', 0, 'step', 'done', '{}'::jsonb, now()"
        " FROM generate_series(1, 200000) g"
    ),
    (
        "INSERT INTO ship_job_steps (run_id, name, seq, kind, state, result, created_at)"
        " SELECT 'f' || g, 'patch:p' || (g % 20), 2, 'patch', 'done', 'true'::jsonb, now()"
        " FROM generate_series(1, 1000) g"
    ),
]


SEED = SeedStep(name="workflow_patches_explain", metadata=metadata, statements=LOAD)
"""The module's data set in the session's seeded template (tests/support/seeded_template.py)."""


@pytest.fixture
def loaded(seeded_engine: AsyncEngine) -> AsyncEngine:
    return seeded_engine


def _no_scan(plan: dict[str, Any]) -> None:
    scans = [
        n
        for n in nodes(plan)
        if n["Node Type"] == "Seq Scan"
        and n.get("Relation Name") in ("ship_job_runs", "ship_job_steps")
    ]
    assert not scans, f"sequential scan: {scans}"


async def test_d8_patch_figures_are_bounded_at_a_million_runs(loaded: AsyncEngine) -> None:
    """D8: each patch figure is one statement over its named indexes (no sequential scan),
    within a number of buffers bounded by the job's live runs, as a custom and as a generic
    plan; the figures are right (1,000 live holders; the 1,000 live runs created before the
    first marker lack it)."""
    figure = {"job_id": "wf", "name": "patch:v2", "read": MAX_PATCH_READ}
    cases = [
        (S[sql.PATCH_IDS], {"limit": MAX_PATCHES_LISTED}, steps, {"patch_idx"}),
        (S[sql.PATCH_HOLDING], figure, runs, {"due_idx", "lease_idx"}),
        (S[sql.PATCH_LACKING], figure, runs, {"due_idx", "lease_idx"}),
        (S[sql.PATCH_LACKING], figure, steps, {"patch_idx", "pkey"}),
    ]
    async with loaded.connect() as connection:
        for statement, params, table, uses in cases:
            for generic in (False, True):
                async with connection.begin():
                    plan = await explain(connection, statement, params, generic=generic)
                check_plan(plan, table, uses=uses)
                _no_scan(plan)
                assert buffers(plan) < MAX_BUFFERS, (statement.text[:80], generic, buffers(plan))
        ids = (await connection.execute(S[sql.PATCH_IDS], {"limit": 100})).scalars().all()
        assert set(ids) == {f"patch:p{i}" for i in range(20)} | {"patch:v2"}
        holding = (await connection.execute(S[sql.PATCH_HOLDING], figure)).one()
        assert (holding.runs, holding.read) == (WAITING // 2, LIVE)
        lacking = (await connection.execute(S[sql.PATCH_LACKING], figure)).one()
        assert lacking.first_marker_at is not None
        # The running runs were created before the first marker (two days ago) and lack it.
        assert (lacking.runs, lacking.read) == (RUNNING, LIVE)
