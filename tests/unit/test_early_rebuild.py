"""J17, J22: the rule of the runs table's early index rebuild (the fleet sampler's, between
two maintenance passes), on an injected clock: at the first sample after a held snapshot's
release, or when the largest index is far past the rebuild rule; never while a snapshot older
than the lock timeout (1 s) is held; a deferred check retried; and the sampler wired to it."""

from __future__ import annotations

from typing import Any

from ship_sqla.jobs import HealthBounds, HorizonHolder
from ship_sqla.kernel._early_rebuild import (
    EARLY_REBUILD_GAP,
    RETRIES,
    EarlyRebuild,
    RunsIndexRebuilder,
    rebuild_allowance,
)
from ship_sqla.kernel._health import StorageHealth, TableHealth
from ship_sqla.kernel._history_partitions import HistoryMaintenance, index_needs_rebuild
from ship_sqla.kernel._metrics import JobMetrics
from ship_sqla.kernel._ports import QueueDepth
from ship_sqla.kernel._runtime.depth import DepthSampler
from ship_sqla.kernel._runtime.wiring import Plumbing
from ship_sqla.testing import FrozenClock

MIB = 1 << 20
DONE = HistoryMaintenance(rebuilt=("ship_job_runs_pkey",))
DEFERRED = HistoryMaintenance(deferred=("rebuild ship_job_runs_pkey",))


def _health(
    largest: int | None, *, held: float | None = None, live: int = 0, alarm: float = 300.0
) -> StorageHealth:
    runs = TableHealth("runs", '"ship_job_runs"', live, 0, 0, None, largest)
    holder = None if held is None else HorizonHolder(7, "report", held)
    return StorageHealth(
        tables=(runs,), horizon=holder, bounds=HealthBounds(horizon_alarm=alarm), known=True
    )


def test_j17_the_allowance_is_the_rebuild_rules() -> None:
    """J17: the early rule's allowance is exactly what index_needs_rebuild allows."""
    for live in (-1, 0, 1_000, 100_000):
        allowed = rebuild_allowance(live)
        assert not index_needs_rebuild(allowed, live)
        assert index_needs_rebuild(allowed + 1, live)


def test_j17_j22_a_released_hold_calls_for_a_rebuild_at_the_next_sample_never_while_held() -> None:
    """J17, J22: a snapshot held 30 s or more is seen; while it (or any snapshot older than 1 s)
    is held nothing is due, however bloated; at the first sample without it the rebuild is due
    ("released", no gap); once a check completed, moderate bloat waits for the pass."""
    clock = FrozenClock()
    early = EarlyRebuild(clock)
    assert early.due(_health(2 * MIB, held=31.0)) is None
    assert early.hold_seen
    clock.advance(15)
    assert early.due(_health(100 * MIB, held=46.0)) is None
    assert early.due(_health(100 * MIB, held=1.5)) is None  # another holder, older than 1 s
    assert early.hold_seen
    clock.advance(15)
    assert early.due(_health(2 * MIB, held=0.2)) == "released"  # a short reader is no hold
    early.checked(DONE)
    assert not early.hold_seen
    assert early.due(_health(2 * MIB)) is None


def test_j17_a_short_hold_or_an_ordinary_load_is_left_to_the_pass_unless_far_past_the_rule() -> (
    None
):
    """J17: without a long hold released, only an index past 4x the rule's allowance is
    rebuilt early, at most once per gap (60 s); up to 4x it waits for the pass."""
    clock = FrozenClock()
    early = EarlyRebuild(clock)
    assert early.due(_health(2 * MIB, held=29.0)) is None
    assert not early.hold_seen
    assert early.due(_health(4 * MIB)) is None
    assert early.due(_health(4 * MIB + 1)) == "bloated"
    early.checked(DONE)
    clock.advance(EARLY_REBUILD_GAP - 1)
    assert early.due(_health(9 * MIB)) is None
    clock.advance(1)
    assert early.due(_health(9 * MIB)) == "bloated"
    assert early.due(_health(4 * 128 * 100_000 + 1, live=100_000)) == "bloated"
    assert early.due(_health(4 * 128 * 100_000, live=100_000)) is None


def test_j22_a_warned_about_hold_counts_whatever_its_age() -> None:
    """J22, J17: a hold past the health's alarm bound (the SHIP_SQLA_DB_HORIZON_HELD warning)
    counts as a long hold even when the bound is under 30 s."""
    early = EarlyRebuild(FrozenClock())
    assert early.due(_health(2 * MIB, held=11.0, alarm=10.0)) is None
    assert early.hold_seen
    assert early.due(_health(2 * MIB, alarm=10.0)) == "released"


def test_j17_a_release_with_nothing_to_rebuild_is_forgotten() -> None:
    """J17: a long hold released while every index is within the rule awaits nothing more: a
    later moderate growth is the pass's."""
    early = EarlyRebuild(FrozenClock())
    assert early.due(_health(MIB, held=60.0)) is None
    assert early.due(_health(MIB)) is None
    assert not early.hold_seen
    assert early.due(_health(2 * MIB)) is None


