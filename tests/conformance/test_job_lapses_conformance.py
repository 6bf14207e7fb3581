"""Crash loops end (J15, with J6), on every backend: a claim that retakes a lapsed run counts
one more lapse (``lapses``, ``consecutive_lapses``); ``RetryPolicy(max_lapses=N)`` dead-letters
the run at its N-th lapse in a row whatever attempts it has left; any settle by the handler
ends the streak, a release does not, and neither is a lapse."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from global_meter import global_meter
from job_helpers import ErrorLog, claim_request, record_of

from ship_sqla import define_job, start_job_runtime
from ship_sqla.errors import ConfigurationError, JobCrashLoopError
from ship_sqla.jobs import Concurrency, RetryPolicy
from ship_sqla.kernel import LEASE_LAPSED_CRASH_LOOP, completed, failed, released, snoozed
from ship_sqla.kernel._ports import (
    LEASE_LAPSED_FINAL_MESSAGE,
    LEASE_LAPSED_MESSAGE,
    BuriedRun,
    crash_loop_message,
)

LEASE = 30.0


async def _noop(ctx, payload):
    return None


def job(*, attempts=25, max_lapses=None, max_=None):
    return define_job(
        "lapses.job",
        _noop,
        payload=dict,
        concurrency=Concurrency(max=max_, lease=LEASE),
        retry=RetryPolicy(
            attempts=attempts,
            backoff="fixed",
            base_delay=1,
            jitter="none",
            max_lapses=max_lapses,
        ),
    )


async def lapse(backend, clock, definition, worker="B"):
    """Let the current holder's lease lapse, then claim as ``worker`` (the batch)."""
    clock.advance(LEASE)
    return await backend.claim(claim_request(definition, worker=worker, limit=5))


async def test_j15_j6_a_retaken_run_counts_its_lapses(clock, job_backend_factory):
    """J15, J6: each claim that retakes a lapsed run spends an attempt and adds one to the run's
    ``lapses`` and ``consecutive_lapses`` (the claim says it ``retaken`` the run); a first claim
    of a waiting run counts none."""
    backend = job_backend_factory(clock)
    definition = job()
    result = await backend.enqueue(definition, {"n": 1})
    [first] = await backend.claim(claim_request(definition, worker="A"))
    assert (first.retaken, first.lapses, first.consecutive_lapses) == (False, 0, 0)
    record = await record_of(backend, result.run_id)
    assert (record.lapses, record.consecutive_lapses) == (0, 0)

    [second] = await lapse(backend, clock, definition)
    assert (second.attempt, second.retaken, second.lapses, second.consecutive_lapses) == (
        2,
        True,
        1,
        1,
    )
    [third] = await lapse(backend, clock, definition, worker="C")
    assert (third.attempt, third.lapses, third.consecutive_lapses) == (3, 2, 2)
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt, record.lapses, record.consecutive_lapses) == (
        "running",
        3,
        2,
        2,
    )
    assert [entry["error"] for entry in record.history] == [LEASE_LAPSED_MESSAGE] * 2


@pytest.mark.parametrize("ending", ["completed", "failed", "snoozed"])
async def test_j15_a_settle_by_the_handler_ends_the_streak(clock, job_backend_factory, ending):
    """J15: any settle by the handler (completed, failed and retried, snoozed) sets
    ``consecutive_lapses`` back to 0; ``lapses`` keeps the total."""
    backend = job_backend_factory(clock)
    definition = job()
    result = await backend.enqueue(definition, {"n": 1})
    await backend.claim(claim_request(definition, worker="A"))
    await lapse(backend, clock, definition)
    [held] = await lapse(backend, clock, definition, worker="C")
    assert held.consecutive_lapses == 2
    settlement = {
        "completed": lambda: completed(held),
        "failed": lambda: failed(held, "boom", retry_at=clock.now()),
        "snoozed": lambda: snoozed(held, clock.now(), "later"),
    }[ending]()

    [answer] = await backend.settle([settlement])

    assert answer == {"completed": "completed", "failed": "retrying", "snoozed": "snoozed"}[ending]
    record = await record_of(backend, result.run_id)
    assert (record.lapses, record.consecutive_lapses) == (2, 0)


async def test_j15_j12_a_release_is_no_lapse_and_keeps_the_streak(clock, job_backend_factory):
    """J15, J12, J7: a release (a drain's cancellation, a held lock) hands the run back without
    counting a lapse and without ending the streak: the next claim of the waiting run is no
    retake, and a later lapse counts on from where the streak was."""
    backend = job_backend_factory(clock)
    definition = job()
    result = await backend.enqueue(definition, {"n": 1})
    await backend.claim(claim_request(definition, worker="A"))
    [held] = await lapse(backend, clock, definition)
    assert held.consecutive_lapses == 1

    assert await backend.settle(
        [released(held, clock.now(), reason="cancelled", error="drained")]
    ) == ["released"]
    record = await record_of(backend, result.run_id)
    assert (record.state, record.lapses, record.consecutive_lapses) == ("waiting", 1, 1)
    [again] = await backend.claim(claim_request(definition, worker="B"))
    assert (again.retaken, again.lapses, again.consecutive_lapses) == (False, 1, 1)
    assert await backend.settle([released(again, clock.now(), reason="lock-held")]) == ["released"]
    [third] = await backend.claim(claim_request(definition, worker="C"))
    assert third.consecutive_lapses == 1

    [fourth] = await lapse(backend, clock, definition, worker="D")

    assert (fourth.retaken, fourth.lapses, fourth.consecutive_lapses) == (True, 2, 2)


