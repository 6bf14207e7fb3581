"""J20: every hot statement of the runs table is served by its named index whatever the table's
statistics say: with the table empty (never analyzed, as right after ``schema apply``) and then
with 100,000 dead rows (0 live, analyzed), each as a custom and as a generic plan
(``plan_cache_mode`` forced per transaction, as a pooled connection's prepared statement would
get either). One table goes through both states in turn; the third state, 1,000,000 live rows,
is test_job_explain.py's seeded table (the same statements, J19's floored claims included).

The statements and the indexes they must name are test_job_explain's (J3, J2, J5, F1, F2),
J19's floored claims among them; settle and heartbeat probe the primary key. Here also the
settle of a backend with a history table (J16's SETTLE_MOVING: its UPDATE of what stays live
and its DELETE of what ends, every kind and completes only), which must probe the primary key
too. F8-F10's claims (the partitioned walks and the aged seek) go through the same two states
on a second table, declared for them. The mechanism
(statement shapes; no session setting, so it holds through PgBouncer's transaction pooling) is
in docs/architecture.md, "Plans that cannot flip"."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from explain_helpers import check_plan, explain
from sqlalchemy import MetaData, Table, text
from sqlalchemy.ext.asyncio import AsyncEngine
from test_job_explain import CASES, GATE, _load, completes_params, settle_params
from test_job_plans_held import _aged, _partitioned

from ship_sqla._jobs import ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._sql import JobStatements, claim, live
from ship_sqla._jobs._tables import ship_job_history_table

metadata = MetaData()
runs = ship_job_runs_table(metadata, name="stable_job_runs", fair_claims=True)
flows = ship_job_runs_table(
    metadata, name="stable_flow_runs", partitioned_claims=True, partition_keys=True
)
"""The claims of F8-F10 (partitioned walks, the aged seek) on a table declared for them."""
ship_job_state_table(metadata)
history = ship_job_history_table(metadata, name="stable_job_history")
DEAD = 100_000


def _moving(params: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """SETTLE_MOVING's arrays: the settle's, plus each attempt's start and what history keeps
    (both empty: NULLs, as for a batch of completions)."""
    return lambda: {**params(), "starts": [], "keeps": []}


STATEMENTS = [
    # J10's queue-depth gauges (a sampler's statement, not a hot path) are left out: with the
    # table empty or dead their count runs off the due or the tenant index, varying by run.
    *(
        (name, template, params, uses)
        for name, template, params, uses, _, _ in CASES
        if name != "queue depths"
    ),
    ("settle moving", live.SETTLE_MOVING, _moving(settle_params), {"pkey"}),
    ("settle moving completes", live.SETTLE_MOVING, _moving(completes_params), {"pkey"}),
]
"""(name, statement, parameters, the indexes its plan must name)."""

FLOW_STATEMENTS = [
    # test_job_plans_held's parameters; the 1,000,000-run state is test_job_partition_explain's
    # (F8, F9) and test_job_aging's EXPLAIN (F10).
    ("claim aged", claim.CLAIM_AGED, _aged, {"due_idx"}),
    ("claim aged gated", claim.CLAIM_AGED_GATED, _aged, {"due_idx", "lease_idx"}),
    ("claim partitioned", claim.CLAIM_PARTITIONED, _partitioned, {"tenant_idx"}),
    ("claim partitioned by key", claim.CLAIM_PARTITIONED_BY_KEY, _partitioned, {"part_idx"}),
]


def known_flip(state_name: str, name: str) -> bool:
    """J20 is not yet met for these (measured on PostgreSQL 15; this list is strict: a fix, or
    a new flip, fails the test until the list says so):

    - ``empty`` (never analyzed: the planner assumes 10 pages): every claim's closing UPDATEs
      (``buried``, ``claimed``: ``WHERE r.id = ANY(ARRAY(...))``, the shared ``_CLAIM_TAIL``)
      scan the table sequentially instead of probing ``<runs>_pkey``. Their walks (due, tenant,
      lease indexes) hold. Harmless while the table is truly empty; the risk is a generic plan
      kept while it fills, until the next ANALYZE invalidates it. The settles' one-path probe
      (settle.py's docstring) was tried here and fixes it, but flips the same UPDATEs to a
      sequential scan on test_job_plans_held.py's table and costs the claim ~5-10 % of its
      server time (BENCHMARKS.md, "J20's two listed flips"), so it is not applied.

    The batched settles (in place and J16's moving one) probe ``<runs>_pkey`` in every state.
    """
    return state_name == "empty" and name.startswith("claim") and name != "claim state"


def expected_flips(*states: str, statements: list[Any] = STATEMENTS) -> list[str]:
    return [
        f"{state_name} {name} {kind}"
        for state_name in states
        for name, *_ in statements
        for kind in ("custom", "generic")
        if known_flip(state_name, name)
    ]


async def _check(
    engine: AsyncEngine, state_name: str, table: Table = runs, statements: list[Any] = STATEMENTS
) -> list[str]:
    """EXPLAIN every statement, custom and generic; the failures as text."""
    failures: list[str] = []
    for name, template, params, uses in statements:
        statement = JobStatements(runs=table.name, state="ship_job_state", history=history.name)[
            template
        ]
        for generic in (False, True):
            async with engine.connect() as connection, connection.begin() as transaction:
                plan = await explain(connection, statement, params(), generic=generic)
                await transaction.rollback()
            try:
                check_plan(plan, table, uses=uses)
            except AssertionError as error:
                kind = "generic" if generic else "custom"
                failures.append(f"{state_name} {name} {kind}")
                print(f"{state_name} {name} {kind}: {str(error)[:160]}")  # noqa: T201
    return failures


async def _create(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await connection.execute(text(GATE))
    # Still empty and never analyzed, but its indexes hold a page each (a first insert rolled
    # back, as after a failed first enqueue): a primary key with a leaf prices each probe
    # higher than one with its metapage alone, which tips a one-path probe without its
    # padding into a sequential scan (settle.py's docstring: the padding is the margin).
    async with engine.connect() as connection, connection.begin() as transaction:
        await connection.execute(
            text(
                f"INSERT INTO {runs.name} (id, job_id, state, payload, max_attempts, run_at,"
                " created_at, updated_at) VALUES ('first', 'bulk', 'waiting', '{}', 5, now(),"
                " now(), now())"
            )
        )
        await transaction.rollback()


async def _dead(engine: AsyncEngine, table: Table = runs) -> None:
    async with engine.begin() as connection:
        for statement in _load(table.name, DEAD):
            await connection.execute(text(statement))
        await connection.execute(text(f"DELETE FROM {table.name}"))
    async with engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        await connection.execute(text(f"ANALYZE {table.name}"))


@pytest.mark.timeout(300)
async def test_j20_hot_statements_name_their_index_empty_and_at_100k_dead(
    ship_engine: AsyncEngine,
) -> None:
    """J20 (J3, J5, F1, F2, J19): with the runs table empty (never analyzed) and then with
    100,000 dead rows and none live (analyzed), every hot statement's custom and generic plan
    names its index and never scans the runs table sequentially, except the flips
    ``known_flip`` lists (J20 not yet met for them: strict, a fix fails until listed). The
    settles (J5; J16's moving settle too) probe ``<runs>_pkey`` in every state."""
    await _create(ship_engine)
    failures = await _check(ship_engine, "empty")
    await _dead(ship_engine)
    failures += await _check(ship_engine, "dead")
    assert failures == expected_flips("empty", "dead")


@pytest.mark.timeout(300)
async def test_j20_f8_f9_f10_claims_name_their_index_empty_and_at_100k_dead(
    ship_engine: AsyncEngine,
) -> None:
    """J20 (F8, F9, F10): the partitioned claims (by tenant and by key) and the aged seek, on a
    table declared with ``partitioned_claims`` and ``partition_keys``, name their walk's index
    and never scan the runs table sequentially, empty (never analyzed) and at 100,000 dead
    rows (analyzed), custom and generic, but for the flips ``known_flip`` lists."""
    await _create(ship_engine)
    failures = await _check(ship_engine, "empty", flows, FLOW_STATEMENTS)
    await _dead(ship_engine, flows)
    failures += await _check(ship_engine, "dead", flows, FLOW_STATEMENTS)
    assert failures == expected_flips("empty", "dead", statements=FLOW_STATEMENTS)