def test_j17_a_deferred_check_is_retried_at_the_next_samples_then_waits_the_gap() -> None:
    """J17: a check whose rebuild gave up on its 1 s lock (or was skipped) is due again at the
    next sample, RETRIES times in a row; then once per gap; a complete one ends the release."""
    clock = FrozenClock()
    early = EarlyRebuild(clock)
    early.due(_health(2 * MIB, held=40.0))
    for _ in range(RETRIES + 1):
        assert early.due(_health(2 * MIB)) == "released"
        early.checked(DEFERRED)
    assert early.due(_health(2 * MIB)) is None
    clock.advance(EARLY_REBUILD_GAP)
    assert early.due(_health(2 * MIB)) == "released"
    early.checked(HistoryMaintenance(rebuild_skipped="a snapshot held for 2 s"))
    assert early.due(_health(2 * MIB)) is None  # past RETRIES: the gap again
    clock.advance(EARLY_REBUILD_GAP)
    early.checked(DONE)
    assert early.due(_health(2 * MIB)) is None


def test_j17_nothing_is_due_without_a_known_runs_table_and_its_largest_index() -> None:
    """J17, J22: an unknown health, a health without the runs table, or without its index
    size never calls for a rebuild."""
    early = EarlyRebuild(FrozenClock())
    assert early.due(StorageHealth()) is None
    assert early.due(StorageHealth(known=True)) is None
    assert early.due(_health(None)) is None


class _Source:
    """A sampled source that keeps a history, reads a health (scripted) and rebuilds."""

    def __init__(self) -> None:
        self.health = _health(MIB // 2)
        self.passes = 0
        self.rebuilds = 0

    async def queue_depths(self, job_ids: Any) -> dict[str, QueueDepth]:
        return {job_id: QueueDepth(0, 0.0) for job_id in job_ids}

    async def maintain_history(self, retentions: Any = ()) -> HistoryMaintenance:
        del retentions
        self.passes += 1
        return HistoryMaintenance()

    async def storage_health(self) -> StorageHealth:
        return self.health

    async def rebuild_runs_indexes(self) -> HistoryMaintenance:
        self.rebuilds += 1
        return DONE


async def test_j17_j22_the_sampler_rebuilds_after_a_release_without_waiting_for_the_pass() -> None:
    """J17, J22, F5: the sampler's step (no metric reader: the runtime keeps the history itself)
    runs its pass at first; under a 40 s hold with bloated indexes it rebuilds nothing; at the
    first step after the release it runs the rebuild step alone, 30 s later, not 10 minutes."""
    source = _Source()
    assert isinstance(source, RunsIndexRebuilder)
    clock = FrozenClock()
    shared = Plumbing(clock, lambda _exc: None, lambda _n: 0.1)
    sampler = DepthSampler(source, JobMetrics(), ["a"], shared)  # type: ignore[arg-type]
    await sampler.step()
    assert (source.passes, source.rebuilds) == (1, 0)
    source.health = _health(50 * MIB, held=40.0)
    clock.advance(15)
    await sampler.step()
    assert source.rebuilds == 0
    source.health = _health(96 * MIB)
    clock.advance(15)
    await sampler.step()
    assert (source.passes, source.rebuilds) == (1, 1)
    assert [reason for reason, _ in sampler.early_rebuilds] == ["released"]
    source.health = _health(2 * MIB)
    clock.advance(15)
    await sampler.step()
    assert source.rebuilds == 1


async def test_j17_j22_the_lease_holders_sample_rebuilds_early_and_a_pass_counts_as_a_check() -> (
    None
):
    """J17, J22, F5: the sampler-lease holder's sample (a reader collects its gauges) reads
    the health after its queues and rebuilds at the first sample after the release; a
    maintenance pass that falls on the release's sample checked the indexes itself, so no
    early rebuild follows it."""
    source = _Source()
    clock = FrozenClock()
    shared = Plumbing(clock, lambda _exc: None, lambda _n: 0.1)
    sampler = DepthSampler(source, JobMetrics(), ["a"], shared)  # type: ignore[arg-type]
    await sampler.sample()
    source.health = _health(50 * MIB, held=35.0)
    clock.advance(15)
    await sampler.sample()
    source.health = _health(60 * MIB)
    clock.advance(15)
    await sampler.sample()
    assert (source.passes, source.rebuilds) == (1, 1)
    source.health = _health(50 * MIB, held=35.0)
    clock.advance(600)  # the next sample is also the 10-minute pass's
    await sampler.sample()
    assert source.passes == 2
    source.health = _health(2 * MIB, held=50.0)
    clock.advance(15)
    await sampler.sample()
    source.health = _health(2 * MIB)
    clock.advance(600)
    await sampler.sample()  # the pass runs first and completes: the release is handled
    assert (source.passes, source.rebuilds) == (3, 1)
