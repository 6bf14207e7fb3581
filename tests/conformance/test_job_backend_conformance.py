"""The JobBackend contract, run against every backend (in-memory reference, PostgreSQL).

Each backend runs in the default shape (J16: live runs only, ended runs in history) and, here
only, in the legacy in-place shape too (no history table declared: runs end in the runs
table), so both stay under the contract. Time moves only through the FrozenClock; nothing
sleeps on the wall clock.
"""

from __future__ import annotations

from datetime import timedelta

import anyio
import anyio.lowlevel
import attrs
import pytest
from job_helpers import claim_request, record_of

from ship_sqla import create_job_operations, define_job
from ship_sqla.errors import InvalidPayloadError
from ship_sqla.jobs import (
    Concurrency,
    EnqueueRequest,
    IdempotencyPolicy,
    RetryPolicy,
    Schedule,
    occurrence_id,
    previous_occurrence,
)
from ship_sqla.kernel import LEASE_LAPSED_FINAL_ATTEMPT, JobBackend, completed, failed, released
from ship_sqla.kernel._ports import (
    LEASE_LAPSED,
    LEASE_LAPSED_FINAL_MESSAGE,
    LEASE_LAPSED_MESSAGE,
    BuriedRun,
    ClaimBatch,
)

LEASE = 30.0


@pytest.fixture
def job_backend_factory(any_shape_backend_factory):
    """J16: every backend in the default shape and in the legacy in-place one."""
    return any_shape_backend_factory


async def _noop(ctx, payload):
    return None


def job(job_id="conf.job", *, max_=10, attempts=3, single_runner=False, key=None, **kw):
    return define_job(
        job_id,
        _noop,
        payload=dict,
        concurrency=Concurrency(max=max_, lease=LEASE, single_runner=single_runner, key=key),
        retry=RetryPolicy(attempts=attempts, backoff="fixed", base_delay=5, jitter="none"),
        **kw,
    )


async def run_of(backend, run_id):
    """The stored run, through the backend's administration port (``backend.admin``)."""
    return await record_of(backend, run_id)


async def test_enqueue_then_claim(clock, job_backend_factory):
    """A due run is claimed once, with attempt 1, a token and the job's lease."""
    backend = job_backend_factory(clock)
    assert isinstance(backend, JobBackend)
    definition = job()
    result = await backend.enqueue(definition, {"n": 1})
    assert result.accepted
    assert not result.deduplicated
    assert result.run_id is not None
    [claimed] = await backend.claim(claim_request(definition, worker="A", limit=5))
    assert claimed.run_id == result.run_id
    assert claimed.job_id == definition.id
    assert claimed.payload == {"n": 1}
    assert claimed.attempt == 1
    assert claimed.max_attempts == 3
    assert claimed.key is None
    assert claimed.lease_expires_at == clock.now() + timedelta(seconds=LEASE)
    assert await backend.claim(claim_request(definition, worker="B", limit=5)) == []
    record = await run_of(backend, result.run_id)
    assert record.state == "running"
    assert record.attempt == 1


async def test_invalid_payload_writes_nothing(clock, job_backend_factory):
    backend = job_backend_factory(clock)
    definition = job()
    with pytest.raises(InvalidPayloadError):
        await backend.enqueue(definition, ["not", "a", "dict"])
    assert await backend.claim(claim_request(definition, worker="A", limit=5)) == []


async def test_j1_dedupe_key_returns_the_existing_non_terminal_run(clock, job_backend_factory):
    """J1: a dedupe_key held by a non-terminal run of the job returns that run, deduplicated;
    once the run is terminal, the key is free again."""
    backend = job_backend_factory(clock)
    definition = job()
    first = await backend.enqueue(definition, {"n": 1}, dedupe_key="k")
    again = await backend.enqueue(definition, {"n": 2}, dedupe_key="k")
    assert again.run_id == first.run_id
    assert again.deduplicated
    assert again.accepted
    [claimed] = await backend.claim(claim_request(definition, worker="A", limit=5))
    running = await backend.enqueue(definition, {"n": 3}, dedupe_key="k")
    assert running.run_id == first.run_id
    assert running.deduplicated
    other_job = await backend.enqueue(job("conf.other"), {"n": 4}, dedupe_key="k")
    assert not other_job.deduplicated
    assert await backend.settle([completed(claimed)]) == ["completed"]
    fresh = await backend.enqueue(definition, {"n": 5}, dedupe_key="k")
    assert not fresh.deduplicated
    assert fresh.run_id != first.run_id


