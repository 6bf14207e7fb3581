"""The worker: the ``orders.confirm`` job in a registry, its handler's engine from a lifespan.

Run it (from the repository root, with ``SHIP_SQLA_DATABASE_URL`` set, as the app and the
relay read it)::

    ship-sqla worker examples.fastapi_service.worker:registry

The command enters :func:`lifespan` once before its first claim and leaves it after its drain:
every run of the process shares the one engine it opens (``ctx.resources``).
"""

from __future__ import annotations

import contextlib
import uuid
from typing import TYPE_CHECKING

import attrs
from sqlalchemy import func, update

from examples.fastapi_service.settings import get_settings
from examples.fastapi_service.tables import orders
from ship_sqla.jobs import Concurrency, JobRegistry, RetryPolicy

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sqlalchemy.ext.asyncio import AsyncEngine

    from ship_sqla import JobContext


@attrs.frozen
class Resources:
    """What the handlers reach through ``ctx.resources``."""

    engine: AsyncEngine


@contextlib.asynccontextmanager
async def lifespan() -> AsyncIterator[Resources]:
    engine = get_settings().engine()
    try:
        yield Resources(engine)
    finally:
        await engine.dispose()


registry = JobRegistry(lifespan=lifespan)
"""What ``ship-sqla worker examples.fastapi_service.worker:registry`` executes."""


@attrs.frozen
class ConfirmOrder:
    order_id: str


@registry.job(
    "orders.confirm",
    payload=ConfirmOrder,
    concurrency=Concurrency(max=20, lease=30),
    retry=RetryPolicy(attempts=5, base_delay=1),
)
async def confirm_order(ctx: JobContext[Resources], payload: ConfirmOrder) -> None:
    # At least once: a run retaken after a crash confirms an order already confirmed, which
    # changes nothing (the status guard makes the effect idempotent).
    statement = (
        update(orders)
        .where(orders.c.id == uuid.UUID(payload.order_id), orders.c.status == "placed")
        .values(status="confirmed", confirmed_at=func.now())
    )
    async with ctx.resources.engine.begin() as connection:
        await connection.execute(statement)
