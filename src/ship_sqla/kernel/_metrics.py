"""Job metrics (J10): the seed's six instruments, and J15's lapses, through the OpenTelemetry
metrics API.

Names, units and attributes match the seed (and ship-jobs-bullmq), so one dashboard serves
every backend:

- ``ship.job.queue.depth``: observable gauge, ``{run}``; ``ship.job.id``.
- ``ship.job.queue.oldest_waiting_age``: observable gauge, ``s``; ``ship.job.id``.
- ``ship.job.run.duration``: histogram, ``s``; ``ship.job.id``, ``ship.job.key``,
  ``ship.job.outcome``.
- ``ship.job.runs``: counter, ``{run}``; ``ship.job.id``, ``ship.job.key``, ``ship.job.outcome``.
- ``ship.job.dead_letter.count``: counter, ``{run}``; ``ship.job.id``, ``ship.job.key``.
- ``ship.job.lock.wait``: histogram, ``s``; ``ship.job.id``, ``ship.job.key``.
- ``ship.job.lapses`` (J15, not the seed's): counter, ``{lapse}``; ``ship.job.id``,
  ``ship.job.key``: runs whose lease lapsed (their worker died) that a claim retook or buried.

J22's storage health (observable gauges, refreshed with the queue gauges by the fleet's sampler,
:meth:`JobMetrics.set_storage_health`; each table by ``ship.db.table``: runs, state, workers,
steps, events):

- ``ship.db.table.live_tuples`` and ``ship.db.table.dead_tuples``: ``{tuple}``, the statistics'
  estimates.
- ``ship.db.table.size``: ``By``, heap, indexes and TOAST.
- ``ship.db.autovacuum.age``: ``s`` since the table's last vacuum or autovacuum (absent: never).
- ``ship.db.horizon.age``: ``s`` the oldest held snapshot of the database has been held (0:
  none); ``ship.db.horizon.scope``: ``all`` or ``own-role`` (who the read could see).
- ``ship.job.history.partitions_ahead``: ``{partition}``, absent while J17's history table
  does not exist.

``ship.job.key`` is set only for keyed single-runner jobs (a non-empty key); keys can be of
high cardinality (one per customer, say), so ``JobMetrics(include_key=False)`` drops it.

Metrics are on by default: a runtime given no ``meter_provider`` (``start_job_runtime``'s one
metrics knob) records through OpenTelemetry's global provider, a no-op until the application
installs an SDK (before or after the runtime starts: the API's proxy forwards to the SDK once it
is set), so installing the SDK is all it takes. The API alone records nothing, so the runtime
calls these methods unconditionally. This module imports the OpenTelemetry API only (never an
SDK, never SQLAlchemy).
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, Final, Literal, get_args

from opentelemetry import metrics

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from opentelemetry.metrics import CallbackOptions, Histogram, Meter, MeterProvider
    from opentelemetry.util.types import AttributeValue

    from ship_sqla.kernel._health import StorageHealth
    from ship_sqla.kernel._versions import Stranded, VersionCount

__all__ = [
    "JOB_METRIC_NAMES",
    "STORAGE_METRIC_NAMES",
    "JobMetrics",
    "JobOutcome",
    "job_metrics_for",
    "storage_observations",
]

JobOutcome = Literal[
    "completed",
    "duplicate",
    "retrying",
    "dead",
    "stale",
    "lock_held",
    "cancelled",
    "snoozed",
    "suspended",
    "parked",
]
"""How one execution of a run ended, the ``ship.job.outcome`` attribute of ``ship.job.runs``:

- ``completed``: the handler returned and the completion landed.
- ``duplicate``: a transactional job's inbox key was completed before; the run completed
  without calling its handler (J13).
- ``retrying``: the handler failed and the run was rescheduled with backoff (J7).
- ``dead``: the handler failed on its last attempt; the run is dead-lettered.
- ``stale``: the outcome was rejected because the claim token was no longer current (J5).
- ``lock_held``: ``JOB_LOCK_HELD``; the run went back to waiting without using an attempt (J7).
- ``cancelled``: the runtime stopped and cancelled the run past its drain timeout (J12).
- ``snoozed``: the handler raised ``Snooze``; the run waits again without using an attempt (K4).
- ``suspended``: a workflow slept or waits (D3); the run waits again without using an attempt.
- ``parked``: a workflow's handler diverged from its history (D10); the run waits parked,
  attempt unspent, until an operator or a new build unparks it.