async def test_j1_idempotency_policy_derives_the_dedupe_key(clock, job_backend_factory):
    """J1: a job's idempotency policy supplies the dedupe key when the caller gives none."""
    backend = job_backend_factory(clock)
    definition = job(idempotency=IdempotencyPolicy(key=lambda payload: str(payload["order"])))
    first = await backend.enqueue(definition, {"order": 7, "try": 1})
    again = await backend.enqueue(definition, {"order": 7, "try": 2})
    other = await backend.enqueue(definition, {"order": 8, "try": 1})
    assert again.deduplicated
    assert again.run_id == first.run_id
    assert not other.deduplicated


async def test_j1_durable_run_id_is_inserted_once(clock, job_backend_factory):
    """J1/J9: a caller-chosen run id that exists already is returned deduplicated."""
    backend = job_backend_factory(clock)
    definition = job()
    first = await backend.enqueue(definition, {"n": 1}, run_id="conf.job/2030-01-01T00:00:00Z")
    again = await backend.enqueue(definition, {"n": 2}, run_id="conf.job/2030-01-01T00:00:00Z")
    assert first.run_id == "conf.job/2030-01-01T00:00:00Z"
    assert again.run_id == first.run_id
    assert again.deduplicated
    assert len(await backend.claim(claim_request(definition, worker="A", limit=5))) == 1


async def test_j1_enqueue_many_dedupes_within_the_batch(clock, job_backend_factory):
    """J1 holds inside one enqueue_many; results come back in request order."""
    backend = job_backend_factory(clock)
    definition = job()
    results = await backend.enqueue_many(
        definition,
        [
            EnqueueRequest({"n": 1}, dedupe_key="a"),
            EnqueueRequest({"n": 2}, dedupe_key="b"),
            EnqueueRequest({"n": 3}, dedupe_key="a"),
            EnqueueRequest({"n": 4}),
        ],
    )
    assert [r.deduplicated for r in results] == [False, False, True, False]
    assert results[2].run_id == results[0].run_id
    claimed = await backend.claim(claim_request(definition, worker="A", limit=10))
    assert sorted(c.payload["n"] for c in claimed) == [1, 2, 4]


async def test_j2_queue_full_counts_waiting_and_delayed_runs(clock, job_backend_factory):
    """J2: once the job holds queue_depth_limit waiting runs (due or delayed), enqueue is
    rejected "queue-full"; claimed runs free room; a duplicate is still deduplicated."""
    backend = job_backend_factory(clock, queue_depth_limit=3)
    definition = job()
    later = clock.now() + timedelta(hours=1)
    accepted = [
        await backend.enqueue(definition, {"n": 1}, dedupe_key="d"),
        await backend.enqueue(definition, {"n": 2}),
        await backend.enqueue(definition, {"n": 3}, run_at=later),
    ]
    assert all(r.accepted for r in accepted)
    full = await backend.enqueue(definition, {"n": 4})
    assert full.rejected == "queue-full"
    assert not full.accepted
    assert full.run_id is None
    duplicate = await backend.enqueue(definition, {"n": 5}, dedupe_key="d")
    assert duplicate.deduplicated
    assert duplicate.run_id == accepted[0].run_id
    assert (await backend.enqueue(job("conf.other"), {"n": 6})).accepted
    await backend.claim(claim_request(definition, worker="A", limit=1))
    assert (await backend.enqueue(definition, {"n": 7})).accepted
    assert (await backend.enqueue(definition, {"n": 8})).rejected == "queue-full"


async def test_j3_enqueue_wakes_a_waiting_loop(clock, job_backend_factory):
    """J3: wait_for_work returns at once after a local enqueue, long before the poll interval
    (frozen time never reaches it here); a wake before the wait is not lost."""
    backend = job_backend_factory(clock)
    definition = job()
    returned = anyio.Event()

    async def waiter():
        await backend.wait_for_work(60.0)
        returned.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.lowlevel.checkpoint()
        await backend.enqueue(definition, {"n": 1})
        with anyio.fail_after(5):
            await returned.wait()
    await backend.enqueue(definition, {"n": 2})
    with anyio.fail_after(5):
        await backend.wait_for_work(60.0)


