"""ship_sqla: SQLAlchemy 2.x (asyncio + asyncpg) infrastructure for the Ship application kernel.

Public API is what ``__all__`` lists; every ``_module`` is private.
"""

# --- unit of work and scope ---------------------------------------------------------------------
from ship_sqla._rls import tenant_policy_ddl as tenant_policy_ddl
from ship_sqla._scope import Database as Database
from ship_sqla._scope import TransactionScope as TransactionScope
from ship_sqla._scope import current_scope as current_scope
from ship_sqla._uow import UnitOfWork as UnitOfWork
from ship_sqla._uow import create_unit_of_work as create_unit_of_work

# --- repositories (section owned by the repositories work) --------------------------------------
# isort: split
from ship_sqla._projection import Projection as Projection
from ship_sqla._repository import BoundRepository as BoundRepository
from ship_sqla._repository import Page as Page
from ship_sqla._repository import RepositoryUsageError as RepositoryUsageError
from ship_sqla._repository import TableRepository as TableRepository

# --- outbox (section owned by the outbox work) --------------------------------------------------
# isort: split
from ship_sqla._outbox import DeadLetterPage as DeadLetterPage
from ship_sqla._outbox import Outbox as Outbox
from ship_sqla._outbox import OutboxBackoff as OutboxBackoff
from ship_sqla._outbox import OutboxClaimStaleError as OutboxClaimStaleError
from ship_sqla._outbox import OutboxDeadLetteredError as OutboxDeadLetteredError
from ship_sqla._outbox import OutboxIntent as OutboxIntent
from ship_sqla._outbox import OutboxMessage as OutboxMessage
from ship_sqla._outbox import OutboxOutcome as OutboxOutcome
from ship_sqla._outbox import OutboxPayloadError as OutboxPayloadError
from ship_sqla._outbox import OutboxPublishError as OutboxPublishError
from ship_sqla._outbox import OutboxRecord as OutboxRecord
from ship_sqla._outbox import OutboxRelay as OutboxRelay
from ship_sqla._outbox import OutboxSink as OutboxSink
from ship_sqla._outbox import OutboxSinkRejectedError as OutboxSinkRejectedError
from ship_sqla._outbox import OutboxStatus as OutboxStatus
from ship_sqla._outbox import create_outbox as create_outbox
from ship_sqla._outbox import create_outbox_relay as create_outbox_relay
from ship_sqla._outbox import job_sink as job_sink
from ship_sqla._outbox import ship_outbox_table as ship_outbox_table

# --- idempotency and webhooks (section owned by the idempotency/webhooks work) ------------------
# isort: split
from ship_sqla._idempotency import IdempotencyClaim as IdempotencyClaim
from ship_sqla._idempotency import IdempotencyClaimLostError as IdempotencyClaimLostError
from ship_sqla._idempotency import IdempotencyFingerprintMismatch as IdempotencyFingerprintMismatch
from ship_sqla._idempotency import IdempotencyInProgress as IdempotencyInProgress
from ship_sqla._idempotency import IdempotencyKeyError as IdempotencyKeyError
from ship_sqla._idempotency import IdempotencyOutcome as IdempotencyOutcome
from ship_sqla._idempotency import IdempotencyRecord as IdempotencyRecord
from ship_sqla._idempotency import IdempotencyRecordCorruptError as IdempotencyRecordCorruptError
from ship_sqla._idempotency import IdempotencyReplay as IdempotencyReplay
from ship_sqla._idempotency import IdempotencyStarted as IdempotencyStarted
from ship_sqla._idempotency import IdempotencyStore as IdempotencyStore
from ship_sqla._idempotency import StoredResponse as StoredResponse
from ship_sqla._idempotency import create_idempotency_store as create_idempotency_store
from ship_sqla._idempotency import ship_idempotency_table as ship_idempotency_table
from ship_sqla._webhooks import VerifiedWebhook as VerifiedWebhook
from ship_sqla._webhooks import WebhookCleanupResult as WebhookCleanupResult
from ship_sqla._webhooks import WebhookEvent as WebhookEvent
from ship_sqla._webhooks import WebhookEventInProgressError as WebhookEventInProgressError
from ship_sqla._webhooks import WebhookEventNotFoundError as WebhookEventNotFoundError
from ship_sqla._webhooks import WebhookEventStore as WebhookEventStore
from ship_sqla._webhooks import WebhookHeaderError as WebhookHeaderError
from ship_sqla._webhooks import WebhookRecordResult as WebhookRecordResult
from ship_sqla._webhooks import WebhookSignatureError as WebhookSignatureError
from ship_sqla._webhooks import WebhookTimestampError as WebhookTimestampError
from ship_sqla._webhooks import WebhookVerificationError as WebhookVerificationError
from ship_sqla._webhooks import create_webhook_event_store as create_webhook_event_store
from ship_sqla._webhooks import parse_webhook_secret as parse_webhook_secret
from ship_sqla._webhooks import ship_webhook_events_table as ship_webhook_events_table
from ship_sqla._webhooks import sign_webhook as sign_webhook
from ship_sqla._webhooks import verify_webhook as verify_webhook
from ship_sqla._webhooks import webhook_headers as webhook_headers
from ship_sqla._webhooks import webhook_idempotency_prefix as webhook_idempotency_prefix

# --- jobs and locks (section owned by the PostgreSQL job backend work) --------------------------

# --- operations: schema check (T3), DDL, command line ---------------------------------------------
# isort: split
from ship_sqla._schema_check import SchemaCheckError as SchemaCheckError
from ship_sqla._schema_check import SchemaDifference as SchemaDifference
from ship_sqla._schema_check import SchemaReport as SchemaReport
from ship_sqla._schema_check import check_schema as check_schema
from ship_sqla._schema_sql import schema_sql as schema_sql

__all__ = (
    # unit of work and scope
    "Database",
    "TransactionScope",
    "UnitOfWork",
    "create_unit_of_work",
    "current_scope",
    "tenant_policy_ddl",
    # repositories
    "BoundRepository",
    "Page",
    "Projection",
    "RepositoryUsageError",
    "TableRepository",
    # outbox
    "DeadLetterPage",
    "Outbox",
    "OutboxBackoff",
    "OutboxClaimStaleError",
    "OutboxDeadLetteredError",
    "OutboxIntent",
    "OutboxMessage",
    "OutboxOutcome",
    "OutboxPayloadError",
    "OutboxPublishError",
    "OutboxRecord",
    "OutboxRelay",
    "OutboxSink",
    "OutboxSinkRejectedError",
    "OutboxStatus",
    "create_outbox",
    "create_outbox_relay",
    "job_sink",
    "ship_outbox_table",
    # idempotency and webhooks
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
    "VerifiedWebhook",
    "WebhookCleanupResult",
    "WebhookEvent",
    "WebhookEventInProgressError",
    "WebhookEventNotFoundError",
    "WebhookEventStore",
    "WebhookHeaderError",
    "WebhookRecordResult",
    "WebhookSignatureError",
    "WebhookTimestampError",
    "WebhookVerificationError",
    "create_idempotency_store",
    "create_webhook_event_store",
    "parse_webhook_secret",
    "ship_idempotency_table",
    "ship_webhook_events_table",
    "sign_webhook",
    "verify_webhook",
    "webhook_headers",
    "webhook_idempotency_prefix",
    # jobs and locks
    # operations
    "SchemaCheckError",
    "SchemaDifference",
    "SchemaReport",
    "check_schema",
    "schema_sql",
)
