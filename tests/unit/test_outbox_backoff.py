"""O4: the retry backoff is a pure function; its properties hold for every input."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ship_sqla._outbox import OutboxBackoff, exponential_delay
from ship_sqla.kernel import ConfigurationError

attempts = st.integers(min_value=1, max_value=10_000)
bases = st.floats(min_value=0, max_value=1e6, allow_nan=False)
factors = st.floats(min_value=1, max_value=100, allow_nan=False)
caps = st.floats(min_value=0, max_value=1e7, allow_nan=False)
draws = st.floats(min_value=0, max_value=1, exclude_max=True)
jitters = st.sampled_from(["none", "full", "equal"])


@given(attempt=attempts, base=bases, factor=factors, cap=caps, jitter=jitters, draw=draws)
def test_delay_is_never_negative_nor_above_the_cap(*, attempt, base, factor, cap, jitter, draw):
    """O4: every retry delay is in [0, max_delay]."""
    delay = exponential_delay(
        attempt, base=base, factor=factor, max_delay=cap, jitter=jitter, draw=draw
    )
    assert 0 <= delay <= cap


@given(attempts, bases, factors, caps)
def test_unjittered_delay_never_shrinks_as_attempts_grow(attempt, base, factor, cap):
    """O4: without jitter the delay is non-decreasing in the attempt number."""
    kwargs = {"base": base, "factor": factor, "max_delay": cap, "jitter": "none", "draw": 0.0}
    assert exponential_delay(attempt, **kwargs) <= exponential_delay(attempt + 1, **kwargs)


@given(attempts, bases, factors, caps, draws)
def test_jitter_stays_within_its_band(attempt, base, factor, cap, draw):
    """O4: full jitter lies in [0, d], equal jitter in [d/2, d], where d is the unjittered delay."""
    kwargs = {"base": base, "factor": factor, "max_delay": cap}
    ceiling = exponential_delay(attempt, jitter="none", draw=0.0, **kwargs)
    full = exponential_delay(attempt, jitter="full", draw=draw, **kwargs)
    equal = exponential_delay(attempt, jitter="equal", draw=draw, **kwargs)
    assert 0 <= full <= ceiling
    assert ceiling / 2 <= equal <= ceiling


def test_the_schedule_doubles_from_base_up_to_the_cap():
    delays = [
        exponential_delay(n, base=1, factor=2, max_delay=10, jitter="none", draw=0)
        for n in range(1, 7)
    ]
    assert delays == [1, 2, 4, 8, 10, 10]
    assert exponential_delay(10**6, base=1, factor=2, max_delay=5, jitter="none", draw=0) == 5


def test_attempts_start_at_one():
    with pytest.raises(ValueError, match="start at 1"):
        exponential_delay(0, base=1, factor=2, max_delay=5, jitter="none", draw=0)


def test_exponential_backoff_draws_from_its_rng_and_validates():
    backoff = OutboxBackoff(base=2, max_delay=100, rng=random.Random(1))
    again = OutboxBackoff(base=2, max_delay=100, rng=random.Random(1))
    assert [backoff(n) for n in range(1, 6)] == [again(n) for n in range(1, 6)]
    assert OutboxBackoff(jitter="none")(3) == 4.0
    for kwargs in ({"base": -1}, {"max_delay": -1}, {"factor": 0.5}):
        with pytest.raises(ConfigurationError, match="Fix:"):
            OutboxBackoff(**kwargs)