async def test_j3_wait_for_work_times_out_on_the_clock(clock, job_backend_factory):
    """J3: without a wake, wait_for_work returns after the poll interval of (frozen) time."""
    backend = job_backend_factory(clock)
    returned = anyio.Event()

    async def waiter():
        await backend.wait_for_work(5.0)
        returned.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        with anyio.fail_after(10):
            while not returned.is_set():
                clock.advance(1)
                for _ in range(20):
                    await anyio.lowlevel.checkpoint()


async def test_claim_order_is_run_at_then_creation(clock, job_backend_factory):
    """J3: due runs are claimed by run_at, then in creation order; delayed runs wait."""
    backend = job_backend_factory(clock)
    definition = job()
    now = clock.now()
    a = await backend.enqueue(definition, {"n": "a"}, run_at=now - timedelta(seconds=1))
    b = await backend.enqueue(definition, {"n": "b"})
    c = await backend.enqueue(definition, {"n": "c"}, run_at=now - timedelta(seconds=5))
    clock.advance(0.001)
    d = await backend.enqueue(definition, {"n": "d"}, run_at=now)
    e = await backend.enqueue(definition, {"n": "e"}, run_at=now + timedelta(seconds=10))
    # Which runs a claim takes follows the order; the order inside one claim's answer is free.
    claimed = await backend.claim(claim_request(definition, worker="A", limit=1))
    assert [r.run_id for r in claimed] == [c.run_id]
    claimed = await backend.claim(claim_request(definition, worker="A", limit=2))
    assert {r.run_id for r in claimed} == {a.run_id, b.run_id}
    claimed = await backend.claim(claim_request(definition, worker="A", limit=10))
    assert [r.run_id for r in claimed] == [d.run_id]
    assert await backend.claim(claim_request(definition, worker="A", limit=10)) == []
    clock.advance(10)
    [late] = await backend.claim(claim_request(definition, worker="A", limit=10))
    assert late.run_id == e.run_id


async def test_concurrency_max_is_never_exceeded_by_two_workers(clock, job_backend_factory):
    """J3: concurrency.max caps running runs with live leases across all claimers."""
    backend = job_backend_factory(clock)
    definition = job(max_=3)
    await backend.enqueue_many(definition, [EnqueueRequest({"n": n}) for n in range(10)])
    first = await backend.claim(claim_request(definition, worker="A", limit=2))
    second = await backend.claim(claim_request(definition, worker="B", limit=5))
    assert len(first) == 2
    assert len(second) == 1
    assert await backend.claim(claim_request(definition, worker="A", limit=5)) == []
    assert await backend.settle([completed(r) for r in first[:1]]) == ["completed"]
    assert len(await backend.claim(claim_request(definition, worker="B", limit=5))) == 1
    assert await backend.claim(claim_request(definition, worker="A", limit=5)) == []


async def test_a_lapsed_lease_keeps_its_slot_until_retaken(clock, job_backend_factory):
    """J3, J5: a lapsed lease that no claim retook still holds its concurrency.max slot (its
    holder may heartbeat it back to life), so a claim never starts a due run in its place, even
    one due earlier; it retakes the lapsed run instead, which moves the slot and fences out the
    old holder. The job never has two runs going at concurrency.max = 1."""
    backend = job_backend_factory(clock)
    definition = job(max_=1)
    late = await backend.enqueue(definition, {"n": "late"})
    [held] = await backend.claim(claim_request(definition, worker="A", limit=1))
    clock.advance(LEASE + 1)
    early = await backend.enqueue(
        definition, {"n": "early"}, run_at=clock.now() - timedelta(hours=1)
    )

    [retaken] = await backend.claim(claim_request(definition, worker="B", limit=1))

    assert retaken.run_id == late.run_id
    assert retaken.attempt == 2
    assert await backend.heartbeat([held]) == [False]
    assert (await run_of(backend, early.run_id)).state == "waiting"
    assert await backend.claim(claim_request(definition, worker="C", limit=1)) == []


