"""Properties of the schedule arithmetic (J9), over cron and interval schedules in DST zones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from ship_sqla.kernel._jobs import Schedule
from ship_sqla.kernel._plans.schedule import (
    due_occurrence,
    next_occurrence,
    occurrence_id,
    previous_occurrence,
)

CRONS = [
    "30 2 * * *",
    "0 3 * * *",
    "0,30 2 * * *",
    "15 1-3 * * *",
    "*/7 * * * *",
    "0 */2 * * *",
    "5 2 * * SUN",
    "0 0 1 * *",
    "0 0 L * *",
    "*/20 * * * * *",
]
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Santiago"]

cron_schedules = st.builds(
    lambda cron, zone: Schedule(cron=cron, timezone=zone),
    st.sampled_from(CRONS),
    st.sampled_from(ZONES),
)
interval_schedules = st.builds(
    lambda micros: Schedule(interval=timedelta(microseconds=micros)),
    st.integers(min_value=1, max_value=10 * 86_400 * 10**6),
)
schedules = st.one_of(cron_schedules, interval_schedules)
# Instants around the 2024 DST changes of the zones above weigh in, plus anything 2000-2040.
DST_DAYS = [
    datetime(2024, 3, 31, tzinfo=UTC),
    datetime(2024, 10, 27, tzinfo=UTC),
    datetime(2024, 3, 10, tzinfo=UTC),
    datetime(2024, 11, 3, tzinfo=UTC),
    datetime(2024, 4, 7, tzinfo=UTC),
    datetime(2024, 9, 8, tzinfo=UTC),
]
instants = st.one_of(
    st.datetimes(
        min_value=datetime(2000, 1, 1),  # noqa: DTZ001 - hypothesis bounds are naive
        max_value=datetime(2040, 1, 1),  # noqa: DTZ001
        timezones=st.just(UTC),
    ),
    st.builds(
        lambda day, seconds: day + timedelta(seconds=seconds),
        st.sampled_from(DST_DAYS),
        st.floats(min_value=-2 * 86_400, max_value=2 * 86_400),
    ),
)


@settings(max_examples=300, deadline=None)
@given(schedules, instants)
def test_next_occurrence_is_strictly_after_and_nothing_is_skipped(
    schedule: Schedule, after: datetime
) -> None:
    """J9: next_occurrence(after) > after, and the previous occurrence of it is not after
    `after` (no occurrence lies between `after` and the result)."""
    occurrence = next_occurrence(schedule, after)
    assert occurrence > after
    assert occurrence.tzinfo is UTC
    before = previous_occurrence(schedule, occurrence - timedelta(microseconds=1))
    assert before is None or before <= after


@settings(max_examples=300, deadline=None)
@given(schedules, instants, st.floats(min_value=0, max_value=3 * 86_400))
def test_next_occurrence_is_monotone(schedule: Schedule, after: datetime, gap: float) -> None:
    """J9: a later `after` never yields an earlier next occurrence."""
    later = after + timedelta(seconds=gap)
    assert next_occurrence(schedule, after) <= next_occurrence(schedule, later)


@settings(max_examples=300, deadline=None)
@given(schedules, instants, st.floats(min_value=0, max_value=30 * 86_400))
def test_a_tick_fires_at_most_once_and_lands_after_now(
    schedule: Schedule, start: datetime, downtime: float
) -> None:
    """J9: however long the process was down, one tick fires at most one run, for an occurrence
    in [next_at, now], and moves next_at past now; a second tick at the same now fires nothing."""
    next_at = next_occurrence(schedule, start)
    now = start + timedelta(seconds=downtime)
    fire, new_next = due_occurrence(schedule, next_at, now)
    assert new_next > now
    if next_at > now:
        assert fire is None
        assert new_next == next_at
    else:
        assert fire is not None
        assert next_at <= fire <= now
        # The latest missed occurrence: nothing between it and now.
        assert next_occurrence(schedule, fire) > now
        assert new_next == next_occurrence(schedule, now)
    assert due_occurrence(schedule, new_next, now) == (None, new_next)


@given(schedules, instants)
def test_occurrence_id_round_trips_the_instant(schedule: Schedule, after: datetime) -> None:
    """J9: the durable id names the occurrence exactly (ISO UTC), so it is stable."""
    occurrence = next_occurrence(schedule, after)
    job_id, _, text = occurrence_id("job.x", occurrence).partition("/")
    assert job_id == "job.x"
    assert text.endswith("Z")
    assert datetime.fromisoformat(text) == occurrence
