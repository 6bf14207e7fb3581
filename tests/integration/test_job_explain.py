"""The hot statements' plans at a backlog of 1,000,000 waiting runs (J2, J3).

EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) of the claim of 50, of the enqueue's bounded depth check,
of a batched settle (every kind in one statement) and of a batched heartbeat, both as custom
plans and as a prepared statement's generic plan (asyncpg's statement cache gets one once
PostgreSQL prefers it): index scans on the named partial indexes, never a sequential scan of the
runs table, and buffer counts within 2x of the same statement against a backlog of 1,000.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from explain_helpers import buffers, check_plan, due_index_entries, explain
from explain_helpers import claim_params as base_claim_params
from seeded_template import SeedStep
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._jobs import ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._sql import JobStatements, admin, claim, enqueue, settle

BIG = 1_000_000
SMALL = 1_000
RUNNING = 2_000

metadata = MetaData()
# fair_claims: the fair claims are explained too (F2); the other statements never read that index.
big_runs = ship_job_runs_table(metadata, fair_claims=True)
small_runs = ship_job_runs_table(metadata, name="small_job_runs", fair_claims=True)
ship_job_state_table(metadata)


def _load(table: str, waiting: int) -> list[str]:
    """Waiting runs of job 'bulk' (due over the last hour), finished runs, and running runs
    (tokens 1..RUNNING) spread over three jobs: a busy queue table's shape."""
    columns = "id, job_id, state, payload, max_attempts, run_at, created_at, updated_at"
    return [
        (
            # Ten tenants (F2's fair claim walks them), interleaved in due order.
            f"INSERT INTO {table} ({columns}, tenant_id)"
            " SELECT 'w' || lpad(g::text, 9, '0'), 'bulk', 'waiting', '{}'::jsonb, 5,"
            "  now() - interval '1 hour' + g * interval '1 millisecond', now(), now(),"
            "  't' || (g % 10)"
            f" FROM generate_series(1, {waiting}) g"
        ),
        (
            f"INSERT INTO {table} ({columns}, finished_at)"
            " SELECT 'c' || lpad(g::text, 9, '0'), 'bulk', 'completed', '{}'::jsonb, 5,"
            "  now(), now(), now(), now()"
            f" FROM generate_series(1, {max(waiting // 10, 100)}) g"
        ),
        (
            f"INSERT INTO {table} ({columns}, lease_expires_at, lease_token, attempt)"
            " SELECT 'x' || lpad(g::text, 9, '0'), 'bulk' || (g % 3), 'running', '{}'::jsonb, 5,"
            "  now(), now(), now(), now() + interval '1 hour', g, 1"
            f" FROM generate_series(1, {RUNNING}) g"
        ),
    ]


GATE = (
    "INSERT INTO ship_job_state (job_id, claim_granted, claim_grant)"
    " VALUES ('bulk#claim-gate', 0, 0)"
)
"""The job's claim gate, as its first gated claim leaves it (F1): a new gate grants nothing."""


@pytest.fixture
def loaded(seeded_engine: AsyncEngine) -> AsyncEngine:
    """The module's copy of the seeded template (``SEED``, below): both data sets analyzed."""
    return seeded_engine


def claim_params() -> dict[str, Any]:
    # J19: a full walk (no floors), as every sweep's claim; test_job_claim_floor.py explains
    # the floored walk.
    return base_claim_params(
        "bulk",
        limit=50,
        max_running=100,
        max_lapses=3,
        crash_loop="lapsed 3 times in a row",
        lapsed_limit=150,
        rate_limit=1000,
        rate_period=1.0,
        after_tenant=None,
        max_tenants=64,
        widest=64,
        weight_tenants=["t3"],
        weights=[2],
        default_weight=1,
        tuned=True,
    )


def floored_claim_params() -> dict[str, Any]:
    """J19: a claim whose priority walk starts at a floor on level 0 (below every run here),
    and whose lapsed probe (J6) starts at its lapsed floor, 2 s before now (an index condition
    of lease_idx)."""
    return {
        **claim_params(),
        "lapsed_window": 2.0,
        "floor_priorities": [0],
        "floor_run_ats": ["2000-01-01T00:00:00+00"],
        "floor_seqs": [1],
    }


def depth_params() -> dict[str, Any]:
    return {
        "job_id": "bulk",
        "max_attempts": [5],
        "depth_limit": 500,
        "now": None,
        "ids": ["explained-run"],
        "payloads": ["{}"],
        "dedupe_keys": ["explained-key"],
        "keys": [None],
        "run_ats": [None],
        "priorities": [0],
        "trace_contexts": [None],
        "tenant": None,
        "handler_version": None,
    }