async def test_limit_zero_claims_nothing(clock, job_backend_factory):
    backend = job_backend_factory(clock)
    definition = job()
    await backend.enqueue(definition, {"n": 1})
    assert await backend.claim(claim_request(definition, worker="A", limit=0)) == []


async def test_exclude_keys_skips_keys_this_process_runs(clock, job_backend_factory):
    """J4: a single-runner claim skips the keys listed in exclude_keys."""
    backend = job_backend_factory(clock)
    definition = job(single_runner=True, key=lambda payload: payload["account"])
    await backend.enqueue(definition, {"account": "x", "n": 1})
    await backend.enqueue(definition, {"account": "y", "n": 2})
    [claimed] = await backend.claim(
        claim_request(definition, worker="A", limit=1, exclude_keys=["x"])
    )
    assert claimed.key == "y"
    assert (
        await backend.claim(claim_request(definition, worker="A", limit=1, exclude_keys=["x", "y"]))
        == []
    )
    [other] = await backend.claim(claim_request(definition, worker="A", limit=1))
    assert other.key == "x"


async def test_j5_stale_token_changes_nothing(clock, job_backend_factory):
    """J5: once another worker retook the run, the old holder's complete, fail, release and
    heartbeat change nothing and answer "stale"/False; the new holder settles normally."""
    backend = job_backend_factory(clock)
    definition = job()
    await backend.enqueue(definition, {"n": 1})
    [old] = await backend.claim(claim_request(definition, worker="A", limit=1))
    clock.advance(LEASE + 1)
    [new] = await backend.claim(claim_request(definition, worker="B", limit=1))
    assert new.run_id == old.run_id
    assert new.token != old.token
    assert new.attempt == 2
    before = await run_of(backend, old.run_id)
    assert await backend.settle([completed(old)]) == ["stale"]
    assert await backend.settle([failed(old, "late failure", retry_at=clock.now())]) == ["stale"]
    assert await backend.settle([failed(old, "late failure", retry_at=None)]) == ["stale"]
    assert await backend.settle([released(old, clock.now(), reason="lock-held", error="late")]) == [
        "stale"
    ]
    assert await backend.heartbeat([old]) == [False]
    after = await run_of(backend, old.run_id)
    assert after == before
    assert await backend.settle([completed(new)]) == ["completed"]
    assert (await run_of(backend, new.run_id)).state == "completed"


async def test_j5_heartbeat_extends_the_lease(clock, job_backend_factory):
    """J5: a heartbeat moves the lease to now + concurrency.lease, so nobody retakes the run."""
    backend = job_backend_factory(clock)
    definition = job()
    await backend.enqueue(definition, {"n": 1})
    [claimed] = await backend.claim(claim_request(definition, worker="A", limit=1))
    clock.advance(LEASE * 0.8)
    assert await backend.heartbeat([claimed]) == [True]
    assert (await run_of(backend, claimed.run_id)).lease_expires_at == clock.now() + timedelta(
        seconds=LEASE
    )
    clock.advance(LEASE * 0.8)
    assert await backend.claim(claim_request(definition, worker="B", limit=1)) == []
    assert await backend.settle([completed(claimed)]) == ["completed"]


async def test_j5_settles_of_one_batch_are_fenced_one_by_one(clock, job_backend_factory):
    """J5: complete and heartbeat answer per run, in order, mixing current and stale claims."""
    backend = job_backend_factory(clock)
    definition = job()
    await backend.enqueue_many(definition, [EnqueueRequest({"n": n}) for n in range(2)])
    first, second = await backend.claim(claim_request(definition, worker="A", limit=2))
    assert await backend.heartbeat([first, second]) == [True, True]
    assert await backend.settle([completed(first)]) == ["completed"]
    assert await backend.heartbeat([first, second]) == [False, True]
    assert await backend.settle([completed(first), completed(second)]) == ["stale", "completed"]


