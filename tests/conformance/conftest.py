"""The job backend conformance suite's fixtures: one suite, every backend (SPEC §9).

``job_backend_factory`` is parametrized over the backends. Each test gets a factory bound to a
clean store; calling it returns a backend on that store (call it twice for two "processes").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from jobs_conformance_support import INPLACE_BACKENDS, JOB_BACKENDS
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
    """J16 (the default shape): the application's metadata declares the history table beside
    the runs table, so the runs table holds live runs only (ended runs move to history; every
    read of finished runs reads both) and the steps table has no foreign key to the runs."""
    async for make in _postgres_factory(ship_engine, live_only=True):
        yield make


@pytest.fixture
async def postgres_inplace_job_backend_factory(ship_engine: Any) -> AsyncIterator[Any]:
    """The legacy in-place shape (no history table declared): runs end in the runs table."""
    async for make in _postgres_factory(ship_engine, live_only=False):
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
    if live_only:
        # J16: declared beside the runs table, before the steps table (which then declares no
        # foreign key to the runs); the backend finds it in the runs table's metadata.
        ship_job_history_table(metadata)
    steps_table = ship_job_steps_table(metadata)
    events_table = ship_job_events_table(metadata)
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
        )
        assert backend.history is live_only  # J16: from the declaration
        made.append(backend)
        return backend

    yield make
    for backend in made:
        close = getattr(backend, "aclose", None)
        if close is not None:
            await close()


# --- end of the PostgreSQL section ---------------------------------------------------------------


def backend_factory(request: pytest.FixtureRequest, name: str) -> BackendFactory:
    """The factory of the backend ``name`` (one of JOB_BACKENDS or INPLACE_BACKENDS)."""
    if name in ("memory", "memory-live", "memory-inplace"):
        return _memory_factory(live_only=name != "memory-inplace")
    if name == "postgres-inplace":
        return request.getfixturevalue("postgres_inplace_job_backend_factory")  # type: ignore[no-any-return]
    return request.getfixturevalue("postgres_job_backend_factory")  # type: ignore[no-any-return]


@pytest.fixture(params=JOB_BACKENDS)
def job_backend_factory(request: pytest.FixtureRequest) -> BackendFactory:
    return backend_factory(request, request.param)


@pytest.fixture(params=INPLACE_BACKENDS)
def inplace_backend_factory(request: pytest.FixtureRequest) -> BackendFactory:
    """The legacy in-place shape (no history table declared: runs end in the runs table)."""
    return backend_factory(request, request.param)


@pytest.fixture(params=JOB_BACKENDS + INPLACE_BACKENDS)
def any_shape_backend_factory(request: pytest.FixtureRequest) -> BackendFactory:
    """J16: every backend in the default shape and in the legacy in-place one."""
    return backend_factory(request, request.param)


@pytest.fixture(params=["memory-live", "postgres-live"])
def live_only_backend_factory(request: pytest.FixtureRequest) -> BackendFactory:
    """J16: a backend whose runs table holds live runs only (ended runs in history)."""
    return backend_factory(request, request.param)


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