def capped_params() -> dict[str, Any]:
    return {
        "job_id": "bulk",
        "max_attempts": [5],
        "depth_limit": 500,
        "now": None,
        "ids": ["explained-run"],
        "payloads": "[{}]",
        "keys": [None],
        "run_ats": [None],
        "priorities": [0],
        "trace_contexts": [None],
        "tenant": None,
        "handler_version": None,
    }


def settle_params() -> dict[str, Any]:
    """50 settlements of running runs with current tokens: complete, fail (retry and dead) and
    release mixed, as the completer batches them (the kernel's Settlement fields)."""
    kinds = ["complete", "fail", "fail", "release", "complete"] * 10
    dead = [kind == "fail" and n % 10 == 2 for n, kind in enumerate(kinds)]
    return {
        "ids": [f"x{n:09d}" for n in range(1, 51)],
        "tokens": list(range(1, 51)),
        "states": [
            "completed" if kind == "complete" else "dead" if is_dead else "waiting"
            for kind, is_dead in zip(kinds, dead, strict=True)
        ],
        "ats": [
            None if kind == "complete" or is_dead else "2030-01-01T00:00:00+00"
            for kind, is_dead in zip(kinds, dead, strict=True)
        ],
        "refunds": [kind == "release" for kind in kinds],
        "snoozes_added": [0 for _ in kinds],
        "errors": [None if kind == "complete" else "boom" for kind in kinds],
        "entry_kinds": [
            None if kind == "complete" else ("failure" if kind == "fail" else "released")
            for kind in kinds
        ],
        "keeps_lapses": [kind == "release" for kind in kinds],
        "wait_fors": [None for _ in kinds],
        "now": None,
    }


def completes_params() -> dict[str, Any]:
    """A batch of 50 completes, as the backend sends it: ids and tokens only."""
    full = settle_params()
    return {**full, **{name: [] for name in full if name not in {"ids", "tokens", "now"}}}


def heartbeat_params() -> dict[str, Any]:
    return {
        "ids": [f"x{n:09d}" for n in range(1, 51)],
        "tokens": list(range(1, 51)),
        "leases": [30.0] * 50,
        "now": None,
    }


CASES = [
    # name, statement, parameters, indexes it must read, rows it returns, buffers bounded by 2x
    # F1, F3: a gated claim (capped and rate-limited here) counts the job's running runs off the
    # lease index and takes its claim gate (the state table's primary key); an ungated one
    # reads the due index and the lapsed leases alone.
    (
        "claim gated",
        claim.CLAIM_GATED,
        claim_params,
        {"due_idx", "lease_idx"},
        50,
        True,
    ),
    ("claim uncapped", claim.CLAIM_UNCAPPED, claim_params, {"due_idx", "lease_idx"}, 50, True),
    # J19: the same claims with their walk starting at a floor (an index condition of due_idx).
    (
        "claim floored",
        claim.CLAIM_UNCAPPED,
        floored_claim_params,
        {"due_idx", "lease_idx"},
        50,
        True,
    ),
    (
        "claim gated floored",
        claim.CLAIM_GATED,
        floored_claim_params,
        {"due_idx", "lease_idx"},
        50,
        True,
    ),
    # F2: a fair claim walks the ten tenants (a loose scan), counts and takes each one's due
    # runs off the tenant index: bounded by tenants x limit at any backlog.
    ("claim fair", claim.CLAIM_FAIR, claim_params, {"tenant_idx", "lease_idx"}, 50, True),
    (
        "claim fair gated",
        claim.CLAIM_FAIR_GATED,
        claim_params,
        {"tenant_idx", "lease_idx"},
        50,
        True,
    ),
    # J4: the same claims excluding single-runner keys (the *_KEYED statements).
    (
        "claim gated keyed",
        claim.CLAIM_GATED_KEYED,
        claim_params,
        {"due_idx", "lease_idx"},
        50,
        True,
    ),
    (
        "claim uncapped keyed",
        claim.CLAIM_UNCAPPED_KEYED,
        claim_params,
        {"due_idx", "lease_idx"},
        50,
        True,
    ),
    (
        "claim fair keyed",
        claim.CLAIM_FAIR_KEYED,
        claim_params,
        {"tenant_idx", "lease_idx"},
        50,
        True,
    ),
    ("depth check", enqueue.ENQUEUE_MANY, depth_params, {"due_idx", "dedupe_idx", "pkey"}, 1, True),
    # J2's capped plain enqueue (after its gate): the same bounded count, no probes.
    ("capped enqueue", enqueue.ENQUEUE_PLAIN_CAPPED, capped_params, {"due_idx"}, 1, True),
    # J10's gauges: counting a million waiting runs reads them all, so only the index is
    # checked (an index-only scan of the due index, never the heap sequentially).
    (
        "queue depths",
        admin.QUEUE_DEPTHS,
        lambda: {"job_ids": ["bulk"], "now": None},
        {"due_idx"},
        1,
        False,
    ),
    # F5's demand of every job: a loose index scan finds the four jobs, each count stops at
    # its cap, the oldest due run is one probe per level: bounded at any backlog.
    (
        "demand",
        admin.DEMAND,
        lambda: {"job_ids": [], "all_jobs": True, "cap": 500, "max_jobs": 1000, "now": None},
        {"due_idx", "lease_idx"},
        4,
        True,
    ),
    # At a few thousand rows a hash join over a sequential scan is the cheaper plan, so only
    # the large table's plan shape is checked for the batched settle and heartbeat.
    ("settle", settle.SETTLE_IF_TOKEN_CURRENT, settle_params, {"pkey"}, 50, False),
    ("settle completes", settle.SETTLE_IF_TOKEN_CURRENT, completes_params, {"pkey"}, 50, False),
    # The heartbeat probes the primary key, or (its predicate implies the lease index's) reads
    # the lease index's running runs, which concurrency.max bounds whatever the backlog: either
    # serves it; a sequential scan never does.
    ("heartbeat", settle.HEARTBEAT_IF_TOKEN_CURRENT, heartbeat_params, set(), 50, False),
    # J13: a transactional handler's fence and the read that resolves an ambiguous COMMIT each
    # probe the primary key once.
    (
        "fence",
        settle.FENCE_RUN_FOR_UPDATE,
        lambda: {"id": "x000000001", "token": 1, "idle_ms": "30000"},
        {"pkey"},
        1,
        True,
    ),
    (
        "claim state",
        settle.CLAIM_STATE_IF_TOKEN,
        lambda: {"id": "x000000001", "token": 1},
        {"pkey"},
        1,
        True,
    ),
]


