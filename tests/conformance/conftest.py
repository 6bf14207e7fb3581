"""The job backend conformance suite's fixtures: one suite, every backend (SPEC §9).

``job_backend_factory`` is parametrized over the backends. Each test gets a factory bound to a
clean store; calling it returns a backend on that store (call it twice for two "processes").
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

import pytest

from ship_sqla.kernel import FrozenClock, InMemoryJobBackend, InMemoryLockProvider

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from jobs_conformance_support import BackendFactory


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


def _memory_factory() -> BackendFactory:
    # One store for every backend of the test, like one database: the first backend made is
    # reused, and a second call with other options gets a view of the same runs.
    shared: dict[str, Any] = {}

    def make(
        clock: FrozenClock,
        *,
        queue_depth_limit: int | None = None,
        max_in_flight: int = 100,
        poll_interval: float = 1.0,
        on_error: Any = None,
        with_locks: bool = False,
    ) -> InMemoryJobBackend:
        if "backend" in shared:
            return shared["backend"]  # type: ignore[no-any-return]
        locks = shared.setdefault("locks", InMemoryLockProvider(clock)) if with_locks else None
        backend = InMemoryJobBackend(
            clock=clock,
            lock_provider=locks,
            queue_depth_limit=queue_depth_limit,
            max_in_flight=max_in_flight,
            poll_interval=poll_interval,
            on_error=on_error,
        )
        shared["backend"] = backend
        return backend

    return make


# --- PostgreSQL backend: section owned by the PostgreSQL job backend work -----------------------
# The "postgres" parameter runs the whole suite against ship_sqla._jobs. It is skipped, with the
# reason below, only while that package has no create_job_backend. Adjust the wiring here to the
# real factory's signature; keep the BackendFactory contract (tests/conformance/
# jobs_conformance_support.py): every backend made in one test shares one clean database.


def _require_postgres_backend() -> Any:
    if importlib.util.find_spec("ship_sqla._jobs") is None:
        pytest.skip("ship_sqla._jobs (the PostgreSQL job backend) does not exist yet")
    jobs = importlib.import_module("ship_sqla._jobs")
    if not hasattr(jobs, "create_job_backend"):
        pytest.skip("ship_sqla._jobs has no create_job_backend yet (PostgreSQL backend unfinished)")
    return jobs


@pytest.fixture
async def postgres_job_backend_factory(ship_engine: Any) -> AsyncIterator[Any]:
    from sqlalchemy import MetaData  # noqa: PLC0415 - only the postgres parameter needs it

    jobs = _require_postgres_backend()
    engine = ship_engine
    metadata = MetaData()
    runs_table = jobs.ship_job_runs_table(metadata)
    state_table = jobs.ship_job_state_table(metadata)
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    made: list[Any] = []

    def make(
        clock: FrozenClock,
        *,
        queue_depth_limit: int | None = None,
        max_in_flight: int = 100,
        poll_interval: float = 1.0,
        on_error: Any = None,
        with_locks: bool = False,
    ) -> Any:
        locks_module = importlib.import_module("ship_sqla._locks")
        backend = jobs.create_job_backend(
            database=engine,
            table=runs_table,
            state_table=state_table,
            lock_provider=(
                locks_module.advisory_lock_provider(engine, clock=clock) if with_locks else None
            ),
            poll_interval=poll_interval,
            queue_depth_limit=queue_depth_limit,
            max_in_flight=max_in_flight,
            on_error=on_error,
            clock=clock,
        )
        made.append(backend)
        return backend

    yield make
    for backend in made:
        close = getattr(backend, "aclose", None)
        if close is not None:
            await close()


# --- end of the PostgreSQL section ---------------------------------------------------------------


@pytest.fixture(params=["memory", "postgres"])
def job_backend_factory(request: pytest.FixtureRequest) -> BackendFactory:
    if request.param == "memory":
        return _memory_factory()
    # Checked before the database fixtures are set up, so a missing backend costs no server.
    _require_postgres_backend()
    return request.getfixturevalue("postgres_job_backend_factory")  # type: ignore[no-any-return]