async def test_j15_max_lapses_dead_letters_a_crash_loop_with_attempts_left(
    clock, job_backend_factory
):
    """J15: with ``max_lapses=3`` a run whose lease lapses a third time in a row is
    dead-lettered by that claim with SHIP_SQLA_JOB_CRASH_LOOP (its own message, naming the
    count), though 22 of its 25 attempts are left; the claim lists it in ``buried`` with
    ``crash_loop``. The two lapses before were retaken as usual."""
    backend = job_backend_factory(clock)
    definition = job(attempts=25, max_lapses=3)
    result = await backend.enqueue(definition, {"n": 1})
    await backend.claim(claim_request(definition, worker="A"))
    [second] = await lapse(backend, clock, definition)
    [third] = await lapse(backend, clock, definition, worker="C")
    assert (second.consecutive_lapses, third.consecutive_lapses) == (1, 2)

    batch = await lapse(backend, clock, definition, worker="D")

    assert list(batch) == []
    assert batch.buried == (BuriedRun(result.run_id, definition.id, 3, None, crash_loop=True),)
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt, record.max_attempts) == ("dead", 3, 25)
    assert (record.lapses, record.consecutive_lapses) == (3, 3)
    assert record.last_error == crash_loop_message(3)
    assert record.last_error.startswith(LEASE_LAPSED_CRASH_LOOP)
    assert "3 times in a row" in record.last_error
    assert "max_lapses" in record.last_error
    assert [(entry["attempt"], entry["kind"]) for entry in record.history] == [
        (1, "lapsed"),
        (2, "lapsed"),
        (3, "lapsed"),
    ]
    assert record.history[-1]["error"] == crash_loop_message(3)
    assert await backend.settle([completed(third)]) == ["stale"]


async def test_j15_max_lapses_counts_only_lapses_in_a_row(clock, job_backend_factory):
    """J15: a settle by the handler between lapses ends the streak, so lapses that are not
    consecutive never reach ``max_lapses``; a lapse on the final attempt is still J6's dead
    letter (LEASE_LAPSED_FINAL_MESSAGE, not a crash loop)."""
    backend = job_backend_factory(clock)
    definition = job(attempts=4, max_lapses=2)
    result = await backend.enqueue(definition, {"n": 1})
    await backend.claim(claim_request(definition, worker="A"))
    [second] = await lapse(backend, clock, definition)
    assert await backend.settle([failed(second, "boom", retry_at=clock.now())]) == ["retrying"]
    [third] = await backend.claim(claim_request(definition, worker="C"))
    assert third.consecutive_lapses == 0
    [fourth] = await lapse(backend, clock, definition, worker="D")
    assert (fourth.attempt, fourth.lapses, fourth.consecutive_lapses) == (4, 2, 1)

    batch = await lapse(backend, clock, definition, worker="E")

    # Attempt 4 of 4 lapsed: the final attempt, and the second lapse in a row (max_lapses=2):
    # the crash loop's message wins, as it says more about why.
    assert batch.buried == (BuriedRun(result.run_id, definition.id, 4, None, crash_loop=True),)
    record = await record_of(backend, result.run_id)
    assert (record.state, record.lapses, record.consecutive_lapses) == ("dead", 3, 2)

    other = job(attempts=2, max_lapses=5)
    result = await backend.enqueue(other, {"n": 2})
    await backend.claim(claim_request(other, worker="A"))
    await lapse(backend, clock, other)
    batch = await lapse(backend, clock, other, worker="C")
    assert batch.buried == (BuriedRun(result.run_id, other.id, 2, None, crash_loop=False),)
    record = await record_of(backend, result.run_id)
    assert (record.last_error, record.lapses, record.consecutive_lapses) == (
        LEASE_LAPSED_FINAL_MESSAGE,
        2,
        2,
    )


async def test_j15_max_lapses_one_dead_letters_at_the_first_lapse(clock, job_backend_factory):
    """J15: ``max_lapses=1`` dead-letters a run at its first lapse, on a capped job too (the
    buried run gives its concurrency slot up: a due run is claimed in its place)."""
    backend = job_backend_factory(clock)
    definition = job(max_lapses=1, max_=1)
    crashed = await backend.enqueue(definition, {"n": 1})
    await backend.claim(claim_request(definition, worker="A"))
    waiting = await backend.enqueue(definition, {"n": 2})

    batch = await lapse(backend, clock, definition)

    assert [run.run_id for run in batch] == [waiting.run_id]
    assert [buried.run_id for buried in batch.buried] == [crashed.run_id]
    assert batch.buried[0].crash_loop
    assert (await record_of(backend, crashed.run_id)).state == "dead"


