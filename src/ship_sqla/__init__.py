"""ship_sqla: SQLAlchemy 2.x (asyncio + asyncpg) infrastructure for the Ship application kernel.

Public API is what ``__all__`` lists; every ``_module`` is private. Names are imported lazily
(PEP 562), so ``import ship_sqla.kernel`` loads neither SQLAlchemy nor asyncpg: the kernel's
contracts stay usable without the database layer.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from ship_sqla._idempotency import IdempotencyClaim as IdempotencyClaim
    from ship_sqla._idempotency import IdempotencyClaimLostError as IdempotencyClaimLostError
    from ship_sqla._idempotency import (
        IdempotencyFingerprintMismatch as IdempotencyFingerprintMismatch,
    )
    from ship_sqla._idempotency import IdempotencyInProgress as IdempotencyInProgress
    from ship_sqla._idempotency import IdempotencyKeyError as IdempotencyKeyError
    from ship_sqla._idempotency import IdempotencyOutcome as IdempotencyOutcome
    from ship_sqla._idempotency import IdempotencyRecord as IdempotencyRecord
    from ship_sqla._idempotency import (
        IdempotencyRecordCorruptError as IdempotencyRecordCorruptError,
    )
    from ship_sqla._idempotency import IdempotencyReplay as IdempotencyReplay
    from ship_sqla._idempotency import IdempotencyStarted as IdempotencyStarted
    from ship_sqla._idempotency import IdempotencyStore as IdempotencyStore
    from ship_sqla._idempotency import StoredResponse as StoredResponse
    from ship_sqla._idempotency import create_idempotency_store as create_idempotency_store
    from ship_sqla._idempotency import ship_idempotency_table as ship_idempotency_table
    from ship_sqla._jobs import JobBackendTimeoutError as JobBackendTimeoutError
    from ship_sqla._jobs import JobOperationRefusedError as JobOperationRefusedError
    from ship_sqla._jobs import JobOperations as JobOperations
    from ship_sqla._jobs import PostgresJobBackend as PostgresJobBackend
    from ship_sqla._jobs import RunPage as RunPage
    from ship_sqla._jobs import create_job_backend as create_job_backend
    from ship_sqla._jobs import create_job_operations as create_job_operations
    from ship_sqla._jobs import ship_job_runs_table as ship_job_runs_table
    from ship_sqla._jobs import ship_job_state_table as ship_job_state_table
    from ship_sqla._locks import AdvisoryLock as AdvisoryLock
    from ship_sqla._locks import AdvisoryLockProvider as AdvisoryLockProvider
    from ship_sqla._locks import advisory_lock_key as advisory_lock_key
    from ship_sqla._locks import advisory_lock_provider as advisory_lock_provider
    from ship_sqla._outbox import DeadLetterPage as DeadLetterPage
    from ship_sqla._outbox import Outbox as Outbox
    from ship_sqla._outbox import OutboxBackoff as OutboxBackoff
    from ship_sqla._outbox import OutboxClaimStaleError as OutboxClaimStaleError
    from ship_sqla._outbox import OutboxDeadLetteredError as OutboxDeadLetteredError
    from ship_sqla._outbox import OutboxIntent as OutboxIntent
    from ship_sqla._outbox import OutboxMessage as OutboxMessage
    from ship_sqla._outbox import OutboxOutcome as OutboxOutcome
    from ship_sqla._outbox import OutboxPayloadError as OutboxPayloadError
    from ship_sqla._outbox import OutboxPayloadTooLargeError as OutboxPayloadTooLargeError
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
    from ship_sqla._projection import Projection as Projection
    from ship_sqla._repository import BoundRepository as BoundRepository
    from ship_sqla._repository import Page as Page
    from ship_sqla._repository import RepositoryUsageError as RepositoryUsageError
    from ship_sqla._repository import TableRepository as TableRepository
    from ship_sqla._repository_guard import UnsafeExpressionError as UnsafeExpressionError
    from ship_sqla._rls import tenant_policy_ddl as tenant_policy_ddl
    from ship_sqla._schema_check import SchemaCheckError as SchemaCheckError
    from ship_sqla._schema_check import SchemaDifference as SchemaDifference
    from ship_sqla._schema_check import SchemaReport as SchemaReport
    from ship_sqla._schema_check import check_schema as check_schema
    from ship_sqla._schema_sql import schema_sql as schema_sql
    from ship_sqla._scope import Database as Database
    from ship_sqla._scope import TransactionScope as TransactionScope
    from ship_sqla._scope import current_scope as current_scope
    from ship_sqla._uow import UnitOfWork as UnitOfWork
    from ship_sqla._uow import create_unit_of_work as create_unit_of_work
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
    from ship_sqla.kernel._errors import DatabaseUnavailableError as DatabaseUnavailableError
    from ship_sqla.kernel._jobs import PayloadTooLargeError as PayloadTooLargeError
    from ship_sqla.kernel._keys import InvalidKeyError as InvalidKeyError

_EXPORTS: dict[str, str] = {
    "advisory_lock_key": "ship_sqla._locks",
    "advisory_lock_provider": "ship_sqla._locks",
    "AdvisoryLock": "ship_sqla._locks",
    "AdvisoryLockProvider": "ship_sqla._locks",
    "BoundRepository": "ship_sqla._repository",
    "check_schema": "ship_sqla._schema_check",
    "create_idempotency_store": "ship_sqla._idempotency",
    "create_job_backend": "ship_sqla._jobs",
    "create_job_operations": "ship_sqla._jobs",
    "create_outbox": "ship_sqla._outbox",
    "create_outbox_relay": "ship_sqla._outbox",
    "create_unit_of_work": "ship_sqla._uow",
    "create_webhook_event_store": "ship_sqla._webhooks",
    "current_scope": "ship_sqla._scope",
    "Database": "ship_sqla._scope",
    "DeadLetterPage": "ship_sqla._outbox",
    "IdempotencyClaim": "ship_sqla._idempotency",
    "IdempotencyClaimLostError": "ship_sqla._idempotency",
    "IdempotencyFingerprintMismatch": "ship_sqla._idempotency",
    "IdempotencyInProgress": "ship_sqla._idempotency",
    "IdempotencyKeyError": "ship_sqla._idempotency",
    "IdempotencyOutcome": "ship_sqla._idempotency",
    "IdempotencyRecord": "ship_sqla._idempotency",
    "IdempotencyRecordCorruptError": "ship_sqla._idempotency",
    "IdempotencyReplay": "ship_sqla._idempotency",
    "IdempotencyStarted": "ship_sqla._idempotency",
    "IdempotencyStore": "ship_sqla._idempotency",
    "job_sink": "ship_sqla._outbox",
    "JobBackendTimeoutError": "ship_sqla._jobs",
    "JobOperationRefusedError": "ship_sqla._jobs",
    "JobOperations": "ship_sqla._jobs",
    "RunPage": "ship_sqla._jobs",
    "Outbox": "ship_sqla._outbox",
    "OutboxBackoff": "ship_sqla._outbox",
    "OutboxClaimStaleError": "ship_sqla._outbox",
    "OutboxDeadLetteredError": "ship_sqla._outbox",
    "OutboxIntent": "ship_sqla._outbox",
    "OutboxMessage": "ship_sqla._outbox",
    "OutboxOutcome": "ship_sqla._outbox",
    "OutboxPayloadError": "ship_sqla._outbox",
    "OutboxPublishError": "ship_sqla._outbox",
    "OutboxRecord": "ship_sqla._outbox",
    "OutboxRelay": "ship_sqla._outbox",
    "OutboxSink": "ship_sqla._outbox",
    "OutboxSinkRejectedError": "ship_sqla._outbox",
    "OutboxStatus": "ship_sqla._outbox",
    "Page": "ship_sqla._repository",
    "parse_webhook_secret": "ship_sqla._webhooks",
    "PostgresJobBackend": "ship_sqla._jobs",
    "Projection": "ship_sqla._projection",
    "RepositoryUsageError": "ship_sqla._repository",
    "schema_sql": "ship_sqla._schema_sql",
    "SchemaCheckError": "ship_sqla._schema_check",
    "SchemaDifference": "ship_sqla._schema_check",
    "SchemaReport": "ship_sqla._schema_check",
    "ship_idempotency_table": "ship_sqla._idempotency",
    "ship_job_runs_table": "ship_sqla._jobs",
    "ship_job_state_table": "ship_sqla._jobs",
    "ship_outbox_table": "ship_sqla._outbox",
    "ship_webhook_events_table": "ship_sqla._webhooks",
    "sign_webhook": "ship_sqla._webhooks",
    "StoredResponse": "ship_sqla._idempotency",
    "TableRepository": "ship_sqla._repository",
    "tenant_policy_ddl": "ship_sqla._rls",
    "TransactionScope": "ship_sqla._scope",
    "UnitOfWork": "ship_sqla._uow",
    "VerifiedWebhook": "ship_sqla._webhooks",
    "verify_webhook": "ship_sqla._webhooks",
    "webhook_headers": "ship_sqla._webhooks",
    "webhook_idempotency_prefix": "ship_sqla._webhooks",
    "WebhookCleanupResult": "ship_sqla._webhooks",
    "WebhookEvent": "ship_sqla._webhooks",
    "WebhookEventInProgressError": "ship_sqla._webhooks",
    "WebhookEventNotFoundError": "ship_sqla._webhooks",
    "WebhookEventStore": "ship_sqla._webhooks",
    "WebhookHeaderError": "ship_sqla._webhooks",
    "WebhookRecordResult": "ship_sqla._webhooks",
    "WebhookSignatureError": "ship_sqla._webhooks",
    "WebhookTimestampError": "ship_sqla._webhooks",
    "WebhookVerificationError": "ship_sqla._webhooks",
    "UnsafeExpressionError": "ship_sqla._repository_guard",
    "DatabaseUnavailableError": "ship_sqla.kernel._errors",
    "OutboxPayloadTooLargeError": "ship_sqla._outbox",
    "PayloadTooLargeError": "ship_sqla.kernel._jobs",
    "InvalidKeyError": "ship_sqla.kernel._keys",
}

__all__ = (
    "AdvisoryLock",
    "AdvisoryLockProvider",
    "BoundRepository",
    "Database",
    "DatabaseUnavailableError",
    "DeadLetterPage",
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
    "InvalidKeyError",
    "JobBackendTimeoutError",
    "JobOperationRefusedError",
    "JobOperations",
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
    "Page",
    "PayloadTooLargeError",
    "PostgresJobBackend",
    "Projection",
    "RepositoryUsageError",
    "RunPage",
    "SchemaCheckError",
    "SchemaDifference",
    "SchemaReport",
    "StoredResponse",
    "TableRepository",
    "TransactionScope",
    "UnitOfWork",
    "UnsafeExpressionError",
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
    "advisory_lock_key",
    "advisory_lock_provider",
    "check_schema",
    "create_idempotency_store",
    "create_job_backend",
    "create_job_operations",
    "create_outbox",
    "create_outbox_relay",
    "create_unit_of_work",
    "create_webhook_event_store",
    "current_scope",
    "job_sink",
    "parse_webhook_secret",
    "schema_sql",
    "ship_idempotency_table",
    "ship_job_runs_table",
    "ship_job_state_table",
    "ship_outbox_table",
    "ship_webhook_events_table",
    "sign_webhook",
    "tenant_policy_ddl",
    "verify_webhook",
    "webhook_headers",
    "webhook_idempotency_prefix",
)


def __getattr__(name: str) -> _typing.Any:  # noqa: ANN401 - any exported object
    module = _EXPORTS.get(name)
    if module is None:
        msg = f"module 'ship_sqla' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
