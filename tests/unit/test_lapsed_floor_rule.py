"""J19's floor for J6's lapsed-lease probe (kernel ``LapsedFloors``), pure: where a claim's
probe of lapsed leases starts, when it probes from the start, and that a lapsed run is never
hidden longer than ``sweep`` (docs/jobs.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from ship_sqla.kernel._plans.claim_floor import (
    DEFAULT_FLOOR_LAG,
    DEFAULT_FLOOR_SWEEP,
    LapsedFloors,
    lapsed_probe_complete,
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


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.floats(0.0, 3.0), st.booleans()), min_size=1, max_size=40))
def test_j6_j19_a_lapsed_run_is_hidden_at_most_the_sweep(
    steps: list[tuple[float, bool]],
) -> None:
    """J6, J19's bound: whatever the probes' times and outcomes, a lease that expired at any
    moment is below the probe's floor for at most ``sweep`` seconds of probes in a row: within
    ``sweep`` seconds of any probe, some probe reads from the start (window None)."""
    floors, now, last_full = LapsedFloors(), 0.0, None
    for step, complete in steps:
        now += step
        window = floors.window(JOB, at(now))
        if window is None:
            last_full = now
        else:
            assert last_full is not None
            assert now - last_full < SWEEP
            assert window >= LAG  # never above now - lag
        floors.record(JOB, at(now), window, complete=complete)
