from ship_sqla._idempotency import IdempotencyClaimLostError as IdempotencyClaimLostError
from ship_sqla._idempotency import IdempotencyKeyError as IdempotencyKeyError
from ship_sqla._idempotency import IdempotencyRecordCorruptError as IdempotencyRecordCorruptError
from ship_sqla._jobs import JobBackendTimeoutError as JobBackendTimeoutError
from ship_sqla._notify import ListenerLostError as ListenerLostError
from ship_sqla._notify import ListenerNotLiveError as ListenerNotLiveError
from ship_sqla._outbox import OutboxDeadLetteredError as OutboxDeadLetteredError
from ship_sqla._outbox import OutboxLeaseStaleError as OutboxLeaseStaleError
from ship_sqla._outbox import OutboxPayloadError as OutboxPayloadError
from ship_sqla._outbox import OutboxPayloadTooLargeError as OutboxPayloadTooLargeError
from ship_sqla._outbox import OutboxPublishError as OutboxPublishError
from ship_sqla._outbox import OutboxSinkRejectedError as OutboxSinkRejectedError
from ship_sqla._outbox import OutboxTimeoutError as OutboxTimeoutError
from ship_sqla._repository import RepositoryUsageError as RepositoryUsageError
from ship_sqla._repository_guard import UnsafeExpressionError as UnsafeExpressionError
from ship_sqla._schema_check import SchemaCheckError as SchemaCheckError
from ship_sqla._schema_probe import MissingTablesError as MissingTablesError
from ship_sqla._server import NoServerError as NoServerError
from ship_sqla._uow import UnitOfWorkTimeoutError as UnitOfWorkTimeoutError
from ship_sqla._webhooks import WebhookDeliveryFailedError as WebhookDeliveryFailedError
from ship_sqla._webhooks import WebhookEventInProgressError as WebhookEventInProgressError
from ship_sqla._webhooks import WebhookEventNotFoundError as WebhookEventNotFoundError
from ship_sqla._webhooks import WebhookHeaderError as WebhookHeaderError
from ship_sqla._webhooks import WebhookSignatureError as WebhookSignatureError
from ship_sqla._webhooks import WebhookTimestampError as WebhookTimestampError
from ship_sqla._webhooks import WebhookVerificationError as WebhookVerificationError
from ship_sqla.kernel._audit import AuditUnavailableError as AuditUnavailableError
from ship_sqla.kernel._backfill_operations import BackfillRefusedError as BackfillRefusedError
from ship_sqla.kernel._consumers import ConsumerCursorError as ConsumerCursorError
from ship_sqla.kernel._consumers import ConsumerDeclarationError as ConsumerDeclarationError
from ship_sqla.kernel._consumers import ConsumerRunEnqueueError as ConsumerRunEnqueueError
from ship_sqla.kernel._errors import BoundExceededError as BoundExceededError
from ship_sqla.kernel._errors import ConfigurationError as ConfigurationError
from ship_sqla.kernel._errors import DatabaseTimeoutError as DatabaseTimeoutError
from ship_sqla.kernel._errors import DatabaseUnavailableError as DatabaseUnavailableError
from ship_sqla.kernel._errors import InvalidCursorError as InvalidCursorError
from ship_sqla.kernel._errors import InvalidPayloadError as InvalidPayloadError
from ship_sqla.kernel._errors import JobAttemptError as JobAttemptError
from ship_sqla.kernel._errors import OutageError as OutageError
from ship_sqla.kernel._errors import PayloadTooLargeError as PayloadTooLargeError
from ship_sqla.kernel._errors import PermissionDeniedError as PermissionDeniedError
from ship_sqla.kernel._errors import RefusedError as RefusedError
from ship_sqla.kernel._errors import RollbackOnlyError as RollbackOnlyError
from ship_sqla.kernel._errors import ScopeClosedError as ScopeClosedError
from ship_sqla.kernel._errors import ScopeConcurrencyError as ScopeConcurrencyError
from ship_sqla.kernel._errors import ShipError as ShipError
from ship_sqla.kernel._errors import StaleLeaseError as StaleLeaseError
from ship_sqla.kernel._errors import TenantRequiredError as TenantRequiredError
from ship_sqla.kernel._errors import TenantViolationError as TenantViolationError
from ship_sqla.kernel._errors import UnknownProjectionError as UnknownProjectionError
from ship_sqla.kernel._errors import UsageError as UsageError
from ship_sqla.kernel._errors import VersionConflictError as VersionConflictError
from ship_sqla.kernel._evolution import WorkflowChangedError as WorkflowChangedError
from ship_sqla.kernel._evolution import WorkflowDivergedError as WorkflowDivergedError
from ship_sqla.kernel._fences import LockHeldError as LockHeldError
from ship_sqla.kernel._fences import StaleFenceError as StaleFenceError
from ship_sqla.kernel._history import HistoryFormatError as HistoryFormatError
from ship_sqla.kernel._job_context import ResourcesNotConfiguredError as ResourcesNotConfiguredError
from ship_sqla.kernel._jobs import JobVersionUnavailableError as JobVersionUnavailableError
from ship_sqla.kernel._keys import InvalidKeyError as InvalidKeyError
from ship_sqla.kernel._lifespan import LifespanFailedError as LifespanFailedError
from ship_sqla.kernel._operations import AuditWriteError as AuditWriteError
from ship_sqla.kernel._operations import JobOperationRefusedError as JobOperationRefusedError
from ship_sqla.kernel._outcomes import JobSnoozeLimitError as JobSnoozeLimitError
from ship_sqla.kernel._outcomes import JobTimeoutError as JobTimeoutError
from ship_sqla.kernel._outcomes import JobTimeoutIgnoredError as JobTimeoutIgnoredError
from ship_sqla.kernel._outcomes import RetryAfter as RetryAfter
from ship_sqla.kernel._outcomes import Snooze as Snooze
from ship_sqla.kernel._outcomes import TerminalError as TerminalError
from ship_sqla.kernel._ports import JobCrashLoopError as JobCrashLoopError
from ship_sqla.kernel._ports import JobLeaseLapsedError as JobLeaseLapsedError
from ship_sqla.kernel._ports import JobLeaseLapsedFinalError as JobLeaseLapsedFinalError
from ship_sqla.kernel._ports import JobLeaseStaleError as JobLeaseStaleError
from ship_sqla.kernel._priority import InvalidPriorityError as InvalidPriorityError
from ship_sqla.kernel._registry import DuplicateJobError as DuplicateJobError
from ship_sqla.kernel._registry import UnknownJobError as UnknownJobError
from ship_sqla.kernel._replay import ReplayFailedError as ReplayFailedError
from ship_sqla.kernel._runtime.state import JobCancelledError as JobCancelledError
from ship_sqla.kernel._search import BulkTokenError as BulkTokenError
from ship_sqla.kernel._search import RunFilterError as RunFilterError
from ship_sqla.kernel._settlement import JobSettleRefusedError as JobSettleRefusedError
from ship_sqla.kernel._transactional import (
    InboxFingerprintMismatchError as InboxFingerprintMismatchError,
)
from ship_sqla.kernel._transactional import (
    TransactionalHandlerMisuseError as TransactionalHandlerMisuseError,
)
from ship_sqla.kernel._webhooks_out import (
    WebhookDestinationRefusedError as WebhookDestinationRefusedError,
)
from ship_sqla.kernel._webhooks_out import (
    WebhookEndpointUnknownError as WebhookEndpointUnknownError,
)
from ship_sqla.kernel._workflows import ChildJobUnservedError as ChildJobUnservedError
from ship_sqla.kernel._workflows import ChildRunsRefusedError as ChildRunsRefusedError
from ship_sqla.kernel._workflows import StepNameReusedError as StepNameReusedError
from ship_sqla.kernel._workflows import WorkflowMisuseError as WorkflowMisuseError
from ship_sqla.kernel._workflows import WorkflowsNotConfiguredError as WorkflowsNotConfiguredError

