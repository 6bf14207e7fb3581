"""Retry and backoff arithmetic (kernel/_plans/retry.py): pure, property-tested without a clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ship_sqla.errors import ConfigurationError
from ship_sqla.jobs import RetryPolicy
from ship_sqla.kernel._plans.retry import backoff_delay, lock_held_delay, retry_at, retry_delay

positive = st.floats(min_value=1e-6, max_value=1e7, allow_nan=False, allow_infinity=False)
attempts = st.integers(min_value=1, max_value=5000)
draws = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


@st.composite
def policies(draw: st.DrawFn, jitter: str | None = None, backoff: str | None = None) -> RetryPolicy:
    return RetryPolicy(
        attempts=draw(st.integers(min_value=1, max_value=50)),
        backoff=backoff or draw(st.sampled_from(["exponential", "linear", "fixed"])),  # type: ignore[arg-type]
        base_delay=draw(positive),
        max_delay=draw(positive),
        jitter=jitter or draw(st.sampled_from(["full", "equal", "none"])),  # type: ignore[arg-type]
    )


@given(policies(), attempts, draws)
def test_delay_is_within_zero_and_max_delay(policy, attempt, draw):
    """J7 backoff bound: 0 <= retry_delay <= max_delay for every policy, attempt and draw."""
    delay = retry_delay(policy, attempt, random=lambda: draw)
    assert 0.0 <= delay <= policy.max_delay


@given(policies(jitter="none", backoff="exponential") | policies(jitter="none", backoff="linear"),
       attempts)  # fmt: skip
def test_unjittered_delay_never_decreases(policy, attempt):
    """J7 backoff: without jitter, exponential and linear delays are monotone non-decreasing."""
    assert retry_delay(policy, attempt) <= retry_delay(policy, attempt + 1)


@given(policies(jitter="equal"), attempts, draws)
def test_equal_jitter_keeps_at_least_half(policy, attempt, draw):
    """Equal jitter never drops below half the un-jittered (capped) delay."""
    delay = retry_delay(policy, attempt, random=lambda: draw)
    assert delay >= backoff_delay(policy, attempt) / 2


@given(policies(jitter="full"), attempts, draws)
def test_full_jitter_scales_the_capped_delay(policy, attempt, draw):
    delay = retry_delay(policy, attempt, random=lambda: draw)
    assert delay == pytest.approx(backoff_delay(policy, attempt) * draw)


@given(policies(), st.floats())
def test_a_misbehaving_random_source_cannot_escape_the_bounds(policy, draw):
    delay = retry_delay(policy, 3, random=lambda: draw)
    assert 0.0 <= delay <= policy.max_delay


@given(policies(), draws)
def test_lock_held_step_is_never_near_zero(policy, draw):
    """J7: a JOB_LOCK_HELD step waits at least half the first backoff step, at most max_delay."""
    delay = lock_held_delay(policy, random=lambda: draw)
    first = backoff_delay(policy, 1)
    assert first / 2 <= delay <= min(first, policy.max_delay)


def test_shapes():
    exponential = RetryPolicy(backoff="exponential", base_delay=2, max_delay=100, jitter="none")
    assert [retry_delay(exponential, n) for n in range(1, 8)] == [2, 4, 8, 16, 32, 64, 100]
    linear = RetryPolicy(backoff="linear", base_delay=3, max_delay=10, jitter="none")
    assert [retry_delay(linear, n) for n in range(1, 5)] == [3, 6, 9, 10]
    fixed = RetryPolicy(backoff="fixed", base_delay=5, max_delay=60, jitter="none")
    assert {retry_delay(fixed, n) for n in range(1, 10)} == {5}


def test_huge_attempts_are_capped_not_overflowing():
    # The largest base a policy accepts (a year) times 2 ** 1023 is inf: still capped.
    policy = RetryPolicy(backoff="exponential", base_delay=365 * 86400, max_delay=7, jitter="none")
    assert retry_delay(policy, 10**6) == 7


def test_attempts_start_at_one():
    with pytest.raises(ConfigurationError, match="start at 1"):
        retry_delay(RetryPolicy(), 0)


def test_retry_at_is_none_once_attempts_are_spent():
    """J7: the last attempt's failure dead-letters (no retry time)."""
    now = datetime(2030, 1, 1, tzinfo=UTC)
    policy = RetryPolicy(attempts=3, backoff="fixed", base_delay=10, jitter="none")
    assert retry_at(policy, 1, 3, now) == now + timedelta(seconds=10)
    assert retry_at(policy, 2, 3, now) == now + timedelta(seconds=10)
    assert retry_at(policy, 3, 3, now) is None
    # An operator retry raises max_attempts above the policy's: the run's own bound counts.
    assert retry_at(policy, 3, 4, now) == now + timedelta(seconds=10)
