"""S2, issue 36 item 6: the audit page's filtered reads at 100,000 entries. A filtered page is
at most ten reads of the log's newest-first page (LIST_AUDIT), each a backward range of
``<audit>_pkey`` from the cursor, never a sequential scan; the walk stops at the scan bound
and says so."""

from __future__ import annotations

from datetime import UTC, datetime

from explain_helpers import check_plan, explain, nodes
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla import create_audit_log, ship_audit_table
from ship_sqla._audit._sql import LIST_AUDIT
from ship_sqla.kernel._audit import AUDIT_SCAN, AuditFilter, search_audit

ENTRIES = 100_000


async def test_s2_a_filtered_audit_page_reads_the_primary_key_within_its_bound(
    ship_engine: AsyncEngine,
) -> None:
    """S2: LIST_AUDIT at 100,000 entries is an index scan of ``ship_audit_pkey`` reading at most
    its limit (custom and generic plans); a filter no entry matches reads exactly the scan
    bound (5,000 entries in ten reads), stops, and names where to read on."""
    metadata = MetaData()
    table = ship_audit_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await connection.execute(
            text(
                "INSERT INTO ship_audit (at, actor, operation, target, count)"
                " SELECT now() - make_interval(secs => :n - g), 'user' || (g % 7),"
                " 'jobs.retry', 'run-' || g, 1 FROM generate_series(1, :n) g"
            ),
            {"n": ENTRIES},
        )
        await connection.execute(text("ANALYZE ship_audit"))
    log = create_audit_log(database=ship_engine, table=table)
    statement = log._s[LIST_AUDIT]
    for generic in (False, True):
        async with ship_engine.connect() as connection:
            plan = await explain(
                connection, statement, {"limit": 500, "before": ENTRIES // 2}, generic=generic
            )
            await connection.rollback()
        check_plan(plan, table, uses={"pkey"})
        read = sum(int(n.get("Actual Rows", 0)) for n in nodes(plan) if "Index Name" in n)
        assert read <= 500, (generic, read)
    nobody = AuditFilter(actor="nobody", since=datetime(2000, 1, 1, tzinfo=UTC))
    page = await search_audit(log, nobody, limit=50, before=None)
    assert (page.entries, page.scanned, page.stopped) == ((), AUDIT_SCAN, True)
    assert page.next_before == ENTRIES - AUDIT_SCAN + 1
    found = await search_audit(log, AuditFilter(target="run-99993"), limit=50, before=None)
    assert [e.target for e in found.entries] == ["run-99993"]
