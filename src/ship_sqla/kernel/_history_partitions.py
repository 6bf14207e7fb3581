"""J17: the rules of the run history's partitions, pure (no SQLAlchemy).

History (the runs that ended, J16) is partitioned by **state class** and by **UTC day** of
``finished_at``. A state class is the set of finished states that share one retention bound and
one partition tree:

- ``completed``: ``completed`` runs (``Retention.completed``);
- ``dead``: ``dead`` runs (``Retention.dead``);
- ``ended``: ``cancelled`` and ``discarded`` runs (the longer of the two retentions).

Each class has one partition per UTC day and a DEFAULT partition that catches the rows no
prepared day holds (maintenance fell behind, a clock far off): it is reported when not empty.

A day partition leaves by being dropped once its whole day is older than the class's retention:
the longest retention any registered job declares for a state of the class (retention is per
job, :class:`~ship_sqla.kernel.Retention`; the backend's registered jobs are the source, so no
definitions table is needed for it). A job whose retention is shorter keeps its rows until the
partition goes. No scheduled DELETE of history rows exists (J17).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Literal,
    Protocol,
    TypeAlias,
    get_args,
    runtime_checkable,
)

import attrs

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from ship_sqla.kernel._jobs import Retention

__all__ = [
    "DAYS_AHEAD",
    "INDEX_REBUILD_ENTRY_BYTES",
    "INDEX_REBUILD_FLOOR",
    "LOCK_TIMEOUT",
    "MAINTENANCE_INTERVAL",
    "STATE_CLASSES",
    "HistoryMaintainer",
    "HistoryMaintenance",
    "HistoryPlan",
    "StateClass",
    "class_retentions",
    "class_states",
    "day_of",
    "day_suffix",
    "default_suffix",
    "expired_days",
    "index_needs_rebuild",
    "is_rebuild_leftover",
    "parse_day_suffix",
    "plan_history",
    "state_class",
]

StateClass: TypeAlias = Literal["completed", "dead", "ended"]
STATE_CLASSES: Final[tuple[StateClass, ...]] = get_args(StateClass)

_CLASS_STATES: Final[Mapping[StateClass, tuple[str, ...]]] = {
    "completed": ("completed",),
    "dead": ("dead",),
    "ended": ("cancelled", "discarded"),
}

DAYS_AHEAD: Final = 3
"""Day partitions prepared after today (so today and three more days exist): a settle never
needs a day that maintenance has not created unless maintenance stopped for that long, and
then the DEFAULT partition takes the rows (reported, J22)."""

_DAY_FORMAT: Final = "%Y%m%d"

LOCK_TIMEOUT: Final = 1.0
"""Seconds any one partition DDL may wait for its lock (``lock_timeout``): a DDL queued behind
a long reader makes every settle into that class wait behind it, so it gives up after this and
is retried at the next pass (J17): no settle waits longer for maintenance."""

MAINTENANCE_INTERVAL: Final = 600.0
"""Seconds between two maintenance passes in the fleet's sampler-lease holder (F5); a pass
whose DDL gave up on its lock is retried at the next one."""


INDEX_REBUILD_FLOOR: Final = 1 << 20
"""Bytes under which a runs-table index is never rebuilt (1 MiB: 128 pages; rebuilding one
that small saves nothing worth a pass)."""

INDEX_REBUILD_ENTRY_BYTES: Final = 128
"""Bytes allowed per live run in each of the runs table's indexes before it counts as bloated:
twice a generous 64 B entry (a btree tuple of the widest key, its line pointer and the page's
free space at the default fill factor, about 2x a fresh build's ~30-45 B). An index grown by
inserts and vacuumed sits near 2x its fresh size; past 4x the free pages are never coming
back."""


def index_needs_rebuild(size_bytes: int, live_entries: int) -> bool:
    """Whether a runs-table index of ``size_bytes`` holding at most ``live_entries`` live runs
    is rebuilt by the maintenance pass (J17): larger than :data:`INDEX_REBUILD_FLOOR` and than
    :data:`INDEX_REBUILD_ENTRY_BYTES` a live entry. J16 keeps only live runs in the table, so
    ``live_entries`` is small and a rebuild cheap, while the index keeps every page it ever
    split into: a btree page is reused only once wholly empty and recycled, and the primary
    key's ids only grow (issue 39: +5.5 MiB over 2M runs with an empty queue)."""
    return size_bytes > max(INDEX_REBUILD_FLOOR, INDEX_REBUILD_ENTRY_BYTES * max(live_entries, 0))


def is_rebuild_leftover(index_name: str) -> bool:
    """Whether the INVALID index ``index_name`` is what an interrupted ``REINDEX
    CONCURRENTLY`` left (PostgreSQL names its transient copy ``<name>_ccnew``, and the old
    index ``<name>_ccold`` when only its drop failed, with a digit when the name was taken):
    dropping it is PostgreSQL's documented recovery. Other invalid indexes are the operator's."""
    stem = index_name.rstrip("0123456789")
    return stem.endswith(("_ccnew", "_ccold"))


def class_states(cls: StateClass) -> tuple[str, ...]:
    """The finished states of ``cls``."""
    return _CLASS_STATES[cls]


def state_class(state: str) -> StateClass:
    """The class of the finished ``state``."""
    for cls, states in _CLASS_STATES.items():
        if state in states:
            return cls
    msg = f"{state!r} is not a finished run state"
    raise ValueError(msg)


def day_of(moment: datetime) -> date:
    """The UTC day of ``moment`` (an aware datetime)."""
    return moment.astimezone(UTC).date()


def day_suffix(cls: StateClass, day: date) -> str:
    """The suffix of ``cls``'s partition of ``day``: ``_<class>_<YYYYMMDD>``."""
    return f"_{cls}_{day.strftime(_DAY_FORMAT)}"


def default_suffix(cls: StateClass) -> str:
    """The suffix of ``cls``'s DEFAULT partition: ``_<class>_default``."""
    return f"_{cls}_default"


def parse_day_suffix(cls: StateClass, suffix: str) -> date | None:
    """The day of a partition suffix of ``cls`` (None: not a day partition of it)."""
    head = f"_{cls}_"
    if not suffix.startswith(head):
        return None
    try:
        return datetime.strptime(suffix[len(head) :], _DAY_FORMAT).replace(tzinfo=UTC).date()
    except ValueError:
        return None


def class_retentions(retentions: Iterable[Retention]) -> dict[StateClass, timedelta]:
    """Each class's retention: the longest any of ``retentions`` (the registered jobs') keeps a
    state of the class; the default :class:`Retention` when there are none."""
    from ship_sqla.kernel._jobs import Retention  # noqa: PLC0415 - the kernel's job model

    chosen = list(retentions) or [Retention()]
    return {
        "completed": max(r.completed for r in chosen),
        "dead": max(r.dead for r in chosen),
        "ended": max(max(r.cancelled, r.discarded) for r in chosen),
    }


def expired_days(days: Iterable[date], retention: timedelta, now: datetime) -> list[date]:
    """The ``days`` whose whole UTC day ended more than ``retention`` before ``now``: every run
    in it is past retention, so its partition can be dropped. Oldest first."""
    cutoff = now.astimezone(UTC) - retention
    return sorted(
        day
        for day in days
        if datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=1) <= cutoff
    )