"""

_OUTCOMES: Final = frozenset(get_args(JobOutcome))

INSTRUMENTATION_SCOPE: Final = "ship_sqla.jobs"

QUEUE_DEPTH: Final = "ship.job.queue.depth"
QUEUE_OLDEST_WAITING_AGE: Final = "ship.job.queue.oldest_waiting_age"
RUN_DURATION: Final = "ship.job.run.duration"
RUNS: Final = "ship.job.runs"
DEAD_LETTER_COUNT: Final = "ship.job.dead_letter.count"
LOCK_WAIT: Final = "ship.job.lock.wait"
LAPSES: Final = "ship.job.lapses"
WORKFLOW_RUNS: Final = "ship.workflow.runs"
WORKFLOW_RUNS_STRANDED: Final = "ship.workflow.runs.stranded"

WORKFLOW_DIVERGED: Final = "ship.workflow.diverged"
WORKFLOW_RUNS_PARKED: Final = "ship.workflow.runs.parked"

WORKFLOW_METRIC_NAMES: Final = (
    WORKFLOW_RUNS,
    WORKFLOW_RUNS_STRANDED,
    WORKFLOW_DIVERGED,
    WORKFLOW_RUNS_PARKED,
)
"""D9's two gauges (live runs per handler version, and the stranded ones) and D10's counter of
runs parked on a divergence and gauge of the runs parked now."""

JOB_METRIC_NAMES: Final = (
    QUEUE_DEPTH,
    QUEUE_OLDEST_WAITING_AGE,
    RUN_DURATION,
    RUNS,
    DEAD_LETTER_COUNT,
    LOCK_WAIT,
    LAPSES,
)
"""The six instrument names of J10, in the seed's order, then J15's ``ship.job.lapses``."""

TABLE_LIVE_TUPLES: Final = "ship.db.table.live_tuples"
TABLE_DEAD_TUPLES: Final = "ship.db.table.dead_tuples"
TABLE_SIZE: Final = "ship.db.table.size"
AUTOVACUUM_AGE: Final = "ship.db.autovacuum.age"
HORIZON_AGE: Final = "ship.db.horizon.age"
PARTITIONS_AHEAD: Final = "ship.job.history.partitions_ahead"

STORAGE_METRIC_NAMES: Final = (
    TABLE_LIVE_TUPLES,
    TABLE_DEAD_TUPLES,
    TABLE_SIZE,
    AUTOVACUUM_AGE,
    HORIZON_AGE,
    PARTITIONS_AHEAD,
)
"""J22's storage-health gauges."""

ATTR_TABLE: Final = "ship.db.table"
ATTR_HORIZON_SCOPE: Final = "ship.db.horizon.scope"

ATTR_JOB_ID: Final = "ship.job.id"
ATTR_JOB_KEY: Final = "ship.job.key"
ATTR_OUTCOME: Final = "ship.job.outcome"
ATTR_VERSION: Final = "ship.job.version"
ATTR_STATE: Final = "ship.job.state"

# Job runs last from milliseconds to hours; the SDK's default buckets are tuned for
# milliseconds and would put every run above 10 s into one bucket.
_DURATION_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip
_LOCK_WAIT_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


def _histogram(meter: Meter, name: str, description: str, buckets: Sequence[float]) -> Histogram:
    try:
        return meter.create_histogram(
            name, unit="s", description=description, explicit_bucket_boundaries_advisory=buckets
        )
    except TypeError:
        # opentelemetry-api before 1.30 has no bucket advisory; the SDK's View still can.
        return meter.create_histogram(name, unit="s", description=description)


