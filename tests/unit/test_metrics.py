"""Job metrics (J10): the seed's names, units, instruments and attributes, read back through the
OpenTelemetry SDK's in-memory reader (values and attributes, not just names)."""

from __future__ import annotations

import ast
import inspect
from types import ModuleType
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    Gauge,
    Histogram,
    InMemoryMetricReader,
    Metric,
    Sum,
)

from ship_sqla.kernel import _metrics
from ship_sqla.kernel._metrics import JOB_METRIC_NAMES, JobMetrics
from ship_sqla.kernel._plans import schedule as _schedule


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def job_metrics(reader: InMemoryMetricReader) -> JobMetrics:
    return JobMetrics(MeterProvider(metric_readers=[reader]))


def collect(reader: InMemoryMetricReader) -> dict[str, Metric]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        metric.name: metric
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }


def points(metric: Metric) -> dict[frozenset[tuple[str, Any]], Any]:
    return {frozenset((point.attributes or {}).items()): point for point in metric.data.data_points}


def test_the_seed_instruments_and_the_lapses_have_their_names_and_units(
    job_metrics: JobMetrics, reader: InMemoryMetricReader
) -> None:
    """J10, J15: exactly the seed's six metric names and ``ship.job.lapses``, with their
    instrument kinds and units."""
    job_metrics.record_run("mail.send", None, "completed", 0.5)
    job_metrics.record_dead_letter("mail.send", None)
    job_metrics.record_lapse("mail.send", None)
    job_metrics.record_lock_wait("mail.send", None, 0.01)
    job_metrics.set_depth("mail.send", 3, 12.0)
    metrics = collect(reader)
    assert set(metrics) == set(JOB_METRIC_NAMES)
    assert JOB_METRIC_NAMES == (
        "ship.job.queue.depth",
        "ship.job.queue.oldest_waiting_age",
        "ship.job.run.duration",
        "ship.job.runs",
        "ship.job.dead_letter.count",
        "ship.job.lock.wait",
        "ship.job.lapses",
    )
    kinds = {name: (type(m.data), m.unit) for name, m in metrics.items()}
    assert kinds == {
        "ship.job.queue.depth": (Gauge, "{run}"),
        "ship.job.queue.oldest_waiting_age": (Gauge, "s"),
        "ship.job.run.duration": (Histogram, "s"),
        "ship.job.runs": (Sum, "{run}"),
        "ship.job.dead_letter.count": (Sum, "{run}"),
        "ship.job.lock.wait": (Histogram, "s"),
        "ship.job.lapses": (Sum, "{lapse}"),
    }
    assert metrics["ship.job.runs"].data.is_monotonic
    assert metrics["ship.job.dead_letter.count"].data.is_monotonic
    assert metrics["ship.job.lapses"].data.is_monotonic


def test_runs_count_by_outcome_with_job_id_and_key(
    job_metrics: JobMetrics, reader: InMemoryMetricReader
) -> None:
    """J10: ship.job.runs and ship.job.run.duration carry ship.job.id, ship.job.key (keyed jobs
    only) and ship.job.outcome."""
    job_metrics.record_run("mail.send", None, "completed", 0.25)
    job_metrics.record_run("mail.send", None, "completed", 0.75)
    job_metrics.record_run("mail.send", None, "retrying", 2.0)
    job_metrics.record_run("sync.customer", "cust-42", "dead", 1.5)
    job_metrics.record_run("sync.customer", "", "stale", 3.0)  # unkeyed single runner: no key
    metrics = collect(reader)
    runs = points(metrics["ship.job.runs"])
    assert {attrs: point.value for attrs, point in runs.items()} == {
        frozenset({("ship.job.id", "mail.send"), ("ship.job.outcome", "completed")}): 2,
        frozenset({("ship.job.id", "mail.send"), ("ship.job.outcome", "retrying")}): 1,
        frozenset(
            {
                ("ship.job.id", "sync.customer"),
                ("ship.job.key", "cust-42"),
                ("ship.job.outcome", "dead"),
            }
        ): 1,
        frozenset({("ship.job.id", "sync.customer"), ("ship.job.outcome", "stale")}): 1,
    }
    durations = points(metrics["ship.job.run.duration"])
    completed = durations[
        frozenset({("ship.job.id", "mail.send"), ("ship.job.outcome", "completed")})
    ]
    assert completed.count == 2
    assert completed.sum == pytest.approx(1.0)
    assert completed.min == pytest.approx(0.25)
    assert completed.max == pytest.approx(0.75)
    # Seconds-scale buckets reaching an hour, not the SDK's millisecond defaults.
    assert completed.explicit_bounds[0] == pytest.approx(0.005)
    assert completed.explicit_bounds[-1] == pytest.approx(3600.0)


