"""J8 operator operations on every backend (in-memory reference, PostgreSQL): list_dead, get_run,
retry, discard, cleanup, state_counts, all through the one gate (``create_job_operations``) over
the backend's administration port (``backend.admin``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from job_helpers import claim_request
from sqlalchemy import text

from ship_sqla import create_job_operations
from ship_sqla.errors import (
    BoundExceededError,
    InvalidCursorError,
    JobOperationRefusedError,
    PermissionDeniedError,
)
from ship_sqla.jobs import JobOperations
from ship_sqla.kernel import InMemoryJobBackend, completed, failed
from ship_sqla.kernel._jobs import Concurrency, Retention, RetryPolicy, define_job
from ship_sqla.kernel._ports import (
    QueueDepthSource,
    RunAdmin,
    RunStore,
    ScheduleStore,
)
from ship_sqla.testing import FrozenClock


async def noop(ctx: Any, payload: Any) -> None:
    return None


JOB = define_job(
    "ops.mail",
    noop,
    payload=dict,
    concurrency=Concurrency(max=100, lease=30),
    retry=RetryPolicy(attempts=1),
    retention=Retention(
        completed=timedelta(hours=1), dead=timedelta(hours=2), discarded=timedelta(hours=3)
    ),
)
OTHER = define_job(
    "ops.other",
    noop,
    payload=dict,
    concurrency=Concurrency(max=100, lease=30),
    retry=RetryPolicy(attempts=1),
)


class Authorizer:
    def __init__(self, *, allow: bool) -> None:
        self.allow = allow
        self.calls: list[tuple[str, str]] = []

    def __call__(self, permission: str, operation: str) -> bool:
        self.calls.append((permission, operation))
        return self.allow


@pytest.fixture
def ship_clock(clock: FrozenClock) -> FrozenClock:
    return clock


@pytest.fixture
def backend(job_backend_factory: Any, clock: FrozenClock) -> Any:
    return job_backend_factory(clock)


@pytest.fixture
def ops(backend: Any) -> JobOperations:
    return create_job_operations(backend, authorizer=Authorizer(allow=True))


async def snapshot(backend: Any) -> list[Any]:
    """Every stored run, as the store holds it."""
    if isinstance(backend, InMemoryJobBackend):
        return backend.runs()
    async with backend.database.connect() as connection:
        result = await connection.execute(text("SELECT * FROM ship_job_runs ORDER BY id"))
        return list(result.all())


def _id(row: Any) -> str:
    """A snapshot row's run id (a RunRecord's ``run_id``, a table row's ``id``)."""
    return row.run_id if hasattr(row, "run_id") else row.id


async def dead_runs(backend: Any, job: Any, count: int) -> list[str]:
    """Enqueue ``count`` runs of ``job`` and fail each on its only attempt: dead."""
    for i in range(count):
        await backend.enqueue(job, {"i": i})
    claimed = await backend.claim(claim_request(job, worker="w", limit=count))
    assert len(claimed) == count
    for run in claimed:
        assert await backend.settle([failed(run, "boom", retry_at=None)]) == ["dead"]
    return [run.run_id for run in claimed]


async def test_refusal_changes_nothing(backend: Any, ship_clock: FrozenClock) -> None:
    """J8, S2: every operation asks for ship.jobs:manage first (a read, refused it, then
    ship.jobs:read); a refusal (sync or async authorizer) raises PermissionDeniedError naming
    permission and operation, and changes nothing."""
    [dead] = await dead_runs(backend, JOB, 1)
    waiting = (await backend.enqueue(JOB, {"w": 1})).run_id
    assert waiting is not None
    ship_clock.advance(timedelta(days=365))
    before = await snapshot(backend)
    refuse = Authorizer(allow=False)

    async def refuse_async(permission: str, operation: str) -> bool:
        return False

    for authorizer in (refuse, refuse_async):
        denied = create_job_operations(backend, authorizer=authorizer)
        calls = [
            ("list_dead", denied.list_dead()),
            ("get_run", denied.get_run(dead)),
            ("retry", denied.retry(dead)),
            ("discard", denied.discard(waiting)),
            ("cleanup", denied.cleanup([JOB])),
        ]
        for operation, call in calls:
            with pytest.raises(PermissionDeniedError) as caught:
                await call
            assert "ship.jobs:manage" in str(caught.value)
            assert operation in str(caught.value)
    assert refuse.calls == [
        ("ship.jobs:manage", "list_dead"),
        ("ship.jobs:read", "list_dead"),
        ("ship.jobs:manage", "get_run"),
        ("ship.jobs:read", "get_run"),
        ("ship.jobs:manage", "retry"),
        ("ship.jobs:manage", "discard"),
        ("ship.jobs:manage", "cleanup"),
    ]
    assert await snapshot(backend) == before


