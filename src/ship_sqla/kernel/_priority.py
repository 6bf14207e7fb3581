"""Run priorities (K6): a bounded integer, higher first.

A run's priority is its enqueue's ``priority=`` when given, else its job definition's
(``define_job(priority=...)``, default :data:`DEFAULT_PRIORITY`). A claim takes the due runs of a
job in the order ``priority`` descending, then ``run_at``, then creation order: a due run of a
higher priority is claimed before every due run of a lower one, however long that one has
waited (priorities are strict, nothing ages). A delayed run is not due, whatever its priority.

The bound keeps a claim's cost bounded: on PostgreSQL a claim walks the job's priority levels
from the highest down, reading about one index entry per level it visits beside the runs it
takes, so at most ``MAX_PRIORITY - MIN_PRIORITY + 1`` (21) levels can ever be in use.
"""

from __future__ import annotations

from typing import Any, Final

from ship_sqla.kernel._errors import UsageError

__all__ = [
    "DEFAULT_PRIORITY",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "InvalidPriorityError",
    "check_priority_field",
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