def test_dead_letters_and_lock_waits(job_metrics: JobMetrics, reader: InMemoryMetricReader):
    """J10: ship.job.dead_letter.count and ship.job.lock.wait per job id and key."""
    job_metrics.record_dead_letter("sync.customer", "cust-1")
    job_metrics.record_dead_letter("sync.customer", "cust-1")
    job_metrics.record_dead_letter("mail.send", None)
    job_metrics.record_lock_wait("sync.customer", "cust-1", 0.2)
    job_metrics.record_lock_wait("sync.customer", "cust-1", 0.4)
    metrics = collect(reader)
    dead = points(metrics["ship.job.dead_letter.count"])
    assert {attrs: p.value for attrs, p in dead.items()} == {
        frozenset({("ship.job.id", "sync.customer"), ("ship.job.key", "cust-1")}): 2,
        frozenset({("ship.job.id", "mail.send")}): 1,
    }
    [(attrs, wait)] = points(metrics["ship.job.lock.wait"]).items()
    assert attrs == frozenset({("ship.job.id", "sync.customer"), ("ship.job.key", "cust-1")})
    assert wait.count == 2
    assert wait.sum == pytest.approx(0.6)


def test_queue_gauges_report_the_latest_snapshot_per_job(
    job_metrics: JobMetrics, reader: InMemoryMetricReader
) -> None:
    """J10: ship.job.queue.depth and ship.job.queue.oldest_waiting_age per ship.job.id, from the
    latest snapshot; a forgotten job stops being reported."""
    job_metrics.set_depth("mail.send", 7, 42.5)
    job_metrics.set_depth("sync.customer", 0, 0.0)
    metrics = collect(reader)
    depth = {a: p.value for a, p in points(metrics["ship.job.queue.depth"]).items()}
    age = {a: p.value for a, p in points(metrics["ship.job.queue.oldest_waiting_age"]).items()}
    assert depth == {
        frozenset({("ship.job.id", "mail.send")}): 7,
        frozenset({("ship.job.id", "sync.customer")}): 0,
    }
    assert age == {
        frozenset({("ship.job.id", "mail.send")}): 42.5,
        frozenset({("ship.job.id", "sync.customer")}): 0.0,
    }

    job_metrics.set_depth("mail.send", 2, 3.0)
    job_metrics.forget_depth("sync.customer")
    metrics = collect(reader)
    depth = {a: p.value for a, p in points(metrics["ship.job.queue.depth"]).items()}
    assert depth == {frozenset({("ship.job.id", "mail.send")}): 2}

    job_metrics.set_depths({"other": (5, 1.0)})
    metrics = collect(reader)
    age = {a: p.value for a, p in points(metrics["ship.job.queue.oldest_waiting_age"]).items()}
    assert age == {frozenset({("ship.job.id", "other")}): 1.0}


def test_include_key_false_drops_the_key_attribute(reader: InMemoryMetricReader) -> None:
    """J10: high-cardinality keys can be left out of every instrument."""
    job_metrics = JobMetrics(MeterProvider(metric_readers=[reader]), include_key=False)
    job_metrics.record_run("sync.customer", "cust-42", "completed", 1.0)
    job_metrics.record_lock_wait("sync.customer", "cust-42", 0.1)
    for metric in collect(reader).values():
        for point in metric.data.data_points:
            assert "ship.job.key" not in (point.attributes or {})


