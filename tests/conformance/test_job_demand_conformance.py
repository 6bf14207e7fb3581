"""F5 demand on every backend (in-memory reference, PostgreSQL): per job the due, delayed and
running runs, each counted up to the cap, and the oldest due run's age, through the one operator
gate (``JobOperations.demand``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from job_helpers import claim_request

from ship_sqla import create_job_operations
from ship_sqla.errors import BoundExceededError, ConfigurationError, PermissionDeniedError
from ship_sqla.jobs import EnqueueRequest, JobDemand, JobOperations
from ship_sqla.kernel import completed, failed
from ship_sqla.kernel._jobs import Concurrency, define_job
from ship_sqla.testing import FrozenClock


async def noop(ctx: Any, payload: Any) -> None:
    return None


MAIL = define_job("demand.mail", noop, payload=dict, concurrency=Concurrency(max=100, lease=30))
PDF = define_job("demand.pdf", noop, payload=dict, concurrency=Concurrency(max=100, lease=30))
IDLE = define_job("demand.idle", noop, payload=dict)


def allow(permission: str, operation: str) -> bool:
    return True


@pytest.fixture
def backend(job_backend_factory: Any, clock: FrozenClock) -> Any:
    return job_backend_factory(clock)


@pytest.fixture
def ops(backend: Any) -> JobOperations:
    return create_job_operations(backend, authorizer=allow)


async def _load(backend: Any, clock: FrozenClock) -> None:
    """MAIL: 3 running, 4 due (two priority levels, the oldest due 60 s ago), 2 delayed;
    PDF: 1 due; the finished runs of both count for nothing."""
    now = clock.now()
    await backend.enqueue_many(MAIL, [EnqueueRequest({"r": n}) for n in range(3)])
    assert len(await backend.claim(claim_request(MAIL, worker="w", limit=3))) == 3
    await backend.enqueue(MAIL, {"old": 1}, run_at=now - timedelta(seconds=60), priority=-3)
    await backend.enqueue(MAIL, {"due": 1}, priority=5)
    await backend.enqueue_many(MAIL, [EnqueueRequest({"d": n}, priority=2) for n in range(2)])
    later = now + timedelta(hours=1)
    await backend.enqueue_many(
        MAIL, [EnqueueRequest({"l": n}, run_at=later, priority=p) for n, p in ((0, 5), (1, -3))]
    )
    await backend.enqueue(PDF, {"p": 1}, run_at=now - timedelta(seconds=5))
    await backend.enqueue(PDF, {"p": 2})
    [done] = await backend.claim(claim_request(PDF, worker="w", limit=1))
    assert await backend.settle([completed(done)]) == ["completed"]


async def test_f5_demand_counts_due_delayed_running_and_the_oldest_due_age(
    backend: Any, ops: JobOperations, clock: FrozenClock
) -> None:
    """F5: due, delayed and running per job, across priority levels (K6), with the oldest due
    run's age; finished runs count for nothing; a named idle job is answered with zeros; with no
    job ids, every job with waiting or running runs, in job id byte order."""
    await _load(backend, clock)
    named = await ops.demand([MAIL.id, IDLE.id, PDF.id])
    assert named == [
        JobDemand(IDLE.id, 0, 0, 0, None, 10_000),
        JobDemand(MAIL.id, 4, 2, 3, pytest.approx(60.0), 10_000),
        JobDemand(PDF.id, 1, 0, 0, pytest.approx(0.0), 10_000),
    ]
    assert [d.job_id for d in await ops.demand()] == [MAIL.id, PDF.id]
    assert not any(d.capped for d in named)


async def test_f5_demand_counts_stop_at_the_cap_and_say_so(
    backend: Any, ops: JobOperations, clock: FrozenClock
) -> None:
    """F5: each count stops at ``cap`` (its cost), and ``capped`` says a count reached it; the
    oldest due age stays exact."""
    await _load(backend, clock)
    [mail] = await ops.demand([MAIL.id], cap=2)
    assert (mail.due, mail.delayed, mail.running) == (2, 2, 2)
    assert mail.capped
    assert mail.oldest_due_age == pytest.approx(60.0)


async def test_f5_demand_refuses_bad_input_before_any_sql(backend: Any, ops: JobOperations) -> None:
    """F5: a bad cap, a bad job id, a string for the list, too many jobs: refused, named; and the
    gate asks the authorizer first (J8)."""
    for cap in (0, -1, 1_000_001, True, 2.5):
        with pytest.raises(BoundExceededError, match="demand cap"):
            await ops.demand(cap=cap)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="not a job id"):
        await ops.demand(["no spaces"])
    with pytest.raises(ConfigurationError, match="the string"):
        await ops.demand(MAIL.id)
    with pytest.raises(BoundExceededError, match="at most 1000"):
        await ops.demand([f"job.{n}" for n in range(1001)])

    def refuse(permission: str, operation: str) -> bool:
        return False

    with pytest.raises(PermissionDeniedError):
        await create_job_operations(backend, authorizer=refuse).demand()


async def test_dead_by_job_counts_each_jobs_dead_runs_up_to_the_cap_issue_36(backend, ops, clock):
    """Issue 36 (the overview's failing jobs): ``dead_by_job`` lists every job with dead runs,
    by job id, each counted up to the cap (a count at the cap is marked a floor) with its newest
    dead run's finish time; a job with only completed or live runs is not listed."""
    for job, count in ((MAIL, 3), (PDF, 1)):
        await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(count)])
        claimed = await backend.claim(claim_request(job, worker="w", limit=count))
        settled = await backend.settle([failed(run, "boom", retry_at=None) for run in claimed])
        assert settled == ["dead"] * count
    await backend.enqueue(IDLE, {})
    listed = await ops.dead_by_job(cap=2)
    assert [(f.job_id, f.dead, f.capped) for f in listed] == [
        (MAIL.id, 2, True),
        (PDF.id, 1, False),
    ]
    assert all(f.last_dead_at is not None for f in listed)
    assert [f.dead for f in await ops.dead_by_job()] == [3, 1]