async def test_j5_a_heartbeat_never_revives_a_lapsed_lease(clock, job_backend_factory):
    """J5: a lease that lapsed is never extended by a heartbeat, even when no claim retook the
    run (any claim may, from the moment it lapsed): the heartbeat answers False and changes
    nothing, so the holder stops. Its token is still current for a settle that arrives first
    (nobody else holds the run), so a finished run's completion still lands."""
    backend = job_backend_factory(clock)
    definition = job()
    await backend.enqueue_many(definition, [EnqueueRequest({"n": n}) for n in range(2)])
    lapsing, live = await backend.claim(claim_request(definition, worker="A", limit=2))
    clock.advance(LEASE / 2)
    assert await backend.heartbeat([live]) == [True]
    clock.advance(LEASE / 2)
    before = await run_of(backend, lapsing.run_id)
    assert await backend.heartbeat([lapsing, live]) == [False, True]
    assert await run_of(backend, lapsing.run_id) == before
    assert await backend.settle([completed(lapsing)]) == ["completed"]


async def test_j6_lapsed_lease_is_retaken(clock, job_backend_factory):
    """J6: a run whose holder died is retaken by any worker once its lease lapses, as a new
    attempt; before the lapse nobody can take it."""
    backend = job_backend_factory(clock)
    definition = job(attempts=3)
    await backend.enqueue(definition, {"n": 1})
    [first] = await backend.claim(claim_request(definition, worker="A", limit=1))
    clock.advance(LEASE - 1)
    assert await backend.claim(claim_request(definition, worker="B", limit=1)) == []
    clock.advance(1)
    [second] = await backend.claim(claim_request(definition, worker="B", limit=1))
    assert second.run_id == first.run_id
    assert second.attempt == 2
    assert second.token > first.token


async def test_j5_claim_state_is_the_claims_own_end_only(clock, job_backend_factory):
    """J5, J13, J16: ``claim_state`` (how a settle whose answer was lost is resolved) answers
    the run's state for the claim that ended it, in both shapes (an ended run in history keeps
    no token: the claim's attempt stands for it), and nothing for an earlier claim whose lease
    lapsed and whose run another claim retook and completed: that one's settle was stale."""
    backend = job_backend_factory(clock)
    definition = job(attempts=3)
    await backend.enqueue(definition, {"n": 1})
    [first] = await backend.claim(claim_request(definition, worker="A", limit=1))
    assert await backend.claim_state(first) == "running"
    clock.advance(LEASE)
    [second] = await backend.claim(claim_request(definition, worker="B", limit=1))
    assert await backend.claim_state(first) is None
    assert await backend.settle([completed(second)]) == ["completed"]
    assert await backend.claim_state(second) == "completed"
    assert await backend.claim_state(first) is None
    assert await backend.settle([completed(first)]) == ["stale"]


async def test_j6_lapse_on_the_final_attempt_dead_letters(clock, job_backend_factory):
    """J6: a run whose lease lapses on its final attempt is dead-lettered with
    LEASE_LAPSED_FINAL_ATTEMPT instead of being returned by a claim."""
    backend = job_backend_factory(clock)
    definition = job(attempts=2)
    result = await backend.enqueue(definition, {"n": 1})
    await backend.claim(claim_request(definition, worker="A", limit=1))
    clock.advance(LEASE)
    [second] = await backend.claim(claim_request(definition, worker="B", limit=1))
    assert second.attempt == 2
    clock.advance(LEASE)
    assert await backend.claim(claim_request(definition, worker="C", limit=5)) == []
    record = await run_of(backend, result.run_id)
    assert record.state == "dead"
    assert record.last_error is not None
    assert LEASE_LAPSED_FINAL_ATTEMPT in record.last_error
    assert record.finished_at is not None
    assert await backend.settle([completed(second)]) == ["stale"]


async def test_j6_a_retaken_run_records_the_lapsed_attempt(clock, job_backend_factory):
    """J6: a run retaken after its lease lapsed has the lapsed attempt in its history (and as
    last_error), so an operator sees why attempt 2 began; settling the new attempt keeps it."""
    backend = job_backend_factory(clock)
    definition = job(attempts=3)
    result = await backend.enqueue(definition, {"n": 1})
    await backend.claim(claim_request(definition, worker="A", limit=1))
    clock.advance(LEASE)
    [second] = await backend.claim(claim_request(definition, worker="B", limit=1))
    assert second.attempt == 2
    record = await run_of(backend, result.run_id)
    assert [entry["attempt"] for entry in record.history] == [1]
    assert record.history[0]["error"] == LEASE_LAPSED_MESSAGE
    assert record.history[0]["error"].startswith(LEASE_LAPSED)
    assert record.last_error == LEASE_LAPSED_MESSAGE
    assert await backend.settle([failed(second, "boom", retry_at=clock.now())]) == ["retrying"]
    record = await run_of(backend, result.run_id)
    assert [(entry["attempt"], entry["error"]) for entry in record.history] == [
        (1, LEASE_LAPSED_MESSAGE),
        (2, "boom"),
    ]