def test_unknown_outcome_is_refused(job_metrics: JobMetrics) -> None:
    with pytest.raises(ValueError, match=r"unknown job outcome 'exploded'.*Fix: use one of"):
        job_metrics.record_run("mail.send", None, "exploded", 1.0)  # type: ignore[arg-type]


def test_without_a_provider_the_global_no_op_is_used() -> None:
    """J10: with no meter provider and no SDK installed, recording is a silent no-op."""
    job_metrics = JobMetrics()
    job_metrics.record_run("mail.send", None, "completed", 0.1)
    job_metrics.record_dead_letter("mail.send", None)
    job_metrics.record_lock_wait("mail.send", "k", 0.1)
    job_metrics.set_depth("mail.send", 1, 1.0)


@pytest.mark.parametrize("module", [_metrics, _schedule])
def test_kernel_modules_import_no_sqlalchemy_and_no_sdk(module: ModuleType) -> None:
    """The kernel's metrics and schedule modules import neither SQLAlchemy/asyncpg nor the
    OpenTelemetry SDK (the API alone is a no-op until the application installs an SDK)."""
    tree = ast.parse(inspect.getsource(module))
    imported = {
        name
        for node in ast.walk(tree)
        for name in (
            [alias.name for alias in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
    }
    forbidden = {
        name
        for name in imported
        if name.split(".")[0] in {"sqlalchemy", "asyncpg"} or name.startswith("opentelemetry.sdk")
    }
    assert not forbidden


def test_one_job_metrics_per_provider_and_process() -> None:
    """J10: every backend and runtime of a process on one provider share one JobMetrics (the
    SDK would silently drop a second instance's queue gauges); None is the global provider's."""
    from ship_sqla.kernel._metrics import job_metrics_for  # noqa: PLC0415

    provider = MeterProvider(shutdown_on_exit=False)
    assert job_metrics_for(provider) is job_metrics_for(provider)
    assert job_metrics_for(provider) is not job_metrics_for(MeterProvider(shutdown_on_exit=False))
    assert job_metrics_for(None) is job_metrics_for()


def test_metrics_default_to_the_global_provider_installed_later() -> None:
    """J10: metrics are on by default: the default JobMetrics, made before any SDK exists,
    records through the SDK the application installs afterwards as the global provider."""
    from global_meter import global_meter  # noqa: PLC0415

    from ship_sqla.kernel._metrics import job_metrics_for  # noqa: PLC0415

    with global_meter() as meter:
        default = job_metrics_for()
        default.record_run("mail.send", None, "completed", 0.5)  # no SDK yet: nothing kept
        meter.install()
        default.record_run("mail.send", None, "dead", 0.5)
        default.record_dead_letter("mail.send", None)
        found = meter.collect()
    runs = found["ship.job.runs"].data.data_points
    assert {p.attributes["ship.job.outcome"]: p.value for p in runs} == {"dead": 1}
    [dead] = found["ship.job.dead_letter.count"].data.data_points
    assert dead.value == 1
    assert job_metrics_for() is not default  # the global state was put back


def test_gauges_collected_only_once_a_reader_collects(
    job_metrics: JobMetrics, reader: InMemoryMetricReader
) -> None:
    """J10: the queue sampler waits for a reader to collect the gauges before it queries (a
    sample reads one index entry per waiting run); update_depths replaces only the jobs it
    names, so runtimes sharing one JobMetrics keep each other's gauges."""
    assert not job_metrics.gauges_collected
    assert reader.get_metrics_data() is None  # collected, with nothing to report yet
    assert job_metrics.gauges_collected
    job_metrics.update_depths({"a": (1, 2.0)})
    job_metrics.update_depths({"b": (3, 4.0)})
    gauge = collect(reader)["ship.job.queue.depth"]
    assert {p.attributes["ship.job.id"]: p.value for p in gauge.data.data_points} == {
        "a": 1,
        "b": 3,
    }
