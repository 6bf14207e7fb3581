from ship_sqla._idempotency import IdempotencyClaim as IdempotencyClaim
from ship_sqla._idempotency import IdempotencyFingerprintMismatch as IdempotencyFingerprintMismatch
from ship_sqla._idempotency import IdempotencyInProgress as IdempotencyInProgress
from ship_sqla._idempotency import IdempotencyOutcome as IdempotencyOutcome
from ship_sqla._idempotency import IdempotencyRecord as IdempotencyRecord
from ship_sqla._idempotency import IdempotencyReplay as IdempotencyReplay
from ship_sqla._idempotency import IdempotencyStarted as IdempotencyStarted
from ship_sqla._idempotency import IdempotencyStore as IdempotencyStore
from ship_sqla._idempotency import StoredResponse as StoredResponse

__all__ = (
    "IdempotencyClaim",
    "IdempotencyFingerprintMismatch",
    "IdempotencyInProgress",
    "IdempotencyOutcome",
    "IdempotencyRecord",
    "IdempotencyReplay",
    "IdempotencyStarted",
    "IdempotencyStore",
    "StoredResponse",
)
