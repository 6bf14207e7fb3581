"""ORM-free contracts of ship_sqla: errors, the clock, job definitions, backend Protocols, the
job runtime and in-memory reference backends.

This package imports neither SQLAlchemy nor asyncpg (a test proves it), so applications can
depend on the contracts alone and unit-test against the in-memory backends.
"""

from ship_sqla.kernel._clock import Clock as Clock
from ship_sqla.kernel._clock import FrozenClock as FrozenClock
from ship_sqla.kernel._clock import SystemClock as SystemClock
from ship_sqla.kernel._errors import BoundExceededError as BoundExceededError
from ship_sqla.kernel._errors import ConfigurationError as ConfigurationError
from ship_sqla.kernel._errors import DatabaseUnavailableError as DatabaseUnavailableError
from ship_sqla.kernel._errors import InvalidCursorError as InvalidCursorError
from ship_sqla.kernel._errors import NotYetImplementedError as NotYetImplementedError
from ship_sqla.kernel._errors import PermissionDeniedError as PermissionDeniedError
from ship_sqla.kernel._errors import RollbackOnlyError as RollbackOnlyError
from ship_sqla.kernel._errors import ScopeClosedError as ScopeClosedError
from ship_sqla.kernel._errors import ScopeConcurrencyError as ScopeConcurrencyError
from ship_sqla.kernel._errors import ShipError as ShipError
from ship_sqla.kernel._errors import TenantRequiredError as TenantRequiredError
from ship_sqla.kernel._errors import TenantViolationError as TenantViolationError
from ship_sqla.kernel._errors import UnknownProjectionError as UnknownProjectionError
from ship_sqla.kernel._errors import VersionConflictError as VersionConflictError
from ship_sqla.kernel._job_context import Cancellation as Cancellation
from ship_sqla.kernel._job_context import CancelReason as CancelReason
from ship_sqla.kernel._job_context import JobContext as JobContext
from ship_sqla.kernel._jobs import DEFAULT_MAX_PAYLOAD_BYTES as DEFAULT_MAX_PAYLOAD_BYTES
from ship_sqla.kernel._jobs import Concurrency as Concurrency
from ship_sqla.kernel._jobs import IdempotencyPolicy as IdempotencyPolicy
from ship_sqla.kernel._jobs import InvalidPayloadError as InvalidPayloadError
from ship_sqla.kernel._jobs import JobDefinition as JobDefinition
from ship_sqla.kernel._jobs import PayloadCodec as PayloadCodec
from ship_sqla.kernel._jobs import PayloadTooLargeError as PayloadTooLargeError
from ship_sqla.kernel._jobs import Retention as Retention
from ship_sqla.kernel._jobs import RetryPolicy as RetryPolicy
from ship_sqla.kernel._jobs import Schedule as Schedule
from ship_sqla.kernel._jobs import define_job as define_job
from ship_sqla.kernel._keys import MAX_KEY_CHARS as MAX_KEY_CHARS
from ship_sqla.kernel._keys import InvalidKeyError as InvalidKeyError
from ship_sqla.kernel._memory.jobs import InMemoryJobBackend as InMemoryJobBackend
from ship_sqla.kernel._memory.locks import InMemoryLock as InMemoryLock
from ship_sqla.kernel._memory.locks import InMemoryLockProvider as InMemoryLockProvider
from ship_sqla.kernel._metrics import JOB_METRIC_NAMES as JOB_METRIC_NAMES
from ship_sqla.kernel._metrics import JobMetrics as JobMetrics
from ship_sqla.kernel._metrics import JobOutcome as JobOutcome
from ship_sqla.kernel._plans.retry import backoff_delay as backoff_delay
from ship_sqla.kernel._plans.retry import lock_held_delay as lock_held_delay
from ship_sqla.kernel._plans.retry import retry_at as retry_at
from ship_sqla.kernel._plans.retry import retry_delay as retry_delay
from ship_sqla.kernel._plans.schedule import due_occurrence as due_occurrence
from ship_sqla.kernel._plans.schedule import next_occurrence as next_occurrence
from ship_sqla.kernel._plans.schedule import occurrence_id as occurrence_id
from ship_sqla.kernel._plans.schedule import previous_occurrence as previous_occurrence
from ship_sqla.kernel._ports import LEASE_LAPSED as LEASE_LAPSED
from ship_sqla.kernel._ports import LEASE_LAPSED_FINAL_ATTEMPT as LEASE_LAPSED_FINAL_ATTEMPT
from ship_sqla.kernel._ports import TERMINAL_STATES as TERMINAL_STATES
from ship_sqla.kernel._ports import BuriedRun as BuriedRun
from ship_sqla.kernel._ports import ClaimBatch as ClaimBatch
from ship_sqla.kernel._ports import ClaimedRun as ClaimedRun
from ship_sqla.kernel._ports import EnqueueRequest as EnqueueRequest
from ship_sqla.kernel._ports import EnqueueResult as EnqueueResult
from ship_sqla.kernel._ports import JobBackend as JobBackend
from ship_sqla.kernel._ports import JobLeaseLapsedError as JobLeaseLapsedError
from ship_sqla.kernel._ports import JobLeaseLapsedFinalError as JobLeaseLapsedFinalError
from ship_sqla.kernel._ports import JobLeaseStaleError as JobLeaseStaleError
from ship_sqla.kernel._ports import Lock as Lock
from ship_sqla.kernel._ports import LockProvider as LockProvider
from ship_sqla.kernel._ports import QueueDepth as QueueDepth
from ship_sqla.kernel._ports import QueueDepthSource as QueueDepthSource
from ship_sqla.kernel._ports import RenewableLock as RenewableLock
from ship_sqla.kernel._ports import RunRecord as RunRecord
from ship_sqla.kernel._ports import RunState as RunState
from ship_sqla.kernel._ports import SettleOutcome as SettleOutcome
from ship_sqla.kernel._registry import DuplicateJobError as DuplicateJobError
from ship_sqla.kernel._registry import JobRegistry as JobRegistry
from ship_sqla.kernel._registry import UnknownJobError as UnknownJobError
from ship_sqla.kernel._runtime.runtime import JobRuntime as JobRuntime
from ship_sqla.kernel._runtime.runtime import RuntimeMode as RuntimeMode
from ship_sqla.kernel._runtime.runtime import start_job_runtime as start_job_runtime
from ship_sqla.kernel._runtime.state import JobCancelledError as JobCancelledError

