"""Run priorities (K6): a bounded integer, higher first.

A run's priority is its enqueue's ``priority=`` when given, else its job definition's
(``define_job(priority=...)``, default :data:`DEFAULT_PRIORITY`). A claim takes the due runs of a
job in the order ``priority`` descending, then ``run_at``, then creation order: a due run of a
higher priority is claimed before every due run of a lower one, however long that one has
waited, unless its job ages priorities (F10, :class:`Aging`: then the order is by *effective*
priority, :func:`effective_priority`). A delayed run is not due, whatever its priority.

The bound keeps a claim's cost bounded: on PostgreSQL a claim walks the job's priority levels
from the highest down, reading about one index entry per level it visits beside the runs it
takes, so at most ``MAX_PRIORITY - MIN_PRIORITY + 1`` (21) levels can ever be in use.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any, Final

import attrs

from ship_sqla.kernel._durations import require_duration
from ship_sqla.kernel._errors import ConfigurationError, UsageError

__all__ = [
    "DEFAULT_PRIORITY",
    "MAX_AGING_EVERY",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "Aging",
    "InvalidPriorityError",
    "aging_bound",
    "check_priority_field",
    "effective_priority",
    "require_priority",
]

MIN_PRIORITY: Final = -10
MAX_PRIORITY: Final = 10
DEFAULT_PRIORITY: Final = 0


class InvalidPriorityError(UsageError, ValueError):
    """A priority is not an int from :data:`MIN_PRIORITY` to :data:`MAX_PRIORITY`; raised by
    ``define_job`` or before an enqueue writes anything."""

    code = "SHIP_SQLA_JOB_PRIORITY_INVALID"


def require_priority(value: object, what: str) -> int:
    """``value`` when it is an int (not a bool) within the bounds; else
    :class:`InvalidPriorityError` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidPriorityError(
            f"{what} must be an int, got {type(value).__name__} {value!r}.",
            fix=f"pass an int from {MIN_PRIORITY} to {MAX_PRIORITY} (higher runs first).",
        )
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidPriorityError(
            f"{what} must be from {MIN_PRIORITY} to {MAX_PRIORITY}, got {value}.",
            fix=f"pass an int from {MIN_PRIORITY} to {MAX_PRIORITY}: higher runs first,"
            f" {DEFAULT_PRIORITY} is the default.",
        )
    return value


def check_priority_field(_instance: object, attribute: Any, value: object) -> None:  # noqa: ANN401 - an attrs.Attribute
    """An attrs validator: :func:`require_priority` naming the field."""
    require_priority(value, attribute.name)


MAX_AGING_EVERY: Final = 86_400.0
"""The longest ``Aging.every``: a day."""


def _aging_step(_instance: object, _attribute: Any, value: Any) -> None:  # noqa: ANN401
    top = MAX_PRIORITY - MIN_PRIORITY
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        raise ConfigurationError(
            f"aging.step must be an int from 1 to {top}, got {value!r}.",
            fix="pass how many priority levels a waiting run rises per aging.every,"
            " e.g. Aging(step=1, every=30.0).",
        )


def _aging_every(value: object) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    seconds = require_duration(value, "aging.every", maximum=MAX_AGING_EVERY)
    if round(seconds * 1_000_000) < 1:
        raise ConfigurationError(
            f"aging.every must be at least a microsecond, got {value!r}.",
            fix="pass aging.every in seconds, e.g. Aging(step=1, every=30.0).",
        )
    return seconds


def _aging_ceiling(_instance: object, _attribute: Any, value: object) -> None:  # noqa: ANN401
    require_priority(value, "aging.ceiling")


@attrs.frozen
class Aging:
    """F10, priority aging: a due run that has waited ``every`` seconds rises ``step`` priority
    levels, and ``step`` more each further ``every``, up to ``ceiling`` (default
    :data:`MAX_PRIORITY`); a run at or above the ceiling does not age. Its wait counts from its
    ``run_at`` (when it became due); its stored priority never changes.

    Aged runs of one effective priority are taken oldest first, so a run that has reached the
    ceiling goes before every run enqueued after it at the ceiling or below: under a steady
    stream of higher-priority runs (none above the ceiling) a run of priority ``p`` is passed
    over for at most :func:`aging_bound` ``(p)`` seconds plus one claim interval."""

    step: int = attrs.field(validator=_aging_step)
    every: float = attrs.field(converter=_aging_every)
    ceiling: int = attrs.field(default=MAX_PRIORITY, validator=_aging_ceiling)

    @property
    def every_us(self) -> int:
        """``every`` in whole microseconds: the unit both backends count the wait in (integer
        arithmetic on both sides, so the model and the SQL never round apart)."""
        return round(self.every * 1_000_000)


def _microseconds(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def effective_priority(priority: int, run_at: datetime, now: datetime, aging: Aging | None) -> int:
    """F10: the priority a due run of stored ``priority``, due since ``run_at``, claims with at
    ``now``: ``min(ceiling, priority + step * (wait // every))`` below the ceiling, its own
    priority otherwise (and without aging). PostgreSQL's aged claim computes the same in SQL
    (``ship_sqla._jobs._sql.claim``), on the same whole microseconds."""
    if aging is None or priority >= aging.ceiling:
        return priority
    waited = max(_microseconds(now - run_at), 0)
    return min(aging.ceiling, priority + aging.step * (waited // aging.every_us))


def aging_bound(priority: int, aging: Aging) -> timedelta:
    """F10: how long a due run of ``priority`` waits before it reaches the ceiling, where no
    run enqueued after it (at or below the ceiling) is claimed before it:
    ``ceil((ceiling - priority) / step) * every``; zero at or above the ceiling."""
    if priority >= aging.ceiling:
        return timedelta(0)
    steps = math.ceil((aging.ceiling - priority) / aging.step)
    return timedelta(microseconds=steps * aging.every_us)
