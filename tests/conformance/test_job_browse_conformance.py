"""S2 on every backend (in-memory reference, PostgreSQL): ``JobOperations.list_runs``, the
dashboard's pages of runs, pages each state in its own order (waiting in claim order, running by
lease expiry, finished newest first), every run exactly once, one job or every job, with signed
cursors of the state's kind."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from job_helpers import claim_request

from ship_sqla import create_job_operations, define_job
from ship_sqla.errors import ConfigurationError, InvalidCursorError
from ship_sqla.jobs import EnqueueRequest, JobOperations, RunRecord
from ship_sqla.kernel import completed
from ship_sqla.kernel._jobs import Concurrency
from ship_sqla.kernel._tenancy import tenant_ambient
from ship_sqla.testing import FrozenClock


async def noop(ctx: Any, payload: Any) -> None:
    return None


WAIT = define_job("browse.wait", noop, payload=dict)
WAIT_TOO = define_job("browse.wait-too", noop, payload=dict)
RUN = define_job("browse.run", noop, payload=dict, concurrency=Concurrency(max=100, lease=30))
DONE = define_job("browse.done", noop, payload=dict)


def allow(permission: str, operation: str) -> bool:
    return True


@pytest.fixture
def backend(job_backend_factory: Any, clock: FrozenClock) -> Any:
    return job_backend_factory(clock)


@pytest.fixture
def ops(backend: Any) -> JobOperations:
    return create_job_operations(backend, authorizer=allow)


async def every_page(ops: JobOperations, *, limit: int, **query: Any) -> list[RunRecord]:
    """Every run of the query, page after page of at most ``limit``, in page order."""
    seen: list[RunRecord] = []
    cursor = None
    while True:
        page = await ops.list_runs(limit=limit, cursor=cursor, **query)
        assert len(page.items) <= limit
        seen += page.items
        if page.next_cursor is None:
            return seen
        assert len(page.items) == limit
        cursor = page.next_cursor


async def enqueue_waiting(backend: Any, clock: FrozenClock) -> dict[str, list[str]]:
    """Waiting runs of two jobs over several priorities, some delayed, many tying on run_at
    (one batch shares its enqueue time), a few of tenant acme; returns each job's run ids in
    claim order (priority descending, run_at, then creation order) and acme's of WAIT."""
    order: dict[str, list[tuple[int, Any, int, str]]] = {WAIT.id: [], WAIT_TOO.id: []}
    acme: list[tuple[int, Any, int, str]] = []
    made = 0
    later = clock.now() + timedelta(minutes=5)
    batches = [
        (WAIT, [0, 5, -3, 10, 0, 5, 0, -10], None, None),
        (WAIT_TOO, [5, 0, 10], None, None),
        (WAIT, [5, 0, 5], later, None),
        (WAIT, [0, 10, 0], None, "acme"),
        (WAIT_TOO, [0, 0, -3], later, "acme"),
    ]
    for job, priorities, run_at, tenant in batches:
        with tenant_ambient(tenant):
            results = await backend.enqueue_many(
                job, [EnqueueRequest({"p": p}, priority=p, run_at=run_at) for p in priorities]
            )
        for p, result in zip(priorities, results, strict=True):
            due = run_at if run_at is not None else clock.now()
            entry = (-p, due, made, result.run_id)
            order[job.id].append(entry)
            if tenant == "acme" and job is WAIT:
                acme.append(entry)
            made += 1
        clock.advance(1)
    everything = order[WAIT.id] + order[WAIT_TOO.id]
    return {
        WAIT.id: [entry[3] for entry in sorted(order[WAIT.id])],
        WAIT_TOO.id: [entry[3] for entry in sorted(order[WAIT_TOO.id])],
        "every job": [entry[3] for entry in sorted(everything)],
        "acme": [entry[3] for entry in sorted(acme)],
    }


async def test_s2_waiting_runs_page_in_claim_order_exactly_once(
    backend: Any, ops: JobOperations, clock: FrozenClock
) -> None:
    """S2, K6: waiting runs page in the order a claim takes them: highest priority first, then
    run_at, then creation order (runs enqueued in one batch tie on run_at), each exactly once,
    at any page size, of one job, of one tenant, and across jobs (one merged order); the page
    order is the claim's: claiming the job takes its first page."""
    expected = await enqueue_waiting(backend, clock)
    for limit in (1, 2, 3, 500):
        of_job = await every_page(ops, limit=limit, state="waiting", job_id=WAIT.id)
        assert [r.run_id for r in of_job] == expected[WAIT.id], limit
        assert {r.state for r in of_job} == {"waiting"}
        across = await every_page(ops, limit=limit, state="waiting")
        assert [r.run_id for r in across] == expected["every job"], limit
        acme = await every_page(ops, limit=limit, state="waiting", job_id=WAIT.id, tenant="acme")
        assert [r.run_id for r in acme] == expected["acme"], limit
    clock.advance(timedelta(minutes=10))  # every delayed run is due: the claim sees them all
    first = await ops.list_runs(state="waiting", job_id=WAIT.id, limit=4)
    claimed = await backend.claim(claim_request(WAIT, worker="w", limit=4))
    assert [run.run_id for run in claimed] == [r.run_id for r in first.items]


