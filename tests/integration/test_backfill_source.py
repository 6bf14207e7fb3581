"""``selectable_source`` on PostgreSQL (C4): keyset pages in key order, a composite key with
repeated leading values, the select's own filter kept, and each page one range scan of the key's
index (never a sort of the whole table)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Column, Index, Integer, MetaData, Table, Text, select, text

from ship_sqla.backfills import selectable_source

ROWS = 20_000
metadata = MetaData()
events = Table(
    "bf_source_events",
    metadata,
    Column("tenant", Integer, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("kind", Text, nullable=False),
    Index("bf_source_events_key_idx", "tenant", "seq", unique=True),
)


async def _load(engine: Any) -> None:
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await connection.execute(
            text(
                "INSERT INTO bf_source_events (tenant, seq, kind)"
                " SELECT g % 7, g, CASE WHEN g % 3 = 0 THEN 'skip' ELSE 'keep' END"
                f" FROM generate_series({ROWS}, 1, -1) g"
            )
        )
        await connection.execute(text("ANALYZE bf_source_events"))


async def test_c4_a_composite_key_pages_every_matching_row_once_in_key_order(ship_engine) -> None:
    """C4: ``(tenant, seq) > (:a, :b) ORDER BY tenant, seq LIMIT n`` walks every row the
    select's filter keeps, once, in key order, across pages that end in the middle of a
    tenant; the last page is short, then an empty one ends the pass."""
    await _load(ship_engine)
    source = selectable_source(
        ship_engine,
        select(events.c.tenant, events.c.seq).where(events.c.kind == "keep"),
        key=[events.c.tenant, events.c.seq],
    )
    seen: list[tuple[int, int]] = []
    after = None
    pages = 0
    while True:
        page = await source.page(after, 997)
        if not page.rows:
            assert page.last_key is None
            break
        pages += 1
        seen.extend((row.tenant, row.seq) for row in page.rows)
        assert page.last_key == seen[-1]
        after = page.last_key
    expected = sorted((g % 7, g) for g in range(1, ROWS + 1) if g % 3 != 0)
    assert seen == expected
    assert pages == -(-len(expected) // 997)


async def test_c4_a_page_is_a_range_scan_of_the_key_index(ship_engine) -> None:
    """C4: one page is one statement served by the index on the key columns: an index scan
    from the stored key, stopped by the LIMIT, no sort and no sequential scan of the table."""
    await _load(ship_engine)
    source = selectable_source(
        ship_engine,
        select(events.c.tenant, events.c.seq).where(events.c.kind == "keep"),
        key=[events.c.tenant, events.c.seq],
    )
    statement = source.statement((3, 10_000), 500)
    compiled = statement.compile(ship_engine.sync_engine, compile_kwargs={"literal_binds": True})
    async with ship_engine.connect() as connection:
        plan = (await connection.execute(text(f"EXPLAIN (FORMAT JSON) {compiled}"))).scalar_one()
    text_plan = repr(plan)
    assert "bf_source_events_key_idx" in text_plan
    assert "'Sort'" not in text_plan
    assert "Seq Scan" not in text_plan
