"""The transactional outbox (SPEC section 4): table, store, relay and operator surface.

O1-O4 are stated in ``_store.py``; the claim's SQL and the indexes serving it in ``_sql.py`` and
``_tables.py``; the relay loop and the ordered-mode guarantee in ``_relay.py``; the operator
port in ``_admin.py`` and its permission gate in ``_operations.py``.
"""

from ship_sqla._outbox._admin import OutboxAdmin as OutboxAdmin
from ship_sqla._outbox._operations import MANAGE_PERMISSION as MANAGE_PERMISSION
from ship_sqla._outbox._operations import OutboxOperations as OutboxOperations
from ship_sqla._outbox._operations import RedriveResult as RedriveResult
from ship_sqla._outbox._operations import create_outbox_operations as create_outbox_operations
from ship_sqla._outbox._relay import OutboxRelay as OutboxRelay
from ship_sqla._outbox._relay import OutboxSink as OutboxSink
from ship_sqla._outbox._relay import job_sink as job_sink
from ship_sqla._outbox._relay import start_outbox_relay as start_outbox_relay
from ship_sqla._outbox._sql import LEASE_LAPSED_FINAL_ATTEMPT as LEASE_LAPSED_FINAL_ATTEMPT
from ship_sqla._outbox._store import Outbox as Outbox
from ship_sqla._outbox._store import create_outbox as create_outbox
from ship_sqla._outbox._tables import ship_outbox_table as ship_outbox_table
from ship_sqla._outbox._types import OutboxDeadLetteredError as OutboxDeadLetteredError
from ship_sqla._outbox._types import OutboxIntent as OutboxIntent
from ship_sqla._outbox._types import OutboxLeaseStaleError as OutboxLeaseStaleError
from ship_sqla._outbox._types import OutboxMessage as OutboxMessage
from ship_sqla._outbox._types import OutboxOutcome as OutboxOutcome
from ship_sqla._outbox._types import OutboxPayloadError as OutboxPayloadError
from ship_sqla._outbox._types import OutboxPayloadTooLargeError as OutboxPayloadTooLargeError
from ship_sqla._outbox._types import OutboxPublishError as OutboxPublishError
from ship_sqla._outbox._types import OutboxRecord as OutboxRecord
from ship_sqla._outbox._types import OutboxSinkRejectedError as OutboxSinkRejectedError
from ship_sqla._outbox._types import OutboxState as OutboxState
from ship_sqla._outbox._types import OutboxTimeoutError as OutboxTimeoutError
from ship_sqla.kernel._plans.backoff import Backoff as Backoff

__all__ = [
    "LEASE_LAPSED_FINAL_ATTEMPT",
    "MANAGE_PERMISSION",
    "Backoff",
    "Outbox",
    "OutboxAdmin",
    "OutboxDeadLetteredError",
    "OutboxIntent",
    "OutboxLeaseStaleError",
    "OutboxMessage",
    "OutboxOperations",
    "OutboxOutcome",
    "OutboxPayloadError",
    "OutboxPayloadTooLargeError",
    "OutboxPublishError",
    "OutboxRecord",
    "OutboxRelay",
    "OutboxSink",
    "OutboxSinkRejectedError",
    "OutboxState",
    "OutboxTimeoutError",
    "RedriveResult",
    "create_outbox",
    "create_outbox_operations",
    "job_sink",
    "ship_outbox_table",
    "start_outbox_relay",
]
