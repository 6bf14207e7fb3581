"""Schedule arithmetic for recurring jobs (J9): pure functions, no I/O, no database.

Every instant going in or out is an aware ``datetime`` in UTC. Cron expressions are parsed and
iterated by the maintained ``cronsim`` library (never by hand) in the schedule's IANA time zone
(``zoneinfo``), so "02:30 every day in Europe/Berlin" stays 02:30 local across both DST changes.

Occurrences:

- ``Schedule(cron=..., timezone=...)``: cronsim's occurrences, five fields (``m h dom mon dow``)
  or six with a leading seconds field, with cronsim's extensions (``L``, ``#``, ``MON``,
  ``JAN``). DST follows cronsim (Debian cron's rules) for expressions with a fixed minute AND
  hour: a local time that does not exist (the spring-forward gap, e.g. 02:30 in
  Europe/Berlin on the last Sunday of March) fires at the first valid minute after the gap (03:00
  local); a local time that exists twice (the autumn fold) fires once, at its first (summer-time)
  instance. Expressions whose minute or hour is a wildcard/step (``*/15 * * * *``) run on real
  elapsed time and are unaffected by the fold or gap.
- ``Schedule(interval=...)``: the multiples of the interval counted from the Unix epoch
  (1970-01-01T00:00:00Z). The anchor is fixed, not "when the process started", so every process
  and every restart computes the same occurrences and therefore the same durable run id
  ``<job_id>/<occurrence>``; an interval that divides a day lands on round UTC times (every
  5 minutes fires at :00, :05, ...). Weekly intervals therefore fall on Thursdays 00:00 UTC (the
  epoch's weekday): use cron for a wall-clock weekday.

Catch-up (J9): :func:`due_occurrence` fires ONE run for the latest occurrence at or before now,
however many were missed, and advances to the first occurrence strictly after now.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from ship_sqla.kernel._errors import ConfigurationError

if TYPE_CHECKING:
    from ship_sqla.kernel._jobs import Schedule

__all__ = [
    "due_occurrence",
    "next_occurrence",
    "occurrence_id",
    "previous_occurrence",
    "validate_schedule",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# A fixed, ordinary instant to try a cron expression against when validating it.
_PROBE = datetime(2024, 1, 1, tzinfo=UTC)


def _require_aware(name: str, value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            f"{name}={value!r} is a naive datetime; schedule arithmetic needs an aware instant."
            " Fix: pass datetime.now(UTC) or clock.now() (aware UTC)."
        )
    return value.astimezone(UTC)


def _zone(key: str) -> ZoneInfo:
    if not key:
        raise ConfigurationError(
            f"schedule time zone {key!r} is not an IANA time zone name.",
            fix="use a name such as 'UTC', 'Europe/Berlin' or 'America/New_York'.",
        )
    try:
        return ZoneInfo(key)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigurationError(
            f"schedule time zone {key!r} is unknown to this system's time zone database.",
            fix="use an IANA name such as 'Europe/Berlin', or install the 'tzdata' package"
            " where the OS has no zoneinfo files (Windows, slim containers).",
        ) from exc


def _cron(expression: str, start: datetime, *, reverse: bool = False) -> CronSim:
    try:
        return CronSim(expression, start, reverse=reverse)
    except CronSimError as exc:
        raise ConfigurationError(
            f"cron expression {expression!r} is not valid: {exc}.",
            fix="use five fields 'minute hour day-of-month month day-of-week' such as"
            " '30 2 * * *' (or six with a leading seconds field); '@daily'-style aliases are"
            " not supported, write '0 0 * * *'.",
        ) from exc


def validate_schedule(schedule: Schedule) -> None:
    """Raise :class:`ConfigurationError` unless ``schedule``'s cron and time zone are usable.

    Meant to run when the schedule is declared (``Schedule.__attrs_post_init__``), so a typo
    fails at import time rather than at the first tick.
    """
    zone = _zone(schedule.timezone)
    if schedule.cron is None:
        return
    iterator = _cron(schedule.cron, _PROBE.astimezone(zone))
    try:
        next(iterator)
    except StopIteration:
        raise ConfigurationError(
            f"cron expression {schedule.cron!r} has no occurrence within 50 years.",
            fix="check the day-of-month and month fields (e.g. '0 0 31 4 *' never happens).",
        ) from None


def _next_cron(expression: str, zone: ZoneInfo, after: datetime) -> datetime:
    iterator = _cron(expression, after.astimezone(zone))
    # cronsim walks local wall time; started inside the autumn fold (the second 02:xx) it can
    # yield the first 02:30, which is before `after`. Skip such candidates: the next one is
    # strictly later.
    for candidate in iterator:
        occurrence: datetime = candidate.astimezone(UTC)
        if occurrence > after:
            return _not_skipped(expression, zone, after, occurrence)
    raise ConfigurationError(
        f"cron expression {expression!r} has no occurrence within 50 years of {after.isoformat()}.",
        fix="check the day-of-month and month fields.",
    )


def _not_skipped(
    expression: str, zone: ZoneInfo, after: datetime, occurrence: datetime
) -> datetime:
    """``occurrence``, or an earlier one after ``after`` that cronsim's forward iteration
    skipped: right after a fold that ends on the half hour (Australia/Lord_Howe, whose clocks go
    back from 02:00 to 01:30) it steps from 00:00 to 04:00, missing 02:00 +10:30, which its
    reverse iteration (and so :func:`previous_occurrence`) has. An occurrence is what either
    direction yields."""
    while True:
        earlier = next(_cron(expression, occurrence.astimezone(zone), reverse=True), None)
        if earlier is None or earlier.astimezone(UTC) <= after:
            return occurrence
        occurrence = earlier.astimezone(UTC)


def _interval_index(interval: timedelta, at: datetime) -> int:
    """How many whole intervals lie between the epoch and ``at`` (floor; exact integers)."""
    return (at - _EPOCH) // _MICROSECOND // (interval // _MICROSECOND)


def next_occurrence(schedule: Schedule, after: datetime) -> datetime:
    """The first occurrence of ``schedule`` strictly after ``after`` (aware; returned in UTC)."""
    after = _require_aware("after", after)
    if schedule.cron is not None:
        return _next_cron(schedule.cron, _zone(schedule.timezone), after)
    interval = _interval(schedule)
    occurrence: datetime = _EPOCH + interval * (_interval_index(interval, after) + 1)
    return occurrence


def previous_occurrence(schedule: Schedule, at: datetime) -> datetime | None:
    """The latest occurrence of ``schedule`` at or before ``at`` (UTC), or None if there is
    none within cronsim's 50-year horizon."""
    at = _require_aware("at", at)
    if schedule.cron is None:
        interval = _interval(schedule)
        occurrence: datetime = _EPOCH + interval * _interval_index(interval, at)
        return occurrence
    zone = _zone(schedule.timezone)
    # cronsim's reverse iteration yields occurrences strictly before its start second; start
    # one microsecond past `at` so an occurrence exactly at `at` counts.
    iterator = _cron(schedule.cron, (at + _MICROSECOND).astimezone(zone), reverse=True)
    try:
        candidate: datetime = next(iterator).astimezone(UTC)
    except StopIteration:
        return None
    # Reverse iteration and forward iteration disagree inside the autumn fold (reverse misses
    # the first 02:30 when started in the second 02:xx). The forward sequence is the
    # definition; walk it from the reverse candidate to the last occurrence <= at.
    while True:
        following = _next_cron(schedule.cron, zone, candidate)
        if following > at:
            return candidate
        candidate = following


