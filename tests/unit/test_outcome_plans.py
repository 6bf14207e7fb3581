"""How an attempt that raised is classified (kernel/_plans/retry.py::plan_raised), the outcome
signals a handler raises, and the declarations they rest on (RetryPolicy, define_job timeout):
pure, no clock, no database (K4, K5)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ship_sqla import define_job
from ship_sqla.errors import (
    ConfigurationError,
    JobSnoozeLimitError,
    JobTimeoutError,
    RetryAfter,
    Snooze,
    TerminalError,
)
from ship_sqla.jobs import RetryPolicy
from ship_sqla.kernel._plans.retry import plan_raised

NOW = datetime(2030, 1, 1, tzinfo=UTC)
POLICY = RetryPolicy(attempts=3, backoff="fixed", base_delay=10, jitter="none", max_delay=60)


async def noop(ctx, payload):
    return None


def plan(error, *, policy=POLICY, attempt=1, max_attempts=3, snoozes=0):
    return plan_raised(
        policy, error, attempt=attempt, max_attempts=max_attempts, snoozes=snoozes, now=NOW
    )


class CardDeclinedError(Exception):
    pass


class ExpiredCardError(CardDeclinedError):
    pass


def test_k4_an_ordinary_exception_is_a_failure_retried_with_the_backoff():
    """K4/J7: an exception the policy does not name is kind "failure", at the backoff's time,
    and dead (None) once the attempts are spent."""
    assert (plan(ValueError("x")).kind, plan(ValueError("x")).at) == (
        "failure",
        NOW + timedelta(seconds=10),
    )
    spent = plan(ValueError("x"), attempt=3)
    assert (spent.kind, spent.at) == ("failure", None)


def test_k4_terminal_error_is_dead_now_whatever_attempts_are_left():
    """K4: TerminalError ends the run on the attempt it was raised in (kind "terminal")."""
    result = plan(TerminalError("card declined"), attempt=1, max_attempts=10)
    assert (result.kind, result.at) == ("terminal", None)
    assert str(result.error) == "SHIP_SQLA_JOB_TERMINAL: card declined"


def test_k4_non_retryable_types_and_their_subclasses_are_terminal():
    """K4: exception types RetryPolicy.non_retryable names (subclasses included) are terminal;
    other types are still retried."""
    policy = RetryPolicy(attempts=5, non_retryable=(CardDeclinedError, KeyError))
    assert plan(ExpiredCardError(), policy=policy).kind == "terminal"
    assert plan(KeyError("k"), policy=policy).at is None
    assert plan(ValueError(), policy=policy).kind == "failure"
    assert plan(ValueError(), policy=policy).at is not None


def test_k4_retry_after_overrides_the_backoff_and_is_capped_by_max_delay():
    """K4: RetryAfter(delay) runs again after the delay it names, not the backoff; the delay is
    capped by the policy's max_delay; the attempt is spent, so on the final attempt it is dead."""
    assert plan(RetryAfter(7)).at == NOW + timedelta(seconds=7)
    assert plan(RetryAfter(timedelta(minutes=5))).at == NOW + timedelta(seconds=60)
    assert plan(RetryAfter(0)).at == NOW
    assert plan(RetryAfter(7)).kind == "retry-after"
    final = plan(RetryAfter(7), attempt=3)
    assert (final.kind, final.at) == ("retry-after", None)


def test_k4_signals_a_handler_raises_win_over_non_retryable():
    """K4: a Snooze or a RetryAfter is the handler's chosen outcome, even when non_retryable
    names one of their bases (Exception here)."""
    policy = RetryPolicy(attempts=3, non_retryable=(Exception,))
    assert plan(Snooze(5), policy=policy).kind == "snooze"
    assert plan(RetryAfter(5), policy=policy).kind == "retry-after"
    assert plan(ValueError(), policy=policy).kind == "terminal"


def test_k4_snooze_spends_no_attempt_up_to_max_snoozes_then_is_a_failure():
    """K4: a snooze while the run snoozed fewer than max_snoozes times is kind "snooze" at
    now + delay (even on the final attempt: no attempt is spent); past the bound it is a
    JobSnoozeLimitError failure, retried with the backoff or dead once the attempts are
    spent."""
    policy = RetryPolicy(attempts=2, backoff="fixed", base_delay=10, jitter="none", max_snoozes=2)
    first = plan(Snooze(30, "export not ready"), policy=policy, max_attempts=2, attempt=2)
    assert (first.kind, first.at) == ("snooze", NOW + timedelta(seconds=30))
    assert str(first.error) == "SHIP_SQLA_JOB_SNOOZE: snoozed for 30 s: export not ready"
    assert plan(Snooze(30), policy=policy, max_attempts=2, snoozes=1).kind == "snooze"
    past = plan(Snooze(30), policy=policy, max_attempts=2, snoozes=2)
    assert (past.kind, past.at) == ("failure", NOW + timedelta(seconds=10))
    assert isinstance(past.error, JobSnoozeLimitError)
    assert "SHIP_SQLA_JOB_SNOOZE_LIMIT" in str(past.error)
    assert plan(Snooze(30), policy=policy, attempt=2, max_attempts=2, snoozes=2).at is None


