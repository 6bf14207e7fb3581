"""Helpers the job runtime's unit and conformance tests share: moving a FrozenClock until
something happened, letting the loop settle, an ``on_error`` that records what it got, the claim
the runtime would send for a job, and reading a run back from any backend.

``tests/support`` is on pytest's ``pythonpath`` (pyproject.toml), so tests import this module
by its name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from ship_sqla.kernel._ports import ClaimRequest

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from ship_sqla.jobs import JobDefinition, RunRecord
    from ship_sqla.testing import FrozenClock


def claim_request(
    job: JobDefinition[Any], *, worker: str, limit: int = 1, exclude_keys: tuple[str, ...] = ()
) -> ClaimRequest:
    """The claim the runtime sends for ``job``: its ``concurrency.max``, ``lease``, rate limit,
    fairness, ``retry.max_lapses`` and aging (F10)."""
    return ClaimRequest(
        job_id=job.id,
        worker=worker,
        limit=limit,
        max_running=job.concurrency.max,
        lease=job.concurrency.lease,
        exclude_keys=exclude_keys,
        rate_limit=job.rate_limit,
        fairness=job.fairness,
        partition=job.partition,
        max_lapses=job.retry.max_lapses,
        aging=job.aging,
    )


async def record_of(backend: Any, run_id: str | None) -> RunRecord:
    """The run as the backend's administration port (``backend.admin``) answers it; it must
    exist."""
    assert run_id is not None
    record = await backend.admin.get_run(run_id)
    assert record is not None, f"run {run_id!r} does not exist"
    return record  # type: ignore[no-any-return]


async def all_in_state(backend: Any, run_ids: Iterable[str | None], state: str) -> bool:
    """True when every run of ``run_ids`` is in ``state``."""
    for run_id in run_ids:
        if (await record_of(backend, run_id)).state != state:
            return False
    return True


async def settle_loop(rounds: int = 30) -> None:
    """Let every ready task run a few steps (no wall-clock wait)."""
    for _ in range(rounds):
        await anyio.lowlevel.checkpoint()


async def advance_until(
    clock: FrozenClock,
    done: anyio.Event,
    *,
    step: float,
    limit: float = 10.0,
    most: float | None = None,
) -> None:
    """Move frozen time forward ``step`` seconds at a time until ``done`` is set, at most
    ``most`` seconds in all (None: no bound); past it, time stands still while the tasks go on
    (``limit`` real seconds in all).

    Small steps keep the test independent of when exactly a task parked in ``clock.sleep``;
    ``most`` keeps a loaded machine's slow database work from letting time run on to what
    the test must not reach (a run due later, a lease's end).
    """
    moved = 0.0
    with anyio.fail_after(limit):
        while not done.is_set():
            if most is None or moved + step <= most:
                clock.advance(step)
                moved += step
            await settle_loop()


async def advance_until_awaited(
    clock: FrozenClock,
    waiting: Callable[[], Awaitable[object]],
    *,
    step: float,
    limit: float = 10.0,
    most: float | None = None,
) -> None:
    """Move frozen time forward ``step`` seconds at a time until ``waiting()`` returned (for
    example ``lambda: spy.wait_calls("heartbeat", 2)``), at most ``most`` seconds in all (see
    :func:`advance_until`)."""
    done = anyio.Event()

    async def watch() -> None:
        await waiting()
        done.set()

    async with anyio.create_task_group() as group:
        group.start_soon(watch)
        await advance_until(clock, done, step=step, limit=limit, most=most)


class ErrorLog:
    """An ``on_error`` that keeps what it was given and signals each arrival."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []
        self._arrived = anyio.Event()

    def __call__(self, error: BaseException) -> None:
        self.errors.append(error)
        self._arrived.set()
        self._arrived = anyio.Event()

    def codes(self) -> list[str]:
        return [getattr(error, "code", type(error).__name__) for error in self.errors]

    async def wait_count(self, count: int, *, limit: float = 10.0) -> None:
        """Until at least ``count`` errors arrived."""
        with anyio.fail_after(limit):
            while len(self.errors) < count:
                await self._arrived.wait()

    async def wait_for(self, predicate: Any, limit: float = 5.0) -> BaseException:
        """The first error ``predicate`` accepts, waiting for it to arrive."""
        with anyio.fail_after(limit):
            while True:
                for error in self.errors:
                    if predicate(error):
                        return error
                await self._arrived.wait()


async def default_job_backend(engine: Any) -> Any:
    """The job tables and the audit table under their default names on ``engine`` (what
    ``ship-sqla schema apply`` creates, and the verbs find without table options; S1: a verb
    that changes state writes its audit entry), the history included (J16: the backend with no
    tables given moves ended runs there, and the commands follow the database), and a polling
    PostgreSQL backend on them."""
    from sqlalchemy import MetaData  # noqa: PLC0415 - job_helpers serves the in-memory tests too

    from ship_sqla._audit import ship_audit_table  # noqa: PLC0415
    from ship_sqla._jobs import (  # noqa: PLC0415
        create_job_backend,
        ship_job_history_table,
        ship_job_runs_table,
        ship_job_state_table,
    )

    metadata = MetaData()
    ship_job_runs_table(metadata)
    ship_job_history_table(metadata)
    ship_job_state_table(metadata)
    ship_audit_table(metadata)
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return create_job_backend(database=engine, listen=False)
