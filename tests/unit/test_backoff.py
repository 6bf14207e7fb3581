"""The one backoff (kernel/_plans/backoff.py): pure, property-tested without a clock.

It serves a job's RetryPolicy (J7; tests/unit/test_retry.py checks the policy's view of it), the
outbox's message backoff (O4) and the loops' error backoff (J11).
"""

from __future__ import annotations

import random

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ship_sqla.errors import ConfigurationError
from ship_sqla.jobs import Backoff, RetryPolicy

# Private on purpose: the pure functions and the loops' constant under test live there.
from ship_sqla.kernel._plans.backoff import (
    ERROR_BACKOFF,
    capped_delay,
    error_backoff,
    jittered,
)

attempts = st.integers(min_value=1, max_value=10_000)
bases = st.floats(min_value=0, max_value=1e6, allow_nan=False)
factors = st.floats(min_value=1, max_value=100, allow_nan=False)
caps = st.floats(min_value=0, max_value=1e7, allow_nan=False)
draws = st.floats(min_value=0, max_value=1, exclude_max=True)
kinds = st.sampled_from(["exponential", "linear", "fixed"])
jitters = st.sampled_from(["none", "full", "equal"])


@st.composite
def backoffs(draw: st.DrawFn, jitter: str | None = None) -> Backoff:
    return Backoff(
        kind=draw(kinds),
        base=draw(bases),
        factor=draw(factors),
        max_delay=draw(caps),
        jitter=jitter or draw(jitters),  # type: ignore[arg-type]
    )


@given(backoffs(), attempts, draws)
def test_delay_is_never_negative_nor_above_the_cap(backoff, attempt, draw):
    """O4, J7: every delay is in [0, max_delay], whatever the kind, jitter and draw."""
    assert 0 <= backoff.delay(attempt, random=lambda: draw) <= backoff.max_delay


@given(backoffs(jitter="none"), attempts)
def test_the_capped_delay_never_shrinks_as_attempts_grow(backoff, attempt):
    """O4, J7: without jitter the delay is non-decreasing in the attempt number (factor >= 1)."""
    assert backoff.delay(attempt) <= backoff.delay(attempt + 1)
    assert capped_delay(backoff, attempt) <= capped_delay(backoff, attempt + 1)


@given(backoffs(), attempts, draws)
def test_jitter_stays_within_its_band(backoff, attempt, draw):
    """O4: full jitter lies in [0, d], equal jitter in [d/2, d], none is d, where d is the
    capped (un-jittered) delay; full jitter scales d by the draw."""
    ceiling = capped_delay(backoff, attempt)
    full = attrs.evolve(backoff, jitter="full").delay(attempt, random=lambda: draw)
    equal = attrs.evolve(backoff, jitter="equal").delay(attempt, random=lambda: draw)
    none = attrs.evolve(backoff, jitter="none").delay(attempt, random=lambda: draw)
    assert 0 <= full <= ceiling
    assert full == pytest.approx(ceiling * draw)
    assert ceiling / 2 <= equal <= ceiling
    assert none == ceiling


@given(st.floats(min_value=0, max_value=1e7, allow_nan=False), jitters, st.floats())
def test_a_misbehaving_random_source_cannot_escape_the_band(delay, jitter, draw):
    """A draw outside [0, 1) (NaN, negative, huge) is clamped: the delay stays in [0, d]."""
    assert 0 <= jittered(delay, jitter, draw) <= delay


def test_the_shapes():
    exponential = Backoff(base=1, factor=2, max_delay=10, jitter="none")
    assert [exponential.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    tripling = Backoff(base=1, factor=3, max_delay=100, jitter="none")
    assert [tripling.delay(n) for n in range(1, 6)] == [1, 3, 9, 27, 81]
    linear = Backoff(kind="linear", base=3, max_delay=10, jitter="none")
    assert [linear.delay(n) for n in range(1, 5)] == [3, 6, 9, 10]
    fixed = Backoff(kind="fixed", base=5, max_delay=60, jitter="none")
    assert {fixed.delay(n) for n in range(1, 10)} == {5}


def test_huge_attempts_are_capped_not_overflowing():
    assert Backoff(base=1, factor=2, max_delay=5, jitter="none").delay(10**6) == 5
    assert Backoff(base=365 * 86400, factor=100, max_delay=7, jitter="none").delay(10**6) == 7
    assert Backoff(kind="linear", base=1, max_delay=9, jitter="none").delay(10**400) == 9


def test_attempts_start_at_one():
    with pytest.raises(ConfigurationError, match="start at 1"):
        Backoff().delay(0)


def test_the_draw_is_injected():
    """The random draw is the caller's: the same source gives the same delays."""
    backoff = Backoff(base=2, max_delay=100)
    first, again = random.Random(1), random.Random(1)
    assert [backoff.delay(n, random=first.random) for n in range(1, 6)] == [
        backoff.delay(n, random=again.random) for n in range(1, 6)
    ]
    assert Backoff(jitter="none").delay(3) == 4.0


def test_a_bad_plan_is_refused_when_built():
    for kwargs in (
        {"base": -1},
        {"max_delay": -1},
        {"base": float("nan")},
        {"max_delay": float("inf")},
        {"factor": 0.5},
        {"factor": float("nan")},
        {"kind": "quadratic"},
        {"jitter": "some"},
    ):
        with pytest.raises(ConfigurationError, match="backoff") as raised:
            Backoff(**kwargs)
        assert "Fix:" in str(raised.value)


def test_the_loops_error_backoff():
    """J11: the loops' error backoff is 0.1 s doubling to 1 s, equal jitter (never below half a
    step); a loop polling faster than 0.1 s starts from its poll interval."""
    assert [ERROR_BACKOFF.capped(n) for n in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert ERROR_BACKOFF.jitter == "equal"
    assert 0.5 <= ERROR_BACKOFF.delay(10**6, random=lambda: 0.0) <= 1.0
    assert error_backoff(0.02).capped(1) == 0.02
    assert error_backoff(5.0) == ERROR_BACKOFF


def test_a_retry_policy_is_one_backoff():
    """J7: a RetryPolicy's fields are one Backoff (its ``plan``), checked with the policy."""
    policy = RetryPolicy(backoff="linear", base_delay=3, max_delay=10, jitter="equal", factor=3)
    assert policy.plan == Backoff(kind="linear", base=3, factor=3, max_delay=10, jitter="equal")
    with pytest.raises(ConfigurationError, match="factor"):
        RetryPolicy(factor=0.5)
