"""Durations given as options: one check for every one of them, before any work starts.

A lease, a poll interval or a timeout of ``nan``, ``inf`` or ``1e12`` seconds is accepted by
Python's arithmetic and then breaks later, far from where it was given: ``now + timedelta(
seconds=1e12)`` overflows at every claim, ``nan`` compares false with everything, so a loop
never waits or never wakes. :func:`require_duration` refuses such values where the option is
given, naming the option and the bound.

Every duration option of the job backends and the runtime is checked here (``concurrency.lease``,
``retry.base_delay`` / ``retry.max_delay``, ``poll_interval``, ``operation_timeout``,
``drain_timeout``, ``queue_sample_interval``, a job's ``timeout``); other areas should use it
too rather than a check of their own.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Final

from ship_sqla.kernel._errors import ConfigurationError

__all__ = [
    "MAX_DRAIN_TIMEOUT",
    "MAX_JOB_TIMEOUT",
    "MAX_LEASE",
    "MAX_OPERATION_TIMEOUT",
    "MAX_POLL_INTERVAL",
    "MAX_RETRY_DELAY",
    "MAX_SAMPLE_INTERVAL",
    "require_duration",
    "require_lock_lease",
]

_MINUTE: Final = 60.0
_HOUR: Final = 60 * _MINUTE
_DAY: Final = 24 * _HOUR

MAX_LEASE: Final = _DAY
"""``concurrency.lease``: a worker that died holds its runs this long before they are retaken
(J6); beyond a day that is an outage, not a lease (heartbeats keep long runs alive anyway)."""
MAX_RETRY_DELAY: Final = 365 * _DAY
"""``retry.base_delay`` and ``retry.max_delay``."""
MAX_POLL_INTERVAL: Final = _HOUR
"""``poll_interval``: the longest a due run may wait for a worker that got no local wake (J3)."""
MAX_OPERATION_TIMEOUT: Final = _HOUR
"""``operation_timeout`` of one backend operation."""
MAX_DRAIN_TIMEOUT: Final = _DAY
"""``drain_timeout`` of ``start_job_runtime`` / ``runtime.stop`` (J12)."""
MAX_SAMPLE_INTERVAL: Final = _DAY
"""``queue_sample_interval`` of ``start_job_runtime`` (J10)."""
MAX_JOB_TIMEOUT: Final = 7 * _DAY
"""``define_job(timeout=)`` (K5): heartbeats keep a long run's lease, so a run may outlast a lease;
a week bounds the arithmetic, not the use."""


def _seconds(bound: float) -> str:
    for unit, size in (("day", _DAY), ("hour", _HOUR), ("minute", _MINUTE)):
        if bound >= size and bound % size == 0:
            count = bound / size
            return f"{bound:g} s ({count:g} {unit}{'' if count == 1 else 's'})"
    return f"{bound:g} s"


def require_duration(
    value: object, name: str, *, maximum: float, allow_zero: bool = False
) -> float:
    """``value`` as float seconds, when it is a real number (not a bool), finite, positive (or
    zero with ``allow_zero``) and at most ``maximum``; else :class:`ConfigurationError` naming
    ``name`` and the bound it broke."""
    lowest = "zero or more" if allow_zero else "positive"
    fix = f"pass {name} as a {lowest} number of seconds, at most {_seconds(maximum)}."
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ConfigurationError(
            f"{name} must be a number of seconds, got {value!r} ({type(value).__name__}).",
            fix=fix,
        )
    too_long = ConfigurationError(
        f"{name} must be at most {_seconds(maximum)}, got {value!r}.", fix=fix
    )
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond any float
        raise too_long from None
    if not math.isfinite(seconds):
        raise ConfigurationError(f"{name} must be finite, got {value!r}.", fix=fix)
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ConfigurationError(f"{name} must be {lowest}, got {value!r}.", fix=fix)
    if seconds > maximum:
        raise too_long
    return seconds


def require_lock_lease(lease: object) -> float:
    """The lease of every lock provider's ``acquire`` and ``extend`` (L2): a ``nan`` or ``inf``
    lease would never end (the timer compares false or sleeps forever) and ``1e12`` would
    outlive every holder, so it is a positive, finite number of seconds within MAX_LEASE."""
    return require_duration(lease, "lock lease", maximum=MAX_LEASE)