@pytest.mark.timeout(300)
@pytest.mark.slow
async def test_hot_statements_use_their_indexes_at_a_million_runs(loaded: AsyncEngine) -> None:
    """J3, J2, F1, F2: at 1,000,000 waiting runs the claim of 50 (capped, through the job's
    claim gate, and uncapped; fair across ten tenants, F2, off the tenant index) reads the due
    and lease partial indexes,
    the depth check reads the due index (index-only, stops at the limit), the J10 queue gauges
    read the due index, a batched settle of every kind (J5) probes the primary key, a batched
    heartbeat an index, F5's demand the due and lease indexes; no statement scans the runs table
    sequentially, in custom or generic
    plans, and each reads at most twice the buffers it reads at a backlog of 1,000. The J19
    floored claims too. This is J20's 1,000,000-live-rows state (test_job_plans_stable.py has
    the empty and dead states), sharing this seeded table."""
    report = []
    for name, template, params, uses, returned, bounded in CASES:
        for generic in (False, True):
            plans = {}
            for table in (big_runs, small_runs):
                statement = JobStatements(runs=table.name, state="ship_job_state")[template]
                async with loaded.connect() as connection, connection.begin() as transaction:
                    plans[table.name] = await explain(
                        connection, statement, params(), generic=generic
                    )
                    await transaction.rollback()
            big, small = plans[big_runs.name], plans[small_runs.name]
            check_plan(big, big_runs, uses=uses)
            if bounded:
                check_plan(small, small_runs, uses=uses)
            assert big["Actual Rows"] == small["Actual Rows"] == returned
            report.append((name, "generic" if generic else "custom", buffers(big), buffers(small)))
            if bounded:
                assert buffers(big) <= 2 * buffers(small), report[-1]
    print(report)  # noqa: T201 - the measured buffers, for the log


# --- K6: the claim over mixed priorities and many delayed high-priority runs ---------------------

prio_runs = ship_job_runs_table(metadata, name="prio_job_runs")
small_prio_runs = ship_job_runs_table(metadata, name="small_prio_job_runs")

PRIORITY_SHAPE = [
    # tag, runs per 1,000 of backlog (None: a fixed count), priority, delayed
    ("p10d", 200, 10, True),  # the highest level: every run delayed
    ("p5u", None, 5, False),  # 20 due runs under 100 delayed ones per 1,000
    ("p5d", 100, 5, True),
    ("p3u", None, 3, False),  # 10 due runs
    ("p1u", 400, 1, False),
    ("p0u", 290, 0, False),
    ("pm5d", 10, -5, True),  # a low level, delayed
]
"""Seven groups on six levels. A claim of 50 must take p5u's 20 due runs, p3u's 10, then 20 of
p1u's, reading past none of the delayed runs (a third of the backlog, most of it at the highest
priority) and never reaching level 0."""
FIXED = {"p5u": 20, "p3u": 10}
LEVELS = 6


