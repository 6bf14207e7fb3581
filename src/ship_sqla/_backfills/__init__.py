"""Paced backfills on PostgreSQL (C4, C5): the ledger table, its store and the default source."""

from ship_sqla._backfills._source import SelectableSource as SelectableSource
from ship_sqla._backfills._source import selectable_source as selectable_source
from ship_sqla._backfills._store import PostgresBackfillLedger as PostgresBackfillLedger
from ship_sqla._backfills._store import create_backfill_ledger as create_backfill_ledger
from ship_sqla._backfills._tables import ship_backfills_table as ship_backfills_table

__all__ = [
    "PostgresBackfillLedger",
    "SelectableSource",
    "create_backfill_ledger",
    "selectable_source",
    "ship_backfills_table",
]
