"""Schedule arithmetic (J9): occurrences, catch-up with one run, durable occurrence ids, DST."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from ship_sqla.errors import ConfigurationError
from ship_sqla.kernel._jobs import Schedule
from ship_sqla.kernel._plans.schedule import (
    due_occurrence,
    next_occurrence,
    occurrence_id,
    previous_occurrence,
    validate_schedule,
)

BERLIN = ZoneInfo("Europe/Berlin")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


# --- interval schedules ---------------------------------------------------------------------


def test_interval_is_anchored_on_the_unix_epoch() -> None:
    """J9: interval occurrences are multiples of the interval since 1970-01-01T00:00Z, so every
    process computes the same occurrence (and the same durable id) whenever it started."""
    every_5 = Schedule(interval=timedelta(minutes=5))
    assert next_occurrence(every_5, utc(2024, 5, 1, 12, 3, 10)) == utc(2024, 5, 1, 12, 5)
    assert next_occurrence(every_5, utc(2024, 5, 1, 12, 5)) == utc(2024, 5, 1, 12, 10)
    assert previous_occurrence(every_5, utc(2024, 5, 1, 12, 5)) == utc(2024, 5, 1, 12, 5)
    assert previous_occurrence(every_5, utc(2024, 5, 1, 12, 9, 59)) == utc(2024, 5, 1, 12, 5)
    odd = Schedule(interval=timedelta(seconds=7, microseconds=3))
    after = utc(2024, 5, 1, 12, 3, 10)
    occurrence = next_occurrence(odd, after)
    assert after < occurrence <= after + timedelta(seconds=7, microseconds=3)
    assert (occurrence - datetime(1970, 1, 1, tzinfo=UTC)) % timedelta(
        seconds=7, microseconds=3
    ) == timedelta(0)


def test_results_are_utc_whatever_the_input_zone() -> None:
    every_hour = Schedule(interval=timedelta(hours=1))
    after = datetime(2024, 5, 1, 14, 30, tzinfo=BERLIN)  # 12:30 UTC
    result = next_occurrence(every_hour, after)
    assert result == utc(2024, 5, 1, 13)
    assert result.tzinfo is UTC


def test_naive_datetimes_are_refused_with_the_fix() -> None:
    schedule = Schedule(interval=timedelta(minutes=1))
    with pytest.raises(ValueError, match=r"naive datetime.*Fix: pass datetime.now\(UTC\)"):
        next_occurrence(schedule, datetime(2024, 1, 1))  # noqa: DTZ001 - the point of the test
    with pytest.raises(ValueError, match="naive"):
        due_occurrence(schedule, utc(2024, 1, 1), datetime(2024, 1, 1))  # noqa: DTZ001
    with pytest.raises(ValueError, match="naive"):
        occurrence_id("job", datetime(2024, 1, 1))  # noqa: DTZ001


# --- cron schedules -------------------------------------------------------------------------


def test_cron_in_utc() -> None:
    quarter = Schedule(cron="*/15 * * * *")
    assert next_occurrence(quarter, utc(2024, 1, 1, 10, 7)) == utc(2024, 1, 1, 10, 15)
    assert next_occurrence(quarter, utc(2024, 1, 1, 10, 15)) == utc(2024, 1, 1, 10, 30)
    assert next_occurrence(quarter, utc(2024, 1, 1, 10, 14, 59, 999999)) == utc(2024, 1, 1, 10, 15)
    assert previous_occurrence(quarter, utc(2024, 1, 1, 10, 15)) == utc(2024, 1, 1, 10, 15)
    assert previous_occurrence(quarter, utc(2024, 1, 1, 10, 14, 59)) == utc(2024, 1, 1, 10)


def test_cron_is_evaluated_in_the_schedule_time_zone() -> None:
    """J9: a cron expression means wall time in the schedule's IANA zone."""
    nine_new_york = Schedule(cron="0 9 * * MON-FRI", timezone="America/New_York")
    # Friday 2024-01-05 15:00 UTC is 10:00 in New York: the next is Monday 09:00 EST.
    assert next_occurrence(nine_new_york, utc(2024, 1, 5, 15)) == utc(2024, 1, 8, 14)


def _daily_local_times(cron: str, start: datetime, days: int) -> list[datetime]:
    schedule = Schedule(cron=cron, timezone="Europe/Berlin")
    found: list[datetime] = []
    at = start
    for _ in range(days):
        at = next_occurrence(schedule, at)
        found.append(at)
    return found


