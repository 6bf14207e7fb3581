"""The transactional outbox (SPEC section 4): table, store and relay.

O1-O4 are stated in ``_store.py``; the claim's SQL and the indexes serving it in ``_sql.py`` and
``_tables.py``; the relay loop and the ordered-mode guarantee in ``_relay.py``.
"""

from ship_sqla._outbox._backoff import Backoff as Backoff
from ship_sqla._outbox._backoff import OutboxBackoff as OutboxBackoff
from ship_sqla._outbox._backoff import exponential_delay as exponential_delay
from ship_sqla._outbox._relay import MAX_ERROR_DELAY as MAX_ERROR_DELAY
from ship_sqla._outbox._relay import OutboxRelay as OutboxRelay
from ship_sqla._outbox._relay import OutboxSink as OutboxSink
from ship_sqla._outbox._relay import create_outbox_relay as create_outbox_relay
from ship_sqla._outbox._relay import job_sink as job_sink
from ship_sqla._outbox._sql import LEASE_LAPSED_FINAL_ATTEMPT as LEASE_LAPSED_FINAL_ATTEMPT
from ship_sqla._outbox._store import Outbox as Outbox
from ship_sqla._outbox._store import create_outbox as create_outbox
from ship_sqla._outbox._tables import ship_outbox_table as ship_outbox_table
from ship_sqla._outbox._types import DeadLetterPage as DeadLetterPage
from ship_sqla._outbox._types import OutboxClaimStaleError as OutboxClaimStaleError
from ship_sqla._outbox._types import OutboxDeadLetteredError as OutboxDeadLetteredError
from ship_sqla._outbox._types import OutboxIntent as OutboxIntent
from ship_sqla._outbox._types import OutboxMessage as OutboxMessage
from ship_sqla._outbox._types import OutboxOutcome as OutboxOutcome
from ship_sqla._outbox._types import OutboxPayloadError as OutboxPayloadError
from ship_sqla._outbox._types import OutboxPayloadTooLargeError as OutboxPayloadTooLargeError
from ship_sqla._outbox._types import OutboxPublishError as OutboxPublishError
from ship_sqla._outbox._types import OutboxRecord as OutboxRecord
from ship_sqla._outbox._types import OutboxSinkRejectedError as OutboxSinkRejectedError
from ship_sqla._outbox._types import OutboxStatus as OutboxStatus

__all__ = [
    "LEASE_LAPSED_FINAL_ATTEMPT",
    "MAX_ERROR_DELAY",
    "Backoff",
    "DeadLetterPage",
    "Outbox",
    "OutboxBackoff",
    "OutboxClaimStaleError",
    "OutboxDeadLetteredError",
    "OutboxIntent",
    "OutboxMessage",
    "OutboxOutcome",
    "OutboxPayloadError",
    "OutboxPayloadTooLargeError",
    "OutboxPublishError",
    "OutboxRecord",
    "OutboxRelay",
    "OutboxSink",
    "OutboxSinkRejectedError",
    "OutboxStatus",
    "create_outbox",
    "create_outbox_relay",
    "exponential_delay",
    "job_sink",
    "ship_outbox_table",
]