__all__ = (
    "AuditUnavailableError",
    "AuditWriteError",
    "BackfillRefusedError",
    "BoundExceededError",
    "BulkTokenError",
    "ChildJobUnservedError",
    "ChildRunsRefusedError",
    "ConfigurationError",
    "ConsumerCursorError",
    "ConsumerDeclarationError",
    "ConsumerRunEnqueueError",
    "DatabaseTimeoutError",
    "DatabaseUnavailableError",
    "DuplicateJobError",
    "HistoryFormatError",
    "IdempotencyClaimLostError",
    "IdempotencyKeyError",
    "IdempotencyRecordCorruptError",
    "InboxFingerprintMismatchError",
    "InvalidCursorError",
    "InvalidKeyError",
    "InvalidPayloadError",
    "InvalidPriorityError",
    "JobAttemptError",
    "JobBackendTimeoutError",
    "JobCancelledError",
    "JobCrashLoopError",
    "JobLeaseLapsedError",
    "JobLeaseLapsedFinalError",
    "JobLeaseStaleError",
    "JobOperationRefusedError",
    "JobSettleRefusedError",
    "JobSnoozeLimitError",
    "JobTimeoutError",
    "JobTimeoutIgnoredError",
    "JobVersionUnavailableError",
    "LifespanFailedError",
    "ListenerLostError",
    "ListenerNotLiveError",
    "LockHeldError",
    "MissingTablesError",
    "NoServerError",
    "OutageError",
    "OutboxDeadLetteredError",
    "OutboxLeaseStaleError",
    "OutboxPayloadError",
    "OutboxPayloadTooLargeError",
    "OutboxPublishError",
    "OutboxSinkRejectedError",
    "OutboxTimeoutError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RefusedError",
    "ReplayFailedError",
    "RepositoryUsageError",
    "ResourcesNotConfiguredError",
    "RetryAfter",
    "RollbackOnlyError",
    "RunFilterError",
    "SchemaCheckError",
    "ScopeClosedError",
    "ScopeConcurrencyError",
    "ShipError",
    "Snooze",
    "StaleFenceError",
    "StaleLeaseError",
    "StepNameReusedError",
    "TenantRequiredError",
    "TenantViolationError",
    "TerminalError",
    "TransactionalHandlerMisuseError",
    "UnitOfWorkTimeoutError",
    "UnknownJobError",
    "UnknownProjectionError",
    "UnsafeExpressionError",
    "UsageError",
    "VersionConflictError",
    "WebhookDeliveryFailedError",
    "WebhookDestinationRefusedError",
    "WebhookEndpointUnknownError",
    "WebhookEventInProgressError",
    "WebhookEventNotFoundError",
    "WebhookHeaderError",
    "WebhookSignatureError",
    "WebhookTimestampError",
    "WebhookVerificationError",
    "WorkflowChangedError",
    "WorkflowDivergedError",
    "WorkflowMisuseError",
    "WorkflowsNotConfiguredError",
)
