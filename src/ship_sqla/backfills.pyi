from ship_sqla._backfills import create_backfill_ledger as create_backfill_ledger
from ship_sqla._backfills import selectable_source as selectable_source
from ship_sqla._backfills import ship_backfills_table as ship_backfills_table
from ship_sqla.kernel._backfill_operations import BackfillBlocker as BackfillBlocker
from ship_sqla.kernel._backfill_operations import BackfillCancel as BackfillCancel
from ship_sqla.kernel._backfill_operations import BackfillOperations as BackfillOperations
from ship_sqla.kernel._backfill_operations import BackfillStart as BackfillStart
from ship_sqla.kernel._backfill_operations import (
    create_backfill_operations as create_backfill_operations,
)
from ship_sqla.kernel._backfills import Backfill as Backfill
from ship_sqla.kernel._backfills import BackfillPage as BackfillPage
from ship_sqla.kernel._backfills import BackfillRecord as BackfillRecord
from ship_sqla.kernel._backfills import BackfillState as BackfillState
from ship_sqla.kernel._backfills import define_backfill as define_backfill

__all__ = (
    "Backfill",
    "BackfillBlocker",
    "BackfillCancel",
    "BackfillOperations",
    "BackfillPage",
    "BackfillRecord",
    "BackfillStart",
    "BackfillState",
    "create_backfill_ledger",
    "create_backfill_operations",
    "define_backfill",
    "selectable_source",
    "ship_backfills_table",
)
