"""J19's floor for J6's lapsed-lease probe (kernel ``LapsedFloors``), pure: where a claim's
probe of lapsed leases starts, when it probes from the start, and that a lapsed run is never
hidden longer than ``sweep``, or after a slow probe from the start its spacing (docs/jobs.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from ship_sqla.kernel._plans.claim_floor import (
    DEFAULT_FLOOR_LAG,
    DEFAULT_FLOOR_SWEEP,
    DEFAULT_SWEEP_CEILING,
    LapsedFloors,
    lapsed_probe_complete,
    sweep_spacing,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SWEEP = DEFAULT_FLOOR_SWEEP
LAG = DEFAULT_FLOOR_LAG
JOB = "job"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_j6_j19_first_probe_from_the_start_then_from_the_last_complete_one() -> None:
    """J6, J19: a backend's first probe of a job reads from the start; after a complete probe at
    t, the next ones read leases expired after t - lag; every ``sweep`` seconds one reads from
    the start again; a clock that went back probes from the start."""
    floors = LapsedFloors()
    assert floors.window(JOB, at(0)) is None
    floors.record(JOB, at(0), None, complete=True)
    assert floors.window(JOB, at(2)) == 2 + LAG  # leases expired after at(0) - lag
    floors.record(JOB, at(2), 2 + LAG, complete=True)
    assert floors.window(JOB, at(3)) == 1 + LAG  # the floor moved to at(2) - lag
    assert floors.window(JOB, at(SWEEP)) is None
    assert floors.window(JOB, at(-1)) is None
    assert floors.window("other", at(3)) is None


def test_j6_j19_an_incomplete_probe_keeps_the_floor() -> None:
    """J6, J19: a probe that hit its limit, left runs it found unretaken, or met a paused job
    keeps the floor where it was (its runs are read again by the next probe); after an
    incomplete probe from the start, the next ones read from the start until one is complete."""
    assert not lapsed_probe_complete(found=5, handled=5, limit=5, paused=False)
    assert not lapsed_probe_complete(found=2, handled=1, limit=5, paused=False)
    assert not lapsed_probe_complete(found=0, handled=0, limit=5, paused=True)
    assert lapsed_probe_complete(found=2, handled=2, limit=5, paused=False)
    floors = LapsedFloors()
    floors.record(JOB, at(0), None, complete=True)
    floors.record(JOB, at(2), 2 + LAG, complete=False)
    assert floors.window(JOB, at(3)) == 3 + LAG  # still from at(0) - lag
    floors.record(JOB, at(SWEEP), None, complete=False)
    assert floors.window(JOB, at(SWEEP + 1)) is None
    floors.record(JOB, at(SWEEP + 1), None, complete=True)
    assert floors.window(JOB, at(SWEEP + 2)) == 1 + LAG


def test_j6_j19_a_slow_probe_from_the_start_spaces_the_next_one_out() -> None:
    """J6, J19: a probe from the start that took ``t`` seconds is followed by the next one
    after ``max(sweep, t / share)`` seconds, at most the ceiling (kernel ``sweep_spacing``): under
    a held horizon it reads every lease entry the hold kept. A slow floored probe changes
    nothing."""
    floors = LapsedFloors()
    floors.record(JOB, at(0), None, complete=True, took=0.1)
    spacing = sweep_spacing(0.1)
    assert spacing > SWEEP
    floors.record(JOB, at(1), floors.window(JOB, at(1)), complete=True, took=9.0)
    assert floors.window(JOB, at(spacing - 0.1)) is not None
    assert floors.window(JOB, at(spacing)) is None
    floors.record(JOB, at(spacing), None, complete=True, took=1e9)
    assert floors.window(JOB, at(spacing + DEFAULT_SWEEP_CEILING - 0.1)) is not None
    assert floors.window(JOB, at(spacing + DEFAULT_SWEEP_CEILING)) is None


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.floats(0.0, 3.0), st.booleans(), st.sampled_from([None, 0.001, 0.05, 1.0])),
        min_size=1,
        max_size=40,
    )
)
def test_j6_j19_a_lapsed_run_is_hidden_at_most_the_sweep(
    steps: list[tuple[float, bool, float | None]],
) -> None:
    """J6, J19's bound: whatever the probes' times, outcomes and durations, a lease that expired
    at any moment is below the probe's floor for at most the spacing of the probes from the
    start: within ``sweep`` seconds of any probe (or, after a slow probe from the start, its
    ``sweep_spacing``, never more than the ceiling), some probe reads from the start."""
    floors, now, last_full, spacing = LapsedFloors(), 0.0, None, SWEEP
    for step, complete, took in steps:
        now += step
        window = floors.window(JOB, at(now))
        if window is None:
            last_full = now
        else:
            assert last_full is not None
            assert now - last_full < spacing <= DEFAULT_SWEEP_CEILING
            assert window >= LAG  # never above now - lag
        floors.record(JOB, at(now), window, complete=complete, took=took)
        if window is None:
            spacing = sweep_spacing(took)
