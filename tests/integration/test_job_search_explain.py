"""S2, issue 36 item 4 at 1,000,000 runs (the dashboard EXPLAIN test's seeded data): a search
sends only the runs pages' statements, each index-served at the walk's read size (500 rows),
and a filter the index does not serve stops at its scan bound and says so."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from explain_helpers import check_plan, explain, nodes
from sqlalchemy import MetaData
from statement_watch import watched
from tests.integration.test_dashboard_explain import JOBS, LEVELS, SEED, big_runs

from ship_sqla import create_job_operations
from ship_sqla._jobs import create_job_backend, ship_job_runs_table
from ship_sqla._jobs._sql import JobStatements, browse
from ship_sqla.jobs import RunFilter

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["SEED"]

READ = 500
"""Rows per statement of the search's walk (kernel/_search.py ``_READ``)."""


async def _ops(engine: AsyncEngine) -> Any:
    # The in-place shape (a runs table given, no history declared): its walk is measured.
    backend = create_job_backend(
        database=engine, table=ship_job_runs_table(MetaData()), listen=False
    )
    return create_job_operations(backend, authorizer=lambda *_: True)


async def test_s2_a_search_stops_at_its_scan_bound_at_1m_runs(seeded_engine: AsyncEngine) -> None:
    """S2, issue 36 item 4: a payload filter that matches nothing, on one job, reads exactly its
    scan bound (2,000 runs, in a few statements of the waiting runs' page: the first of the
    page's size, each next one four times larger up to 500) and stops saying "scanned 2,000,
    stopped"; a state the index serves costs one page (across jobs, after the JIT switch).
    Each statement is the runs page's own (index-served: see the EXPLAIN below and
    test_dashboard_explain.py)."""
    ops = await _ops(seeded_engine)
    flt = RunFilter.parse(["job=job1", "payload=order.id=1"])
    with watched(seeded_engine) as seen:
        started = time.perf_counter()
        page = await ops.search_runs(flt, scan=2000)
        elapsed = time.perf_counter() - started
    print(f"\nsearch at 1M runs, one job, 2,000 read past: {elapsed * 1000:.0f} ms")  # noqa: T201 - the figure docs/jobs.md states, read with -s
    assert page.items == ()
    assert page.stopped
    assert page.note == "scanned 2,000, stopped"
    assert page.next_cursor is not None
    assert len(seen) == 6  # 51 + 204 + 500 + 500 + 500 + 245
    assert all("ship_job_runs" in statement for statement in seen)
    with watched(seeded_engine) as seen:
        dead = await ops.search_runs(RunFilter.parse(["state=dead"]), limit=20)
    assert len(dead.items) == 20
    assert not dead.stopped
    # one page statement, after the cross-job reads' JIT switch (``SET LOCAL jit = off``)
    assert [s for s in seen if not s.startswith("SET LOCAL jit")] == seen[-1:]
    assert len(seen) == 2


async def test_s2_the_search_walk_s_page_is_index_served_at_its_read_size(
    seeded_engine: AsyncEngine,
) -> None:
    """S2: the waiting runs' page across every job at the walk's 500 rows reads
    ``<runs>_due_idx``, no sequential scan, at most a page per job and priority level; the
    dead runs' page reads ``<runs>_browse_idx`` likewise, the completed runs' (J18, in finish
    order) ``<runs>_finished_idx``."""
    statements = JobStatements(runs="ship_job_runs", state="ship_job_state")
    waiting = {"limit": READ, "tenant": None, "max_jobs": 200}
    waiting |= {"after_priority": None, "after_run_at": None, "after_seq": None}
    finished = {"limit": READ, "tenant": None, "max_jobs": 200, "state": "dead"}
    finished |= {"created_from": None, "created_to": None, "after_at": None, "after_id": None}
    completed = {"limit": READ, "tenant": None, "max_jobs": 200}
    completed |= {"finished_from": None, "finished_to": None, "after_at": None, "after_id": None}
    for template, params, index in (
        (browse.LIST_WAITING_ALL_JOBS, waiting, "due_idx"),
        (browse.LIST_FINISHED_ALL_JOBS, finished, "browse_idx"),
        (browse.LIST_COMPLETED_ALL_JOBS, completed, "finished_idx"),
    ):
        async with seeded_engine.connect() as connection:
            plan = await explain(connection, statements[template], params, generic=True)
            await connection.rollback()
        check_plan(plan, big_runs, uses={index})
        read = sum(
            int(n.get("Actual Rows", 0)) * int(n.get("Actual Loops", 1))
            for n in nodes(plan)
            if str(n.get("Index Name", "")).startswith("ship_job_runs_")
        )
        assert 0 < read <= JOBS * LEVELS * (READ + 1), (index, read)
