"""J19's claim floor and its bounded relaxation of K6, against every backend (in-memory model,
PostgreSQL). Time moves only through the FrozenClock."""

from __future__ import annotations

from datetime import timedelta

import pytest
from job_helpers import claim_request
from transactional_kit import kit_for

from ship_sqla import define_job
from ship_sqla.jobs import Concurrency
from ship_sqla.kernel._plans.claim_floor import DEFAULT_FLOOR_SWEEP


async def _noop(ctx, payload):
    return None


def job(*, max_=None):
    return define_job(
        "conf.floor", _noop, payload=dict, concurrency=Concurrency(max=max_, lease=30.0)
    )


async def _names(backend, definition, limit=1):
    batch = await backend.claim(claim_request(definition, worker="A", limit=limit))
    return [run.payload["name"] for run in batch]


async def test_j19_k6_own_back_dated_enqueue_is_claimed_in_its_turn(clock, job_backend_factory):
    """J19, K6: after a floored claim, a run the same backend enqueues with a run_at an hour in
    the past (below the floor) is claimed first, as K6 orders it (its own enqueue lowers its
    floor); uncapped and capped (gated) claims alike."""
    backend = job_backend_factory(clock)
    for definition in (job(), job(max_=10)):
        now = clock.now()
        for name in ("a", "b", "c"):
            await backend.enqueue(definition, {"name": name}, run_at=now)
        assert await _names(backend, definition, limit=2) == ["a", "b"]
        await backend.enqueue(definition, {"name": "old"}, run_at=now - timedelta(hours=1))
        assert await _names(backend, definition) == ["old"]
        assert await _names(backend, definition) == ["c"]
        clock.advance(DEFAULT_FLOOR_SWEEP)


async def test_j19_k6_another_process_back_dated_run_waits_at_most_the_sweep(
    clock, job_backend_factory
):
    """J19's stated relaxation of K6: a run another process enqueues with a run_at more than
    ``lag`` in the past may be claimed after later runs (the claimer's walk starts at its
    floor), but for at most ``sweep`` seconds: the next full walk takes it in its turn. Later
    runs enqueued with run_at = now are always taken in order."""
    claimer, other = job_backend_factory(clock), job_backend_factory(clock)
    definition = job()
    now = clock.now()
    for name in ("a", "b"):
        await claimer.enqueue(definition, {"name": name}, run_at=now)
    assert await _names(claimer, definition) == ["a"]  # a full walk; the floor is set
    await other.enqueue(definition, {"name": "old"}, run_at=now - timedelta(hours=1))
    for n in range(5):
        await other.enqueue(definition, {"name": f"later{n}"})
    order: list[str] = []
    started = clock.now()
    while "old" not in order:
        order += await _names(claimer, definition)
        assert clock.now() - started <= timedelta(seconds=DEFAULT_FLOOR_SWEEP), order
        clock.advance(1.0)
    assert order[0] in {"old", "b"}
    assert [name for name in order if name != "old"] == ["b", *[f"later{n}" for n in range(5)]][
        : len(order) - 1
    ]


LEASE = 30.0


async def _claimed(backend, definition):
    batch = await backend.claim(claim_request(definition, worker="B"))
    return [(run.payload["name"], run.retaken) for run in batch]


async def test_j6_j19_a_lapsed_run_is_retaken_at_the_first_claim_after_its_lapse(
    clock, job_backend_factory
):
    """J6 under J19's lapsed floor: a run whose holder stops heartbeating is retaken by the
    first claim after its lease expires, while every probe before it started at the lapsed
    floor (a claim a second, each probe complete): the floor is never above a lease that
    expires after the probe that set it."""
    backend = job_backend_factory(clock)
    definition = job()
    await backend.enqueue(definition, {"name": "a"})
    assert await _names(backend, definition) == ["a"]
    for _ in range(int(LEASE) - 1):
        clock.advance(1.0)
        assert await _claimed(backend, definition) == []
    clock.advance(1.0)  # the lease expires now (lease_expires_at <= now)
    assert await _claimed(backend, definition) == [("a", True)]


async def test_j6_j19_a_lapsed_run_skipped_while_locked_is_retaken_within_the_sweep(
    clock, job_backend_factory
):
    """J6, J19's stated relaxation of J6's timing: a run whose row a transaction holds (its
    fence, SKIP LOCKED) when its lease expires is skipped by the probes meanwhile, which move
    the lapsed floor above its lease; once that transaction rolls back, the run is retaken
    within ``sweep`` seconds plus one claim interval (the next probe from the start), never
    later. The clock is the FrozenClock: claims one second apart."""
    backend = job_backend_factory(clock)
    kit = await kit_for(backend, clock)
    definition = job()
    await backend.enqueue(definition, {"name": "held"})
    [held] = await backend.claim(claim_request(definition, worker="A"))

    class Rollback(Exception):  # noqa: N818 - the test's own signal
        pass

    async def locked(repositories):
        assert await backend.fence(held) == "held"
        for _ in range(int(LEASE) + 3):  # past the lease, and a complete probe after it
            clock.advance(1.0)
            assert await _claimed(backend, definition) == []
        raise Rollback

    with pytest.raises(Rollback):
        await kit.uow.run(locked)
    released = clock.now()
    got: list[tuple[str, bool]] = []
    while not got:
        clock.advance(1.0)
        got = await _claimed(backend, definition)
        assert clock.now() - released <= timedelta(seconds=DEFAULT_FLOOR_SWEEP + 1.0)
    assert got == [("held", True)]
