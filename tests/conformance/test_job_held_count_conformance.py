"""F1's held count (kernel ``_plans/held_count.py``) against every backend (in-memory model,
PostgreSQL): whatever takes a capped job's run out of ``running`` gives its slot back, a rolled
back settle gives back nothing, and no path leaves the cap stuck or exceeded. Time moves only
through the FrozenClock, a second per claim: the claims between sweeps read the kept count (on
PostgreSQL), not the running runs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from job_helpers import claim_request
from transactional_kit import kit_for
from workflow_helpers import execute_once

from ship_sqla import create_job_operations, define_job
from ship_sqla.jobs import Concurrency, RetryPolicy, Schedule
from ship_sqla.kernel import cancelled, completed, failed, released
from ship_sqla.kernel._plans.claim_floor import DEFAULT_FLOOR_SWEEP
from ship_sqla.kernel._ports import CANCELLED_MESSAGE

LEASE = 30.0


async def _noop(ctx, payload):
    return None


def _allow(permission: str, operation: str) -> bool:
    return True


def job(max_: int, *, attempts: int = 3):
    return define_job(
        "conf.held",
        _noop,
        payload=dict,
        concurrency=Concurrency(max=max_, lease=LEASE),
        retry=RetryPolicy(attempts=attempts),
    )


async def _claim(backend, clock, definition, limit=10):
    clock.advance(1.0)
    return list(await backend.claim(claim_request(definition, worker="w", limit=limit)))


async def _filled(backend, definition, n):
    for index in range(n):
        await backend.enqueue(definition, {"n": index})


async def test_f1_every_settle_kind_gives_its_slot_back(clock, job_backend_factory):
    """F1: at a cap of 2, each kind of settlement of a running run (completion, a retry, a
    release, a dead letter, a cancellation) lets the next claim take exactly one more run, and
    no claim ever takes the job above 2 running."""
    backend = job_backend_factory(clock)
    definition = job(2, attempts=5)
    await _filled(backend, definition, 12)
    running = await _claim(backend, clock, definition)
    assert len(running) == 2
    assert await _claim(backend, clock, definition) == []
    ends = [
        completed,
        lambda run: failed(run, "boom", clock.now()),
        lambda run: released(run, clock.now(), reason="lock-held"),
        lambda run: failed(run, "boom", None),
        lambda run: cancelled(run, CANCELLED_MESSAGE),
    ]
    for end in ends:
        first, *rest = running
        assert len(await backend.settle([end(first)])) == 1
        got = await _claim(backend, clock, definition)
        assert len(got) == 1, end
        running = [*rest, *got]
        assert await _claim(backend, clock, definition) == []


async def test_f1_a_rolled_back_settle_gives_nothing_back(clock, job_backend_factory):
    """F1 with J13: a settle inside a transaction that rolls back leaves the run running and
    its slot held (the release is written in the settle's own statement, so it rolls back with
    it): no claim takes the job above its cap; the settle that commits gives the slot back."""
    backend = job_backend_factory(clock)
    kit = await kit_for(backend, clock)
    definition = job(1)
    await _filled(backend, definition, 3)
    [run] = await _claim(backend, clock, definition)

    class Rollback(Exception):  # noqa: N818 - the test's own signal
        pass

    async def settle_then_fail(repositories):
        assert await backend.fence(run) == "held"
        assert await backend.settle_within(completed(run)) == "completed"
        raise Rollback

    with pytest.raises(Rollback):
        await kit.uow.run(settle_then_fail)
    for _ in range(3):
        assert await _claim(backend, clock, definition) == []
    assert await backend.settle([completed(run)]) == ["completed"]
    assert len(await _claim(backend, clock, definition)) == 1


async def test_f1_j6_a_lapsed_run_keeps_its_slot_until_retaken_or_buried(
    clock, job_backend_factory
):
    """F1, J6: a run whose holder died keeps its slot after its lease lapses: the claim that
    retakes it takes no other run (the slot moved); the claim that buries it on its final
    attempt gives the slot back, and a waiting run is claimed within one more claim. Never two
    running at a cap of 1."""
    backend = job_backend_factory(clock)
    definition = job(1, attempts=2)
    await _filled(backend, definition, 3)
    [first] = await _claim(backend, clock, definition)
    clock.advance(LEASE)
    [again] = await _claim(backend, clock, definition)
    assert (again.run_id, again.retaken) == (first.run_id, True)
    assert await _claim(backend, clock, definition) == []
    clock.advance(LEASE)  # its second and final attempt lapses: buried
    got: list = []
    for _ in range(2):
        got = await _claim(backend, clock, definition)
        if got:
            break
    assert len(got) == 1
    assert got[0].run_id != first.run_id
    assert await _claim(backend, clock, definition) == []


async def test_f1_j6_the_claim_that_buries_a_run_uses_its_slot_at_once(clock, job_backend_factory):
    """F1, J6: a claim that buries a lapsed run on its final attempt frees its slot for itself:
    at a cap of 1 the same claim takes a waiting run (between sweeps too, where PostgreSQL reads
    the kept count: the transactional state machine found it one too high there)."""
    backend = job_backend_factory(clock)
    definition = job(1, attempts=1)
    await _filled(backend, definition, 2)
    [first] = await _claim(backend, clock, definition)
    clock.advance(LEASE - 2)
    assert await _claim(backend, clock, definition) == []  # a sweep: the count is exact
    got = await _claim(backend, clock, definition)  # its lease has just lapsed
    assert len(got) == 1
    assert got[0].run_id != first.run_id
    assert await _claim(backend, clock, definition) == []


async def test_f1_j6_a_grant_left_for_a_retaken_run_gives_its_slot_back(clock, job_backend_factory):
    """F1, J6: a claim sorts the lapsed runs it retakes with the due ones, so its limit may
    leave part of what the cap granted untaken; that part is no running run: at a cap of 2,
    after a claim of 1 retook a lapsed run beside a due one, the next claim takes the due one
    (the workflow state machine found the kept count one too high until the next sweep)."""
    backend = job_backend_factory(clock)
    definition = job(2)
    await _filled(backend, definition, 1)
    [first] = await _claim(backend, clock, definition)
    clock.advance(LEASE - 2)
    assert await _claim(backend, clock, definition) == []  # a sweep: the count is exact
    await _filled(backend, definition, 1)
    [again] = await _claim(backend, clock, definition, limit=1)
    assert (again.run_id, again.retaken) == (first.run_id, True)
    [other] = await _claim(backend, clock, definition, limit=1)
    assert other.run_id != first.run_id
    assert await _claim(backend, clock, definition) == []


async def test_f1_an_operator_cancel_of_a_running_run_gives_its_slot_back(
    clock, job_backend_factory
):
    """F1, K2: an operator's cancel of a running run holds its slot until the holder ends it
    cancelled; then the next claim takes one more run."""
    backend = job_backend_factory(clock)
    ops = create_job_operations(backend, authorizer=_allow)
    definition = job(1)
    await _filled(backend, definition, 2)
    [run] = await _claim(backend, clock, definition)
    assert (await ops.cancel(run.run_id)).outcome == "requested"
    assert await _claim(backend, clock, definition) == []
    assert await backend.settle([cancelled(run, CANCELLED_MESSAGE)]) == ["cancelled"]
    assert len(await _claim(backend, clock, definition)) == 1


async def test_f1_the_cap_is_never_stuck_across_sweeps(clock, job_backend_factory):
    """F1 over many sweeps (the recounts on PostgreSQL): a capped job settled run by run drains
    completely, every claim within the cap, across several ``sweep`` periods."""
    backend = job_backend_factory(clock)
    definition = job(3)
    await _filled(backend, definition, 40)
    done = 0
    running: list = []
    started = clock.now()
    while done < 40:
        running += await _claim(backend, clock, definition)
        assert len(running) <= 3
        if running:
            assert await backend.settle([completed(running.pop(0))]) == ["completed"]
            done += 1
        assert clock.now() - started < timedelta(seconds=40 * 2 + DEFAULT_FLOOR_SWEEP)


async def test_f1_d3_a_suspended_workflow_run_gives_its_slot_back(clock, job_backend_factory):
    """F1, D3: a capped workflow run that suspends (a durable sleep) leaves ``running`` in the
    suspend's statement, which gives its slot back: at a cap of 1 the next run is claimed by
    the next claim, a second later (not at the next sweep)."""
    backend = job_backend_factory(clock)

    async def handler(ctx, payload):
        await ctx.sleep("nap", timedelta(seconds=600))

    definition = define_job(
        "conf.held.wf",
        handler,
        payload=dict,
        concurrency=Concurrency(max=1, lease=LEASE),
        retry=RetryPolicy(attempts=3),
    )
    await _filled(backend, definition, 3)
    for _ in range(3):
        clock.advance(1.0)
        execution = await execute_once(backend, definition, clock)
        assert execution.ended == "suspended"


async def test_j9_f1_schedules_list_only_schedules_beside_a_capped_jobs_rows(
    clock, job_backend_factory
):
    """J9 with F1 and D10: the operators' list of schedules (the dashboard's Schedules page)
    holds the scheduled jobs only. A capped job's held base (written at its claims' recount,
    the backend's first claim of the job among them) and the last build to unpark a job (D10)
    are rows of the same state table that carry a trigger too; neither is listed as a
    schedule, nor offered a pause under its row's name."""
    backend = job_backend_factory(clock)
    capped = job(2)
    scheduled = define_job(
        "conf.held.scheduled", _noop, payload=dict, schedule=Schedule(interval=timedelta(hours=1))
    )
    await backend.install_schedules([scheduled])
    await _filled(backend, capped, 3)
    running = await _claim(backend, clock, capped)
    assert len(running) == 2
    assert len(await backend.settle([completed(running[0])])) == 1
    assert len(await _claim(backend, clock, capped)) == 1
    assert await backend.admin.claim_build_unpark(capped.id, "B1")
    ops = create_job_operations(backend, authorizer=_allow)
    assert [state.job_id for state in await ops.schedules()] == [scheduled.id]
