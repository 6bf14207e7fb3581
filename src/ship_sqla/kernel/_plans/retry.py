"""A job's retry plan: pure functions of a :class:`RetryPolicy`, an attempt number and a
source of randomness. No clock, no I/O; the runtime adds the result to ``clock.now()``.

The arithmetic is the package's one backoff (:mod:`ship_sqla.kernel._plans.backoff`) over the
policy's :attr:`~ship_sqla.kernel.RetryPolicy.plan`: ``retry_delay(policy, attempt)`` is the wait
after attempt ``attempt`` (numbered from 1) failed, ``0 <= delay <= max_delay``; what this
module adds is the job's rules around it: when the attempts are spent (J7), and the step a run
waits when its single-runner lock is held elsewhere.
"""

from __future__ import annotations

import random as _random
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ship_sqla.kernel._plans.backoff import Random, capped_delay, jittered

if TYPE_CHECKING:
    from ship_sqla.kernel._jobs import RetryPolicy

__all__ = [
    "attempts_spent",
    "backoff_delay",
    "lock_held_delay",
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
