"""The job backend conformance suite's fixtures: one suite, every backend (SPEC §9).

``job_backend_factory`` is parametrized over the backends. Each test gets a factory bound to a
clean store; calling it returns a backend on that store (call it twice for two "processes").
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import MetaData

from ship_sqla import (
    create_job_backend,
    create_outbox,
    ship_job_events_table,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
    ship_job_workers_table,
    ship_outbox_table,
)
from ship_sqla.kernel import InMemoryJobBackend, InMemoryOutbox
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from jobs_conformance_support import BackendFactory


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


def _memory_factory(*, live_only: bool = False) -> BackendFactory:
    # One store for every backend of the test, like one database: the first backend made is
    # reused, and a second call with other options gets a view of the same runs.
    shared: dict[str, Any] = {}

    def make(
        clock: FrozenClock,
        *,
        queue_depth_limit: int | None = None,
        on_error: Any = None,
    ) -> InMemoryJobBackend:
        if "backend" in shared:
            return shared["backend"]  # type: ignore[no-any-return]
        backend = InMemoryJobBackend(
            clock=clock,
            queue_depth_limit=queue_depth_limit,
            on_error=on_error,
            live_only=live_only,
        )
        shared["backend"] = backend
        return backend

    return make


# --- PostgreSQL backend: every backend made in one test shares one clean database -----------------


@pytest.fixture
async def postgres_job_backend_factory(ship_engine: Any) -> AsyncIterator[Any]:
    async for make in _postgres_factory(ship_engine, live_only=False):
        yield make


@pytest.fixture
async def postgres_live_job_backend_factory(ship_engine: Any) -> AsyncIterator[Any]:
    """J16: the PostgreSQL backend with a history table given, so its runs table holds live
    runs only (ended runs move to history; every read of finished runs reads both)."""
    async for make in _postgres_factory(ship_engine, live_only=True):
        yield make


async def _postgres_factory(ship_engine: Any, *, live_only: bool) -> AsyncIterator[Any]:
    engine = ship_engine
    metadata = MetaData()
    # fair_claims: the fairness conformance suite claims fair jobs (F2); partitioned_claims:
    # the partition suite claims jobs with per-tenant limits (F8, F9); other suites never read
    # their indexes.
    runs_table = ship_job_runs_table(
        metadata, fair_claims=True, partitioned_claims=True, partition_keys=True
    )
    state_table = ship_job_state_table(metadata)
    workers_table = ship_job_workers_table(metadata)
    steps_table = ship_job_steps_table(metadata, runs_fkey=not live_only)
    events_table = ship_job_events_table(metadata)
    history_table = ship_job_history_table(metadata) if live_only else None
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    made: list[Any] = []

    def make(
        clock: FrozenClock,
        *,
        queue_depth_limit: int | None = None,
        on_error: Any = None,
    ) -> Any:
        backend = create_job_backend(
            database=engine,
            table=runs_table,
            state_table=state_table,
            workers_table=workers_table,
            steps_table=steps_table,
            events_table=events_table,
            queue_depth_limit=queue_depth_limit,
            on_error=on_error,
            clock=clock,
            history_table=history_table,
        )
        made.append(backend)
        return backend

    yield make
    for backend in made:
        close = getattr(backend, "aclose", None)
        if close is not None:
            await close()


# --- end of the PostgreSQL section ---------------------------------------------------------------


JOB_BACKENDS = os.environ.get("SHIP_SQLA_CONFORMANCE_BACKENDS", "memory,postgres").split(",")
"""The job backends the conformance suite runs on: memory and postgres by default;
``memory-live`` and ``postgres-live`` (J16: live runs only, ended runs in history) on request
(tests/conformance/test_job_history_conformance.py runs the J16 cases on them always)."""


@pytest.fixture(params=JOB_BACKENDS)
def job_backend_factory(request: pytest.FixtureRequest) -> BackendFactory:
    if request.param in ("memory", "memory-live"):
        return _memory_factory(live_only=request.param == "memory-live")
    if request.param == "postgres-live":
        return request.getfixturevalue("postgres_live_job_backend_factory")  # type: ignore[no-any-return]
    return request.getfixturevalue("postgres_job_backend_factory")  # type: ignore[no-any-return]


@pytest.fixture(params=["memory-live", "postgres-live"])
def live_only_backend_factory(request: pytest.FixtureRequest) -> BackendFactory:
    """J16: a backend whose runs table holds live runs only (ended runs in history)."""
    if request.param == "memory-live":
        return _memory_factory(live_only=True)
    return request.getfixturevalue("postgres_live_job_backend_factory")  # type: ignore[no-any-return]


# --- The outbox store port (kernel/_outbox.py): the in-memory outbox and the PostgreSQL one -------


@pytest.fixture
async def postgres_outbox_factory(ship_engine: Any) -> Any:
    metadata = MetaData()
    table = ship_outbox_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)

    def make(clock: FrozenClock, **options: Any) -> Any:
        return create_outbox(database=ship_engine, table=table, clock=clock, **options)

    return make


@pytest.fixture(params=["memory", "postgres"])
def outbox_store_factory(request: pytest.FixtureRequest) -> Any:
    """Makes an outbox store (the ``OutboxStore`` port, plus ``enqueue`` and ``get``) on a clean
    store: ``make(clock, max_attempts=..., backoff=..., on_error=...)``."""
    if request.param == "memory":
        return lambda clock, **options: InMemoryOutbox(clock=clock, **options)
    return request.getfixturevalue("postgres_outbox_factory")
