from ship_sqla.kernel._backend_base import JobBackendBase as JobBackendBase
from ship_sqla.kernel._backfills import BackfillLedger as BackfillLedger
from ship_sqla.kernel._backfills import BackfillSource as BackfillSource
from ship_sqla.kernel._browse import BrowsedRun as BrowsedRun
from ship_sqla.kernel._browse import ClaimPosition as ClaimPosition
from ship_sqla.kernel._browse import CreatedPosition as CreatedPosition
from ship_sqla.kernel._browse import FinishedPosition as FinishedPosition
from ship_sqla.kernel._browse import LeasePosition as LeasePosition
from ship_sqla.kernel._browse import RunBrowser as RunBrowser
from ship_sqla.kernel._browse import RunOrder as RunOrder
from ship_sqla.kernel._browse import RunPosition as RunPosition
from ship_sqla.kernel._browse import RunQuery as RunQuery
from ship_sqla.kernel._clock import Clock as Clock
from ship_sqla.kernel._clock import SystemClock as SystemClock
from ship_sqla.kernel._health import StorageHealthSource as StorageHealthSource
from ship_sqla.kernel._memory.backfills import InMemoryBackfillLedger as InMemoryBackfillLedger
from ship_sqla.kernel._memory.inbox import InMemoryInbox as InMemoryInbox
from ship_sqla.kernel._memory.jobs import InMemoryJobBackend as InMemoryJobBackend
from ship_sqla.kernel._memory.locks import InMemoryLock as InMemoryLock
from ship_sqla.kernel._memory.locks import InMemoryLockProvider as InMemoryLockProvider
from ship_sqla.kernel._memory.outbox import InMemoryOutbox as InMemoryOutbox
from ship_sqla.kernel._memory.transactions import InMemoryTransaction as InMemoryTransaction
from ship_sqla.kernel._memory.transactions import InMemoryUnitOfWork as InMemoryUnitOfWork
from ship_sqla.kernel._memory.webhooks_out import (
    InMemoryWebhookDeliveryStore as InMemoryWebhookDeliveryStore,
)
from ship_sqla.kernel._memory.workers import InMemoryWorkerRegistry as InMemoryWorkerRegistry
from ship_sqla.kernel._memory.workflows import InMemoryWorkflowStore as InMemoryWorkflowStore
from ship_sqla.kernel._outbox import OutboxStore as OutboxStore
from ship_sqla.kernel._outbox_records import OutboxSettlement as OutboxSettlement
from ship_sqla.kernel._outbox_records import message_delivered as message_delivered
from ship_sqla.kernel._outbox_records import message_failed as message_failed
from ship_sqla.kernel._outbox_records import message_released as message_released
from ship_sqla.kernel._ports import LEASE_LAPSED as LEASE_LAPSED
from ship_sqla.kernel._ports import LEASE_LAPSED_CRASH_LOOP as LEASE_LAPSED_CRASH_LOOP
from ship_sqla.kernel._ports import LEASE_LAPSED_FINAL_ATTEMPT as LEASE_LAPSED_FINAL_ATTEMPT
from ship_sqla.kernel._ports import RUN_CANCELLED as RUN_CANCELLED
from ship_sqla.kernel._ports import BuriedRun as BuriedRun
from ship_sqla.kernel._ports import CancelRequestSource as CancelRequestSource
from ship_sqla.kernel._ports import ClaimBatch as ClaimBatch
from ship_sqla.kernel._ports import ClaimedRun as ClaimedRun
from ship_sqla.kernel._ports import ClaimRequest as ClaimRequest
from ship_sqla.kernel._ports import DeadQuery as DeadQuery
from ship_sqla.kernel._ports import FenceAnswer as FenceAnswer
from ship_sqla.kernel._ports import FencedRuns as FencedRuns
from ship_sqla.kernel._ports import HeartbeatBatch as HeartbeatBatch
from ship_sqla.kernel._ports import JobBackend as JobBackend
from ship_sqla.kernel._ports import Lock as Lock
from ship_sqla.kernel._ports import LockProvider as LockProvider
from ship_sqla.kernel._ports import QueueDepthSource as QueueDepthSource
from ship_sqla.kernel._ports import RenewableLock as RenewableLock
from ship_sqla.kernel._ports import RunAdmin as RunAdmin
from ship_sqla.kernel._ports import RunStore as RunStore
from ship_sqla.kernel._ports import ScheduleStore as ScheduleStore
from ship_sqla.kernel._ports import SettleOutcome as SettleOutcome
from ship_sqla.kernel._ports import Suspend as Suspend
from ship_sqla.kernel._ports import WakeSource as WakeSource
from ship_sqla.kernel._settlement import HistoryEntry as HistoryEntry
from ship_sqla.kernel._settlement import ReleaseReason as ReleaseReason
from ship_sqla.kernel._settlement import Settlement as Settlement
from ship_sqla.kernel._settlement import SettleRequest as SettleRequest
from ship_sqla.kernel._settlement import cancelled as cancelled
from ship_sqla.kernel._settlement import completed as completed
from ship_sqla.kernel._settlement import duplicate as duplicate
from ship_sqla.kernel._settlement import failed as failed
from ship_sqla.kernel._settlement import refused as refused
from ship_sqla.kernel._settlement import released as released
from ship_sqla.kernel._settlement import settle_refusal as settle_refusal
from ship_sqla.kernel._settlement import snoozed as snoozed
from ship_sqla.kernel._transactional import InboxAnswer as InboxAnswer
from ship_sqla.kernel._transactional import InboxStore as InboxStore
from ship_sqla.kernel._webhooks_out import DeliveryAttempt as DeliveryAttempt
from ship_sqla.kernel._webhooks_out import WebhookDeliveryRecord as WebhookDeliveryRecord
from ship_sqla.kernel._webhooks_out import WebhookDeliveryStore as WebhookDeliveryStore
from ship_sqla.kernel._webhooks_out import WebhookEndpointRecord as WebhookEndpointRecord
from ship_sqla.kernel._webhooks_out import WebhookSecret as WebhookSecret
from ship_sqla.kernel._workers import WorkerEntry as WorkerEntry
from ship_sqla.kernel._workers import WorkerRegistry as WorkerRegistry
from ship_sqla.kernel._workflows import NewStep as NewStep
from ship_sqla.kernel._workflows import UnitOfWorkLike as UnitOfWorkLike
from ship_sqla.kernel._workflows import Workflow as Workflow
from ship_sqla.kernel._workflows import WorkflowAdmin as WorkflowAdmin
from ship_sqla.kernel._workflows import Workflows as Workflows
from ship_sqla.kernel._workflows import WorkflowStore as WorkflowStore

