"""ship_sqla: SQLAlchemy 2.x (asyncio + asyncpg) infrastructure for the Ship application kernel.

The names an application starts from: the unit of work and repositories, the table factories,
the job backend, ``define_job`` and ``start_job_runtime``, and the factories of the outbox, the
idempotency store, the webhook event store, advisory locks, the audit log and the dashboard.
Everything else is public by concern, each name in one module:

- :mod:`ship_sqla.jobs`: job options (``RetryPolicy``, ``Concurrency``, ``Schedule``...), the
  runtime, operations and their results
- :mod:`ship_sqla.workflows`: durable workflow values (``StepRetry``, ``WorkflowEvent``...)
- :mod:`ship_sqla.outbox`, :mod:`ship_sqla.idempotency`, :mod:`ship_sqla.webhooks`,
  :mod:`ship_sqla.locks`: each store's types
- :mod:`ship_sqla.operators`: who may operate (``Authorizer``) and the audit log
- :mod:`ship_sqla.schema`: schema check, DDL, row-level security policies
- :mod:`ship_sqla.errors`: every public exception, one base (``ShipError``)
- :mod:`ship_sqla.asgi`, :mod:`ship_sqla.testing`: ASGI building blocks, test support
- :mod:`ship_sqla.kernel`: for backend authors: the ports and the values they exchange

Names load on first use (PEP 562; the list is ``__init__.pyi``, read by
``ship_sqla.kernel._lazy``), so ``from ship_sqla import define_job`` loads neither SQLAlchemy
nor asyncpg.
"""

from ship_sqla.kernel._lazy import attach_stub as _attach_stub

__getattr__, __dir__, __all__ = _attach_stub(__name__, __file__)
