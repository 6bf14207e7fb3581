"""ship_sqla: SQLAlchemy 2.x (asyncio + asyncpg) infrastructure for the Ship application kernel.

An application imports what it uses from here: the SQLAlchemy stores below and every name of
:mod:`ship_sqla.kernel` (job definitions, the runtime, the clock, the errors, the in-memory
backends). Public API is what ``__all__`` lists; every ``_module`` is private.

The public names are listed ONCE, in ``_EXPORTS`` (name -> the private module defining it; the
kernel's come from ``ship_sqla.kernel._EXPORTS``): ``__all__``, the lazy ``__getattr__``
(PEP 562) and the ``TYPE_CHECKING`` imports follow from it (``ship_sqla/kernel/_lazy.py``).
Names are imported on first use, so ``import ship_sqla.kernel`` and
``from ship_sqla import define_job`` load neither SQLAlchemy nor asyncpg.
"""

from __future__ import annotations

import typing as _typing

from ship_sqla.kernel import _EXPORTS as _KERNEL_EXPORTS
from ship_sqla.kernel._lazy import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from ship_sqla._audit import PostgresAuditLog as PostgresAuditLog
    from ship_sqla._audit import create_audit_log as create_audit_log
    from ship_sqla._audit import ship_audit_table as ship_audit_table
    from ship_sqla._dashboard import DashboardAuthorizer as DashboardAuthorizer
    from ship_sqla._dashboard import create_dashboard as create_dashboard
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
    from ship_sqla._jobs import PostgresJobBackend as PostgresJobBackend
    from ship_sqla._jobs import create_job_backend as create_job_backend
    from ship_sqla._jobs import ship_job_events_table as ship_job_events_table
    from ship_sqla._jobs import ship_job_runs_table as ship_job_runs_table
    from ship_sqla._jobs import ship_job_state_table as ship_job_state_table
    from ship_sqla._jobs import ship_job_steps_table as ship_job_steps_table
    from ship_sqla._jobs import ship_job_workers_table as ship_job_workers_table
    from ship_sqla._locks import AdvisoryLock as AdvisoryLock
    from ship_sqla._locks import AdvisoryLockProvider as AdvisoryLockProvider
    from ship_sqla._locks import advisory_lock_key as advisory_lock_key
    from ship_sqla._locks import advisory_lock_provider as advisory_lock_provider
    from ship_sqla._locks import ship_lock_fences_table as ship_lock_fences_table
    from ship_sqla._notify import Listener as Listener
    from ship_sqla._notify import ListenerLostError as ListenerLostError
    from ship_sqla._notify import ListenerNotLiveError as ListenerNotLiveError
    from ship_sqla._outbox import Outbox as Outbox
    from ship_sqla._outbox import OutboxAdmin as OutboxAdmin
    from ship_sqla._outbox import OutboxDeadLetteredError as OutboxDeadLetteredError
    from ship_sqla._outbox import OutboxIntent as OutboxIntent
    from ship_sqla._outbox import OutboxLeaseStaleError as OutboxLeaseStaleError
    from ship_sqla._outbox import OutboxMessage as OutboxMessage
    from ship_sqla._outbox import OutboxOperations as OutboxOperations
    from ship_sqla._outbox import OutboxOutcome as OutboxOutcome
    from ship_sqla._outbox import OutboxPayloadError as OutboxPayloadError
    from ship_sqla._outbox import OutboxPayloadTooLargeError as OutboxPayloadTooLargeError
    from ship_sqla._outbox import OutboxPublishError as OutboxPublishError
    from ship_sqla._outbox import OutboxRecord as OutboxRecord
    from ship_sqla._outbox import OutboxRelay as OutboxRelay
    from ship_sqla._outbox import OutboxSink as OutboxSink
    from ship_sqla._outbox import OutboxSinkRejectedError as OutboxSinkRejectedError
    from ship_sqla._outbox import OutboxState as OutboxState
    from ship_sqla._outbox import create_outbox as create_outbox
    from ship_sqla._outbox import create_outbox_operations as create_outbox_operations
    from ship_sqla._outbox import job_sink as job_sink
    from ship_sqla._outbox import ship_outbox_table as ship_outbox_table
    from ship_sqla._outbox import start_outbox_relay as start_outbox_relay
    from ship_sqla._projection import Projection as Projection
    from ship_sqla._repository import BoundRepository as BoundRepository
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
    from ship_sqla.kernel._audit import AuditEntry as AuditEntry
    from ship_sqla.kernel._audit import AuditLog as AuditLog
    from ship_sqla.kernel._audit import AuditSink as AuditSink
    from ship_sqla.kernel._audit import InMemoryAuditLog as InMemoryAuditLog
    from ship_sqla.kernel._authorize import Authorizer as Authorizer
    from ship_sqla.kernel._backend_base import JobBackendBase as JobBackendBase
    from ship_sqla.kernel._browse import BrowsedRun as BrowsedRun
    from ship_sqla.kernel._browse import ClaimPosition as ClaimPosition
    from ship_sqla.kernel._browse import CreatedPosition as CreatedPosition
    from ship_sqla.kernel._browse import LeasePosition as LeasePosition
    from ship_sqla.kernel._browse import RunBrowser as RunBrowser
    from ship_sqla.kernel._browse import RunOrder as RunOrder
    from ship_sqla.kernel._browse import RunPosition as RunPosition
    from ship_sqla.kernel._browse import RunQuery as RunQuery
    from ship_sqla.kernel._browse import ScheduleState as ScheduleState
    from ship_sqla.kernel._browse import ThroughputBucket as ThroughputBucket
    from ship_sqla.kernel._clock import Clock as Clock
    from ship_sqla.kernel._clock import FrozenClock as FrozenClock
    from ship_sqla.kernel._clock import SystemClock as SystemClock
    from ship_sqla.kernel._errors import BoundExceededError as BoundExceededError
    from ship_sqla.kernel._errors import ConfigurationError as ConfigurationError
    from ship_sqla.kernel._errors import DatabaseTimeoutError as DatabaseTimeoutError
    from ship_sqla.kernel._errors import DatabaseUnavailableError as DatabaseUnavailableError
    from ship_sqla.kernel._errors import InvalidCursorError as InvalidCursorError
    from ship_sqla.kernel._errors import InvalidPayloadError as InvalidPayloadError
    from ship_sqla.kernel._errors import PayloadTooLargeError as PayloadTooLargeError
    from ship_sqla.kernel._errors import PermissionDeniedError as PermissionDeniedError
    from ship_sqla.kernel._errors import RollbackOnlyError as RollbackOnlyError
    from ship_sqla.kernel._errors import ScopeClosedError as ScopeClosedError
    from ship_sqla.kernel._errors import ScopeConcurrencyError as ScopeConcurrencyError
    from ship_sqla.kernel._errors import ShipError as ShipError
    from ship_sqla.kernel._errors import TenantRequiredError as TenantRequiredError
    from ship_sqla.kernel._errors import TenantViolationError as TenantViolationError
    from ship_sqla.kernel._errors import UnknownProjectionError as UnknownProjectionError
    from ship_sqla.kernel._errors import VersionConflictError as VersionConflictError
    from ship_sqla.kernel._fences import FencedLock as FencedLock
    from ship_sqla.kernel._fences import FencingLockProvider as FencingLockProvider
    from ship_sqla.kernel._fences import LockHeldError as LockHeldError
    from ship_sqla.kernel._fences import StaleFenceError as StaleFenceError
    from ship_sqla.kernel._job_context import Cancellation as Cancellation
    from ship_sqla.kernel._job_context import CancelReason as CancelReason
    from ship_sqla.kernel._job_context import JobContext as JobContext
    from ship_sqla.kernel._jobs import DEFAULT_MAX_PAYLOAD_BYTES as DEFAULT_MAX_PAYLOAD_BYTES
    from ship_sqla.kernel._jobs import Concurrency as Concurrency
    from ship_sqla.kernel._jobs import Fairness as Fairness
    from ship_sqla.kernel._jobs import IdempotencyPolicy as IdempotencyPolicy
    from ship_sqla.kernel._jobs import JobDefinition as JobDefinition
    from ship_sqla.kernel._jobs import PayloadCodec as PayloadCodec
    from ship_sqla.kernel._jobs import RateLimit as RateLimit
    from ship_sqla.kernel._jobs import Retention as Retention
    from ship_sqla.kernel._jobs import RetryPolicy as RetryPolicy
    from ship_sqla.kernel._jobs import Schedule as Schedule
    from ship_sqla.kernel._jobs import define_job as define_job
    from ship_sqla.kernel._keys import MAX_KEY_CHARS as MAX_KEY_CHARS
    from ship_sqla.kernel._keys import InvalidKeyError as InvalidKeyError
    from ship_sqla.kernel._memory.jobs import InMemoryJobBackend as InMemoryJobBackend
    from ship_sqla.kernel._memory.locks import InMemoryLock as InMemoryLock
    from ship_sqla.kernel._memory.locks import InMemoryLockProvider as InMemoryLockProvider
    from ship_sqla.kernel._memory.workers import InMemoryWorkerRegistry as InMemoryWorkerRegistry
    from ship_sqla.kernel._memory.workflows import InMemoryWorkflowStore as InMemoryWorkflowStore
    from ship_sqla.kernel._metrics import JOB_METRIC_NAMES as JOB_METRIC_NAMES
    from ship_sqla.kernel._metrics import JobMetrics as JobMetrics
    from ship_sqla.kernel._metrics import JobOutcome as JobOutcome
    from ship_sqla.kernel._operations import AuditWriteError as AuditWriteError
    from ship_sqla.kernel._operations import BulkResult as BulkResult
    from ship_sqla.kernel._operations import CancelResult as CancelResult
    from ship_sqla.kernel._operations import JobOperationRefusedError as JobOperationRefusedError
    from ship_sqla.kernel._operations import JobOperations as JobOperations
    from ship_sqla.kernel._operations import PauseResult as PauseResult
    from ship_sqla.kernel._operations import create_job_operations as create_job_operations
    from ship_sqla.kernel._outcomes import JobSnoozeLimitError as JobSnoozeLimitError
    from ship_sqla.kernel._outcomes import JobTimeoutError as JobTimeoutError
    from ship_sqla.kernel._outcomes import JobTimeoutIgnoredError as JobTimeoutIgnoredError
    from ship_sqla.kernel._outcomes import RetryAfter as RetryAfter
    from ship_sqla.kernel._outcomes import Snooze as Snooze
    from ship_sqla.kernel._outcomes import TerminalError as TerminalError
    from ship_sqla.kernel._page import Page as Page
    from ship_sqla.kernel._plans.backoff import Backoff as Backoff
    from ship_sqla.kernel._plans.schedule import next_occurrence as next_occurrence
    from ship_sqla.kernel._plans.schedule import occurrence_id as occurrence_id
    from ship_sqla.kernel._plans.schedule import previous_occurrence as previous_occurrence
    from ship_sqla.kernel._ports import LEASE_LAPSED as LEASE_LAPSED
    from ship_sqla.kernel._ports import LEASE_LAPSED_FINAL_ATTEMPT as LEASE_LAPSED_FINAL_ATTEMPT
    from ship_sqla.kernel._ports import RUN_CANCELLED as RUN_CANCELLED
    from ship_sqla.kernel._ports import TERMINAL_STATES as TERMINAL_STATES
    from ship_sqla.kernel._ports import BuriedRun as BuriedRun
    from ship_sqla.kernel._ports import CancelRequestSource as CancelRequestSource
    from ship_sqla.kernel._ports import ClaimBatch as ClaimBatch
    from ship_sqla.kernel._ports import ClaimedRun as ClaimedRun
    from ship_sqla.kernel._ports import ClaimRequest as ClaimRequest
    from ship_sqla.kernel._ports import DeadQuery as DeadQuery
    from ship_sqla.kernel._ports import EnqueueRequest as EnqueueRequest
    from ship_sqla.kernel._ports import EnqueueResult as EnqueueResult
    from ship_sqla.kernel._ports import FailureKind as FailureKind
    from ship_sqla.kernel._ports import HeartbeatBatch as HeartbeatBatch
    from ship_sqla.kernel._ports import HistoryKind as HistoryKind
    from ship_sqla.kernel._ports import JobBackend as JobBackend
    from ship_sqla.kernel._ports import JobDemand as JobDemand
    from ship_sqla.kernel._ports import JobLeaseLapsedError as JobLeaseLapsedError
    from ship_sqla.kernel._ports import JobLeaseLapsedFinalError as JobLeaseLapsedFinalError
    from ship_sqla.kernel._ports import JobLeaseStaleError as JobLeaseStaleError
    from ship_sqla.kernel._ports import Lock as Lock
    from ship_sqla.kernel._ports import LockProvider as LockProvider
    from ship_sqla.kernel._ports import PausedJob as PausedJob
    from ship_sqla.kernel._ports import QueueDepth as QueueDepth
    from ship_sqla.kernel._ports import QueueDepthSource as QueueDepthSource
    from ship_sqla.kernel._ports import RenewableLock as RenewableLock
    from ship_sqla.kernel._ports import RunAdmin as RunAdmin
    from ship_sqla.kernel._ports import RunRecord as RunRecord
    from ship_sqla.kernel._ports import RunState as RunState
    from ship_sqla.kernel._ports import RunStore as RunStore
    from ship_sqla.kernel._ports import ScheduleStore as ScheduleStore
    from ship_sqla.kernel._ports import SettleOutcome as SettleOutcome
    from ship_sqla.kernel._ports import StateCount as StateCount
    from ship_sqla.kernel._ports import Suspend as Suspend
    from ship_sqla.kernel._ports import WakeSource as WakeSource
    from ship_sqla.kernel._priority import DEFAULT_PRIORITY as DEFAULT_PRIORITY
    from ship_sqla.kernel._priority import MAX_PRIORITY as MAX_PRIORITY
    from ship_sqla.kernel._priority import MIN_PRIORITY as MIN_PRIORITY
    from ship_sqla.kernel._priority import InvalidPriorityError as InvalidPriorityError
    from ship_sqla.kernel._registry import DuplicateJobError as DuplicateJobError
    from ship_sqla.kernel._registry import JobRegistry as JobRegistry
    from ship_sqla.kernel._registry import UnknownJobError as UnknownJobError
    from ship_sqla.kernel._runtime.runtime import JobRuntime as JobRuntime
    from ship_sqla.kernel._runtime.runtime import RuntimeMode as RuntimeMode
    from ship_sqla.kernel._runtime.runtime import start_job_runtime as start_job_runtime
    from ship_sqla.kernel._runtime.state import JobCancelledError as JobCancelledError
    from ship_sqla.kernel._settlement import HistoryEntry as HistoryEntry
    from ship_sqla.kernel._settlement import ReleaseReason as ReleaseReason
    from ship_sqla.kernel._settlement import Settlement as Settlement
    from ship_sqla.kernel._settlement import SettleRequest as SettleRequest
    from ship_sqla.kernel._settlement import cancelled as cancelled
    from ship_sqla.kernel._settlement import completed as completed
    from ship_sqla.kernel._settlement import failed as failed
    from ship_sqla.kernel._settlement import released as released
    from ship_sqla.kernel._settlement import snoozed as snoozed
    from ship_sqla.kernel._workers import WorkerEntry as WorkerEntry
    from ship_sqla.kernel._workers import WorkerRecord as WorkerRecord
    from ship_sqla.kernel._workers import WorkerRegistry as WorkerRegistry
    from ship_sqla.kernel._workflows import ChildOutcome as ChildOutcome
    from ship_sqla.kernel._workflows import ChildRunsRefusedError as ChildRunsRefusedError
    from ship_sqla.kernel._workflows import EventWait as EventWait
    from ship_sqla.kernel._workflows import NewStep as NewStep
    from ship_sqla.kernel._workflows import StepKind as StepKind
    from ship_sqla.kernel._workflows import StepNameReusedError as StepNameReusedError
    from ship_sqla.kernel._workflows import StepRecord as StepRecord
    from ship_sqla.kernel._workflows import StepRetry as StepRetry
    from ship_sqla.kernel._workflows import UnitOfWorkLike as UnitOfWorkLike
    from ship_sqla.kernel._workflows import Workflow as Workflow
    from ship_sqla.kernel._workflows import WorkflowAdmin as WorkflowAdmin
    from ship_sqla.kernel._workflows import WorkflowChangedError as WorkflowChangedError
    from ship_sqla.kernel._workflows import WorkflowEvent as WorkflowEvent
    from ship_sqla.kernel._workflows import WorkflowMisuseError as WorkflowMisuseError
    from ship_sqla.kernel._workflows import Workflows as Workflows
    from ship_sqla.kernel._workflows import (
        WorkflowsNotConfiguredError as WorkflowsNotConfiguredError,
    )
    from ship_sqla.kernel._workflows import WorkflowStore as WorkflowStore