async def test_j6_j10_a_claim_returns_the_runs_it_buried(clock, job_backend_factory):
    """J6, J10: the runs a claim dead-lettered (lease lapsed on the final attempt) come back in
    its ``buried`` (id, job, attempt, key) for the runtime to report and count, never among the
    claimed runs; their history records the lapsed attempt. A claim that buries nothing, or
    that finds nothing at all, answers an empty ``buried``."""
    backend = job_backend_factory(clock)
    definition = job(attempts=1, max_=5, single_runner=True, key=lambda payload: payload["k"])
    results = await backend.enqueue_many(
        definition, [EnqueueRequest({"k": key}) for key in ("a", "b")]
    )
    first = await backend.claim(claim_request(definition, worker="A", limit=1))
    assert isinstance(first, ClaimBatch)
    assert first.buried == ()
    second = await backend.claim(claim_request(definition, worker="A", limit=1))
    clock.advance(LEASE)
    waiting = await backend.enqueue(definition, {"k": "c"})

    claimed = await backend.claim(claim_request(definition, worker="B", limit=5))

    assert [run.run_id for run in claimed] == [waiting.run_id]
    assert sorted(claimed.buried, key=lambda b: b.run_id) == sorted(
        (
            BuriedRun(results[0].run_id, definition.id, 1, "a"),
            BuriedRun(results[1].run_id, definition.id, 1, "b"),
        ),
        key=lambda b: b.run_id,
    )
    for result in results:
        record = await run_of(backend, result.run_id)
        assert record.state == "dead"
        assert [(entry["attempt"], entry["error"]) for entry in record.history] == [
            (1, LEASE_LAPSED_FINAL_MESSAGE)
        ]
    assert await backend.settle([completed(r) for r in (*first, *second)]) == ["stale", "stale"]
    empty = await backend.claim(claim_request(definition, worker="B", limit=5))
    assert empty == []
    assert empty.buried == ()


async def test_j3_a_lapsed_run_keeps_its_slot_however_the_heartbeat_ends(
    clock, job_backend_factory
):
    """J3: concurrency.max bounds the job's running runs, live or lapsed leases alike. A
    lapsed run holds its slot until a claim retakes it (the slot moves) or buries it; a due run
    never takes it meanwhile, so the bound does not rest on the refused heartbeat."""
    backend = job_backend_factory(clock)
    definition = job(max_=2, attempts=3)
    await backend.enqueue_many(definition, [EnqueueRequest({"n": n}) for n in range(2)])
    held = await backend.claim(claim_request(definition, worker="A", limit=2))
    clock.advance(LEASE + 1)
    assert await backend.heartbeat(held) == [False, False]
    later = await backend.enqueue(definition, {"n": 2})

    retaken = await backend.claim(claim_request(definition, worker="B", limit=1))

    assert [run.run_id for run in retaken] == [held[0].run_id]
    assert (await run_of(backend, later.run_id)).state == "waiting"
    assert (
        len(await backend.claim(claim_request(definition, worker="B", limit=5))) == 1
    )  # the other lapsed
    assert await backend.claim(claim_request(definition, worker="C", limit=5)) == []
    assert (await run_of(backend, later.run_id)).state == "waiting"