def test_k4_past_the_bound_a_snooze_is_terminal_when_the_policy_says_so():
    """K4: naming JobSnoozeLimitError as non-retryable makes the snooze past the bound end the
    run at once."""
    policy = RetryPolicy(max_snoozes=0, non_retryable=(JobSnoozeLimitError,))
    result = plan(Snooze(1), policy=policy)
    assert (result.kind, result.at) == ("terminal", None)


def test_k5_a_timeout_is_a_failure_the_policy_decides():
    """K5: JobTimeoutError is kind "timeout" at the backoff; dead once the attempts are spent,
    or at once when non_retryable names it (still kind "timeout")."""
    timeout = JobTimeoutError("ran past 5 s")
    assert (plan(timeout).kind, plan(timeout).at) == ("timeout", NOW + timedelta(seconds=10))
    assert plan(timeout, attempt=3).at is None
    policy = RetryPolicy(non_retryable=(JobTimeoutError,))
    assert (plan(timeout, policy=policy).kind, plan(timeout, policy=policy).at) == (
        "timeout",
        None,
    )
    assert str(timeout).startswith("SHIP_SQLA_JOB_TIMEOUT: ")


errors = st.sampled_from(
    [
        lambda: ValueError("v"),
        lambda: TerminalError("t"),
        lambda: RetryAfter(3),
        lambda: Snooze(4),
        lambda: JobTimeoutError("late"),
    ]
)


@given(
    make=errors,
    attempt=st.integers(min_value=1, max_value=6),
    extra=st.integers(min_value=0, max_value=3),
    snoozes=st.integers(min_value=0, max_value=4),
    max_snoozes=st.integers(min_value=0, max_value=3),
)
def test_k4_every_plan_is_bounded(make, attempt, extra, snoozes, max_snoozes):
    """K4/J7: whatever was raised, a plan never schedules a run whose attempts are spent (only
    a snooze, which spends none, may), never snoozes past max_snoozes, and never waits longer
    than max_delay after a failed attempt."""
    policy = RetryPolicy(attempts=3, max_delay=60, max_snoozes=max_snoozes)
    max_attempts = attempt + extra
    result = plan(make(), policy=policy, attempt=attempt, max_attempts=max_attempts,
                  snoozes=snoozes)  # fmt: skip
    if result.kind == "snooze":
        assert snoozes < max_snoozes
        assert result.at is not None
        return
    if result.at is not None:
        assert attempt < max_attempts
        assert NOW <= result.at <= NOW + timedelta(seconds=60)
    elif result.kind != "terminal":
        assert attempt >= max_attempts


def test_outcome_signals_refuse_bad_delays():
    """Bad input is refused where it is given: a negative, infinite or over-long delay."""
    for bad in (-1, float("inf"), float("nan"), 10**12, "5", True):
        with pytest.raises(ConfigurationError):
            RetryAfter(bad)
        with pytest.raises(ConfigurationError):
            Snooze(bad)
    assert Snooze(timedelta(seconds=90)).delay == 90.0


def test_retry_policy_checks_non_retryable_and_max_snoozes():
    """RetryPolicy refuses what cannot classify a failure: non-types, the outcome signals
    themselves, and a max_snoozes outside 0..MAX_SNOOZES; a single type is accepted."""
    assert RetryPolicy(non_retryable=KeyError).non_retryable == (KeyError,)
    assert RetryPolicy(non_retryable=[KeyError, OSError]).non_retryable == (KeyError, OSError)
    for bad in (("KeyError",), (int,), (Snooze,), (RetryAfter,)):
        with pytest.raises(ConfigurationError):
            RetryPolicy(non_retryable=bad)
    for count in (-1, 10_001, 1.5, True):
        with pytest.raises(ConfigurationError):
            RetryPolicy(max_snoozes=count)
    assert RetryPolicy().max_snoozes == 100
    assert RetryPolicy(max_snoozes=0).max_snoozes == 0


def test_k5_define_job_timeout_is_a_checked_duration():
    """K5: define_job(timeout=) takes seconds or a timedelta, checked like every duration
    (positive, finite, at most a week); None (the default) is no timeout."""
    assert define_job("t.none", noop).timeout is None
    assert define_job("t.secs", noop, timeout=2.5).timeout == 2.5
    assert define_job("t.delta", noop, timeout=timedelta(minutes=2)).timeout == 120.0
    for bad in (0, -1, float("inf"), 8 * 86400, "10", True):
        with pytest.raises(ConfigurationError, match="timeout"):
            define_job("t.bad", noop, timeout=bad)