def _load_priorities(table: str, backlog: int) -> list[str]:
    columns = "id, job_id, state, payload, max_attempts, run_at, created_at, updated_at, priority"
    statements = []
    for tag, per_thousand, priority, delayed in PRIORITY_SHAPE:
        count = FIXED[tag] if per_thousand is None else per_thousand * backlog // 1_000
        due = "interval '1 day'" if delayed else "- interval '1 hour'"
        statements.append(
            f"INSERT INTO {table} ({columns})"
            f" SELECT '{tag}' || lpad(g::text, 9, '0'), 'bulk', 'waiting', '{{}}'::jsonb, 5,"
            f"  now() + {due} + g * interval '1 millisecond', now(), now(), {priority}"
            f" FROM generate_series(1, {count}) g"
        )
    return statements


SEED = SeedStep(
    name="job_explain",
    # Indexes grown by the inserts, as a live table's are: freshly built ones are denser, and
    # the planner then reads other indexes (the tenant index for the queue depths; the
    # throughput's walk past its cap).
    defer_indexes=False,
    metadata=metadata,
    statements=[
        *_load("ship_job_runs", BIG),
        *_load("small_job_runs", SMALL),
        *_load_priorities(prio_runs.name, BIG),
        *_load_priorities(small_prio_runs.name, SMALL),
        GATE,
    ],
)
"""The module's data set in the session's seeded template (tests/support/seeded_template.py):
the backlog of waiting runs, and the priority levels' backlog, at both sizes."""


@pytest.fixture
def loaded_priorities(seeded_engine: AsyncEngine) -> AsyncEngine:
    return seeded_engine


@pytest.mark.timeout(300)
@pytest.mark.slow
async def test_priority_claim_reads_about_limit_entries_at_a_million_runs(
    loaded_priorities: AsyncEngine,
) -> None:
    """K6, J3, F1: at 1,000,000 waiting runs on six priority levels, a third of them delayed and
    most of those at the highest priority, the claim of 50 takes the due runs highest priority
    first and reads about limit index entries plus two per level it visits (never the delayed
    runs), off the due and lease partial indexes, with no sequential scan, in custom and generic
    plans, at most twice the buffers of the same shape at a backlog of 1,000; its estimated cost
    stays far below jit_above_cost, so PostgreSQL never JIT-compiles a claim; capped (through
    the job's claim gate) and uncapped claims alike."""
    report = []
    for template, generic in itertools.product(
        (claim.CLAIM_GATED, claim.CLAIM_UNCAPPED), (False, True)
    ):
        plans = {}
        for table in (prio_runs, small_prio_runs):
            statement = JobStatements(runs=table.name, state="ship_job_state")[template]
            async with loaded_priorities.connect() as connection, connection.begin() as tx:
                plans[table.name] = await explain(
                    connection, statement, claim_params(), generic=generic
                )
                taken = (
                    await connection.execute(
                        text(
                            f"SELECT left(id, 3) AS tag, count(*) FROM {table.name}"
                            " WHERE state = 'running' GROUP BY 1 ORDER BY 1"
                        )
                    )
                ).all()
                await tx.rollback()
            assert [tuple(row) for row in taken] == [("p1u", 20), ("p3u", 10), ("p5u", 20)]
        big, small = plans[prio_runs.name], plans[small_prio_runs.name]
        # At about a thousand rows the planner may update the 50 claimed ones off a
        # sequential scan of the table's few pages: only the large table's shape is checked.
        check_plan(big, prio_runs, uses={"due_idx", "lease_idx"})
        for plan, table in ((big, prio_runs), (small, small_prio_runs)):
            assert plan["Actual Rows"] == 50
            # 50 runs taken, the next level found from each level visited (10, 5, 3, 1: four
            # probes), and at most one entry per visited level past its due runs.
            assert due_index_entries(plan, table) <= 50 + 2 * LEVELS, report
            assert plan["Total Cost"] < 100_000
        report.append(
            (
                "gated" if template is claim.CLAIM_GATED else "ungated",
                "generic" if generic else "custom",
                buffers(big),
                buffers(small),
                due_index_entries(big, prio_runs),
            )
        )
        assert buffers(big) <= 2 * buffers(small), report[-1]
    print(report)  # noqa: T201 - the measured buffers, for the log
