"""Each attempt's start and worker, kept in its history entry (J18, issue 39 item 3), on every
backend and in both shapes (live runs only, J16, and the legacy in-place one): a failed
attempt, a lapsed attempt a claim retook or buried (J6), a cancel-requested one that lapsed
(K2). A running run's ``updated_at`` is its attempt's start, which the heartbeat and a cancel
request leave as it is, so the start of an attempt whose worker died is still known.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from job_helpers import claim_request, record_of

from ship_sqla import define_job
from ship_sqla.jobs import AttemptRecord, Concurrency, RetryPolicy
from ship_sqla.kernel import completed, failed
from ship_sqla.kernel._ports import CANCEL_LAPSED_MESSAGE, LEASE_LAPSED_MESSAGE

LEASE = 30.0


async def noop(ctx: Any, payload: Any) -> None:
    return None


def job_named(job_id: str, attempts: int = 3) -> Any:
    return define_job(
        job_id,
        noop,
        payload=dict,
        concurrency=Concurrency(max=5, lease=LEASE),
        retry=RetryPolicy(attempts=attempts, backoff="fixed", base_delay=1, jitter="none"),
    )


async def beat_then_lapse(backend: Any, clock: Any, held: Any) -> None:
    """A heartbeat 10 s after the claim (it lands), then the renewed lease lapses."""
    clock.advance(10)
    assert await backend.heartbeat([held]) == [True]
    clock.advance(LEASE + 1)


async def test_j18_a_failed_attempt_records_its_start_and_worker(
    clock: Any, any_shape_backend_factory: Any
) -> None:
    """J18: each failed attempt's entry keeps when it started (its claim) and which worker ran
    it, so its run time is ``at - started``; a heartbeat between leaves the recorded start
    (the running run's ``updated_at``) as it was. The first attempt's queue wait is its start
    minus the due time it was enqueued with."""
    backend = any_shape_backend_factory(clock)
    job = job_named("j18.failed", attempts=2)
    due = clock.now()
    clock.advance(3)  # three seconds in the queue
    run_id = (await backend.enqueue(job, {"n": 1}, run_at=due)).run_id
    first_start = clock.now()
    [first] = await backend.claim(claim_request(job, worker="w-a"))
    clock.advance(10)
    assert await backend.heartbeat([first]) == [True]
    running = await record_of(backend, run_id)
    assert running.updated_at == first_start  # the heartbeat kept the start
    assert (running.started_at, running.worker) == (first_start, "w-a")
    clock.advance(5)
    assert await backend.settle([failed(first, "ValueError: one", clock.now())]) == ["retrying"]
    first_end = clock.now()
    clock.advance(7)
    second_start = clock.now()
    [second] = await backend.claim(claim_request(job, worker="w-b"))
    clock.advance(2)
    assert await backend.settle([failed(second, "ValueError: two", None)]) == ["dead"]

    record = await record_of(backend, run_id)
    assert [(e.get("worker"), e.get("kind")) for e in record.history] == [
        ("w-a", "failure"),
        ("w-b", "failure"),
    ]
    one, two = record.entries
    assert (one.attempt, one.started, one.at, one.worker) == (1, first_start, first_end, "w-a")
    assert one.run_time == timedelta(seconds=15)
    assert one.started - due == timedelta(seconds=3)  # the first attempt's queue wait
    assert (two.attempt, two.started, two.worker, two.run_time) == (
        2,
        second_start,
        "w-b",
        timedelta(seconds=2),
    )
    assert two.error == "ValueError: two"


async def test_j18_j6_j5_a_lapsed_attempt_retaken_records_its_start_and_worker(
    clock: Any, any_shape_backend_factory: Any
) -> None:
    """J18, J6: a claim that retakes a run whose lease lapsed writes the lapsed attempt's entry
    with that attempt's start (not its last heartbeat) and its worker; J5: the stale holder's
    late failure changes nothing, so no entry of it. A completed attempt leaves no entry."""
    backend = any_shape_backend_factory(clock)
    job = job_named("j18.retaken")
    run_id = (await backend.enqueue(job, {"n": 1})).run_id
    started = clock.now()
    [held] = await backend.claim(claim_request(job, worker="w-dies"))
    await beat_then_lapse(backend, clock, held)
    retaken_at = clock.now()
    [again] = await backend.claim(claim_request(job, worker="w-next"))
    assert again.retaken
    assert await backend.settle([failed(held, "late", clock.now())]) == ["stale"]
    assert await backend.settle([completed(again)]) == ["completed"]

    record = await record_of(backend, run_id)
    assert record.state == "completed"
    [lapsed] = record.entries
    assert lapsed == AttemptRecord(
        attempt=1,
        at=retaken_at,
        error=LEASE_LAPSED_MESSAGE,
        kind="lapsed",
        started=started,
        worker="w-dies",
    )
    assert lapsed.run_time == timedelta(seconds=10 + LEASE + 1)


async def test_j18_j6_a_buried_run_records_its_last_attempts_start_and_worker(
    clock: Any, any_shape_backend_factory: Any
) -> None:
    """J18, J6: a run whose lease lapsed on its final attempt is dead-lettered by a claim, its
    entry with that attempt's start and worker; K2: a cancel-requested run that lapsed is ended
    cancelled the same way, the request having left the attempt's start as it was."""
    backend = any_shape_backend_factory(clock)
    job = job_named("j18.buried", attempts=1)
    dead_id = (await backend.enqueue(job, {"n": 1})).run_id
    cancelled_id = (await backend.enqueue(job, {"n": 2})).run_id
    started = clock.now()
    claimed = await backend.claim(claim_request(job, worker="w-gone", limit=2))
    assert len(claimed) == 2
    clock.advance(1)
    assert await backend.admin.cancel(cancelled_id) is not None
    assert (await record_of(backend, cancelled_id)).updated_at == started
    [held, _] = sorted(claimed, key=lambda run: run.run_id != dead_id)
    await beat_then_lapse(backend, clock, held)
    buried_at = clock.now()
    batch = await backend.claim(claim_request(job, worker="w-other"))
    assert list(batch) == []
    assert [run.run_id for run in batch.buried] == [dead_id]

    dead = await record_of(backend, dead_id)
    assert dead.state == "dead"
    [entry] = dead.entries
    assert (entry.kind, entry.started, entry.worker, entry.at) == (
        "lapsed",
        started,
        "w-gone",
        buried_at,
    )
    gone = await record_of(backend, cancelled_id)
    assert gone.state == "cancelled"
    [entry] = gone.entries
    assert (entry.kind, entry.error, entry.started, entry.worker) == (
        "cancelled",
        CANCEL_LAPSED_MESSAGE,
        started,
        "w-gone",
    )


def test_j18_an_entry_written_before_reads_none() -> None:
    """J18: an entry written before the per-attempt times (no ``started``, no ``worker``), or
    before ``kind``, still reads: the keys it lacks are None, and so is its run time."""
    old = AttemptRecord.of({"attempt": 2, "at": "2026-01-02T03:04:05+00:00", "error": "boom"})
    assert (old.attempt, old.error, old.kind, old.started, old.worker, old.run_time) == (
        2,
        "boom",
        None,
        None,
        None,
        None,
    )
    assert old.at is not None
    assert old.at.utcoffset() == timedelta(0)
    assert AttemptRecord.of("not an object") == AttemptRecord(None, None, None, None)