async def test_list_dead_pages_every_dead_run_exactly_once(
    backend: Any, ops: JobOperations, ship_clock: FrozenClock
) -> None:
    """J8: list_dead pages dead runs newest first by (finished_at, id): each exactly once,
    ties included; job_id filters; the limit is bounded and cursors are checked."""
    expected: list[str] = []
    for _ in range(3):  # several runs share each finished_at: the id breaks ties
        expected += await dead_runs(backend, JOB, 3)
        ship_clock.advance(1)
    other = await dead_runs(backend, OTHER, 2)
    await backend.enqueue(JOB, {"live": True})  # waiting: never listed

    async def all_pages(job_id: str | None) -> list[str]:
        seen: list[str] = []
        cursor = None
        while True:
            page = await ops.list_dead(job_id=job_id, limit=2, cursor=cursor)
            assert len(page.items) <= 2
            assert all(r.state == "dead" for r in page.items)
            seen += [r.run_id for r in page.items]
            if page.next_cursor is None:
                return seen
            cursor = page.next_cursor

    of_job = await all_pages(JOB.id)
    assert sorted(of_job) == sorted(expected)
    assert len(of_job) == len(set(of_job))
    everything = await all_pages(None)
    assert sorted(everything) == sorted(expected + other)
    assert len(everything) == len(set(everything))

    with pytest.raises(BoundExceededError):
        await ops.list_dead(limit=501)
    first = await ops.list_dead(job_id=JOB.id, limit=1)
    with pytest.raises(InvalidCursorError):
        await ops.list_dead(job_id=OTHER.id, cursor=first.next_cursor)
    with pytest.raises(InvalidCursorError):
        await ops.list_dead(cursor="not a cursor")


async def test_retry_gives_exactly_one_more_attempt(backend: Any, ops: JobOperations) -> None:
    """J8: retry puts a dead run back to waiting, due now, with exactly one more attempt; a
    claim takes it; failing that attempt makes it dead again. Non-dead runs are refused."""
    [run_id] = await dead_runs(backend, JOB, 1)
    record = await ops.get_run(run_id)
    assert record is not None
    assert record.state == "dead"
    assert [h["error"] for h in record.history] == ["boom"]

    await backend.wait_for_work(0)  # consume the wake the setup's enqueues left pending
    retried = await ops.retry(run_id)
    with anyio.fail_after(5):  # J3: the committed retry woke the local loop (the clock is frozen)
        await backend.wait_for_work(3600)
    assert retried.state == "waiting"
    assert retried.max_attempts == retried.attempt + 1 == 2
    assert retried.finished_at is None

    [claimed] = await backend.claim(claim_request(JOB, worker="w", limit=10))
    assert claimed.run_id == run_id
    assert claimed.attempt == claimed.max_attempts == 2
    assert await backend.settle([failed(claimed, "again", retry_at=backend.clock.now())]) == [
        "dead"
    ]
    again = await ops.get_run(run_id)
    assert again is not None
    assert again.state == "dead"
    assert [h["error"] for h in again.history] == ["boom", "again"]

    waiting = (await backend.enqueue(JOB, {"x": 1})).run_id
    assert waiting is not None
    with pytest.raises(JobOperationRefusedError, match="'waiting'"):
        await ops.retry(waiting)
    with pytest.raises(JobOperationRefusedError, match="no such run"):
        await ops.retry("missing")
    assert await ops.get_run("missing") is None


async def test_discard_waiting_or_dead_but_not_running(backend: Any, ops: JobOperations) -> None:
    """J8: discard makes a waiting or dead run discarded; a running run is refused and left."""
    [dead] = await dead_runs(backend, JOB, 1)
    waiting = (await backend.enqueue(JOB, {"w": 1})).run_id
    assert waiting is not None
    assert (await ops.discard(dead)).state == "discarded"
    discarded = await ops.discard(waiting)
    assert discarded.state == "discarded"
    assert discarded.finished_at is not None

    await backend.enqueue(JOB, {"r": 1})
    [running] = await backend.claim(claim_request(JOB, worker="w", limit=1))
    with pytest.raises(JobOperationRefusedError, match="'running'"):
        await ops.discard(running.run_id)
    record = await ops.get_run(running.run_id)
    assert record is not None
    assert record.state == "running"
    assert await backend.settle([completed(running)]) == ["completed"]
    with pytest.raises(JobOperationRefusedError, match="'completed'"):
        await ops.discard(running.run_id)