@pytest.mark.parametrize(
    ("cron", "start", "expected_utc"),
    [
        # Spring forward, Sunday 2024-03-31: 02:00 CET jumps to 03:00 CEST. 02:30 does not exist
        # that day; cronsim fires at the first valid minute after the gap, 03:00 CEST.
        (
            "30 2 * * *",
            utc(2024, 3, 29, 12),
            [utc(2024, 3, 30, 1, 30), utc(2024, 3, 31, 1), utc(2024, 4, 1, 0, 30)],
        ),
        (
            "0 3 * * *",
            utc(2024, 3, 29, 12),
            [utc(2024, 3, 30, 2), utc(2024, 3, 31, 1), utc(2024, 4, 1, 1)],
        ),
        # Fall back, Sunday 2024-10-27: 03:00 CEST goes back to 02:00 CET. 02:30 happens twice;
        # cronsim fires once, at the first (summer time) instance, 00:30 UTC.
        (
            "30 2 * * *",
            utc(2024, 10, 25, 12),
            [utc(2024, 10, 26, 0, 30), utc(2024, 10, 27, 0, 30), utc(2024, 10, 28, 1, 30)],
        ),
        (
            "0 3 * * *",
            utc(2024, 10, 25, 12),
            [utc(2024, 10, 26, 1), utc(2024, 10, 27, 2), utc(2024, 10, 28, 2)],
        ),
    ],
)
def test_daily_cron_across_dst_fires_once_per_day_at_local_time(
    cron: str, start: datetime, expected_utc: list[datetime]
) -> None:
    """J9: a daily cron in Europe/Berlin fires once per local day across both DST changes, at
    the declared local time (a nonexistent local time fires at the end of the gap)."""
    assert _daily_local_times(cron, start, 3) == expected_utc


@pytest.mark.parametrize("cron", ["30 2 * * *", "0 3 * * *"])
@pytest.mark.parametrize("start", [utc(2024, 3, 25), utc(2024, 10, 21)])
def test_ticking_every_five_minutes_through_a_dst_week_fires_once_per_local_day(
    cron: str, start: datetime
) -> None:
    """J9: a scheduler ticking through a DST week fires exactly one run per local day, and the
    run's occurrence is at the declared local time (or the end of the spring-forward gap)."""
    schedule = Schedule(cron=cron, timezone="Europe/Berlin")
    next_at = next_occurrence(schedule, start)
    fired: list[datetime] = []
    now = start
    while now < start + timedelta(days=7):
        now += timedelta(minutes=5)
        fire, next_at = due_occurrence(schedule, next_at, now)
        if fire is not None:
            fired.append(fire)
    per_day = Counter(f.astimezone(BERLIN).date() for f in fired)
    assert len(per_day) == 7
    assert set(per_day.values()) == {1}
    hour, minute = (2, 30) if cron.startswith("30") else (3, 0)
    for occurrence in fired:
        local = occurrence.astimezone(BERLIN)
        in_gap = local.date().isoformat() == "2024-03-31" and hour == 2
        assert (local.hour, local.minute) == ((3, 0) if in_gap else (hour, minute))


def test_next_occurrence_from_inside_the_autumn_fold_is_later() -> None:
    """J9: started in the second 02:10 (CET) the first 02:30 (CEST) is already past; the next
    occurrence is strictly later (tomorrow), never in the past."""
    schedule = Schedule(cron="30 2 * * *", timezone="Europe/Berlin")
    second_0210 = utc(2024, 10, 27, 1, 10)  # 02:10 CET, after the fold
    assert next_occurrence(schedule, second_0210) == utc(2024, 10, 28, 1, 30)
    assert previous_occurrence(schedule, second_0210) == utc(2024, 10, 27, 0, 30)


# --- catch-up -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schedule",
    [Schedule(interval=timedelta(minutes=10)), Schedule(cron="*/10 * * * *")],
    ids=["interval", "cron"],
)
def test_a_process_down_for_ten_occurrences_catches_up_with_one_run(schedule: Schedule) -> None:
    """J9: a process that was down for ten occurrences catches up with ONE run, not a storm:
    the latest missed occurrence fires, and next_at moves to the first occurrence after now."""
    next_at = utc(2024, 6, 1, 8)
    now = next_at + timedelta(minutes=10 * 9, seconds=42)  # ten occurrences missed (08:00..09:30)
    fire, new_next = due_occurrence(schedule, next_at, now)
    assert fire == utc(2024, 6, 1, 9, 30)
    assert new_next == utc(2024, 6, 1, 9, 40)
    # Every further tick before 09:40 fires nothing: exactly one run for the whole outage.
    for seconds in range(0, 9 * 60, 30):
        again, same_next = due_occurrence(schedule, new_next, now + timedelta(seconds=seconds))
        assert again is None
        assert same_next == new_next
    assert due_occurrence(schedule, new_next, utc(2024, 6, 1, 9, 40)) == (
        utc(2024, 6, 1, 9, 40),
        utc(2024, 6, 1, 9, 50),
    )


