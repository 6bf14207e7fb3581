"""A job's retry plan: pure functions of a :class:`RetryPolicy`, an attempt number and a
source of randomness. No clock, no I/O; the runtime adds the result to ``clock.now()``, or hands
``now`` in.

The arithmetic is the package's one backoff (:mod:`ship_sqla.kernel._plans.backoff`) over the
policy's :attr:`~ship_sqla.jobs.RetryPolicy.plan`: ``retry_delay(policy, attempt)`` is the wait
after attempt ``attempt`` (numbered from 1) failed, ``0 <= delay <= max_delay``; what this
module adds is the job's rules around it: when the attempts are spent (J7), the step a run
waits when its single-runner lock is held elsewhere, and how an attempt that raised is
classified (K4, K5: :func:`plan_raised`).
"""

from __future__ import annotations

import random as _random
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

import attrs

from ship_sqla.kernel._outcomes import (
    JobSnoozeLimitError,
    JobTimeoutError,
    RetryAfter,
    Snooze,
    TerminalError,
)
from ship_sqla.kernel._plans.backoff import Random, capped_delay, jittered

if TYPE_CHECKING:
    from ship_sqla.kernel._jobs import RetryPolicy
    from ship_sqla.kernel._ports import FailureKind

__all__ = [
    "RaisedPlan",
    "attempts_spent",
    "backoff_delay",
    "lock_held_delay",
    "plan_raised",
    "retry_at",
    "retry_delay",
]


def backoff_delay(policy: RetryPolicy, attempt: int) -> float:
    """The un-jittered delay in seconds after attempt ``attempt`` failed, capped by max_delay."""
    return capped_delay(policy.plan, attempt)


def retry_delay(policy: RetryPolicy, attempt: int, *, random: Random = _random.random) -> float:
    """Seconds to wait after attempt ``attempt`` failed: ``0 <= delay <= policy.max_delay``.

    With ``jitter="none"`` the delay never decreases as ``attempt`` grows (exponential, linear);
    with ``jitter="equal"`` it is never below half the un-jittered delay.
    """
    return policy.plan.delay(attempt, random=random)


def lock_held_delay(policy: RetryPolicy, *, random: Random = _random.random) -> float:
    """One jittered backoff step for a run returned to waiting because its single-runner lock is
    held elsewhere (J7, JOB_LOCK_HELD).

    The step is the first backoff delay with at least ``equal`` jitter: ``full`` jitter could draw
    ~0 and make a worker re-claim the same locked run in a tight loop, so a lock-held run always
    waits at least half a step.
    """
    jitter = "equal" if policy.jitter == "full" else policy.jitter
    return jittered(capped_delay(policy.plan, 1), jitter, random())


def attempts_spent(attempt: int, max_attempts: int) -> bool:
    """True when attempt ``attempt`` was the last one ``max_attempts`` allows."""
    return attempt >= max_attempts


def retry_at(
    policy: RetryPolicy,
    attempt: int,
    max_attempts: int,
    now: datetime,
    *,
    random: Random = _random.random,
) -> datetime | None:
    """When a run whose attempt ``attempt`` failed runs again; None when the attempts are spent
    and the run must be dead-lettered (J7)."""
    if attempts_spent(attempt, max_attempts):
        return None
    return now + timedelta(seconds=retry_delay(policy, attempt, random=random))


@attrs.frozen
class RaisedPlan:
    """What an attempt whose handler raised calls for (:func:`plan_raised`): ``kind`` (the
    history entry's), ``at`` (when the run runs again; None: dead now; for a snooze, when it
    wakes) and ``error``, the exception the history describes (the one raised, or the
    :class:`JobSnoozeLimitError` that replaced a snooze past the bound)."""

    kind: FailureKind | Literal["snooze"]
    at: datetime | None
    error: BaseException


def plan_raised(
    policy: RetryPolicy,
    error: BaseException,
    *,
    attempt: int,
    max_attempts: int,
    snoozes: int,
    now: datetime,
    random: Random = _random.random,
) -> RaisedPlan:
    """Classify attempt ``attempt`` (of ``max_attempts``; the run snoozed ``snoozes`` times
    before) whose handler raised ``error``, at ``now`` (K4, K5). The first rule that matches:

    1. :class:`Snooze`, while ``snoozes < policy.max_snoozes``: ``"snooze"``, back at
       ``now + delay``, no attempt spent. Past the bound the snooze becomes a
       :class:`JobSnoozeLimitError`, classified by the rules below like any exception;
    2. :class:`RetryAfter`: ``"retry-after"``, at ``now + min(delay, policy.max_delay)``; dead
       (None) once the attempts are spent;
    3. :class:`TerminalError`, or an instance of a type in ``policy.non_retryable``: dead now
       (kind ``"terminal"``; ``"timeout"`` for a :class:`JobTimeoutError` the policy names);
    4. :class:`JobTimeoutError`: ``"timeout"``, 5. anything else: ``"failure"``; both at the
       policy's backoff (:func:`retry_at`), dead once the attempts are spent.

    The outcome signals a handler raises (1, 2) win over ``non_retryable``, which classifies
    failures only.
    """
    if isinstance(error, Snooze):
        if snoozes < policy.max_snoozes:
            return RaisedPlan("snooze", now + timedelta(seconds=error.delay), error)
        error = JobSnoozeLimitError(
            f"the run already snoozed {snoozes} times, retry.max_snoozes; this snooze ({error})"
            " is a failed attempt instead.",
            fix="raise retry.max_snoozes or snooze for longer, or make the handler fail (or"
            " raise TerminalError) when the work will never be ready.",
        )
    if isinstance(error, RetryAfter):
        if attempts_spent(attempt, max_attempts):
            return RaisedPlan("retry-after", None, error)
        delay = min(error.delay, policy.max_delay)
        return RaisedPlan("retry-after", now + timedelta(seconds=delay), error)
    timed_out = isinstance(error, JobTimeoutError)
    kind: FailureKind = "timeout" if timed_out else "failure"
    if isinstance(error, (TerminalError, *policy.non_retryable)):
        return RaisedPlan("timeout" if timed_out else "terminal", None, error)
    return RaisedPlan(kind, retry_at(policy, attempt, max_attempts, now, random=random), error)