_EXPORTS: dict[str, str] = {
    **_KERNEL_EXPORTS,
    # Unit of work and scope
    "Database": "ship_sqla._scope",
    "TransactionScope": "ship_sqla._scope",
    "current_scope": "ship_sqla._scope",
    "UnitOfWork": "ship_sqla._uow",
    "create_unit_of_work": "ship_sqla._uow",
    # Repositories, tenancy, projections
    "BoundRepository": "ship_sqla._repository",
    "RepositoryUsageError": "ship_sqla._repository",
    "TableRepository": "ship_sqla._repository",
    "UnsafeExpressionError": "ship_sqla._repository_guard",
    "Projection": "ship_sqla._projection",
    "tenant_policy_ddl": "ship_sqla._rls",
    # Schema
    "SchemaCheckError": "ship_sqla._schema_check",
    "SchemaDifference": "ship_sqla._schema_check",
    "SchemaReport": "ship_sqla._schema_check",
    "check_schema": "ship_sqla._schema_check",
    "schema_sql": "ship_sqla._schema_sql",
    # Outbox
    "Outbox": "ship_sqla._outbox",
    "OutboxAdmin": "ship_sqla._outbox",
    "OutboxDeadLetteredError": "ship_sqla._outbox",
    "OutboxIntent": "ship_sqla._outbox",
    "OutboxLeaseStaleError": "ship_sqla._outbox",
    "OutboxMessage": "ship_sqla._outbox",
    "OutboxOperations": "ship_sqla._outbox",
    "OutboxOutcome": "ship_sqla._outbox",
    "OutboxPayloadError": "ship_sqla._outbox",
    "OutboxPayloadTooLargeError": "ship_sqla._outbox",
    "OutboxPublishError": "ship_sqla._outbox",
    "OutboxRecord": "ship_sqla._outbox",
    "OutboxRelay": "ship_sqla._outbox",
    "OutboxSink": "ship_sqla._outbox",
    "OutboxSinkRejectedError": "ship_sqla._outbox",
    "OutboxState": "ship_sqla._outbox",
    "create_outbox": "ship_sqla._outbox",
    "create_outbox_operations": "ship_sqla._outbox",
    "job_sink": "ship_sqla._outbox",
    "ship_outbox_table": "ship_sqla._outbox",
    "start_outbox_relay": "ship_sqla._outbox",
    # Idempotency
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
    "StoredResponse": "ship_sqla._idempotency",
    "create_idempotency_store": "ship_sqla._idempotency",
    "ship_idempotency_table": "ship_sqla._idempotency",
    # Webhooks
    "VerifiedWebhook": "ship_sqla._webhooks",
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
    "create_webhook_event_store": "ship_sqla._webhooks",
    "parse_webhook_secret": "ship_sqla._webhooks",
    "ship_webhook_events_table": "ship_sqla._webhooks",
    "sign_webhook": "ship_sqla._webhooks",
    "verify_webhook": "ship_sqla._webhooks",
    "webhook_headers": "ship_sqla._webhooks",
    "webhook_idempotency_prefix": "ship_sqla._webhooks",
    # Advisory locks
    "AdvisoryLock": "ship_sqla._locks",
    "AdvisoryLockProvider": "ship_sqla._locks",
    "advisory_lock_key": "ship_sqla._locks",
    "advisory_lock_provider": "ship_sqla._locks",
    "ship_lock_fences_table": "ship_sqla._locks",
    # Jobs on PostgreSQL (the job contracts and the runtime are the kernel's, above)
    "JobBackendTimeoutError": "ship_sqla._jobs",
    "PostgresJobBackend": "ship_sqla._jobs",
    "create_job_backend": "ship_sqla._jobs",
    "ship_job_runs_table": "ship_sqla._jobs",
    "ship_job_state_table": "ship_sqla._jobs",
    "ship_job_workers_table": "ship_sqla._jobs",
    "ship_job_steps_table": "ship_sqla._jobs",
    "ship_job_events_table": "ship_sqla._jobs",
    # Push wake (K1): the listener of job backends and outbox relays
    # Operator audit log (S1) and dashboard (S2)
    "PostgresAuditLog": "ship_sqla._audit",
    "create_audit_log": "ship_sqla._audit",
    "ship_audit_table": "ship_sqla._audit",
    "DashboardAuthorizer": "ship_sqla._dashboard",
    "create_dashboard": "ship_sqla._dashboard",
    "Listener": "ship_sqla._notify",
    "ListenerLostError": "ship_sqla._notify",
    "ListenerNotLiveError": "ship_sqla._notify",
}

__all__ = tuple(sorted(_EXPORTS))
if not _typing.TYPE_CHECKING:  # type checkers read the imports above; a typo stays an error
    __getattr__, __dir__ = _lazy_exports(globals(), _EXPORTS)
