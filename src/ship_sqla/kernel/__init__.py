"""ORM-free contracts of ship_sqla: errors, the clock, job definitions, backend Protocols, the
job runtime and in-memory reference backends.

This package imports neither SQLAlchemy nor asyncpg (a test proves it), so applications can
depend on the contracts alone and unit-test against the in-memory backends. ``ship_sqla``
re-exports every name listed here: applications import from ``ship_sqla``.

Public API is ``_EXPORTS`` below, the one list: ``__all__``, the lazy ``__getattr__``
(PEP 562) and the ``TYPE_CHECKING`` imports all follow from it (see ``_lazy.py``).
"""

from __future__ import annotations

import typing as _typing

from ship_sqla.kernel._lazy import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
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
    # Errors
    "BoundExceededError": "ship_sqla.kernel._errors",
    "ConfigurationError": "ship_sqla.kernel._errors",
    "DatabaseTimeoutError": "ship_sqla.kernel._errors",
    "DatabaseUnavailableError": "ship_sqla.kernel._errors",
    "InvalidCursorError": "ship_sqla.kernel._errors",
    "PermissionDeniedError": "ship_sqla.kernel._errors",
    "RollbackOnlyError": "ship_sqla.kernel._errors",
    "ScopeClosedError": "ship_sqla.kernel._errors",
    "ScopeConcurrencyError": "ship_sqla.kernel._errors",
    "ShipError": "ship_sqla.kernel._errors",
    "TenantRequiredError": "ship_sqla.kernel._errors",
    "TenantViolationError": "ship_sqla.kernel._errors",
    "UnknownProjectionError": "ship_sqla.kernel._errors",
    "VersionConflictError": "ship_sqla.kernel._errors",
    # Clock
    "Clock": "ship_sqla.kernel._clock",
    "FrozenClock": "ship_sqla.kernel._clock",
    "SystemClock": "ship_sqla.kernel._clock",
    # Pages (repositories and operator surfaces)
    "Page": "ship_sqla.kernel._page",
    # Job definitions
    "DEFAULT_MAX_PAYLOAD_BYTES": "ship_sqla.kernel._jobs",
    "Concurrency": "ship_sqla.kernel._jobs",
    "IdempotencyPolicy": "ship_sqla.kernel._jobs",
    "InvalidPayloadError": "ship_sqla.kernel._errors",
    "JobDefinition": "ship_sqla.kernel._jobs",
    "PayloadCodec": "ship_sqla.kernel._jobs",
    "RateLimit": "ship_sqla.kernel._jobs",
    "Fairness": "ship_sqla.kernel._jobs",
    "PayloadTooLargeError": "ship_sqla.kernel._errors",
    "Retention": "ship_sqla.kernel._jobs",
    "RetryPolicy": "ship_sqla.kernel._jobs",
    "Schedule": "ship_sqla.kernel._jobs",
    "define_job": "ship_sqla.kernel._jobs",
    "DEFAULT_PRIORITY": "ship_sqla.kernel._priority",
    "MAX_PRIORITY": "ship_sqla.kernel._priority",
    "MIN_PRIORITY": "ship_sqla.kernel._priority",
    "InvalidPriorityError": "ship_sqla.kernel._priority",
    "MAX_KEY_CHARS": "ship_sqla.kernel._keys",
    "InvalidKeyError": "ship_sqla.kernel._keys",
    "DuplicateJobError": "ship_sqla.kernel._registry",
    "JobRegistry": "ship_sqla.kernel._registry",
    "UnknownJobError": "ship_sqla.kernel._registry",
    # How a handler ends an attempt (K4) and the per-run timeout (K5)
    "JobSnoozeLimitError": "ship_sqla.kernel._outcomes",
    "JobTimeoutError": "ship_sqla.kernel._outcomes",
    "JobTimeoutIgnoredError": "ship_sqla.kernel._outcomes",
    "RetryAfter": "ship_sqla.kernel._outcomes",
    "Snooze": "ship_sqla.kernel._outcomes",
    "TerminalError": "ship_sqla.kernel._outcomes",
    # Backoff (job retries, outbox messages) and schedule occurrences
    "Backoff": "ship_sqla.kernel._plans.backoff",
    "next_occurrence": "ship_sqla.kernel._plans.schedule",
    "occurrence_id": "ship_sqla.kernel._plans.schedule",
    "previous_occurrence": "ship_sqla.kernel._plans.schedule",
    # Ports: where runs are stored, locks
    "LEASE_LAPSED": "ship_sqla.kernel._ports",
    "LEASE_LAPSED_FINAL_ATTEMPT": "ship_sqla.kernel._ports",
    "TERMINAL_STATES": "ship_sqla.kernel._ports",
    "RUN_CANCELLED": "ship_sqla.kernel._ports",
    "BuriedRun": "ship_sqla.kernel._ports",
    "CancelRequestSource": "ship_sqla.kernel._ports",
    "HeartbeatBatch": "ship_sqla.kernel._ports",
    "PausedJob": "ship_sqla.kernel._ports",
    "ClaimBatch": "ship_sqla.kernel._ports",
    "ClaimRequest": "ship_sqla.kernel._ports",
    "ClaimedRun": "ship_sqla.kernel._ports",
    "DeadQuery": "ship_sqla.kernel._ports",
    "EnqueueRequest": "ship_sqla.kernel._ports",
    "EnqueueResult": "ship_sqla.kernel._ports",
    "FailureKind": "ship_sqla.kernel._ports",
    "HistoryKind": "ship_sqla.kernel._ports",
    "JobBackend": "ship_sqla.kernel._ports",
    "JobBackendBase": "ship_sqla.kernel._backend_base",
    "JobLeaseLapsedError": "ship_sqla.kernel._ports",
    "JobLeaseLapsedFinalError": "ship_sqla.kernel._ports",
    "JobLeaseStaleError": "ship_sqla.kernel._ports",
    "Lock": "ship_sqla.kernel._ports",
    "LockProvider": "ship_sqla.kernel._ports",
    "QueueDepth": "ship_sqla.kernel._ports",
    "QueueDepthSource": "ship_sqla.kernel._ports",
    "RenewableLock": "ship_sqla.kernel._ports",
    "RunAdmin": "ship_sqla.kernel._ports",
    "RunRecord": "ship_sqla.kernel._ports",
    "RunState": "ship_sqla.kernel._ports",
    "RunStore": "ship_sqla.kernel._ports",
    "ScheduleStore": "ship_sqla.kernel._ports",
    "SettleOutcome": "ship_sqla.kernel._ports",
    "Settlement": "ship_sqla.kernel._settlement",
    "SettleRequest": "ship_sqla.kernel._settlement",
    "HistoryEntry": "ship_sqla.kernel._settlement",
    "ReleaseReason": "ship_sqla.kernel._settlement",
    "cancelled": "ship_sqla.kernel._settlement",
    "completed": "ship_sqla.kernel._settlement",
    "failed": "ship_sqla.kernel._settlement",
    "released": "ship_sqla.kernel._settlement",
    "snoozed": "ship_sqla.kernel._settlement",
    "StateCount": "ship_sqla.kernel._ports",
    "Suspend": "ship_sqla.kernel._ports",
    "FencedLock": "ship_sqla.kernel._fences",
    "FencingLockProvider": "ship_sqla.kernel._fences",
    "LockHeldError": "ship_sqla.kernel._fences",
    "StaleFenceError": "ship_sqla.kernel._fences",
    "JobDemand": "ship_sqla.kernel._ports",
    "WakeSource": "ship_sqla.kernel._ports",
    # The worker registry (F6) and the fleet's one queue sampler (F5)
    "WorkerEntry": "ship_sqla.kernel._workers",
    "WorkerRecord": "ship_sqla.kernel._workers",
    "WorkerRegistry": "ship_sqla.kernel._workers",
    # Durable workflows (SPEC §13)
    "ChildOutcome": "ship_sqla.kernel._workflows",
    "ChildRunsRefusedError": "ship_sqla.kernel._workflows",
    "EventWait": "ship_sqla.kernel._workflows",
    "NewStep": "ship_sqla.kernel._workflows",
    "StepKind": "ship_sqla.kernel._workflows",
    "StepNameReusedError": "ship_sqla.kernel._workflows",
    "StepRecord": "ship_sqla.kernel._workflows",
    "StepRetry": "ship_sqla.kernel._workflows",
    "UnitOfWorkLike": "ship_sqla.kernel._workflows",
    "Workflow": "ship_sqla.kernel._workflows",
    "WorkflowAdmin": "ship_sqla.kernel._workflows",
    "WorkflowChangedError": "ship_sqla.kernel._workflows",
    "WorkflowEvent": "ship_sqla.kernel._workflows",
    "WorkflowMisuseError": "ship_sqla.kernel._workflows",
    "WorkflowStore": "ship_sqla.kernel._workflows",
    "Workflows": "ship_sqla.kernel._workflows",
    "WorkflowsNotConfiguredError": "ship_sqla.kernel._workflows",
    # In-memory reference backends
    "InMemoryJobBackend": "ship_sqla.kernel._memory.jobs",
    "InMemoryWorkflowStore": "ship_sqla.kernel._memory.workflows",
    "InMemoryLock": "ship_sqla.kernel._memory.locks",
    "InMemoryLockProvider": "ship_sqla.kernel._memory.locks",
    "InMemoryWorkerRegistry": "ship_sqla.kernel._memory.workers",
    # Operator surfaces (J8, outbox): the gate over a storage port's admin methods
    "Authorizer": "ship_sqla.kernel._authorize",
    "AuditEntry": "ship_sqla.kernel._audit",
    "AuditLog": "ship_sqla.kernel._audit",
    "AuditSink": "ship_sqla.kernel._audit",
    "InMemoryAuditLog": "ship_sqla.kernel._audit",
    "AuditWriteError": "ship_sqla.kernel._operations",
    "BulkResult": "ship_sqla.kernel._operations",
    "BrowsedRun": "ship_sqla.kernel._browse",
    "ClaimPosition": "ship_sqla.kernel._browse",
    "CreatedPosition": "ship_sqla.kernel._browse",
    "LeasePosition": "ship_sqla.kernel._browse",
    "RunBrowser": "ship_sqla.kernel._browse",
    "RunOrder": "ship_sqla.kernel._browse",
    "RunPosition": "ship_sqla.kernel._browse",
    "RunQuery": "ship_sqla.kernel._browse",
    "ScheduleState": "ship_sqla.kernel._browse",
    "ThroughputBucket": "ship_sqla.kernel._browse",
    "JobOperationRefusedError": "ship_sqla.kernel._operations",
    "CancelResult": "ship_sqla.kernel._operations",
    "PauseResult": "ship_sqla.kernel._operations",
    "JobOperations": "ship_sqla.kernel._operations",
    "create_job_operations": "ship_sqla.kernel._operations",
    # Runtime
    "Cancellation": "ship_sqla.kernel._job_context",
    "CancelReason": "ship_sqla.kernel._job_context",
    "JobContext": "ship_sqla.kernel._job_context",
    "JobRuntime": "ship_sqla.kernel._runtime.runtime",
    "RuntimeMode": "ship_sqla.kernel._runtime.runtime",
    "start_job_runtime": "ship_sqla.kernel._runtime.runtime",
    "JobCancelledError": "ship_sqla.kernel._runtime.state",
    # Metrics
    "JOB_METRIC_NAMES": "ship_sqla.kernel._metrics",
    "JobMetrics": "ship_sqla.kernel._metrics",
    "JobOutcome": "ship_sqla.kernel._metrics",
}

__all__ = tuple(sorted(_EXPORTS))
if not _typing.TYPE_CHECKING:  # type checkers read the imports above; a typo stays an error
    __getattr__, __dir__ = _lazy_exports(globals(), _EXPORTS)