async def test_j15_an_operator_retry_starts_a_new_streak(clock, job_backend_factory):
    """J15, J8: retrying a crash loop's dead letter gives it one more attempt and a new streak
    (``consecutive_lapses`` 0; ``lapses`` keeps the total), so its next lapse is counted from 1."""
    backend = job_backend_factory(clock)
    definition = job(max_lapses=1)
    result = await backend.enqueue(definition, {"n": 1})
    await backend.claim(claim_request(definition, worker="A"))
    await lapse(backend, clock, definition)
    assert (await record_of(backend, result.run_id)).consecutive_lapses == 1

    retried = await backend.admin.retry_dead(result.run_id)

    assert retried is not None
    assert (retried.state, retried.lapses, retried.consecutive_lapses) == ("waiting", 1, 0)
    [again] = await backend.claim(claim_request(definition, worker="B"))
    assert await backend.settle([completed(again)]) == ["completed"]


def test_j15_max_lapses_is_validated():
    """J15: ``max_lapses`` is None (the default: only the attempts bound lapses, J6) or an int
    of at least 1; anything else is a ConfigurationError naming the field and the fix."""
    assert RetryPolicy().max_lapses is None
    assert RetryPolicy(max_lapses=1).max_lapses == 1
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ConfigurationError, match=r"retry\.max_lapses") as caught:
            RetryPolicy(max_lapses=bad)
        assert caught.value.fix is not None
        assert "None (the default)" in caught.value.fix


async def test_j15_a_cancelled_lapse_counts_and_is_not_buried(clock, job_backend_factory):
    """J15, K2: a cancel-requested run whose lease lapsed ends cancelled (never retaken) and
    still counts the lapse; it is no dead letter, so the claim does not list it."""
    backend = job_backend_factory(clock)
    definition = job(max_lapses=5)
    result = await backend.enqueue(definition, {"n": 1})
    await backend.claim(claim_request(definition, worker="A"))
    assert await backend.admin.cancel(result.run_id) is not None
    clock.advance(timedelta(seconds=LEASE))

    batch = await backend.claim(claim_request(definition, worker="B"))

    assert (list(batch), batch.buried) == ([], ())
    record = await record_of(backend, result.run_id)
    assert (record.state, record.lapses, record.consecutive_lapses) == ("cancelled", 1, 1)


async def test_j15_the_runtime_counts_lapses_and_reports_a_crash_loop(clock, job_backend_factory):
    """J15, J10: a runtime counts every lapse its claims report in ``ship.job.lapses`` (a run it
    retook, a run it buried) and reports a crash loop's dead letter to on_error as
    JobCrashLoopError (SHIP_SQLA_JOB_CRASH_LOOP) naming the run, the job and max_lapses, counted
    in ship.job.dead_letter.count too; the crash loop's handler never runs again."""
    ran: list[str] = []
    done = anyio.Event()

    async def handler(ctx, payload):
        ran.append(ctx.run_id)
        done.set()

    looping = define_job(
        "lapses.loop",
        handler,
        payload=dict,
        concurrency=Concurrency(lease=LEASE),
        retry=RetryPolicy(attempts=25, max_lapses=2),
    )
    with global_meter() as meter:
        meter.install()
        errors = ErrorLog()
        backend = job_backend_factory(clock, on_error=errors)
        doomed = await backend.enqueue(looping, {"n": 1})
        retaken = await backend.enqueue(looping, {"n": 2})
        await backend.claim(claim_request(looping, worker="dead-1"))  # doomed; it died
        clock.advance(LEASE)
        # doomed's first lapse, retaken by another worker that died too; then retaken's first.
        await backend.claim(claim_request(looping, worker="dead-2", limit=2))
        clock.advance(LEASE)
        async with await start_job_runtime([looping], backend=backend):
            await errors.wait_count(1)
            with anyio.fail_after(10):
                await done.wait()
        found = meter.collect()
    [error] = errors.errors
    assert isinstance(error, JobCrashLoopError)
    assert error.code == "SHIP_SQLA_JOB_CRASH_LOOP"
    assert doomed.run_id in str(error)
    assert looping.id in str(error)
    assert "max_lapses (2)" in str(error)
    assert ran == [retaken.run_id]
    assert (await record_of(backend, doomed.run_id)).state == "dead"
    record = await record_of(backend, retaken.run_id)
    assert (record.state, record.lapses, record.consecutive_lapses) == ("completed", 1, 0)
    [lapses] = found["ship.job.lapses"].data.data_points
    assert (lapses.value, dict(lapses.attributes)) == (2, {"ship.job.id": looping.id})
    [dead] = found["ship.job.dead_letter.count"].data.data_points
    assert dead.value == 1
