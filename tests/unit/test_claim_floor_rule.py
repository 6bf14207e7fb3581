"""J19's claim floor (kernel ``ClaimFloors``), pure: where a priority walk starts, when it walks
from the start, and the bounded relaxation of K6 it implies (docs/jobs.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import attrs
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ship_sqla.kernel._plans.claim_floor import (
    DEFAULT_FLOOR_LAG,
    DEFAULT_FLOOR_SWEEP,
    DEFAULT_SWEEP_CEILING,
    DEFAULT_SWEEP_SHARE,
    ClaimFloors,
    Floor,
    below_floor,
    sweep_spacing,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SWEEP = DEFAULT_FLOOR_SWEEP
LAG = DEFAULT_FLOOR_LAG
CEILING = DEFAULT_SWEEP_CEILING


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_j19_first_claim_is_a_full_walk_then_floored_until_the_sweep() -> None:
    """J19: a backend's first claim of a job walks from the start; the next ones start at the
    lowest (run_at, seq) the previous claim took per level (never later than now - lag); once
    ``sweep`` seconds have passed since the last full walk, a claim walks from the start again."""
    floors = ClaimFloors()
    assert floors.floors("j", at(0)) == ()
    floors.record("j", at(0), (), [(0, at(-60), 7), (0, at(-50), 9), (3, at(-10), 2)])
    assert floors.floors("j", at(1)) == (Floor(3, at(-10), 2), Floor(0, at(-60), 7))
    # Capped at now - lag: a floor never passes runs enqueued in the last `lag` seconds.
    floors.record("j", at(1), floors.floors("j", at(1)), [(3, at(0.9), 40)])
    assert floors.floors("j", at(2)) == (Floor(3, at(1 - LAG), 0), Floor(0, at(-60), 7))
    assert floors.floors("j", at(SWEEP)) == ()
    assert floors.floors("j", at(-1)) == ()  # the clock went back: from the start
    assert floors.floors("other", at(1)) == ()


def test_j19_a_slow_full_walk_spaces_the_next_one_out_up_to_the_ceiling() -> None:
    """J19: a full walk that took ``t`` seconds is followed by the next one after
    ``max(sweep, t / share)`` seconds, never more than the ceiling: under a held horizon the
    full walk reads every entry the hold kept, and this keeps its share of the backend's time
    bounded. A quick one (or an unmeasured one) keeps the ``sweep`` spacing; a slow floored
    claim changes nothing."""
    assert sweep_spacing(None) == sweep_spacing(0.0) == sweep_spacing(0.002) == SWEEP
    assert sweep_spacing(-1.0) == SWEEP  # the clock went back during the claim
    assert sweep_spacing(0.02) == 0.02 / DEFAULT_SWEEP_SHARE == 20.0
    assert sweep_spacing(5.0) == sweep_spacing(float("inf")) == CEILING
    floors = ClaimFloors()
    floors.record("j", at(0), (), [(0, at(-60), 7)], took=0.02)  # 20 s to the next
    assert floors.floors("j", at(19.9)) != ()
    floors.record("j", at(19.9), floors.floors("j", at(19.9)), [], took=9.0)  # floored
    assert floors.floors("j", at(19.95)) != ()
    assert floors.floors("j", at(20)) == ()
    floors.record("j", at(20), (), [(0, at(19), 8)], took=30.0)
    assert floors.floors("j", at(20 + CEILING - 0.1)) != ()
    assert floors.floors("j", at(20 + CEILING)) == ()
    floors.record("j", at(80), (), [(0, at(79), 9)], took=0.001)  # quick again
    assert floors.floors("j", at(80 + SWEEP)) == ()
    assert floors.floors("other", at(80)) == ()


def test_j19_own_back_dated_enqueue_lowers_the_floor() -> None:
    """J19, K6: a run this backend enqueues below its level's floor lowers the floor to it, so
    this backend never passes over its own back-dated runs."""
    floors = ClaimFloors()
    floors.record("j", at(0), (), [(0, at(-60), 7)])
    floors.lower("j", 0, at(-3600))
    (floor,) = floors.floors("j", at(1))
    assert floor == Floor(0, at(-3600), 0)
    assert not below_floor((floor,), 0, at(-3600), 1)
    assert below_floor((floor,), 0, at(-3601), 99)
    assert not below_floor((floor,), 1, at(-9999), 1)  # another level: no floor


@attrs.define
class _Run:
    priority: int
    run_at: datetime
    seq: int
    enqueued: datetime
    own: bool

    def order(self) -> tuple[int, datetime, int]:
        return (-self.priority, self.run_at, self.seq)


_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("enqueue"),
            st.sampled_from([0, 0, 0, 1, -1]),  # priority
            st.sampled_from([0, 0, 0, -0.5, -3, -30, 2]),  # run_at - now (seconds)
            st.booleans(),  # enqueued by this backend (lowers its floor) or by another
        ),
        st.tuples(st.just("advance"), st.sampled_from([0.0, 0.2, 1.0, 2.5, 6.0])),
        # a claim of n runs that took this long (a slow full walk spaces the next one out)
        st.tuples(st.just("claim"), st.integers(1, 4), st.sampled_from([None, 0.001, 0.05, 1.0])),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(_ops)
# A run back-dated by less than lag is never below a floor.
@example(
    [
        ("enqueue", 0, 0, False),
        ("claim", 1, None),
        ("advance", 0.2),
        ("enqueue", 0, -0.5, False),
        ("enqueue", 0, 0, False),
        ("claim", 1, None),
    ]
)
# Another process's back-dated run below the floor, passed over until the sweep's full walk.
@example(
    [
        ("enqueue", 0, 0, False),
        ("claim", 1, None),
        ("enqueue", 0, -30, False),
        ("enqueue", 0, 0, False),
        ("enqueue", 0, 0, False),
        ("advance", 2.5),
        ("claim", 1, None),
        ("advance", 2.5),
        ("claim", 1, None),
    ]
)
# The same after a slow full walk: passed over for up to its spacing (here 10 s), not the sweep.
@example(
    [
        ("enqueue", 0, 0, False),
        ("claim", 1, 0.05),
        ("enqueue", 0, -30, False),
        ("enqueue", 0, 0, False),
        ("enqueue", 0, 0, False),
        ("advance", 6.0),
        ("claim", 1, None),
        ("advance", 6.0),
        ("claim", 1, None),
    ]
)
def test_j19_k6_no_due_run_waits_longer_than_the_sweep(ops: list[tuple[object, ...]]) -> None:
    """J19's stated relaxation of K6, as a property over any interleaving of enqueues (this
    backend's and other processes', back-dated or not), clock steps and claims (quick or slow):
    whenever a claim takes a run that K6 orders after a due waiting run r it leaves, r was
    enqueued by another process with a run_at more than ``lag`` before its enqueue, and the
    claim came less than the full walks' spacing after that enqueue: ``sweep``, or after a slow
    full walk its ``sweep_spacing``, never more than the ceiling. Every other run is claimed in
    K6 order."""
    floors, waiting, now, seq, spacing = ClaimFloors(), list[_Run](), 0.0, 0, SWEEP
    for op in ops:
        if op[0] == "enqueue":
            _, priority, offset, own = op
            assert isinstance(priority, int)
            assert isinstance(offset, float | int)
            seq += 1
            run = _Run(priority, at(now + offset), seq, at(now), bool(own))
            waiting.append(run)
            if run.own:
                floors.lower("j", priority, run.run_at)
        elif op[0] == "advance":
            assert isinstance(op[1], float)
            now += op[1]
        else:
            assert isinstance(op[1], int)
            took = op[2]
            assert took is None or isinstance(took, float)
            current = floors.floors("j", at(now))
            due = sorted((r for r in waiting if r.run_at <= at(now)), key=_Run.order)
            seen = [r for r in due if not below_floor(current, r.priority, r.run_at, r.seq)]
            taken = seen[: op[1]]
            if taken:
                last = taken[-1].order()
                for passed in (r for r in due if r not in taken and r.order() < last):
                    assert not passed.own, passed
                    assert passed.run_at < passed.enqueued - timedelta(seconds=LAG), passed
                    assert at(now) < passed.enqueued + timedelta(seconds=spacing), passed
                    assert spacing <= CEILING
            for r in taken:
                waiting.remove(r)
            if not current:
                spacing = sweep_spacing(took)
            positions = [(r.priority, r.run_at, r.seq) for r in taken]
            floors.record("j", at(now), current, positions, took=took)
