"""D9 in the kernel (no database): the declaration of pinned handler versions, which definition
executes a run of each recorded version, the stranded rule, the registry entry's texts and the
two gauges."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from ship_sqla import define_job
from ship_sqla.errors import ConfigurationError
from ship_sqla.kernel._metrics import (
    WORKFLOW_RUNS,
    WORKFLOW_RUNS_PARKED,
    WORKFLOW_RUNS_STRANDED,
    JobMetrics,
)
from ship_sqla.kernel._versions import (
    Stranded,
    VersionCount,
    describe_stranded,
    served_by_entries,
    served_by_jobs,
    served_entries,
    stranded_runs,
)


async def v1(ctx: Any, payload: Any) -> None: ...


async def v2(ctx: Any, payload: Any) -> None: ...


async def v3(ctx: Any, payload: Any) -> None: ...


def _sync(ctx: Any, payload: Any) -> None: ...


def test_d9_each_recorded_version_runs_on_its_own_handler() -> None:
    """D9: a run recorded under the current version runs on the definition itself, one under a
    kept previous version on that handler (with that version), a run stored before versions
    existed (None) on the lowest version served; a version neither current nor kept has no
    definition here (the worker hands the run back). An unversioned job runs only unversioned
    runs."""
    job = define_job("orders", v3, payload=dict, version=3, previous={1: v1, 2: v2})
    assert job.served_versions == frozenset({1, 2, 3})
    assert job.at_version(3) is job
    older = job.at_version(2)
    assert older is not None
    assert (older.handler, older.version, older.id) == (v2, 2, "orders")
    legacy = job.at_version(None)
    assert legacy is not None
    assert (legacy.handler, legacy.version) == (v1, 1)
    assert job.at_version(4) is None
    plain = define_job("plain", v1, payload=dict)
    assert plain.served_versions == frozenset()
    assert plain.at_version(None) is plain
    assert plain.at_version(1) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"version": 0}, "version must be an int from 1"),
        ({"version": True}, "version must be an int from 1"),
        ({"version": "2"}, "version must be an int from 1"),
        ({"previous": {1: v1}}, "previous= needs version="),
        ({"version": 2, "previous": {2: v1}}, "previous version 2 is not below version 2"),
        ({"version": 2, "previous": {3: v1}}, "previous version 3 is not below version 2"),
        ({"version": 2, "previous": {0: v1}}, "a previous version must be an int from 1"),
        ({"version": 2, "previous": [v1]}, "previous= must be a mapping"),
        ({"version": 2, "previous": {1: _sync}}, "plain function"),
    ],
)
def test_d9_a_bad_version_declaration_is_refused_at_definition(
    kwargs: dict[str, Any], message: str
) -> None:
    """D9: versions are ints from 1 the application numbers (never computed from the source);
    previous ones are lower, async, and only beside a version."""
    with pytest.raises(ConfigurationError, match=message) as caught:
        define_job("orders", v2, payload=dict, **kwargs)
    assert caught.value.fix


def test_d9_stranded_runs_are_the_live_runs_of_a_version_nobody_serves() -> None:
    """D9: per (job, version) the live runs of both states are summed when ``served`` lacks
    the version (or the job); served versions strand nothing."""
    counts = [
        VersionCount("a", 1, "running", 2),
        VersionCount("a", 1, "waiting", 3),
        VersionCount("a", 2, "waiting", 7),
        VersionCount("b", 1, "waiting", 1),
    ]
    assert stranded_runs(counts, {"a": frozenset({1, 2}), "b": frozenset({1})}) == []
    stranded = stranded_runs(counts, {"a": frozenset({2})})
    assert stranded == [Stranded("a", 1, 5), Stranded("b", 1, 1)]
    assert describe_stranded(stranded) == (
        "job 'a' has 5 live runs of version 1; job 'b' has 1 live run of version 1"
    )


def test_d9_a_worker_entry_reports_the_versions_it_serves() -> None:
    """D9, F6: a worker's registry entry names each (job, version) it serves as
    "<job_id>:<version>" (job ids may hold colons); the fleet's union reads back per job."""
    jobs = [
        define_job("a:b", v2, payload=dict, version=2, previous={1: v1}),
        define_job("plain", v1, payload=dict),
    ]
    assert served_entries(jobs) == ("a:b:1", "a:b:2")
    assert served_by_jobs(jobs) == {"a:b": frozenset({1, 2})}
    assert served_by_entries(["a:b:1", "a:b:2", "c:7", "junk", "d:x"]) == {
        "a:b": frozenset({1, 2}),
        "c": frozenset({7}),
    }


def test_d9_the_version_gauges_report_the_latest_sample_per_job() -> None:
    """D9, D10: ship.workflow.runs per (job, version, state), ship.workflow.runs.stranded per
    (job, version) and ship.workflow.runs.parked per job report what the last sample of each
    job found; a job sampled with nothing reports nothing."""
    reader = InMemoryMetricReader()
    metrics = JobMetrics(MeterProvider(metric_readers=[reader]))
    counts = [VersionCount("a", 1, "waiting", 3), VersionCount("a", 2, "running", 1)]
    metrics.update_versions(["a"], counts, [Stranded("a", 1, 3)])

    def points() -> dict[str, dict[tuple[Any, ...], Any]]:
        data = reader.get_metrics_data()
        return {
            metric.name: {
                tuple(sorted(p.attributes.items())): p.value for p in metric.data.data_points
            }
            for resource in (data.resource_metrics if data is not None else ())
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }

    found = points()
    assert found[WORKFLOW_RUNS] == {
        (("ship.job.id", "a"), ("ship.job.state", "waiting"), ("ship.job.version", 1)): 3,
        (("ship.job.id", "a"), ("ship.job.state", "running"), ("ship.job.version", 2)): 1,
    }
    assert found[WORKFLOW_RUNS_STRANDED] == {(("ship.job.id", "a"), ("ship.job.version", 1)): 3}
    metrics.update_versions(["a"], [], [])
    found = points()
    assert not found.get(WORKFLOW_RUNS)
    assert not found.get(WORKFLOW_RUNS_STRANDED)
    # D10: the parked gauge, per job, likewise replaced by each sample.
    metrics.update_parked(["a", "b"], {"a": 4})
    assert points()[WORKFLOW_RUNS_PARKED] == {(("ship.job.id", "a"),): 4}
    metrics.update_parked(["a"], {})
    assert not points().get(WORKFLOW_RUNS_PARKED)
