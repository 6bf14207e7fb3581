from ship_sqla._jobs import PostgresJobBackend as PostgresJobBackend
from ship_sqla._notify import Listener as Listener
from ship_sqla.kernel._attempts import AttemptRecord as AttemptRecord
from ship_sqla.kernel._browse import ConsumerKeyProgress as ConsumerKeyProgress
from ship_sqla.kernel._browse import ScheduleState as ScheduleState
from ship_sqla.kernel._browse import ThroughputBucket as ThroughputBucket
from ship_sqla.kernel._health import HealthAlarm as HealthAlarm
from ship_sqla.kernel._health import HealthBounds as HealthBounds
from ship_sqla.kernel._health import HorizonHolder as HorizonHolder
from ship_sqla.kernel._health import StorageHealth as StorageHealth
from ship_sqla.kernel._health import TableHealth as TableHealth
from ship_sqla.kernel._job_context import Cancellation as Cancellation
from ship_sqla.kernel._job_context import CancelReason as CancelReason
from ship_sqla.kernel._jobs import DEFAULT_MAX_PAYLOAD_BYTES as DEFAULT_MAX_PAYLOAD_BYTES
from ship_sqla.kernel._jobs import Concurrency as Concurrency
from ship_sqla.kernel._jobs import Determinism as Determinism
from ship_sqla.kernel._jobs import Fairness as Fairness
from ship_sqla.kernel._jobs import IdempotencyPolicy as IdempotencyPolicy
from ship_sqla.kernel._jobs import JobDefinition as JobDefinition
from ship_sqla.kernel._jobs import OnDivergence as OnDivergence
from ship_sqla.kernel._jobs import PayloadCodec as PayloadCodec
from ship_sqla.kernel._jobs import RateLimit as RateLimit
from ship_sqla.kernel._jobs import Retention as Retention
from ship_sqla.kernel._jobs import RetryPolicy as RetryPolicy
from ship_sqla.kernel._jobs import Schedule as Schedule
from ship_sqla.kernel._keys import MAX_KEY_CHARS as MAX_KEY_CHARS
from ship_sqla.kernel._metrics import JOB_METRIC_NAMES as JOB_METRIC_NAMES
from ship_sqla.kernel._metrics import STORAGE_METRIC_NAMES as STORAGE_METRIC_NAMES
from ship_sqla.kernel._metrics import JobMetrics as JobMetrics
from ship_sqla.kernel._metrics import JobOutcome as JobOutcome
from ship_sqla.kernel._operations import BulkResult as BulkResult
from ship_sqla.kernel._operations import CancelResult as CancelResult
from ship_sqla.kernel._operations import JobOperations as JobOperations
from ship_sqla.kernel._operations import PauseResult as PauseResult
from ship_sqla.kernel._partition_waits import PartitionLimits as PartitionLimits
from ship_sqla.kernel._partition_waits import PartitionWait as PartitionWait
from ship_sqla.kernel._plans.backoff import Backoff as Backoff
from ship_sqla.kernel._plans.schedule import next_occurrence as next_occurrence
from ship_sqla.kernel._plans.schedule import occurrence_id as occurrence_id
from ship_sqla.kernel._plans.schedule import previous_occurrence as previous_occurrence
from ship_sqla.kernel._ports import TERMINAL_STATES as TERMINAL_STATES
from ship_sqla.kernel._ports import EnqueueRequest as EnqueueRequest
from ship_sqla.kernel._ports import EnqueueResult as EnqueueResult
from ship_sqla.kernel._ports import FailureKind as FailureKind
from ship_sqla.kernel._ports import HistoryKind as HistoryKind
from ship_sqla.kernel._ports import JobDemand as JobDemand
from ship_sqla.kernel._ports import PausedJob as PausedJob
from ship_sqla.kernel._ports import QueueDepth as QueueDepth
from ship_sqla.kernel._ports import RunRecord as RunRecord
from ship_sqla.kernel._ports import RunState as RunState
from ship_sqla.kernel._ports import StateCount as StateCount
from ship_sqla.kernel._priority import DEFAULT_PRIORITY as DEFAULT_PRIORITY
from ship_sqla.kernel._priority import MAX_PRIORITY as MAX_PRIORITY
from ship_sqla.kernel._priority import MIN_PRIORITY as MIN_PRIORITY
from ship_sqla.kernel._priority import Aging as Aging
from ship_sqla.kernel._priority import aging_bound as aging_bound
from ship_sqla.kernel._registry import JobRegistry as JobRegistry
from ship_sqla.kernel._runtime.runtime import JobRuntime as JobRuntime
from ship_sqla.kernel._runtime.runtime import RuntimeMode as RuntimeMode
from ship_sqla.kernel._search import BulkPreview as BulkPreview
from ship_sqla.kernel._search import BulkProgress as BulkProgress
from ship_sqla.kernel._search import RunFilter as RunFilter
from ship_sqla.kernel._search import SearchPage as SearchPage
from ship_sqla.kernel._transactional import Inbox as Inbox
from ship_sqla.kernel._workers import WorkerRecord as WorkerRecord

__all__ = (
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_PRIORITY",
    "JOB_METRIC_NAMES",
    "MAX_KEY_CHARS",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "STORAGE_METRIC_NAMES",
    "TERMINAL_STATES",
    "Aging",
    "AttemptRecord",
    "Backoff",
    "BulkPreview",
    "BulkProgress",
    "BulkResult",
    "CancelReason",
    "CancelResult",
    "Cancellation",
    "Concurrency",
    "ConsumerKeyProgress",
    "Determinism",
    "EnqueueRequest",
    "EnqueueResult",
    "FailureKind",
    "Fairness",
    "HealthAlarm",
    "HealthBounds",
    "HistoryKind",
    "HorizonHolder",
    "IdempotencyPolicy",
    "Inbox",
    "JobDefinition",
    "JobDemand",
    "JobMetrics",
    "JobOperations",
    "JobOutcome",
    "JobRegistry",
    "JobRuntime",
    "Listener",
    "OnDivergence",
    "PartitionLimits",
    "PartitionWait",
    "PauseResult",
    "PausedJob",
    "PayloadCodec",
    "PostgresJobBackend",
    "QueueDepth",
    "RateLimit",
    "Retention",
    "RetryPolicy",
    "RunFilter",
    "RunRecord",
    "RunState",
    "RuntimeMode",
    "Schedule",
    "ScheduleState",
    "SearchPage",
    "StateCount",
    "StorageHealth",
    "TableHealth",
    "ThroughputBucket",
    "WorkerRecord",
    "aging_bound",
    "next_occurrence",
    "occurrence_id",
    "previous_occurrence",
)