async def test_s2_running_runs_page_by_lease_expiry_exactly_once(
    backend: Any, ops: JobOperations, clock: FrozenClock
) -> None:
    """S2: running runs page soonest lease to lapse first, then by run id (runs claimed in one
    statement tie on their lease), each exactly once, of one job and across jobs; a lapsed
    lease comes first."""
    results = await backend.enqueue_many(RUN, [EnqueueRequest({"i": i}) for i in range(8)])
    assert len(results) == 8
    for limit in (3, 2, 3):
        assert len(await backend.claim(claim_request(RUN, worker="w", limit=limit))) == limit
        clock.advance(1)
    await backend.enqueue(WAIT, {"left": "waiting"})  # waiting: never on a running page
    clock.advance(31)  # the first claim's leases lapsed: still running until retaken
    records = [await ops.get_run(result.run_id) for result in results]
    running = [r for r in records if r is not None and r.state == "running"]
    assert len(running) == 8
    expected = [r.run_id for r in sorted(running, key=lambda r: (r.lease_expires_at, r.run_id))]
    for limit in (1, 2, 3, 500):
        of_job = await every_page(ops, limit=limit, state="running", job_id=RUN.id)
        assert [r.run_id for r in of_job] == expected, limit
        across = await every_page(ops, limit=limit, state="running")
        assert [r.run_id for r in across] == expected, limit


async def test_s2_finished_runs_page_newest_first_exactly_once(
    backend: Any, ops: JobOperations, clock: FrozenClock
) -> None:
    """S2, J18: completed runs page newest finished first by (finished_at, run_id) (the order
    history's (job_id, state, finished_at) index keeps; not creation order), ties on
    finished_at (one settle batch) included, each exactly once, of one job and across jobs,
    within a finish-time range when given; a creation-time range there is refused, and a
    finish-time range on another state."""
    groups = []
    for count in (4, 3, 5):
        await backend.enqueue_many(DONE, [EnqueueRequest({"n": n}) for n in range(count)])
        groups.append(count)
        clock.advance(1)
    claimed = await backend.claim(claim_request(DONE, worker="w", limit=12))
    assert len(claimed) == 12
    # Settled in another order than created: the last group first, then the first, then the
    # middle one, each batch at one finished_at.
    batches = [claimed[7:], claimed[:4], claimed[4:7]]
    for batch in batches:
        await backend.settle([completed(run) for run in batch])
        clock.advance(1)
    await backend.enqueue(DONE, {"left": "waiting"})
    page = await ops.list_runs(state="completed", job_id=DONE.id, limit=500)
    created = list(page.items)
    assert len(created) == 12
    key = lambda r: (r.finished_at, r.run_id)  # noqa: E731
    expected = [r.run_id for r in sorted(created, key=key)][::-1]
    assert (
        expected
        != [r.run_id for r in sorted(created, key=lambda r: (r.created_at, r.run_id))][::-1]
    )
    middle = sorted({r.finished_at for r in created if r.finished_at is not None})[1]
    in_range = [r.run_id for r in created if r.finished_at == middle]
    assert len(in_range) == 4
    for limit in (1, 2, 5, 500):
        of_job = await every_page(ops, limit=limit, state="completed", job_id=DONE.id)
        assert [r.run_id for r in of_job] == expected, limit
        across = await every_page(ops, limit=limit, state="completed")
        assert [r.run_id for r in across] == expected, limit
        ranged = await every_page(
            ops,
            limit=limit,
            state="completed",
            finished_from=middle,
            finished_to=middle + timedelta(microseconds=1),
        )
        assert sorted(r.run_id for r in ranged) == sorted(in_range), limit
    assert (await ops.list_runs(state="dead", job_id=DONE.id)).items == ()
    with pytest.raises(ConfigurationError) as caught:
        await ops.list_runs(state="completed", created_from=middle)
    assert "finished_from" in str(caught.value)
    with pytest.raises(ConfigurationError) as caught:
        await ops.list_runs(state="dead", finished_to=middle)
    assert "created_from" in str(caught.value)


async def test_s2_list_runs_refuses_a_creation_range_on_live_states_and_foreign_cursors(
    backend: Any, ops: JobOperations, clock: FrozenClock
) -> None:
    """S2: a creation-time range on waiting or running runs is refused before any read (it
    could only be filtered there, unbounded), naming what to do; a cursor is valid only for the
    state (and filter) that issued it."""
    await enqueue_waiting(backend, clock)
    for state in ("waiting", "running"):
        with pytest.raises(ConfigurationError) as caught:
            await ops.list_runs(state=state, created_from=clock.now())  # type: ignore[arg-type]
        assert "created_from" in str(caught.value)
        assert "finished states" in str(caught.value)
        with pytest.raises(ConfigurationError):
            await ops.list_runs(state=state, created_to=clock.now())  # type: ignore[arg-type]
    first = await ops.list_runs(state="waiting", job_id=WAIT.id, limit=1)
    assert first.next_cursor is not None
    for state in ("running", "completed", "dead"):
        with pytest.raises(InvalidCursorError):
            await ops.list_runs(
                state=state,  # type: ignore[arg-type]
                job_id=WAIT.id,
                cursor=first.next_cursor,
            )
    with pytest.raises(InvalidCursorError):
        await ops.list_runs(state="waiting", job_id=WAIT_TOO.id, cursor=first.next_cursor)
    with pytest.raises(InvalidCursorError):
        await ops.list_runs(state="waiting", cursor="not a cursor")
