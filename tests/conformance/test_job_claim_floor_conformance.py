"""J19's claim floor and its bounded relaxation of K6, against every backend (in-memory model,
PostgreSQL). Time moves only through the FrozenClock."""

from __future__ import annotations

from datetime import timedelta

from job_helpers import claim_request

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
