from ship_sqla.kernel._browse import BrowsedRun as BrowsedRun
from ship_sqla.kernel._browse import ClaimPosition as ClaimPosition
from ship_sqla.kernel._browse import CreatedPosition as CreatedPosition
from ship_sqla.kernel._browse import LeasePosition as LeasePosition
from ship_sqla.kernel._browse import RunBrowser as RunBrowser
from ship_sqla.kernel._browse import RunOrder as RunOrder
from ship_sqla.kernel._browse import RunPosition as RunPosition
from ship_sqla.kernel._browse import RunQuery as RunQuery
from ship_sqla.kernel._clock import Clock as Clock
from ship_sqla.kernel._clock import SystemClock as SystemClock
from ship_sqla.kernel._memory.jobs import InMemoryJobBackend as InMemoryJobBackend
from ship_sqla.kernel._memory.locks import InMemoryLock as InMemoryLock
from ship_sqla.kernel._memory.locks import InMemoryLockProvider as InMemoryLockProvider
from ship_sqla.kernel._memory.workers import InMemoryWorkerRegistry as InMemoryWorkerRegistry
from ship_sqla.kernel._memory.workflows import InMemoryWorkflowStore as InMemoryWorkflowStore
from ship_sqla.kernel._ports import LEASE_LAPSED as LEASE_LAPSED
from ship_sqla.kernel._ports import LEASE_LAPSED_FINAL_ATTEMPT as LEASE_LAPSED_FINAL_ATTEMPT
from ship_sqla.kernel._ports import RUN_CANCELLED as RUN_CANCELLED
from ship_sqla.kernel._ports import BuriedRun as BuriedRun
from ship_sqla.kernel._ports import Cancel as Cancel
from ship_sqla.kernel._ports import CancelRequestSource as CancelRequestSource
from ship_sqla.kernel._ports import ClaimBatch as ClaimBatch
from ship_sqla.kernel._ports import ClaimedRun as ClaimedRun
from ship_sqla.kernel._ports import ClaimRequest as ClaimRequest
from ship_sqla.kernel._ports import Complete as Complete
from ship_sqla.kernel._ports import DeadQuery as DeadQuery
from ship_sqla.kernel._ports import Fail as Fail
from ship_sqla.kernel._ports import HeartbeatBatch as HeartbeatBatch
from ship_sqla.kernel._ports import JobBackend as JobBackend
from ship_sqla.kernel._ports import JobSupport as JobSupport
from ship_sqla.kernel._ports import Lock as Lock
from ship_sqla.kernel._ports import LockProvider as LockProvider
from ship_sqla.kernel._ports import QueueDepthSource as QueueDepthSource
from ship_sqla.kernel._ports import Release as Release
from ship_sqla.kernel._ports import RenewableLock as RenewableLock
from ship_sqla.kernel._ports import RunAdmin as RunAdmin
from ship_sqla.kernel._ports import RunStore as RunStore
from ship_sqla.kernel._ports import ScheduleStore as ScheduleStore
from ship_sqla.kernel._ports import Settlement as Settlement
from ship_sqla.kernel._ports import SettleOutcome as SettleOutcome
from ship_sqla.kernel._ports import SnoozeRun as SnoozeRun
from ship_sqla.kernel._ports import Suspend as Suspend
from ship_sqla.kernel._ports import WakeSource as WakeSource
from ship_sqla.kernel._workers import WorkerEntry as WorkerEntry
from ship_sqla.kernel._workers import WorkerRegistry as WorkerRegistry
from ship_sqla.kernel._workers import WorkerRegistrySource as WorkerRegistrySource
from ship_sqla.kernel._workflows import NewStep as NewStep
from ship_sqla.kernel._workflows import UnitOfWorkLike as UnitOfWorkLike
from ship_sqla.kernel._workflows import Workflow as Workflow
from ship_sqla.kernel._workflows import WorkflowAdmin as WorkflowAdmin
from ship_sqla.kernel._workflows import WorkflowStore as WorkflowStore

__all__ = (
    "LEASE_LAPSED",
    "LEASE_LAPSED_FINAL_ATTEMPT",
    "RUN_CANCELLED",
    "BrowsedRun",
    "BuriedRun",
    "Cancel",
    "CancelRequestSource",
    "ClaimBatch",
    "ClaimPosition",
    "ClaimRequest",
    "ClaimedRun",
    "Clock",
    "Complete",
    "CreatedPosition",
    "DeadQuery",
    "Fail",
    "HeartbeatBatch",
    "InMemoryJobBackend",
    "InMemoryLock",
    "InMemoryLockProvider",
    "InMemoryWorkerRegistry",
    "InMemoryWorkflowStore",
    "JobBackend",
    "JobSupport",
    "LeasePosition",
    "Lock",
    "LockProvider",
    "NewStep",
    "QueueDepthSource",
    "Release",
    "RenewableLock",
    "RunAdmin",
    "RunBrowser",
    "RunOrder",
    "RunPosition",
    "RunQuery",
    "RunStore",
    "ScheduleStore",
    "SettleOutcome",
    "Settlement",
    "SnoozeRun",
    "Suspend",
    "SystemClock",
    "UnitOfWorkLike",
    "WakeSource",
    "WorkerEntry",
    "WorkerRegistry",
    "WorkerRegistrySource",
    "Workflow",
    "WorkflowAdmin",
    "WorkflowStore",
)