@attrs.frozen
class HistoryPlan:
    """What maintenance should do to one class's partitions: the days to ``create`` (missing,
    today to today + ``DAYS_AHEAD``) and to ``drop`` (expired), and the count of days ``ahead``
    (after today) that exist once the creations are done."""

    state_class: StateClass
    create: tuple[date, ...]
    drop: tuple[date, ...]
    ahead: int


def plan_history(
    cls: StateClass,
    existing: Iterable[date],
    retention: timedelta,
    now: datetime,
    days_ahead: int = DAYS_AHEAD,
) -> HistoryPlan:
    """The plan for ``cls`` given its ``existing`` day partitions (J17)."""
    have = set(existing)
    today = day_of(now)
    wanted = [today + timedelta(days=i) for i in range(days_ahead + 1)]
    create = tuple(day for day in wanted if day not in have)
    drop = tuple(day for day in expired_days(have, retention, now) if day < today)
    ahead = sum(1 for day in have | set(create) if day > today)
    return HistoryPlan(cls, create, drop, ahead)


@attrs.frozen
class HistoryMaintenance:
    """What one maintenance pass did (J17): the partitions ``created`` and ``dropped``, the
    DDL ``deferred`` (gave up on ``lock_timeout``: retried at the next pass), whether the
    parent was ``analyzed``, the rows found in each class's DEFAULT partition
    (``default_rows``: strays, reported when not zero) and the fewest days ready ahead of
    today over the classes (``partitions_ahead``).

    And the runs table's indexes (J16, J17): those ``rebuilt`` (``REINDEX CONCURRENTLY``,
    :func:`index_needs_rebuild`), the INVALID leftovers of an interrupted rebuild dropped
    (``leftovers_dropped``), the INVALID indexes left alone (``invalid``: not a rebuild's; the
    operator's to rebuild or drop), and why no rebuild was tried (``rebuild_skipped``: None
    when it was, or nothing needed one)."""

    created: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    deferred: tuple[str, ...] = ()
    analyzed: bool = False
    default_rows: tuple[tuple[StateClass, int], ...] = ()
    partitions_ahead: int | None = None
    rebuilt: tuple[str, ...] = ()
    leftovers_dropped: tuple[str, ...] = ()
    invalid: tuple[str, ...] = ()
    rebuild_skipped: str | None = None

    @property
    def strays(self) -> int:
        """Rows in the DEFAULT partitions, all classes."""
        return sum(rows for _, rows in self.default_rows)

    @property
    def complete(self) -> bool:
        """Nothing was deferred."""
        return not self.deferred

    def to_dict(self) -> dict[str, Any]:
        return {
            "created": list(self.created),
            "dropped": list(self.dropped),
            "deferred": list(self.deferred),
            "analyzed": self.analyzed,
            "default_rows": dict(self.default_rows),
            "partitions_ahead": self.partitions_ahead,
            "rebuilt": list(self.rebuilt),
            "leftovers_dropped": list(self.leftovers_dropped),
            "invalid": list(self.invalid),
            "rebuild_skipped": self.rebuild_skipped,
        }


@runtime_checkable
class HistoryMaintainer(Protocol):
    """A store whose run history is partitioned and kept by maintenance (J17)."""

    async def maintain_history(self, retentions: Sequence[Retention] = ()) -> HistoryMaintenance:
        """One maintenance pass; ``retentions``: the registered jobs' (each class keeps the
        longest of these and the history table's own)."""
        ...
