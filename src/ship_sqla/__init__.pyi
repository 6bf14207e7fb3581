from ship_sqla._audit import create_audit_log as create_audit_log
from ship_sqla._audit import ship_audit_table as ship_audit_table
from ship_sqla._dashboard import create_dashboard as create_dashboard
from ship_sqla._engine import create_engine as create_engine
from ship_sqla._idempotency import create_idempotency_store as create_idempotency_store
from ship_sqla._idempotency import ship_idempotency_table as ship_idempotency_table
from ship_sqla._jobs import create_job_backend as create_job_backend
from ship_sqla._jobs import create_job_stats as create_job_stats
from ship_sqla._jobs import ship_job_events_table as ship_job_events_table
from ship_sqla._jobs import ship_job_history_table as ship_job_history_table
from ship_sqla._jobs import ship_job_runs_table as ship_job_runs_table
from ship_sqla._jobs import ship_job_state_table as ship_job_state_table
from ship_sqla._jobs import ship_job_stats_table as ship_job_stats_table
from ship_sqla._jobs import ship_job_steps_table as ship_job_steps_table
from ship_sqla._jobs import ship_job_workers_table as ship_job_workers_table
from ship_sqla._locks import advisory_lock_provider as advisory_lock_provider
from ship_sqla._locks import ship_lock_fences_table as ship_lock_fences_table
from ship_sqla._outbox import create_outbox as create_outbox
from ship_sqla._outbox import create_outbox_operations as create_outbox_operations
from ship_sqla._outbox import ship_outbox_table as ship_outbox_table
from ship_sqla._outbox import start_outbox_relay as start_outbox_relay
from ship_sqla._projection import Projection as Projection
from ship_sqla._repository import BoundRepository as BoundRepository
from ship_sqla._repository import TableRepository as TableRepository
from ship_sqla._scope import Database as Database
from ship_sqla._scope import TransactionScope as TransactionScope
from ship_sqla._scope import current_scope as current_scope
from ship_sqla._uow import UnitOfWork as UnitOfWork
from ship_sqla._uow import create_unit_of_work as create_unit_of_work
from ship_sqla._webhooks import create_webhook_event_store as create_webhook_event_store
from ship_sqla._webhooks import ship_webhook_events_table as ship_webhook_events_table
from ship_sqla.kernel._job_context import JobContext as JobContext
from ship_sqla.kernel._jobs import define_job as define_job
from ship_sqla.kernel._operations import create_job_operations as create_job_operations
from ship_sqla.kernel._page import Page as Page
from ship_sqla.kernel._runtime.runtime import start_job_runtime as start_job_runtime

__all__ = (
    "BoundRepository",
    "Database",
    "JobContext",
    "Page",
    "Projection",
    "TableRepository",
    "TransactionScope",
    "UnitOfWork",
    "advisory_lock_provider",
    "create_audit_log",
    "create_dashboard",
    "create_engine",
    "create_idempotency_store",
    "create_job_backend",
    "create_job_operations",
    "create_job_stats",
    "create_outbox",
    "create_outbox_operations",
    "create_unit_of_work",
    "create_webhook_event_store",
    "current_scope",
    "define_job",
    "ship_audit_table",
    "ship_idempotency_table",
    "ship_job_events_table",
    "ship_job_history_table",
    "ship_job_runs_table",
    "ship_job_state_table",
    "ship_job_stats_table",
    "ship_job_steps_table",
    "ship_job_workers_table",
    "ship_lock_fences_table",
    "ship_outbox_table",
    "ship_webhook_events_table",
    "start_job_runtime",
    "start_outbox_relay",
)
