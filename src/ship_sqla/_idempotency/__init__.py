"""Idempotency keys (SPEC section 5): table, store, outcomes."""

from ship_sqla._idempotency._store import IdempotencyStore as IdempotencyStore
from ship_sqla._idempotency._store import create_idempotency_store as create_idempotency_store
from ship_sqla._idempotency._tables import ship_idempotency_table as ship_idempotency_table
from ship_sqla._idempotency._types import IdempotencyClaim as IdempotencyClaim
from ship_sqla._idempotency._types import IdempotencyClaimLostError as IdempotencyClaimLostError
from ship_sqla._idempotency._types import (
    IdempotencyFingerprintMismatch as IdempotencyFingerprintMismatch,
)
from ship_sqla._idempotency._types import IdempotencyInProgress as IdempotencyInProgress
from ship_sqla._idempotency._types import IdempotencyKeyError as IdempotencyKeyError
from ship_sqla._idempotency._types import IdempotencyOutcome as IdempotencyOutcome
from ship_sqla._idempotency._types import IdempotencyRecord as IdempotencyRecord
from ship_sqla._idempotency._types import (
    IdempotencyRecordCorruptError as IdempotencyRecordCorruptError,
)
from ship_sqla._idempotency._types import IdempotencyReplay as IdempotencyReplay
from ship_sqla._idempotency._types import IdempotencyStarted as IdempotencyStarted
from ship_sqla._idempotency._types import StoredResponse as StoredResponse

__all__ = [
    "IdempotencyClaim",
    "IdempotencyClaimLostError",
    "IdempotencyFingerprintMismatch",
    "IdempotencyInProgress",
    "IdempotencyKeyError",
    "IdempotencyOutcome",
    "IdempotencyRecord",
    "IdempotencyRecordCorruptError",
    "IdempotencyReplay",
    "IdempotencyStarted",
    "IdempotencyStore",
    "StoredResponse",
    "create_idempotency_store",
    "ship_idempotency_table",
]