async def test_j7_release_keeps_the_attempt(clock, job_backend_factory):
    """J7: release (JOB_LOCK_HELD) returns the run to waiting at run_at without consuming its
    attempt and, with no error, without touching its history."""
    backend = job_backend_factory(clock)
    definition = job(attempts=1)
    result = await backend.enqueue(definition, {"n": 1})
    [claimed] = await backend.claim(claim_request(definition, worker="A", limit=1))
    assert claimed.attempt == 1
    answers = await backend.settle(
        [released(claimed, clock.now() + timedelta(seconds=3), reason="lock-held")]
    )
    assert answers == ["released"]
    record = await run_of(backend, result.run_id)
    assert record.state == "waiting"
    assert record.attempt == 0
    assert record.history == ()
    assert await backend.claim(claim_request(definition, worker="A", limit=1)) == []
    clock.advance(3)
    [again] = await backend.claim(claim_request(definition, worker="A", limit=1))
    assert again.attempt == 1
    assert again.token > claimed.token
    assert await backend.settle([completed(again)]) == ["completed"]


async def test_j7_release_with_error_records_history(clock, job_backend_factory):
    """J12/J7: a release carrying an error (a drain cancellation) appends it to the history and
    still does not consume the attempt."""
    backend = job_backend_factory(clock)
    definition = job(attempts=1)
    result = await backend.enqueue(definition, {"n": 1})
    [claimed] = await backend.claim(claim_request(definition, worker="A", limit=1))
    assert await backend.settle(
        [released(claimed, clock.now(), reason="lock-held", error="cancelled: drain")]
    ) == ["released"]
    record = await run_of(backend, result.run_id)
    assert record.state == "waiting"
    assert record.attempt == 0
    assert [entry["error"] for entry in record.history] == ["cancelled: drain"]
    assert record.history[0]["attempt"] == 1
    assert record.last_error == "cancelled: drain"
    [again] = await backend.claim(claim_request(definition, worker="A", limit=1))
    assert again.attempt == 1


async def test_j7_fail_retries_then_dead_letters(clock, job_backend_factory):
    """J7: failures append to history, retry at retry_at, and dead-letter after
    retry.attempts; fail with retry_at=None dead-letters at once."""
    backend = job_backend_factory(clock)
    definition = job(attempts=3)
    result = await backend.enqueue(definition, {"n": 1})
    for attempt in (1, 2):
        [claimed] = await backend.claim(claim_request(definition, worker="A", limit=1))
        assert claimed.attempt == attempt
        retry = clock.now() + timedelta(seconds=5)
        assert await backend.settle([failed(claimed, f"boom {attempt}", retry_at=retry)]) == [
            "retrying"
        ]
        record = await run_of(backend, result.run_id)
        assert record.state == "waiting"
        assert record.run_at == retry
        assert await backend.claim(claim_request(definition, worker="A", limit=1)) == []
        clock.advance(5)
    [last] = await backend.claim(claim_request(definition, worker="A", limit=1))
    assert last.attempt == 3
    assert await backend.settle([failed(last, "boom 3", retry_at=clock.now())]) == ["dead"]
    record = await run_of(backend, result.run_id)
    assert record.state == "dead"
    assert [entry["error"] for entry in record.history] == ["boom 1", "boom 2", "boom 3"]
    assert [entry["attempt"] for entry in record.history] == [1, 2, 3]
    assert record.last_error == "boom 3"

    other = await backend.enqueue(definition, {"n": 2})
    [claimed] = await backend.claim(claim_request(definition, worker="A", limit=1))
    assert await backend.settle([failed(claimed, "poison", retry_at=None)]) == ["dead"]
    assert (await run_of(backend, other.run_id)).state == "dead"


async def test_terminal_runs_never_come_back(clock, job_backend_factory):
    """Terminal runs (completed, dead) are never claimed again, whatever time passes."""
    backend = job_backend_factory(clock)
    definition = job(attempts=1)
    await backend.enqueue_many(definition, [EnqueueRequest({"n": n}) for n in range(2)])
    done, doomed = await backend.claim(claim_request(definition, worker="A", limit=2))
    assert await backend.settle([completed(done)]) == ["completed"]
    assert await backend.settle([failed(doomed, "x", retry_at=None)]) == ["dead"]
    for _ in range(3):
        clock.advance(LEASE * 10)
        assert await backend.claim(claim_request(definition, worker="B", limit=10)) == []
    assert await backend.settle([completed(done)]) == ["stale"]
    assert await backend.heartbeat([done, doomed]) == [False, False]


@attrs.frozen
class Order:
    order_id: int


