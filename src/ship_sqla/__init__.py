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

# --- outbox (section owned by the outbox work) --------------------------------------------------

# --- idempotency and webhooks (section owned by the idempotency/webhooks work) ------------------

# --- jobs and locks (section owned by the PostgreSQL job backend work) --------------------------

__all__ = (
    # unit of work and scope
    "Database",
    "TransactionScope",
    "UnitOfWork",
    "create_unit_of_work",
    "current_scope",
    "tenant_policy_ddl",
    # repositories
    # outbox
    # idempotency and webhooks
    # jobs and locks
)
