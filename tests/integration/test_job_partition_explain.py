"""The partitioned claim's plan at 1,000,000 waiting runs over 10,000 partitions (F8, F9).

EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) of CLAIM_PARTITIONED (per tenant) and
CLAIM_PARTITIONED_BY_KEY (per partition key) claiming 50 runs of a job whose runs belong to
10,000 partitions (100 waiting runs each, due), with a per-tenant rate limit
(F8: 5 per second), a per-tenant cap (F9: 2 running, one already running in every tenant the
claim visits), and both, in custom and generic plans. The stated bound: a claim reads about
``limit`` index entries plus a few per partition it visits (at most ``max_tenants``): the
walk's probe, its gate row, its running runs up to the cap and its due runs up to its share of
the room plus one (issue 35 item 4; up to what its limits allow when that is less; a rate of
100/s lets every partition take the whole claim). So at any backlog and any number of
partitions:

- no sequential scan of the runs table, nor of the state table (2,000 gate rows: each
  visited partition's gate row is one primary-key lookup, J20); the tenant, running and
  state primary-key indexes serve it;
- ``<runs>_tenant_idx`` entries read <= 2 x limit + (min(a, top) + 2) per partition visited
  (``a``: what its limits allow; ``top``: an equal share of the room, rounded up, plus one,
  kernel ``counted_for_shares``; the walk's own count of the due runs it finds reads up to
  the room in all): about ``limit`` plus four a partition, whatever the limits allow;
- ``<runs>_lease_idx`` entries read <= the job's running runs (F9: the visited partitions'
  running runs are counted in one scan a claim, never one per partition);
- buffers within 2x of the same claim over 1,000 waiting runs of 100 partitions.

One load serves every case (the data is loaded once, each EXPLAIN rolled back).
"""

from __future__ import annotations

from typing import Any

import pytest
from explain_helpers import buffers, check_plan, claim_params, explain, nodes
from seeded_template import SeedStep
from sqlalchemy import MetaData, Table
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._jobs import ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._sql import JobStatements, claim

BIG, BIG_PARTS = 1_000_000, 10_000
SMALL, SMALL_PARTS = 1_000, 100
LIMIT = 50
WALK = 64
RUNNING = 200
"""Running runs in the big table (one in each of its first 200 tenants)."""

GATES = 2_000
"""Gate rows in the state table (the first 2,000 partitions of the big table claimed before),
made after the template was analysed (its statistics say none), as a drain makes them: the
claims read and update theirs by primary key. At this size a join of the visited partitions to
the state table was planned as a hash of a sequential scan of every gate row (the plan of a
drain's claims once a few thousand partitions had their gates)."""
GATE_ROWS = (
    "INSERT INTO ship_job_state (job_id, claim_granted, claim_grant, updated_at)"
    " SELECT 'bulk#claim-gate/t' || lpad(g::text, 5, '0'), 0, 0, now()"
    f" FROM generate_series(0, {GATES - 1}) g"
)

metadata = MetaData()
big_runs = ship_job_runs_table(
    metadata, name="part_job_runs", partitioned_claims=True, partition_keys=True
)
small_runs = ship_job_runs_table(
    metadata, name="small_part_job_runs", partitioned_claims=True, partition_keys=True
)
state = ship_job_state_table(metadata)


def _load(table: str, waiting: int, parts: int) -> list[str]:
    """Waiting runs of job 'bulk' spread over ``parts`` tenants (due over the last hour, the
    tenants interleaved in due order), one running run in each of the first 200 tenants, and
    finished runs: a busy multi-tenant queue's shape."""
    columns = "id, job_id, state, payload, max_attempts, run_at, created_at, updated_at"
    return [
        (
            # The tenant is the partition key too: the claims by tenant and by key read the
            # same shape off their own indexes.
            f"INSERT INTO {table} ({columns}, tenant_id, partition_key)"
            " SELECT 'w' || lpad(g::text, 9, '0'), 'bulk', 'waiting', '{}'::jsonb, 5,"
            "  now() - interval '1 hour' + g * interval '1 millisecond', now(), now(),"
            f"  't' || lpad((g % {parts})::text, 5, '0'),"
            f"  't' || lpad((g % {parts})::text, 5, '0')"
            f" FROM generate_series(1, {waiting}) g"
        ),
        (
            f"INSERT INTO {table} ({columns}, tenant_id, partition_key, lease_expires_at,"
            " lease_token, attempt)"
            " SELECT 'x' || lpad(g::text, 9, '0'), 'bulk', 'running', '{}'::jsonb, 5,"
            "  now(), now(), now(), 't' || lpad(g::text, 5, '0'), 't' || lpad(g::text, 5, '0'),"
            "  now() + interval '1 hour', g, 1"
            f" FROM generate_series(0, {min(parts, RUNNING) - 1}) g"
        ),
        (
            f"INSERT INTO {table} ({columns}, finished_at)"
            " SELECT 'c' || lpad(g::text, 9, '0'), 'bulk', 'completed', '{}'::jsonb, 5,"
            "  now(), now(), now(), now()"
            f" FROM generate_series(1, {max(waiting // 10, 100)}) g"
        ),
    ]


SEED = SeedStep(
    name="job_partition_explain",
    metadata=metadata,
    statements=[
        *_load(big_runs.name, BIG, BIG_PARTS),
        *_load(small_runs.name, SMALL, SMALL_PARTS),
    ],
)
"""The module's data set in the session's seeded template (tests/support/seeded_template.py)."""


@pytest.fixture
def loaded(seeded_engine: AsyncEngine) -> AsyncEngine:
    return seeded_engine