class JobMetrics:
    """The job instruments of a runtime (J10; ``runtime.metrics``).

    ``meter_provider=None`` uses the global provider, a no-op until the application installs an
    SDK. Synchronous instruments are recorded as events happen; the two queue gauges are
    observed at collection time from the latest snapshot, which a worker runtime refreshes
    through :meth:`set_depths` every ``queue_sample_interval`` seconds (every worker reports
    the same database-wide value: aggregate them with ``max``, not ``sum``); :meth:`set_depth`
    serves code that samples its queues itself.

    Safe to call from any thread: the snapshot is replaced under a lock, and the SDK's reader
    thread only reads it.

    Build one per provider and process (:func:`job_metrics_for` does): the SDK keeps one meter
    per instrumentation scope and answers a second observable gauge of the same name with the
    first one, so a second instance's queue gauges would silently never be observed.
    """

    def __init__(
        self, meter_provider: MeterProvider | None = None, *, include_key: bool = True
    ) -> None:
        self._include_key = include_key
        self._lock = threading.Lock()
        self._depth: dict[str, tuple[int, float]] = {}
        # D9: per job, its live runs per (version, state) and its stranded runs per version.
        self._versions: dict[str, tuple[tuple[int, str, int], ...]] = {}
        self._stranded: dict[str, tuple[tuple[int, int], ...]] = {}
        # D10: per job, its parked runs (absent: none).
        self._parked: dict[str, int] = {}
        self._health: StorageHealth | None = None
        # Set by the first collection of the queue gauges: only then is sampling worth a query.
        self._collected = threading.Event()
        meter = metrics.get_meter(INSTRUMENTATION_SCOPE, meter_provider=meter_provider)
        self._run_duration = _histogram(
            meter,
            RUN_DURATION,
            "Time from a run's start to its outcome, per attempt.",
            _DURATION_BUCKETS,
        )
        self._runs = meter.create_counter(
            RUNS, unit="{run}", description="Run attempts that ended, by outcome."
        )
        self._dead_letter = meter.create_counter(
            DEAD_LETTER_COUNT, unit="{run}", description="Runs that were dead-lettered."
        )
        self._lapses = meter.create_counter(
            LAPSES,
            unit="{lapse}",
            description="Runs whose lease lapsed (their worker died) that a claim retook or"
            " dead-lettered.",
        )
        self._diverged = meter.create_counter(
            WORKFLOW_DIVERGED,
            unit="{run}",
            description="Workflow runs parked because their handler diverged from their history"
            " (D10).",
        )
        self._lock_wait = _histogram(
            meter,
            LOCK_WAIT,
            "Time spent acquiring a single-runner (job id, key) lease before a run started.",
            _LOCK_WAIT_BUCKETS,
        )
        meter.create_observable_gauge(
            QUEUE_DEPTH,
            callbacks=[self._observe_depth],
            unit="{run}",
            description="Runs waiting or delayed (not yet claimed) per job.",
        )
        meter.create_observable_gauge(
            QUEUE_OLDEST_WAITING_AGE,
            callbacks=[self._observe_oldest_age],
            unit="s",
            description="Age of the oldest due, unclaimed run per job (0 when none is due).",
        )
        self._workflow_gauges(meter)
        self._storage_gauges(meter)

    def _workflow_gauges(self, meter: Meter) -> None:
        """D9, D10: the workflow gauges, observed from the latest sample."""
        meter.create_observable_gauge(
            WORKFLOW_RUNS,
            callbacks=[self._observe_versions],
            unit="{run}",
            description="Live runs per job, handler version and state (D9).",
        )
        meter.create_observable_gauge(
            WORKFLOW_RUNS_PARKED,
            callbacks=[self._observe_parked],
            unit="{run}",
            description="Workflow runs parked on a divergence, per job (D10).",
        )
        meter.create_observable_gauge(
            WORKFLOW_RUNS_STRANDED,
            callbacks=[self._observe_stranded],
            unit="{run}",
            description="Live runs of a handler version no registered worker serves (D9).",
        )

    def _storage_gauges(self, meter: Meter) -> None:
        """J22: the storage-health gauges, observed from the latest :meth:`set_storage_health`."""
        gauges = (
            (TABLE_LIVE_TUPLES, "{tuple}", "Live tuples of a ship table (statistics estimate)."),
            (TABLE_DEAD_TUPLES, "{tuple}", "Dead tuples of a ship table (statistics estimate)."),
            (TABLE_SIZE, "By", "Size of a ship table: heap, indexes and TOAST."),
            (AUTOVACUUM_AGE, "s", "Time since a ship table's last vacuum or autovacuum."),
            (HORIZON_AGE, "s", "Age of the database's oldest held snapshot (0: none)."),
            (PARTITIONS_AHEAD, "{partition}", "History partitions ready ahead (J17)."),
        )
        for name, unit, description in gauges:
            meter.create_observable_gauge(
                name,
                callbacks=[self._storage_observer(name)],
                unit=unit,
                description=description,
            )

    def _attributes(self, job_id: str, key: str | None) -> dict[str, AttributeValue]:
        attributes: dict[str, AttributeValue] = {ATTR_JOB_ID: job_id}
        # An empty key is the unkeyed single-runner job (JobDefinition.key_of): not keyed.
        if key and self._include_key:
            attributes[ATTR_JOB_KEY] = key
        return attributes

    def record_run(
        self, job_id: str, key: str | None, outcome: JobOutcome, duration_s: float
    ) -> None:
        """One attempt of a run ended: counts ``ship.job.runs`` and records its duration."""
        if outcome not in _OUTCOMES:
            # An open-ended attribute would multiply time series; refuse instead of exporting.
            raise ValueError(
                f"unknown job outcome {outcome!r}. Fix: use one of {sorted(_OUTCOMES)}."
            )
        attributes = self._attributes(job_id, key)
        attributes[ATTR_OUTCOME] = outcome
        self._runs.add(1, attributes)
        self._run_duration.record(max(duration_s, 0.0), attributes)

    def record_dead_letter(self, job_id: str, key: str | None) -> None:
        """A run became dead, by its last failed attempt or by a lease lapsing on it (J6)."""
        self._dead_letter.add(1, self._attributes(job_id, key))

    def record_lapse(self, job_id: str, key: str | None) -> None:
        """A claim found a run's lease lapsed and retook or dead-lettered it (J6, J15)."""
        self._lapses.add(1, self._attributes(job_id, key))

    def record_divergence(self, job_id: str) -> None:
        """D10: a workflow run of ``job_id`` diverged from its history and parked."""
        self._diverged.add(1, {ATTR_JOB_ID: job_id})

    def record_lock_wait(self, job_id: str, key: str | None, seconds: float) -> None:
        """Time spent acquiring the (job id, key) lease of a single-runner job (J4)."""
        self._lock_wait.record(max(seconds, 0.0), self._attributes(job_id, key))

    def set_depth(self, job_id: str, depth: int, oldest_age_s: float) -> None:
        """Snapshot one job's queue: ``depth`` waiting or delayed runs, and the age in seconds
        of the oldest due one (0 when none is due). Observed at the next collection."""
        with self._lock:
            self._depth[job_id] = (depth, max(oldest_age_s, 0.0))

    def set_depths(self, snapshot: Mapping[str, tuple[int, float]]) -> None:
        """Replace the whole snapshot: jobs absent from ``snapshot`` stop being reported."""
        with self._lock:
            self._depth = {
                job_id: (depth, max(age, 0.0)) for job_id, (depth, age) in snapshot.items()
            }

    def update_depths(self, snapshot: Mapping[str, tuple[int, float]]) -> None:
        """Replace the snapshot of the jobs in ``snapshot`` only (several runtimes of one process
        share one instance, each sampling its own jobs)."""
        with self._lock:
            for job_id, (depth, age) in snapshot.items():
                self._depth[job_id] = (depth, max(age, 0.0))

    def forget_depth(self, job_id: str) -> None:
        """Stop reporting a job's queue gauges (e.g. the job is no longer registered)."""
        with self._lock:
            self._depth.pop(job_id, None)

    def update_versions(
        self, job_ids: Sequence[str], counts: Iterable[VersionCount], stranded: Iterable[Stranded]
    ) -> None:
        """D9: replace the version gauges of ``job_ids`` (a job with no live versioned run
        reports nothing): live runs per (version, state), and the stranded runs per version."""
        versions: dict[str, list[tuple[int, str, int]]] = {job_id: [] for job_id in job_ids}
        for count in counts:
            versions.setdefault(count.job_id, []).append((count.version, count.state, count.runs))
        lost: dict[str, list[tuple[int, int]]] = {job_id: [] for job_id in job_ids}
        for item in stranded:
            lost.setdefault(item.job_id, []).append((item.version, item.runs))
        with self._lock:
            for job_id, rows in versions.items():
                self._versions[job_id] = tuple(rows)
                if not rows:
                    del self._versions[job_id]
            for job_id, pairs in lost.items():
                self._stranded[job_id] = tuple(pairs)
                if not pairs:
                    del self._stranded[job_id]

    def update_parked(self, job_ids: Sequence[str], parked: Mapping[str, int]) -> None:
        """D10: replace the parked gauge of ``job_ids`` (a job with none reports nothing)."""
        with self._lock:
            for job_id in job_ids:
                count = parked.get(job_id, 0)
                if count:
                    self._parked[job_id] = count
                else:
                    self._parked.pop(job_id, None)

    def _observe_parked(self, _options: CallbackOptions) -> Iterable[metrics.Observation]:
        with self._lock:
            rows = list(self._parked.items())
        return [metrics.Observation(runs, {ATTR_JOB_ID: job_id}) for job_id, runs in rows]

    def _observe_versions(self, _options: CallbackOptions) -> Iterable[metrics.Observation]:
        with self._lock:
            rows = [(job_id, row) for job_id, group in self._versions.items() for row in group]
        return [
            metrics.Observation(
                runs, {ATTR_JOB_ID: job_id, ATTR_VERSION: version, ATTR_STATE: state}
            )
            for job_id, (version, state, runs) in rows
        ]

    def _observe_stranded(self, _options: CallbackOptions) -> Iterable[metrics.Observation]:
        with self._lock:
            rows = [(job_id, pair) for job_id, group in self._stranded.items() for pair in group]
        return [
            metrics.Observation(runs, {ATTR_JOB_ID: job_id, ATTR_VERSION: version})
            for job_id, (version, runs) in rows
        ]

    @property
    def gauges_collected(self) -> bool:
        """True once a metric reader collected the queue gauges: an SDK is installed and
        exports them. Until then a queue sample would be a query whose answer nobody reads."""
        return self._collected.is_set()

    def _snapshot(self) -> list[tuple[str, int, float]]:
        with self._lock:
            return [(job_id, depth, age) for job_id, (depth, age) in self._depth.items()]

    def _observe_depth(self, _options: CallbackOptions) -> Iterable[metrics.Observation]:
        self._collected.set()
        return [
            metrics.Observation(depth, {ATTR_JOB_ID: job_id})
            for job_id, depth, _ in self._snapshot()
        ]

    def _observe_oldest_age(self, _options: CallbackOptions) -> Iterable[metrics.Observation]:
        return [
            metrics.Observation(age, {ATTR_JOB_ID: job_id}) for job_id, _, age in self._snapshot()
        ]

    def set_storage_health(self, health: StorageHealth | None) -> None:
        """J22: replace the storage-health snapshot (None, or an unknown health: report
        nothing). Observed at the next collection."""
        with self._lock:
            self._health = health if health is not None and health.known else None

    def _storage_observer(
        self, name: str
    ) -> Callable[[CallbackOptions], Iterable[metrics.Observation]]:
        def observe(_options: CallbackOptions) -> Iterable[metrics.Observation]:
            with self._lock:
                health = self._health
            return [] if health is None else storage_observations(name, health)

        return observe