__all__ = (
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "JOB_METRIC_NAMES",
    "LEASE_LAPSED",
    "LEASE_LAPSED_FINAL_ATTEMPT",
    "MAX_KEY_CHARS",
    "TERMINAL_STATES",
    "BoundExceededError",
    "BuriedRun",
    "CancelReason",
    "Cancellation",
    "ClaimBatch",
    "ClaimedRun",
    "Clock",
    "Concurrency",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "DuplicateJobError",
    "EnqueueRequest",
    "EnqueueResult",
    "FrozenClock",
    "IdempotencyPolicy",
    "InMemoryJobBackend",
    "InMemoryLock",
    "InMemoryLockProvider",
    "InvalidCursorError",
    "InvalidKeyError",
    "InvalidPayloadError",
    "JobBackend",
    "JobCancelledError",
    "JobContext",
    "JobDefinition",
    "JobLeaseLapsedError",
    "JobLeaseLapsedFinalError",
    "JobLeaseStaleError",
    "JobMetrics",
    "JobOutcome",
    "JobRegistry",
    "JobRuntime",
    "Lock",
    "LockProvider",
    "NotYetImplementedError",
    "PayloadCodec",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "QueueDepth",
    "QueueDepthSource",
    "RenewableLock",
    "Retention",
    "RetryPolicy",
    "RollbackOnlyError",
    "RunRecord",
    "RunState",
    "RuntimeMode",
    "Schedule",
    "ScopeClosedError",
    "ScopeConcurrencyError",
    "SettleOutcome",
    "ShipError",
    "SystemClock",
    "TenantRequiredError",
    "TenantViolationError",
    "UnknownJobError",
    "UnknownProjectionError",
    "VersionConflictError",
    "backoff_delay",
    "define_job",
    "due_occurrence",
    "lock_held_delay",
    "next_occurrence",
    "occurrence_id",
    "previous_occurrence",
    "retry_at",
    "retry_delay",
    "start_job_runtime",
)