__all__ = (
    "LEASE_LAPSED",
    "LEASE_LAPSED_CRASH_LOOP",
    "LEASE_LAPSED_FINAL_ATTEMPT",
    "RUN_CANCELLED",
    "BackfillLedger",
    "BackfillSource",
    "BrowsedRun",
    "BuriedRun",
    "CancelRequestSource",
    "ClaimBatch",
    "ClaimPosition",
    "ClaimRequest",
    "ClaimedRun",
    "Clock",
    "CreatedPosition",
    "DeadQuery",
    "DeliveryAttempt",
    "FenceAnswer",
    "FencedRuns",
    "FinishedPosition",
    "HeartbeatBatch",
    "HistoryEntry",
    "InMemoryBackfillLedger",
    "InMemoryInbox",
    "InMemoryJobBackend",
    "InMemoryLock",
    "InMemoryLockProvider",
    "InMemoryOutbox",
    "InMemoryTransaction",
    "InMemoryUnitOfWork",
    "InMemoryWebhookDeliveryStore",
    "InMemoryWorkerRegistry",
    "InMemoryWorkflowStore",
    "InboxAnswer",
    "InboxStore",
    "JobBackend",
    "JobBackendBase",
    "LeasePosition",
    "Lock",
    "LockProvider",
    "NewStep",
    "OutboxSettlement",
    "OutboxStore",
    "QueueDepthSource",
    "ReleaseReason",
    "RenewableLock",
    "RunAdmin",
    "RunBrowser",
    "RunOrder",
    "RunPosition",
    "RunQuery",
    "RunStore",
    "ScheduleStore",
    "SettleOutcome",
    "SettleRequest",
    "Settlement",
    "StorageHealthSource",
    "Suspend",
    "SystemClock",
    "UnitOfWorkLike",
    "WakeSource",
    "WebhookDeliveryRecord",
    "WebhookDeliveryStore",
    "WebhookEndpointRecord",
    "WebhookSecret",
    "WorkerEntry",
    "WorkerRegistry",
    "Workflow",
    "WorkflowAdmin",
    "WorkflowStore",
    "Workflows",
    "cancelled",
    "completed",
    "duplicate",
    "failed",
    "message_delivered",
    "message_failed",
    "message_released",
    "refused",
    "released",
    "settle_refusal",
    "snoozed",
)
