"""S2, issue 36 items 1 and 5 at 1,000,000 runs (the dashboard EXPLAIN test's seeded data): a
bulk preview's count is ONE statement (COUNT_MATCHING_*, ``_jobs/_sql/count.py``), each of its
(state, table) branches served by that state's index (``<runs>_due_idx``, ``<runs>_lease_idx``,
``<runs>_browse_idx`` / ``<runs>_finished_idx``), no sequential scan of the runs table, at most
its scan bound of entries read; its answer is the runs that match (checked against a plain
count), as a custom plan and as a prepared statement's generic plan."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
from explain_helpers import explain, nodes
from sqlalchemy import MetaData, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateIndex
from statement_watch import watched
from tests.integration.test_dashboard_explain import SEED, big_runs

from ship_sqla import create_job_operations
from ship_sqla._jobs import create_job_backend, ship_job_runs_table
from ship_sqla._jobs._sql import JobStatements, count
from ship_sqla.jobs import RunFilter

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["SEED"]

_BASE: dict[str, Any] = {
    "scan": 1_000_000,
    "max_jobs": 200,
    "run_id": None,
    "tenant": None,
    "worker": None,
    "error": None,
    "time_from": None,
    "time_to": None,
    "payload": "[]",
    # the tenant indexes' names as COUNT_MATCHING_OF_JOB's to_regclass reads them (the seeded
    # table has neither: a table declared with fair_claims / partitioned_claims has them)
    "tenant_index": '"ship_job_runs_tenant_idx"',
    "running_index": '"ship_job_runs_running_idx"',
}

CASES: list[tuple[str, dict[str, Any], str, set[str]]] = [
    # cancel job3's runs of tenant t3: 10,000 waiting and 10,000 running entries read
    (
        "cancel.job_tenant",
        {"waiting": True, "running": True, "dead": False, "job_id": "job3", "tenant": "t3"},
        (
            "SELECT count(*) FROM ship_job_runs WHERE state IN ('waiting', 'running')"
            " AND job_id = 'job3' AND tenant_id = 't3'"
        ),
        {"due_idx", "lease_idx"},
    ),
    # retry every dead run whose error holds a text: the 10,000 dead entries
    (
        "retry.error",
        {"waiting": False, "running": False, "dead": True, "error": "Declined"},
        (
            "SELECT count(*) FROM ship_job_runs WHERE state = 'dead'"
            " AND strpos(lower(last_error COLLATE \"C\"), 'declined') > 0"
        ),
        set(),
    ),
    # discard job0's waiting and dead runs with a payload field
    (
        "discard.job_payload",
        {
            "waiting": True,
            "running": False,
            "dead": True,
            "job_id": "job0",
            "payload": json.dumps([[["order", "id"], 7]]),
        },
        (
            "SELECT count(*) FROM ship_job_runs WHERE state IN ('waiting', 'dead')"
            " AND job_id = 'job0' AND payload #> '{order,id}' = '7'"
        ),
        {"due_idx"},
    ),
]


def _seq_scans(plan: dict[str, Any]) -> list[tuple[str, int]]:
    """The sequential scans of the runs table that read any row (a branch its flag switches
    off is planned but never run: its one-time filter is false)."""
    return [
        (str(n["Relation Name"]), round(n["Actual Rows"] + n.get("Rows Removed by Filter", 0)))
        for n in nodes(plan)
        if n["Node Type"] == "Seq Scan"
        and n.get("Relation Name") == big_runs.name
        and n["Actual Rows"] + n.get("Rows Removed by Filter", 0) > 0
    ]


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
async def test_s2_a_preview_count_is_one_index_served_statement_at_1m_runs(
    seeded_engine: AsyncEngine, case: tuple[str, dict[str, Any], str, set[str]], generic: bool
) -> None:
    """S2, issue 36 items 1 and 5: COUNT_MATCHING_OF_JOB / _ALL_JOBS read each state's index
    (no sequential scan of the runs table) and answer the count a plain query gives."""
    _name, given, plain, uses = case
    statements = JobStatements(runs="ship_job_runs", state="ship_job_state")
    template = count.COUNT_MATCHING_OF_JOB if "job_id" in given else count.COUNT_MATCHING_ALL_JOBS
    params = {**_BASE, **given}
    async with seeded_engine.connect() as connection:
        expected = (await connection.execute(text(plain))).scalar_one()
        plan = await explain(connection, statements[template], params, generic=generic)
        await connection.rollback()
    assert not _seq_scans(plan), _seq_scans(plan)
    used = {n["Index Name"] for n in nodes(plan) if "Index Name" in n}
    assert {f"{big_runs.name}_{suffix}" for suffix in uses} <= used, used
    async with seeded_engine.connect() as connection:
        row = (await connection.execute(statements[template], params)).one()
    assert row.matched == expected
    assert not row.stopped


async def test_s2_the_preview_sends_one_count_at_1m_runs(seeded_engine: AsyncEngine) -> None:
    """S2, issue 36 item 1: ``preview_matching`` sends the count (after the cross-job reads'
    JIT switch, which for the count also asks a custom plan: at 10M runs PostgreSQL kept the
    prepared count's generic plan from its sixth run on, a sequential scan of the runs table,
    380 ms against 195) and no page of rows: the preview's time is one statement's."""
    backend = create_job_backend(
        database=seeded_engine, table=ship_job_runs_table(MetaData()), listen=False
    )
    ops = create_job_operations(backend, authorizer=lambda *_: True)
    flt = RunFilter.parse(["job=job3", "tenant=t3"])
    with watched(seeded_engine) as seen:
        started = time.perf_counter()
        preview = await ops.preview_matching("cancel", flt)
        elapsed = time.perf_counter() - started
    print(f"\npreview count at 1M runs, job3 tenant t3: {elapsed * 1000:.0f} ms")  # noqa: T201 - read with -s
    settings = [s for s in seen if s.startswith("SELECT set_config('jit', 'off', true)")]
    assert len(settings) == 1
    assert "set_config('plan_cache_mode', 'force_custom_plan', true)" in settings[0]
    sent = [s for s in seen if s not in settings]
    assert len(sent) == 1
    assert "count(*)" in sent[0]
    assert preview.count > 0
    assert not preview.capped
    assert not preview.stopped


_TENANT_INDEXES = ("tenant_idx", "running_idx")


def _tenant_index_ddl() -> list[str]:
    """CREATE INDEX of ``<runs>_tenant_idx`` and ``<runs>_running_idx`` as a table declared
    with ``partitioned_claims=True`` has them (plain, not CONCURRENTLY: in the test's
    transaction, rolled back)."""
    declared = ship_job_runs_table(MetaData(), partitioned_claims=True)
    wanted = {f"{declared.name}_{suffix}" for suffix in _TENANT_INDEXES}
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    return [
        str(CreateIndex(index).compile(dialect=dialect))
        for index in declared.indexes
        if index.name in wanted
    ]


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize(
    ("given", "only_index"),
    [
        ({"tenant": "t3"}, True),
        ({"tenant": "t3", "time_to": datetime(9999, 1, 1, tzinfo=UTC)}, False),
        ({"tenant": "t3", "worker": "w"}, False),
    ],
    ids=["tenant", "tenant_range", "tenant_worker"],
)
async def test_s2_a_tenant_count_reads_the_tenant_indexes_when_the_table_has_them(
    seeded_engine: AsyncEngine, given: dict[str, Any], only_index: bool, generic: bool
) -> None:
    """S2, issue 36 items 1 and 5 (10,000,000 runs: 624 ms p50 for one job's ~200,000 live runs,
    the tenant residual): on a runs table with ``<runs>_tenant_idx`` and ``<runs>_running_idx``
    (fair_claims / partitioned_claims), COUNT_MATCHING_OF_JOB with a tenant reads only the job's
    and tenant's entries there (their claim indexes' branches are switched off, never run):
    an index-only count when no other filter is asked, else those entries' rows with the other
    filters residual. Still at most :scan entries a branch, and the count a plain query gives."""
    statements = JobStatements(runs="ship_job_runs", state="ship_job_state")
    params = {**_BASE, "waiting": True, "running": True, "dead": False, "job_id": "job3", **given}
    plain = (
        "SELECT count(*) FROM ship_job_runs WHERE state IN ('waiting', 'running')"
        " AND job_id = 'job3' AND tenant_id = 't3'"
        + (" AND claimed_by = 'w' AND state = 'running'" if "worker" in given else "")
    )
    async with seeded_engine.connect() as connection:
        for ddl in _tenant_index_ddl():
            await connection.execute(text(ddl))
        expected = (await connection.execute(text(plain))).scalar_one()
        template = count.COUNT_MATCHING_OF_JOB
        plan = await explain(connection, statements[template], params, generic=generic)
        row = (await connection.execute(statements[template], params)).one()
        await connection.rollback()
    ran = [n for n in nodes(plan) if "Index Name" in n and n.get("Actual Loops", 0) > 0]
    used = {n["Index Name"] for n in ran}
    assert used == {f"{big_runs.name}_{suffix}" for suffix in _TENANT_INDEXES}, used
    kinds = {n["Node Type"] for n in ran}
    if only_index:
        assert kinds == {"Index Only Scan"}, kinds
    else:
        assert kinds <= {"Index Scan", "Bitmap Index Scan"}, kinds
    read = sum(int(n["Actual Rows"]) for n in ran)
    assert read == row.scanned
    assert read < 3_000, read  # job3's tenant t3 entries only: ~1,430 waiting, ~1,430 running
    assert row.matched == expected
    assert not row.stopped