def test_not_yet_due_fires_nothing_and_keeps_next_at() -> None:
    """J9: a tick before next_at changes nothing (next_at is kept as stored)."""
    schedule = Schedule(cron="0 3 * * *", timezone="Europe/Berlin")
    next_at = utc(2024, 6, 2, 1)
    assert due_occurrence(schedule, next_at, utc(2024, 6, 2, 0, 59)) == (None, next_at)


def test_due_exactly_at_next_at_fires_it() -> None:
    schedule = Schedule(interval=timedelta(hours=1))
    assert due_occurrence(schedule, utc(2024, 6, 2, 1), utc(2024, 6, 2, 1)) == (
        utc(2024, 6, 2, 1),
        utc(2024, 6, 2, 2),
    )


def test_next_at_off_the_grid_still_fires_once() -> None:
    """J9: a stored next_at that is not an occurrence of the schedule (kept from before a
    restart) fires once, never an occurrence before it."""
    schedule = Schedule(cron="0 * * * *")
    fire, new_next = due_occurrence(schedule, utc(2024, 6, 2, 1, 30), utc(2024, 6, 2, 1, 45))
    assert fire == utc(2024, 6, 2, 1, 30)
    assert new_next == utc(2024, 6, 2, 2)


# --- durable occurrence ids -----------------------------------------------------------------


def test_occurrence_id_is_stable_iso_utc() -> None:
    """J9: the durable run id is <job_id>/<occurrence in ISO UTC>, the same for the same instant
    in any time zone."""
    instant = utc(2024, 3, 31, 1)
    assert occurrence_id("reports.daily", instant) == "reports.daily/2024-03-31T01:00:00Z"
    as_berlin = instant.astimezone(BERLIN)
    as_fixed = instant.astimezone(timezone(timedelta(hours=-7)))
    assert occurrence_id("reports.daily", as_berlin) == occurrence_id("reports.daily", as_fixed)
    assert occurrence_id("j", utc(2024, 1, 2, 3, 4, 5, 60)) == "j/2024-01-02T03:04:05.000060Z"


# --- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "61 * * * *"}, "cron expression '61 \\* \\* \\* \\*' is not valid: Bad minute"),
        ({"cron": "@daily"}, "aliases are not supported"),
        ({"cron": "* * * *"}, "Wrong number of fields"),
        ({"cron": "0 0 30 2 *"}, "Bad day-of-month"),
        ({"cron": "0 3 * * *", "timezone": "Mars/Olympus_Mons"}, "unknown to this system"),
        ({"cron": "0 3 * * *", "timezone": ""}, "not an IANA time zone name"),
        ({"cron": "0 3 * * *", "timezone": "../etc/passwd"}, "unknown to this system"),
        ({"interval": timedelta(minutes=1), "timezone": "Nowhere/City"}, "unknown"),
    ],
)
def test_validate_schedule_rejects_bad_cron_and_zones(kwargs: dict[str, object], message: str):
    """J9: cron expressions and time zones are validated at declaration with a clear
    ConfigurationError that names the fix."""
    with pytest.raises(ConfigurationError, match=message) as caught:
        Schedule(**kwargs)  # type: ignore[arg-type]
    assert caught.value.code == "SHIP_SQLA_CONFIGURATION"
    assert caught.value.fix


@pytest.mark.parametrize(
    "schedule",
    [
        Schedule(cron="0 3 * * *", timezone="Europe/Berlin"),
        Schedule(cron="*/5 * * * *"),
        Schedule(cron="0 0 L * *", timezone="Asia/Kolkata"),
        Schedule(cron="30 0 9 * * MON", timezone="America/New_York"),  # six fields: seconds first
        Schedule(interval=timedelta(seconds=30)),
    ],
)
def test_validate_schedule_accepts_good_ones(schedule: Schedule) -> None:
    validate_schedule(schedule)