def _interval(schedule: Schedule) -> timedelta:
    if schedule.interval is None:  # pragma: no cover - Schedule guarantees cron xor interval
        raise ConfigurationError("schedule has neither cron nor interval.")
    return schedule.interval


def due_occurrence(
    schedule: Schedule, next_at: datetime, now: datetime
) -> tuple[datetime | None, datetime]:
    """One scheduler tick (J9): ``(fire, new_next_at)``.

    When ``next_at`` is still in the future nothing fires: ``(None, next_at)``. Otherwise the
    tick fires ONE run however many occurrences were missed (a process down for ten
    occurrences catches up with one run, not a storm): ``fire`` is the LATEST occurrence at or
    before ``now`` (never earlier than ``next_at``), so the run's durable id names the most
    recent slot (a daily report for today, not for the day the process died).
    ``new_next_at`` is the first occurrence strictly after ``now``.
    """
    next_at = _require_aware("next_at", next_at)
    now = _require_aware("now", now)
    if next_at > now:
        return None, next_at
    latest = previous_occurrence(schedule, now)
    fire = next_at if latest is None or latest < next_at else latest
    return fire, next_occurrence(schedule, now)


def occurrence_id(job_id: str, occurrence: datetime) -> str:
    """The durable run id of one occurrence: ``<job_id>/<YYYY-MM-DDTHH:MM:SS[.ffffff]Z>``.

    The instant is written in UTC with a ``Z`` suffix, microseconds only when non-zero, so the
    same occurrence gives the same id in every process, time zone and Python version (J9: an
    insert of an id that exists is a duplicate tick, not a second run).
    """
    instant = _require_aware("occurrence", occurrence)
    text = instant.strftime("%Y-%m-%dT%H:%M:%S")
    if instant.microsecond:
        text = f"{text}.{instant.microsecond:06d}"
    return f"{job_id}/{text}Z"
