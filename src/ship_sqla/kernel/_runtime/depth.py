"""J10's queue gauges: a worker runtime with metrics samples queues from the backend.

The gauges are observed by the OpenTelemetry SDK's reader thread, which cannot run a query, so
the runtime refreshes :class:`JobMetrics`'s snapshot every ``DEPTH_SAMPLE_INTERVAL`` seconds
instead. One sampler per fleet (F5): with a worker registry, only the runtime holding the
fleet's sampler lease samples, the queues of every job its fleet runs
(:mod:`ship_sqla.kernel._runtime.registration`, which tells this sampler what to sample, and
when a fresh lease makes a sample due at once); without one, each worker process samples (and
reports) its own jobs' database-wide values, and dashboards aggregate them with ``max``.

A sample costs one index entry read per waiting run (about 0.23 s at a million waiting runs), so
it is taken only once a metric reader has collected the gauges: metrics are on by default (the
global provider), but a process without an SDK, or whose SDK drops these instruments, never
queries its queues. The first sample follows the first collection within one interval; from then
on one per interval. With a backend that is not a :class:`QueueDepthSource`, or with
``queue_sample_interval=None``, nothing is ever sampled.

J22: with each sample, a source that is also a :class:`StorageHealthSource` is asked for its
storage health (a few catalog reads), which replaces the storage gauges and feeds the
held-snapshot warning (:class:`HorizonWarning`, ``SHIP_SQLA_DB_HORIZON_HELD``): so the fleet's
one sampler reports the database's health, the same interval as its queues. A failed health read
is reported (J11) and leaves the queue gauges alone.

J17: the same sampler (so the fleet's one sampler-lease holder, F5) runs the run history's
maintenance when the source is a :class:`HistoryMaintainer`: at its first sample, then once
per ``MAINTENANCE_INTERVAL`` (10 minutes), sooner (at the next sample) when a DDL gave up on
its lock (each waits at most 1 s, never holding settles longer). Each class keeps the longest
retention of this runtime's jobs and the history table's own. A failed pass is reported (J11).
Between passes, after each health read, :class:`EarlyRebuild` may call for the pass's runs-table
index rebuild step alone (``rebuild_runs_indexes``, a :class:`RunsIndexRebuilder` source): at the
first sample after a snapshot held for 30 s or more is released, or when the largest index is
4x past the rule (at most once a minute); never while a snapshot older than 1 s is held.

#36: with a history store (``stats``), each sample also records the jobs' backlog into their
minute rows (one statement), and every maintenance interval the rows older than
the store's ``retention`` are deleted; the sampler then samples whether or not a metric reader
collects the gauges (the history needs its backlog). A failed write is reported (J11).

Maintenance does not wait for a metric reader: a runtime whose gauges nobody collects (no
OpenTelemetry SDK) and that has no history store never takes the sampler lease (F5) and never
samples its queues, so it runs the passes itself, on the same cadence (a pass that finds nothing
to do is one catalog read and a count of the DEFAULT partitions' rows; its DDL is idempotent, so
runtimes passing at once are harmless). Only ``queue_sample_interval=None`` (no sampler at all)
leaves maintenance to ``ship-sqla jobs maintain``. Such a runtime also reads the storage health
every interval for the held-snapshot warning alone (J22: no gauge is set), so a forgotten
transaction is logged whether or not metrics are exported.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final

from ship_sqla.kernel._early_rebuild import EarlyRebuild, RunsIndexRebuilder
from ship_sqla.kernel._health import HorizonWarning, StorageHealthSource
from ship_sqla.kernel._history_partitions import (
    MAINTENANCE_INTERVAL,
    HistoryMaintainer,
    HistoryMaintenance,
)
from ship_sqla.kernel._parking import ParkedCountSource
from ship_sqla.kernel._stats import Backlog, minute_of
from ship_sqla.kernel._versions import VersionCountSource, stranded_runs
from ship_sqla.kernel._waiting import wait_event

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from ship_sqla.kernel._health import StorageHealth
    from ship_sqla.kernel._jobs import Retention
    from ship_sqla.kernel._metrics import JobMetrics
    from ship_sqla.kernel._ports import QueueDepth, QueueDepthSource
    from ship_sqla.kernel._runtime.wiring import Plumbing
    from ship_sqla.kernel._stats import JobStatsStore

__all__ = ["DEPTH_SAMPLE_INTERVAL", "DepthSampler"]

logger = logging.getLogger("ship_sqla.jobs")

EARLY_REBUILD: Final = "SHIP_SQLA_RUNS_INDEXES_REBUILT_EARLY"
"""The code of the INFO line a sampler logs when its early rebuild rebuilt an index."""

DEPTH_SAMPLE_INTERVAL: Final = 15.0
"""Seconds between samples: a metrics exporter's usual period, and one count per job's waiting
runs (an index-only scan of ``<runs>_due_idx``) at most this often per worker process."""


class DepthSampler:
    """Samples the queues of ``jobs()`` (default: ``job_ids``) into ``metrics`` every
    ``interval`` seconds of ``clock`` once the gauges were collected
    (:attr:`JobMetrics.gauges_collected`), and at once after :meth:`sample_soon`, until
    :meth:`close`. A failed sample goes to ``report_error`` (J11) and the previous snapshot
    stays until the next one succeeds. Only the sampled jobs' gauges are replaced (a process's
    runtimes share one :class:`JobMetrics`); a job ``jobs()`` no longer names, and at close
    every job, stops being reported."""

    def __init__(
        self,
        source: QueueDepthSource,
        metrics: JobMetrics,
        job_ids: Sequence[str],
        shared: Plumbing,
        *,
        interval: float = DEPTH_SAMPLE_INTERVAL,
        jobs: Callable[[], Sequence[str]] | None = None,
        served: Callable[[], Mapping[str, frozenset[int]]] | None = None,
        retentions: Sequence[Retention] = (),
        maintenance_interval: float = MAINTENANCE_INTERVAL,
        stats: JobStatsStore | None = None,
        early_rebuild: EarlyRebuild | None = None,
    ) -> None:
        self._source = source
        self._metrics = metrics
        self._job_ids = tuple(job_ids)
        self._jobs = jobs if jobs is not None else self._own_jobs
        # D9: the versions served per job, against which live runs count as stranded.
        self._served = served
        self._clock = shared.clock
        self._report_error = shared.report_error
        self._interval = interval
        self._closing = False
        self._wake = asyncio.Event()
        # The jobs whose gauges this sampler set: only those are forgotten when it stops
        # sampling them (another runtime of the process may report others).
        self._reported: set[str] = set()
        # J22: the storage health's read and warning, when the source reads one.
        self._health = source if isinstance(source, StorageHealthSource) else None
        self._horizon_warning = HorizonWarning(shared.clock)
        # J17: the history's maintenance, when the source keeps one; when it last ran.
        self._maintainer = source if isinstance(source, HistoryMaintainer) else None
        self._retentions = tuple(retentions)
        self._maintenance_interval = maintenance_interval
        self._maintained_at: float | None = None
        # J17, J22: the runs table's index rebuild before the next pass (a hold released).
        self._rebuilder = source if isinstance(source, RunsIndexRebuilder) else None
        self._early = (
            None
            if self._rebuilder is None or self._health is None
            else early_rebuild or EarlyRebuild(shared.clock)
        )
        self.early_rebuilds: list[tuple[str, HistoryMaintenance]] = []
        """The early checks run, latest last (at most 16 kept): their reason and result."""
        # #36: the history's backlog gauge and retention, and when it was last pruned.
        self._stats = stats
        self._pruned_at: float | None = None

    def _own_jobs(self) -> Sequence[str]:
        return self._job_ids

    async def sample(self) -> None:
        """Query the queues of the jobs to sample now (``jobs()``: by default this runtime's)
        once and replace their gauges; stop reporting the ones no longer to sample."""
        wanted = tuple(self._jobs())
        dropped = self._reported.difference(wanted)
        for job_id in dropped:
            self._metrics.forget_depth(job_id)
        self._metrics.update_versions(tuple(dropped), (), ())
        self._metrics.update_parked(tuple(dropped), {})
        self._reported -= dropped
        if not wanted:
            if self._health is not None:  # not the fleet's sampler (any more): not its health
                self._metrics.set_storage_health(None)
            return
        depths = await self._source.queue_depths(wanted)
        self._metrics.update_depths(
            {job_id: (queue.depth, queue.oldest_due_age) for job_id, queue in depths.items()}
        )
        self._reported.update(depths)
        await self._record_history(depths)
        if self._served is not None and isinstance(self._source, VersionCountSource):
            # D9: live runs per handler version, and those no registered worker serves.
            counts = await self._source.version_counts(wanted)
            self._metrics.update_versions(wanted, counts, stranded_runs(counts, self._served()))
        if isinstance(self._source, ParkedCountSource):
            # D10: the runs parked on a divergence, per job.
            self._metrics.update_parked(wanted, await self._source.parked_counts(wanted))
        await self._maintain()
        await self._sample_health()

    async def _maintain(self) -> None:
        """J17: a maintenance pass when due (see the module docstring)."""
        if self._maintainer is None:
            return
        now = self._clock.monotonic()
        last = self._maintained_at
        if last is not None and now - last < self._maintenance_interval:
            return
        self._maintained_at = now
        try:
            done = await self._maintainer.maintain_history(self._retentions)
        except Exception as exc:  # noqa: BLE001 - J11: reported; the next pass retries
            self._report_error(exc)
            return
        if self._early is not None:  # the pass checked the indexes too
            self._early.checked(done)
        if done.deferred:  # a lock was not granted within 1 s: again at the next sample
            self._maintained_at = None

    async def _rebuild_early(self, health: StorageHealth) -> None:
        """J17, J22: the runs table's index rebuild step now, when :class:`EarlyRebuild` says
        so (a held snapshot released, or the indexes far past the rule; never while one is
        held). A failed check is reported (J11) and retried as a deferred one."""
        early, rebuilder = self._early, self._rebuilder
        if early is None or rebuilder is None:
            return
        reason = early.due(health)
        if reason is None:
            return
        try:
            done = await rebuilder.rebuild_runs_indexes()
        except Exception as exc:  # noqa: BLE001 - J11: reported; the next sample retries
            self._report_error(exc)
            done = HistoryMaintenance(rebuild_skipped=f"failed: {type(exc).__name__}")
        early.checked(done)
        self.early_rebuilds = [*self.early_rebuilds[-15:], (reason, done)]
        if done.rebuilt:
            logger.info(
                "%s: %s (%s)",
                EARLY_REBUILD,
                ", ".join(done.rebuilt),
                "a held snapshot was released" if reason == "released" else "bloated",
                extra={"ship.code": EARLY_REBUILD, "ship.reason": reason},
            )

    async def _record_history(self, depths: Mapping[str, QueueDepth]) -> None:
        """#36: the backlog into this minute's rows; the retention's prune when due."""
        stats = self._stats
        if stats is None:
            return
        now = self._clock.now()
        backlog = {
            job_id: Backlog(queue.depth, queue.oldest_due_age) for job_id, queue in depths.items()
        }
        try:
            await stats.record_backlog(minute_of(now), backlog)
            pruned_at, mono = self._pruned_at, self._clock.monotonic()
            if pruned_at is None or mono - pruned_at >= self._maintenance_interval:
                self._pruned_at = mono
                await stats.prune_stats(now - stats.retention)
        except Exception as exc:  # noqa: BLE001 - J11: reported; the next sample retries
            self._report_error(exc)

    async def _sample_health(self) -> None:
        """J22: the storage gauges and the held-snapshot warning, from one health read."""
        if self._health is None:
            return
        try:
            health = await self._health.storage_health()
        except Exception as exc:  # noqa: BLE001 - J11: reported; the next sample retries
            self._metrics.set_storage_health(None)
            self._report_error(exc)
            return
        self._metrics.set_storage_health(health)
        self._horizon_warning.observe(health)
        await self._rebuild_early(health)

    async def _warn_horizon(self) -> None:
        """J22 with no metric reader: the held-snapshot warning alone, from a health read every
        interval (no gauge is set: nobody would collect it). A forgotten transaction must show
        up in the logs whether or not the application exports metrics."""
        if self._health is None:
            return
        try:
            health = await self._health.storage_health()
        except Exception as exc:  # noqa: BLE001 - J11: reported; the next interval retries
            self._report_error(exc)
            return
        self._horizon_warning.observe(health)
        await self._rebuild_early(health)

    async def step(self) -> None:
        """One round of :meth:`run` (without its wait): a sample when a reader collects the
        gauges or a history store is kept; else the maintenance when due and the health read
        for the warning and the early rebuild."""
        if self._metrics.gauges_collected or self._stats is not None:
            try:
                await self.sample()
            except Exception as exc:  # noqa: BLE001 - J11: reported; the next retries
                self._report_error(exc)
        else:  # J17, J22: no reader, no lease (F5): this runtime keeps the history
            await self._maintain()  # itself and warns of a held snapshot itself
            await self._warn_horizon()

    async def run(self) -> None:
        try:
            while not self._closing:
                # Cleared before ``jobs()`` is read: a lease granted after this read wakes the
                # wait below, one granted before it is seen by the read.
                self._wake.clear()
                await self.step()
                await wait_event(self._wake, self._clock, self._interval)
        finally:
            for job_id in self._reported:
                self._metrics.forget_depth(job_id)
            self._metrics.update_versions(tuple(self._reported), (), ())
            self._metrics.update_parked(tuple(self._reported), {})
            self._reported.clear()
            if self._health is not None:
                self._metrics.set_storage_health(None)

    def sample_soon(self) -> None:
        """Sample now instead of at the end of the interval (F5: this runtime was just granted
        the fleet's sampler lease)."""
        self._wake.set()

    def close(self) -> None:
        self._closing = True
        self._wake.set()
