"""F10 at a backlog of 1,000,000 waiting runs: the aged claim's plan (EXPLAIN (ANALYZE, BUFFERS)).

The shape is the one aging exists for: a steady stream of fresh high-priority runs (600,000 due
at priority 5, twenty at 10) over an old low-priority backlog, with delayed runs on the highest
and lowest levels. Aging(step=1, every=60 s): thirty priority-0 runs due seven minutes ago have
an effective priority of 7, the rest of level 0 (due within the last four minutes) at most 4.

The stated bound (``claim.CLAIM_AGED``): the priority walk reads about ``limit`` entries of
``<runs>_due_idx`` plus two per level it visits; the aged seek, below the level where the walk
stopped, reads one or two entries per lower level plus at most ``limit`` per lower level whose
oldest runs have aged up to that level. Here: 50 + 50 (one such level) + 2 per level, in
custom and generic plans, no sequential scan, buffers within twice those of the same shape at
a backlog of 1,000.

Seeded by the test itself, not in the session's seeded template: the aging depends on how long
ago each run became due, so the data must be as old as the test says when the claim runs (a
template built minutes earlier ages every run by those minutes).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from explain_helpers import buffers, check_plan, claim_params, due_index_entries, explain
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._jobs import ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._sql import JobStatements, claim
from ship_sqla.jobs import Aging

BIG = 1_000_000
SMALL = 1_000
LIMIT = 50
AGING = Aging(step=1, every=60.0)
LEVELS = 4  # 10, 5, 0, -5

metadata = MetaData()
big_runs = ship_job_runs_table(metadata, name="aged_job_runs")
small_runs = ship_job_runs_table(metadata, name="small_aged_job_runs")
ship_job_state_table(metadata)

SHAPE = [
    # tag, runs per 1,000 of backlog (None: a fixed count), priority, due from (seconds ago;
    # < 0: delayed), over (seconds, later)
    ("p10d", 50, 10, -3_600, 100),  # the highest level: delayed
    ("p10u", None, 10, 30, 10),  # 20 fresh due runs
    ("p5u", 600, 5, 60, 50),  # the steady stream: fresh, due within the last minute
    ("p0a", None, 0, 420, 10),  # 30 runs due about seven minutes ago: effective 6 or 7
    ("p0u", 300, 0, 230, 200),  # due within the last four minutes: effective at most 3
    ("pm5d", 50, -5, -3_600, 100),  # the lowest level: delayed
]
FIXED = {"p10u": 20, "p0a": 30}


def _load(table: str, backlog: int) -> list[str]:
    columns = "id, job_id, state, payload, max_attempts, run_at, created_at, updated_at, priority"
    statements = []
    for tag, per_thousand, priority, ago, over in SHAPE:
        count = FIXED[tag] if per_thousand is None else per_thousand * backlog // 1_000
        due = f"now() - {ago} * interval '1 second' + g * ({over} * interval '1 second' / {count})"
        statements.append(
            f"INSERT INTO {table} ({columns})"
            f" SELECT '{tag}' || lpad(g::text, 9, '0'), 'aged', 'waiting', '{{}}'::jsonb, 5,"
            f"  {due}, now(), now(), {priority}"
            f" FROM generate_series(1, {count}) g"
        )
    return statements


@pytest.fixture
async def loaded(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        for statement in _load(big_runs.name, BIG) + _load(small_runs.name, SMALL):
            await connection.execute(text(statement))
    async with ship_engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        for table in (big_runs, small_runs):
            await connection.execute(text(f"VACUUM (ANALYZE) {table.name}"))
    return ship_engine


def _params() -> dict[str, Any]:
    return claim_params(
        "aged",
        limit=LIMIT,
        max_running=100,
        max_lapses=3,
        crash_loop="lapsed 3 times in a row",
        lapsed_limit=LIMIT + 100,
        rate_limit=1000,
        rate_period=1.0,
        tuned=True,
        aging_step=AGING.step,
        aging_every_us=AGING.every_us,
        aging_ceiling=AGING.ceiling,
    )


GATE = (
    "INSERT INTO ship_job_state (job_id, claim_granted, claim_grant)"
    " VALUES ('aged#claim-gate', 0, 0)"
)


@pytest.mark.timeout(300)
@pytest.mark.slow
async def test_f10_aged_claim_reads_within_its_bound_at_a_million_runs(
    loaded: AsyncEngine,
) -> None:
    """F10, K6, J3: at 1,000,000 waiting runs, a steady stream of fresh priority-5 runs over an
    aged priority-0 backlog, the aged claim of 50 takes the twenty priority-10 runs and the
    thirty priority-0 runs aged to 7 (none of the stream), and reads at most 50 + 50 + 2 per
    level index entries of the due index (the walk's, then the aged seek's), with no
    sequential scan, in custom and generic plans, uncapped and through the claim gate, within
    twice the buffers of the same shape at a backlog of 1,000."""
    async with loaded.begin() as connection:
        await connection.execute(text(GATE))
    report = []
    for template, generic in itertools.product(
        (claim.CLAIM_AGED_GATED, claim.CLAIM_AGED), (False, True)
    ):
        plans = {}
        for table in (big_runs, small_runs):
            statement = JobStatements(runs=table.name, state="ship_job_state")[template]
            async with loaded.connect() as connection, connection.begin() as tx:
                plans[table.name] = await explain(connection, statement, _params(), generic=generic)
                taken = (
                    await connection.execute(
                        text(
                            f"SELECT left(id, 4) AS tag, count(*) FROM {table.name}"
                            " WHERE state = 'running' GROUP BY 1 ORDER BY 1"
                        )
                    )
                ).all()
                await tx.rollback()
            assert [tuple(row) for row in taken] == [("p0a0", 30), ("p10u", 20)]
        big, small = plans[big_runs.name], plans[small_runs.name]
        check_plan(big, big_runs, uses={"due_idx", "lease_idx"})
        for plan, table in ((big, big_runs), (small, small_runs)):
            assert plan["Actual Rows"] == LIMIT
            assert due_index_entries(plan, table) <= LIMIT + LIMIT + 2 * LEVELS, report
            assert plan["Total Cost"] < 100_000
        report.append(
            (
                "gated" if template is claim.CLAIM_AGED_GATED else "ungated",
                "generic" if generic else "custom",
                buffers(big),
                buffers(small),
                due_index_entries(big, big_runs),
            )
        )
        assert buffers(big) <= 2 * buffers(small), report[-1]
    print(report)  # noqa: T201 - the measured buffers, for the log
