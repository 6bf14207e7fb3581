"""J17's pure rules: state classes, partition names, which days to create and which to drop
per class retention; the report; the fleet sampler's maintenance cadence (F5); the DEFAULT
partition's strays as a storage-health alarm (J22); the runs table's index rebuild rule."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from job_helpers import settle_loop
from sqlalchemy import MetaData

from ship_sqla import ship_job_history_table
from ship_sqla.jobs import HealthBounds, HorizonHolder, Retention
from ship_sqla.kernel._health import HORIZON_HELD, StorageHealth
from ship_sqla.kernel._history_partitions import (
    HistoryMaintainer,
    HistoryMaintenance,
    class_retentions,
    day_suffix,
    expired_days,
    index_needs_rebuild,
    is_rebuild_leftover,
    parse_day_suffix,
    plan_history,
    state_class,
)
from ship_sqla.kernel._metrics import JobMetrics
from ship_sqla.kernel._ports import QueueDepth
from ship_sqla.kernel._runtime.depth import DepthSampler
from ship_sqla.kernel._runtime.wiring import Plumbing
from ship_sqla.schema import ship_include_object
from ship_sqla.testing import FrozenClock

NOON = datetime(2026, 12, 6, 12, tzinfo=UTC)


def test_j17_state_classes_and_names() -> None:
    """J17: completed, dead, and ended (cancelled and discarded) classes; a day partition's
    suffix reads back as its day, anything else as None."""
    assert [state_class(s) for s in ("completed", "dead", "cancelled", "discarded")] == [
        "completed",
        "dead",
        "ended",
        "ended",
    ]
    suffix = day_suffix("dead", date(2026, 12, 6))
    assert suffix == "_dead_20261206"
    assert parse_day_suffix("dead", suffix) == date(2026, 12, 6)
    assert parse_day_suffix("ended", suffix) is None
    assert parse_day_suffix("dead", "_dead_default") is None


def test_j17_a_day_expires_once_its_whole_day_is_past_retention() -> None:
    """J17: a day partition is dropped only when its END is older than the retention: every
    run in it is past retention."""
    days = [date(2026, 12, d) for d in (3, 4, 5, 6)]
    assert expired_days(days, timedelta(days=1), NOON) == [date(2026, 12, 3), date(2026, 12, 4)]
    assert expired_days(days, timedelta(days=30), NOON) == []


def test_j17_plan_creates_today_and_three_ahead_and_counts_them() -> None:
    """J17: the plan creates the missing days from today to 3 ahead, drops the expired ones
    and counts the days ready after today (J22's partitions_ahead)."""
    existing = {date(2026, 12, 1), date(2026, 12, 6), date(2026, 12, 7)}
    plan = plan_history("completed", existing, timedelta(days=1), NOON)
    assert plan.create == (date(2026, 12, 8), date(2026, 12, 9))
    assert plan.drop == (date(2026, 12, 1),)
    assert plan.ahead == 3


def test_j17_each_class_keeps_the_longest_retention() -> None:
    """J17: per class, the longest of the retentions given (ended: cancelled or discarded)."""
    kept = class_retentions(
        [Retention(), Retention(dead=timedelta(days=90), cancelled=timedelta(days=40))]
    )
    assert kept == {
        "completed": timedelta(days=1),
        "dead": timedelta(days=90),
        "ended": timedelta(days=40),
    }


def test_j17_report_and_strays_alarm() -> None:
    """J17, J22: the report's strays and dict; runs in the DEFAULT partitions are an alarm."""
    report = HistoryMaintenance(default_rows=(("completed", 0), ("dead", 2)), deferred=("x",))
    assert report.strays == 2
    assert not report.complete
    assert report.to_dict()["default_rows"] == {"completed": 0, "dead": 2}
    health = StorageHealth(known=True, partitions_ahead=3, history_strays=2)
    assert [alarm.kind for alarm in health.alarms()] == ["history_strays"]
    assert health.to_dict()["history_strays"] == 2


class _Source:
    """A queue-depth source that keeps a history (a HistoryMaintainer)."""

    def __init__(self, deferred: tuple[str, ...] = ()) -> None:
        self.passes: list[tuple[Retention, ...]] = []
        self.deferred = deferred
        self.sampled = 0

    async def queue_depths(self, job_ids: Any) -> dict[str, QueueDepth]:
        self.sampled += 1
        return {job_id: QueueDepth(0, 0.0) for job_id in job_ids}

    async def maintain_history(self, retentions: Any = ()) -> HistoryMaintenance:
        self.passes.append(tuple(retentions))
        return HistoryMaintenance(deferred=self.deferred)


async def test_j17_the_fleet_sampler_maintains_at_first_then_every_interval() -> None:
    """J17, F5: the sampler (the fleet's sampler-lease holder) runs a pass at its first
    sample with its jobs' retentions, then once per interval; not while it samples no job
    (another runtime holds the lease)."""
    source = _Source()
    assert isinstance(source, HistoryMaintainer)
    clock = FrozenClock(NOON)
    shared = Plumbing(clock, lambda _exc: None, lambda _n: 0.1)
    jobs: list[str] = ["a"]
    kept = Retention(dead=timedelta(days=90))
    sampler = DepthSampler(
        source, JobMetrics(), ["a"], shared, jobs=lambda: jobs, retentions=[kept]
    )  # type: ignore[arg-type]
    await sampler.sample()
    await sampler.sample()
    assert source.passes == [(kept,)]
    clock.advance(600)
    await sampler.sample()
    assert len(source.passes) == 2
    jobs.clear()
    clock.advance(600)
    await sampler.sample()
    assert len(source.passes) == 2


async def test_j17_a_deferred_pass_is_retried_at_the_next_sample() -> None:
    """J17: a pass whose DDL gave up on its lock (1 s) is retried at the next sample, not an
    interval later."""
    source = _Source(deferred=("ship_job_history_completed_20261201",))
    shared = Plumbing(FrozenClock(NOON), lambda _exc: None, lambda _n: 0.1)
    sampler = DepthSampler(source, JobMetrics(), ["a"], shared)  # type: ignore[arg-type]
    await sampler.sample()
    await sampler.sample()
    assert len(source.passes) == 2


async def test_j17_maintenance_runs_whether_or_not_a_reader_collects_the_gauges() -> None:
    """J17, F5: a runtime whose queue gauges no metric reader collects (no OpenTelemetry SDK)
    never samples its queues, but still keeps the history: a pass when it starts, then one per
    maintenance interval."""
    source = _Source()
    clock = FrozenClock(NOON)
    metrics = JobMetrics()
    assert not metrics.gauges_collected
    shared = Plumbing(clock, lambda _exc: None, lambda _n: 0.1)
    sampler = DepthSampler(source, metrics, ["a"], shared, interval=15.0)  # type: ignore[arg-type]
    running = asyncio.create_task(sampler.run())
    try:
        await settle_loop()
        assert len(source.passes) == 1
        clock.advance(300)
        await settle_loop()
        assert len(source.passes) == 1
        clock.advance(300)
        await settle_loop()
        assert len(source.passes) == 2
        assert source.sampled == 0
    finally:
        sampler.close()
        await running


def test_j17_an_index_is_rebuilt_past_the_floor_and_its_live_entries_allowance() -> None:
    """J16, J17: a runs-table index is rebuilt only when larger than both 1 MiB and 128 B per
    live run; only PostgreSQL's names for an interrupted rebuild's copies are leftovers."""
    mib = 1 << 20
    assert not index_needs_rebuild(mib, 0)
    assert index_needs_rebuild(mib + 1, 0)
    assert not index_needs_rebuild(12 * mib, 100_000)  # 12.2 MiB allowed
    assert index_needs_rebuild(13 * mib, 100_000)
    assert index_needs_rebuild(mib + 1, -1)  # reltuples unknown (-1) counts as none
    assert is_rebuild_leftover("ship_job_runs_pkey_ccnew")
    assert is_rebuild_leftover("ship_job_runs_due_idx_ccnew12")
    assert is_rebuild_leftover("ship_job_runs_due_idx_ccold")
    assert not is_rebuild_leftover("ship_job_runs_mine")
    assert not is_rebuild_leftover("ship_job_runs_ccnewer")


class _HealthSource(_Source):
    """A history-keeping source that also reads a storage health whose snapshot is held."""

    def __init__(self) -> None:
        super().__init__()
        self.health_reads = 0

    async def storage_health(self) -> StorageHealth:
        self.health_reads += 1
        holder = HorizonHolder(4242, "nightly-report", 900.0)
        return StorageHealth(horizon=holder, bounds=HealthBounds(), known=True)


async def test_j22_the_held_snapshot_warning_is_logged_whether_or_not_a_reader_collects(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """J22, J17, F5: a runtime whose gauges no metric reader collects still reads the storage
    health every interval and logs the held-snapshot warning naming the holder (throttled as
    with a reader), without setting any gauge."""
    source = _HealthSource()
    clock = FrozenClock(NOON)
    metrics = JobMetrics()
    assert not metrics.gauges_collected
    shared = Plumbing(clock, lambda _exc: None, lambda _n: 0.1)
    sampler = DepthSampler(source, metrics, ["a"], shared, interval=15.0)  # type: ignore[arg-type]
    running = asyncio.create_task(sampler.run())
    try:
        with caplog.at_level(logging.WARNING, logger="ship_sqla.jobs"):
            await settle_loop()
            assert source.health_reads == 1
            clock.advance(15)
            await settle_loop()
            assert source.health_reads == 2
    finally:
        sampler.close()
        await running
    lines = [r.getMessage() for r in caplog.records if HORIZON_HELD in r.getMessage()]
    assert len(lines) == 1
    assert "pid 4242" in lines[0]
    assert source.sampled == 0


def test_j17_include_object_skips_only_the_history_partitions() -> None:
    """J17: the Alembic filter leaves out reflected tables named as a declared history
    table's partitions, and asks the application's filter about everything else."""
    metadata = MetaData()
    ship_job_history_table(metadata)
    asked: list[str] = []

    def own(_obj: Any, name: str | None, *_rest: Any) -> bool:
        asked.append(str(name))
        return True

    include = ship_include_object(metadata, own)

    class Reflected:
        schema = None

    for name in (
        "ship_job_history_completed",
        "ship_job_history_dead_default",
        "ship_job_history_ended_20261206",
    ):
        assert not include(Reflected(), name, "table", True, None)
    assert include(Reflected(), "orders_completed", "table", True, None)
    assert include(Reflected(), "ship_job_history", "table", True, object())
    assert asked == ["orders_completed", "ship_job_history"]
