"""Retry and backoff arithmetic: pure functions of a :class:`RetryPolicy`, an attempt number and a
source of randomness. No clock, no I/O; the runtime adds the result to ``clock.now()``.

Attempts are numbered from 1 (the first run). ``retry_delay(policy, attempt)`` is the wait after
attempt ``attempt`` failed:

- ``exponential``: ``base_delay * 2 ** (attempt - 1)``
- ``linear``: ``base_delay * attempt``
- ``fixed``: ``base_delay``

capped by ``max_delay``, then jittered: ``full`` draws uniformly from ``[0, d]``, ``equal`` from
``[d / 2, d]``, ``none`` keeps ``d``. Jitter is applied after the cap, so a delay never exceeds
``max_delay`` and a burst of failures does not retry in lockstep even once capped.
"""

from __future__ import annotations

import math
import random as _random
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ship_sqla.kernel._errors import ConfigurationError

if TYPE_CHECKING:
    from ship_sqla.kernel._jobs import RetryPolicy

__all__ = [
    "attempts_spent",
    "backoff_delay",
    "lock_held_delay",
    "retry_at",
    "retry_delay",
]

Random = Callable[[], float]
"""Returns a float in ``[0, 1)``, like :func:`random.random` (the default)."""

# 2.0 ** 1023 is the largest power of two a float holds; beyond it the delay is capped anyway.
_MAX_EXPONENT = 1023


def _check_attempt(attempt: int) -> None:
    if attempt < 1:
        raise ConfigurationError(
            f"attempt numbers start at 1, got {attempt}.",
            fix="pass the number of the attempt that just ran (ClaimedRun.attempt).",
        )


def backoff_delay(policy: RetryPolicy, attempt: int) -> float:
    """The un-jittered delay in seconds after attempt ``attempt`` failed, capped by max_delay."""
    _check_attempt(attempt)
    if policy.backoff == "exponential":
        raw = policy.base_delay * 2.0 ** min(attempt - 1, _MAX_EXPONENT)
    elif policy.backoff == "linear":
        raw = policy.base_delay * attempt
    else:
        raw = policy.base_delay
    # A huge base times a huge power is inf, never an exception; min() then caps it.
    return min(raw, policy.max_delay) if not math.isnan(raw) else policy.max_delay


def _jittered(delay: float, jitter: str, draw: float) -> float:
    # ``draw`` is clamped so a misbehaving random source can never push a delay out of bounds.
    draw = 0.0 if math.isnan(draw) else min(max(draw, 0.0), 1.0)
    if jitter == "full":
        return delay * draw
    if jitter == "equal":
        half = delay / 2
        return half + half * draw
    return delay


def retry_delay(policy: RetryPolicy, attempt: int, *, random: Random = _random.random) -> float:
    """Seconds to wait after attempt ``attempt`` failed: ``0 <= delay <= policy.max_delay``.

    With ``jitter="none"`` the delay never decreases as ``attempt`` grows (exponential, linear);
    with ``jitter="equal"`` it is never below half the un-jittered delay.
    """
    return _jittered(backoff_delay(policy, attempt), policy.jitter, random())


def lock_held_delay(policy: RetryPolicy, *, random: Random = _random.random) -> float:
    """One jittered backoff step for a run returned to waiting because its single-runner lock is
    held elsewhere (J7, JOB_LOCK_HELD).

    The step is the first backoff delay with at least ``equal`` jitter: ``full`` jitter could draw
    ~0 and make a worker re-claim the same locked run in a tight loop, so a lock-held run always
    waits at least half a step.
    """
    jitter = "equal" if policy.jitter == "full" else policy.jitter
    return _jittered(backoff_delay(policy, 1), jitter, random())


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