async def test_typed_payloads_round_trip(clock, job_backend_factory):
    """The backend stores the codec's JSON form; a claim hands back that JSON form."""
    backend = job_backend_factory(clock)
    definition = define_job("conf.typed", _noop, payload=Order)
    await backend.enqueue(definition, Order(order_id=5))
    [claimed] = await backend.claim(claim_request(definition, worker="A", limit=1))
    assert claimed.payload == {"order_id": 5}
    assert definition.decode(claimed.payload) == Order(order_id=5)


async def test_queue_depths_count_waiting_runs_and_age_the_oldest_due(clock, job_backend_factory):
    """J10: queue_depths answers every job asked for: its waiting runs (due or delayed, never
    running ones) and the seconds since the oldest due one became due (0 when none is due)."""
    backend = job_backend_factory(clock)
    busy, delayed, empty = job("depth.busy"), job("depth.delayed"), job("depth.empty")
    start = clock.now()
    await backend.enqueue_many(busy, [EnqueueRequest({"n": n}) for n in range(3)])
    later = start + timedelta(minutes=5)
    await backend.enqueue(delayed, {"n": 0}, run_at=later)
    clock.advance(90)
    await backend.enqueue(busy, {"n": 3})
    [claimed] = await backend.claim(claim_request(busy, worker="A", limit=1))
    assert claimed.payload == {"n": 0}

    depths = await backend.queue_depths([busy.id, delayed.id, empty.id])

    assert set(depths) == {busy.id, delayed.id, empty.id}
    assert depths[busy.id].depth == 3
    assert depths[busy.id].oldest_due_age == pytest.approx(90.0)
    assert (depths[delayed.id].depth, depths[delayed.id].oldest_due_age) == (1, 0.0)
    assert (depths[empty.id].depth, depths[empty.id].oldest_due_age) == (0, 0.0)
    clock.set(later + timedelta(seconds=30))
    assert (await backend.queue_depths([delayed.id]))[delayed.id].oldest_due_age == pytest.approx(
        30.0
    )


async def test_j9_j2_a_tick_inserts_its_occurrence_whatever_the_queue_depth(
    clock, job_backend_factory
):
    """J9, J2: a schedule's occurrence goes through the same insert path as enqueue (its durable
    id dedupes a repeated tick, J1) but J2's cap bounds enqueue, not schedules: with the job's
    queue full the tick still inserts the occurrence, never drops it, while enqueue stays
    queue-full. The same on every backend."""
    backend = job_backend_factory(clock, queue_depth_limit=2)
    scheduled = job("conf.scheduled", schedule=Schedule(interval=timedelta(minutes=1)))
    await backend.install_schedules([scheduled])
    await backend.enqueue_many(scheduled, [EnqueueRequest({"n": n}) for n in range(2)])
    assert (await backend.enqueue(scheduled, {"n": 2})).rejected == "queue-full"
    clock.advance(timedelta(minutes=1))

    assert await backend.tick_schedules([scheduled]) == 1
    assert await backend.tick_schedules([scheduled]) == 0

    fired = previous_occurrence(scheduled.schedule, clock.now())
    record = await run_of(backend, occurrence_id(scheduled.id, fired))
    assert (record.state, record.run_at, record.payload) == ("waiting", fired, {})
    assert (await backend.queue_depths([scheduled.id]))[scheduled.id].depth == 3
    assert (await backend.enqueue(scheduled, {"n": 3})).rejected == "queue-full"


def _allow_all(permission: str, operation: str) -> bool:
    return True


async def test_j9_d10_schedules_list_only_schedules_beside_a_jobs_other_rows(
    clock, job_backend_factory
):
    """J9 with D10: the operators' list of schedules (the dashboard's Schedules page) holds the
    scheduled jobs only. The last build to unpark a job's parked runs (D10,
    ``<job_id>#unparked-by``) is a row of the same state table that carries a trigger too; it
    is not listed as a schedule, nor offered a pause under its row's name."""
    backend = job_backend_factory(clock)
    other = job("conf.unparked")
    scheduled = job("conf.scheduled", schedule=Schedule(interval=timedelta(hours=1)))
    await backend.install_schedules([scheduled])
    assert await backend.admin.claim_build_unpark(other.id, "B1")
    ops = create_job_operations(backend, authorizer=_allow_all)
    assert [state.job_id for state in await ops.schedules()] == [scheduled.id]
