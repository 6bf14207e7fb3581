"""The web app: FastAPI, ``POST /orders`` behind the Idempotency-Key middleware.

One request, ONE unit of work: the order row, its ``order.placed`` outbox message (for the
relay), its ``orders.confirm`` job run (for the worker), the middleware's claim of the key and
the stored response all commit together, or none of them does. A retry with the same
``Idempotency-Key`` gets the stored 201 back (``Idempotent-Replayed: true``) and writes
nothing; a retry while the first is still running waits for it (at most the store's
``lock_timeout``, then 409: retry again); the same key with another body is 422.

Serve it (from the repository root; it creates its tables at startup)::

    uvicorn --factory examples.fastapi_service.app:create_app

then, in two more shells, ``ship-sqla worker examples.fastapi_service.worker:registry`` and
``python -m examples.fastapi_service.relay`` (see this folder's README.md).
"""

from __future__ import annotations

import contextlib
import uuid
from datetime import datetime  # noqa: TC003 - pydantic reads the annotations at runtime
from typing import TYPE_CHECKING, Annotated

import attrs
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, Response
from pydantic import BaseModel, Field
from sqlalchemy import insert, select

from examples.fastapi_service.settings import Settings, get_settings
from examples.fastapi_service.tables import (
    idempotency_table,
    job_runs,
    job_state,
    metadata,
    orders,
    outbox_table,
)
from examples.fastapi_service.worker import ConfirmOrder, confirm_order
from ship_sqla import (
    TransactionScope,
    UnitOfWork,
    create_idempotency_store,
    create_job_backend,
    create_outbox,
    create_unit_of_work,
)
from ship_sqla.asgi import IdempotencyKeyMiddleware

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sqlalchemy.ext.asyncio import AsyncEngine

    from ship_sqla.jobs import PostgresJobBackend
    from ship_sqla.outbox import Outbox


class OrderIn(BaseModel):
    customer: str = Field(min_length=1, max_length=200)
    total_cents: int = Field(gt=0)


class OrderOut(BaseModel):
    id: uuid.UUID
    customer: str
    total_cents: int
    status: str  # "placed", then "confirmed" once the worker ran orders.confirm
    created_at: datetime
    confirmed_at: datetime | None = None


@attrs.frozen
class Services:
    """What the routes use; built once per app (``app.state.services``)."""

    settings: Settings
    engine: AsyncEngine
    uow: UnitOfWork[TransactionScope]
    outbox: Outbox
    jobs: PostgresJobBackend


def _scope_itself(scope: TransactionScope) -> TransactionScope:
    return scope


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


ServicesDep = Annotated[Services, Depends(services)]
router = APIRouter()


@router.post("/orders", status_code=201)
async def place_order(order: OrderIn, response: Response, app: ServicesDep) -> OrderOut:
    order_id = uuid.uuid4()

    async def place(scope: TransactionScope) -> OrderOut:
        # This run joins the middleware's unit of work (the same engine): the row, the message,
        # the job run, the key's claim and the stored response commit together.
        row = (
            await scope.connection.execute(
                insert(orders)
                .values(id=order_id, customer=order.customer, total_cents=order.total_cents)
                .returning(*orders.c)
            )
        ).one()
        event = {"order_id": str(order_id), "customer": order.customer, "total": order.total_cents}
        await app.outbox.enqueue(app.settings.outbox_id, "order.placed", event, scope=scope)
        await app.jobs.enqueue(
            confirm_order, ConfirmOrder(str(order_id)), dedupe_key=f"order:{order_id}", scope=scope
        )
        return OrderOut.model_validate(row._asdict())

    placed = await app.uow.run(place)
    response.headers["location"] = f"/orders/{order_id}"
    return placed


@router.get("/orders/{order_id}")
async def get_order(order_id: uuid.UUID, app: ServicesDep) -> OrderOut:
    async with app.engine.connect() as connection:
        statement = select(*orders.c).where(orders.c.id == order_id)
        row = (await connection.execute(statement)).one_or_none()
    if row is None:
        raise HTTPException(status_code=404, detail=f"no order {order_id}")
    return OrderOut.model_validate(row._asdict())


def create_app(settings: Settings | None = None) -> FastAPI:
    """The app on ``settings`` (default: :func:`get_settings`); for ``uvicorn --factory``."""
    settings = settings or get_settings()
    engine = settings.engine(pool_size=settings.pool_size, max_overflow=settings.max_overflow)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        async with engine.begin() as connection:  # in an application: Alembic migrations
            await connection.run_sync(metadata.create_all)
        try:
            yield
        finally:
            await engine.dispose()

    app = FastAPI(title="orders (ship_sqla example)", lifespan=lifespan)
    app.include_router(router)
    # POST and PATCH must carry an Idempotency-Key; the key store shares the app's engine, so
    # the routes' units of work join the middleware's.
    idempotency = create_idempotency_store(database=engine, table=idempotency_table)
    app.add_middleware(IdempotencyKeyMiddleware, store=idempotency)
    app.state.services = Services(
        settings=settings,
        engine=engine,
        uow=create_unit_of_work(engine, repositories=_scope_itself),
        outbox=create_outbox(database=engine, table=outbox_table),
        jobs=create_job_backend(database=engine, table=job_runs, state_table=job_state),
    )
    return app