def params(*, cap: int | None, rate: int | None) -> dict[str, Any]:
    return claim_params(
        "bulk",
        limit=LIMIT,
        max_running=cap,
        max_lapses=3,
        crash_loop="lapsed 3 times in a row",
        lapsed_limit=1000,
        rate_limit=rate,
        rate_period=None if rate is None else 1.0,
        after_tenant=None,
        max_tenants=WALK,
        widest=WALK,
        weight_tenants=[],
        weights=[],
        default_weight=1,
        tuned=True,
    )


def entries(plan: dict[str, Any], table: Table, suffix: str) -> int:
    """Index entries the plan read from ``<table><suffix>``, over every loop."""
    return sum(
        round((n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"])
        for n in nodes(plan)
        if n.get("Index Name") == f"{table.name}{suffix}"
    )


TENANT = (claim.CLAIM_PARTITIONED, "_tenant_idx", "_running_idx", "_part_run_idx")
KEY = (claim.CLAIM_PARTITIONED_BY_KEY, "_part_idx", "_part_run_idx", "_running_idx")

CASES = [
    # name, claim and its indexes, cap, rate, what each visited partition's limits allow it
    # (the visited partitions have one running run each), the rows: the 50 runs one claim
    # takes over the 64 partitions it visits, and the walk's cursor (it stopped at max_tenants)
    ("F8 rate 5/s per tenant", TENANT, None, 5, 5, LIMIT + 1),
    ("F9 max 2 per tenant", TENANT, 2, None, 1, LIMIT + 1),
    ("F8+F9 per tenant", TENANT, 2, 5, 1, LIMIT + 1),
    ("F8 rate 5/s per key", KEY, None, 5, 5, LIMIT + 1),
    ("F8+F9 per key", KEY, 2, 5, 1, LIMIT + 1),
    # Limits that allow a partition the whole claim: each is counted up to its share of the
    # room plus one (issue 35 item 4), not up to what its limits allow.
    ("F8 rate 100/s per tenant", TENANT, None, 100, LIMIT, LIMIT + 1),
    ("F8 rate 100/s per key", KEY, None, 100, LIMIT, LIMIT + 1),
]
TOP = -(-LIMIT // WALK) + 1
"""Each visited partition's first count stops here: an equal share of the room, rounded up,
plus one (kernel counted_for_shares); every partition holds more, so there is no second."""


@pytest.mark.timeout(300)
@pytest.mark.slow
async def test_f8_f9_partitioned_claim_is_bounded_at_a_million_runs_over_10000_partitions(
    loaded: AsyncEngine,
) -> None:
    """F8, F9: at 1,000,000 waiting runs over 10,000 partitions, the partitioned claim of 50
    (per tenant or per key; a rate limit, a cap, both) takes 50 runs across the 64 partitions
    it visits, reads its indexes (<runs>_tenant_idx and <runs>_running_idx, by key
    <runs>_part_idx and <runs>_part_run_idx), never scans the runs table, reads at most
    2 x limit + (min(a, top) + 2) entries per visited partition from the walked index (a: what
    the partition's limits allow it; top: an equal share of the room plus one), at most the
    cap per visited partition from its running index and none from the other
    partitioning's, reads each visited partition's gate row off
    <state>_pkey with 2,000 gate rows made after the analyse, never scanning the state table
    (J20), and at most twice the buffers of the same claim over 1,000 runs of 100
    partitions, in custom and generic plans."""
    report = []
    for name, (template, walked, running, other), cap, rate, allowed, returned in CASES:
        uses = {walked[1:]} | ({running[1:]} if cap is not None else set())
        for generic in (False, True):
            plans = {}
            for table in (big_runs, small_runs):
                statement = JobStatements(runs=table.name, state="ship_job_state")[template]
                async with loaded.connect() as connection, connection.begin() as transaction:
                    await connection.exec_driver_sql(GATE_ROWS)
                    plans[table.name] = await explain(
                        connection, statement, params(cap=cap, rate=rate), generic=generic
                    )
                    await transaction.rollback()
            big, small = plans[big_runs.name], plans[small_runs.name]
            check_plan(big, big_runs, uses=uses)
            # J20: each visited partition's gate row is a primary-key lookup whatever the
            # state table holds (2,000 gate rows here): never a scan of every gate row.
            check_plan(big, state, uses={"pkey"})
            assert (big["Actual Rows"], small["Actual Rows"]) == (returned, returned), name
            read = entries(big, big_runs, walked)
            report.append((name, "generic" if generic else "custom", buffers(big), read))
            # The bound: the runs taken, the walk's count of the due runs it found (up to the
            # room in all: it goes on past max_tenants while they fall short of it, F8/F9),
            # and per visited partition its walk probe (two at most) and its due runs counted
            # up to its share of the room plus one (or what its limits allow, when less).
            assert read <= 2 * LIMIT + (min(allowed, TOP) + 2) * WALK, report[-1]
            # Each partition's running runs are counted off its own running index, at most
            # the cap each (index-only): never off the other partitioning's index, which would
            # read every running run of the job per partition.
            assert entries(big, big_runs, other) == 0, report[-1]
            if cap is not None:
                assert entries(big, big_runs, running) <= cap * WALK, report[-1]
            # The visited partitions' running runs are counted in one scan (running_n): were
            # a plan to take <runs>_lease_idx for it, it would read the job's running runs
            # (200 here) once per claim, never once per partition visited (64 x 200).
            assert entries(big, big_runs, "_lease_idx") <= RUNNING, report[-1]
            assert buffers(big) <= 2 * buffers(small), (report[-1], buffers(small))
            assert big["Total Cost"] < 100_000
    print(report)  # noqa: T201 - the measured buffers and entries, for the log