_defaults_lock = threading.Lock()
_global_default: JobMetrics | None = None
_per_provider: weakref.WeakKeyDictionary[Any, JobMetrics] = weakref.WeakKeyDictionary()


def storage_observations(name: str, health: StorageHealth) -> list[metrics.Observation]:
    """The observations of the storage gauge ``name`` in ``health`` (J22)."""
    if name == HORIZON_AGE:
        age = 0.0 if health.horizon is None else max(health.horizon.age, 0.0)
        return [metrics.Observation(age, {ATTR_HORIZON_SCOPE: health.horizon_scope})]
    if name == PARTITIONS_AHEAD:
        ahead = health.partitions_ahead
        return [] if ahead is None else [metrics.Observation(ahead)]
    found: list[metrics.Observation] = []
    for table in health.tables:
        value: float | None = {
            TABLE_LIVE_TUPLES: table.live_tuples,
            TABLE_DEAD_TUPLES: table.dead_tuples,
            TABLE_SIZE: table.size_bytes,
            AUTOVACUUM_AGE: table.vacuum_age,
        }[name]
        if value is not None:
            found.append(metrics.Observation(value, {ATTR_TABLE: table.table}))
    return found


def job_metrics_for(meter_provider: MeterProvider | None = None) -> JobMetrics:
    """The process's one :class:`JobMetrics` for ``meter_provider``; None
    (``start_job_runtime``'s default) is OpenTelemetry's global provider.

    One instance per provider, because the SDK would drop the queue gauges of a second one (see
    :class:`JobMetrics`). For the global provider one instance serves the whole process: made
    before an SDK is installed, it records through the API's proxy, which forwards to the SDK
    once ``opentelemetry.metrics.set_meter_provider`` was called (it can be called once).
    """
    global _global_default  # noqa: PLW0603 - the process-wide default, made on first use
    with _defaults_lock:
        if meter_provider is None:
            if _global_default is None:
                _global_default = JobMetrics()
            return _global_default
        try:
            found = _per_provider.get(meter_provider)
        except TypeError:  # a provider that cannot be weakly referenced or hashed: not shared
            return JobMetrics(meter_provider)
        if found is None:
            found = JobMetrics(meter_provider)
            _per_provider[meter_provider] = found
        return found