@pytest.fixture
def inplace_backend(inplace_backend_factory: Any, clock: FrozenClock) -> Any:
    """The legacy in-place shape (no history table): finished runs stay in the runs table."""
    return inplace_backend_factory(clock)


async def test_cleanup_deletes_only_runs_past_retention_in_batches(
    inplace_backend: Any, ship_clock: FrozenClock
) -> None:
    """J8: cleanup applies each job's retention per terminal state in bounded batches (at most
    max_batches x batch_size per job per call) and leaves live and recent runs. In the legacy
    in-place shape: with a history table (J16, the default) finished runs are not in the runs
    table, and history leaves by its partitions (J17)."""
    backend = inplace_backend
    ops = create_job_operations(backend, authorizer=Authorizer(allow=True))
    for i in range(5):
        await backend.enqueue(JOB, {"c": i})
    done = await backend.claim(claim_request(JOB, worker="w", limit=5))
    await backend.settle([completed(r) for r in done])  # completed at t0 (retention 1 h)
    old_dead = await dead_runs(backend, JOB, 2)  # dead at t0 (retention 2 h)
    waiting = (await backend.enqueue(JOB, {"w": 1})).run_id
    await ops.discard(waiting or "")  # discarded at t0 (retention 3 h)
    await backend.enqueue(JOB, {"live": 1})  # waiting forever: never deleted
    ship_clock.advance(timedelta(minutes=90))
    recent = await dead_runs(backend, JOB, 1)  # dead at t0 + 90 min
    other_done = await dead_runs(backend, OTHER, 1)  # OTHER: default retention (dead 30 d)

    # t0 + 150 min: completed (1 h) and the old dead (2 h) are past; the rest are not.
    ship_clock.advance(timedelta(hours=1))
    assert await ops.cleanup([JOB, OTHER], batch_size=2, max_batches=1) == {JOB.id: 2, OTHER.id: 0}
    assert await ops.cleanup([JOB, OTHER], batch_size=2, max_batches=10) == {
        JOB.id: 5,
        OTHER.id: 0,
    }
    left = {_id(row): row.state for row in await snapshot(backend)}
    assert not set(old_dead) & set(left)
    assert not {run.run_id for run in done} & set(left)
    assert set(recent) | set(other_done) | {waiting} <= set(left)
    assert sorted(left.values()) == ["dead", "dead", "discarded", "waiting"]
    assert await ops.cleanup([JOB]) == {JOB.id: 0}

    with pytest.raises(BoundExceededError):
        await ops.cleanup([JOB], batch_size=10_001)


async def test_state_counts_group_runs_by_job_and_state(
    backend: Any, ship_clock: FrozenClock
) -> None:
    """J8, J10: state_counts (gated like every operation) answers runs per (job, state), ordered
    by job then state, with the age of each job's oldest due waiting run; at most ``limit``
    groups, so a caller asking one more than it shows knows when some were left out."""
    await dead_runs(backend, JOB, 2)
    await backend.enqueue(JOB, {"waiting": True})
    ship_clock.advance(30)
    await backend.enqueue(OTHER, {"waiting": True}, run_at=ship_clock.now() + timedelta(hours=1))
    ops = create_job_operations(backend, authorizer=Authorizer(allow=True))

    counts = await ops.state_counts()

    assert [(c.job_id, c.state, c.runs) for c in counts] == [
        (JOB.id, "dead", 2),
        (JOB.id, "waiting", 1),
        (OTHER.id, "waiting", 1),
    ]
    assert [c.oldest_due_age for c in counts] == [None, pytest.approx(30.0), None]
    assert len(await ops.state_counts(limit=2)) == 2
    with pytest.raises(BoundExceededError):
        await ops.state_counts(limit=0)
    refuse = Authorizer(allow=False)
    with pytest.raises(PermissionDeniedError, match="state_counts"):
        await create_job_operations(backend, authorizer=refuse).state_counts()
    assert refuse.calls == [
        ("ship.jobs:manage", "state_counts"),
        ("ship.jobs:read", "state_counts"),
    ]


async def test_the_backend_carries_its_admin_port_apart(backend: Any) -> None:
    """J8: every backend implements the storage ports (RunStore, ScheduleStore, QueueDepthSource)
    and carries its RunAdmin as ``backend.admin``; the backend's own namespace holds no
    operator verb, so nothing ungated is one attribute away from the runtime's backend."""
    assert isinstance(backend, RunStore)
    assert isinstance(backend, ScheduleStore)
    assert isinstance(backend, QueueDepthSource)
    assert isinstance(backend.admin, RunAdmin)
    verbs = {"list_failed", "list_dead", "get_run", "retry", "retry_dead", "discard", "cleanup"}
    assert not verbs & set(dir(backend))
