"""J22's rules without a database: the alarms of a storage health, the throttled held-snapshot
warning, the storage gauges, the dashboard's banner; J21's declared storage options."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from sqlalchemy import MetaData

from ship_sqla import (
    ship_job_events_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
    ship_job_workers_table,
    ship_outbox_table,
)
from ship_sqla._dashboard._html import health_banner
from ship_sqla._schema_sql import schema_sql
from ship_sqla._storage_options import CHURN_OPTIONS, HOT_ROW_OPTIONS, LIVE_RUNS_OPTIONS
from ship_sqla.errors import ConfigurationError
from ship_sqla.jobs import (
    STORAGE_METRIC_NAMES,
    HealthBounds,
    HorizonHolder,
    StorageHealth,
    TableHealth,
)
from ship_sqla.kernel._health import HORIZON_HELD, UNKNOWN_HEALTH, HorizonWarning
from ship_sqla.kernel._metrics import JobMetrics
from ship_sqla.schema import storage_options, storage_options_ddl
from ship_sqla.testing import FrozenClock


def _runs(live: int, dead: int) -> TableHealth:
    return TableHealth("runs", "ship_job_runs", live, dead, 8192, 12.0)


def _health(
    *,
    age: float | None = None,
    live: int = 10,
    dead: int = 0,
    ahead: int | None = None,
    bounds: HealthBounds | None = None,
) -> StorageHealth:
    holder = None if age is None else HorizonHolder(4242, "nightly-report", age)
    return StorageHealth(
        tables=(_runs(live, dead),),
        horizon=holder,
        horizon_scope="all",
        partitions_ahead=ahead,
        bounds=bounds or HealthBounds(),
        known=True,
    )


def test_j22_alarms_past_each_bound_and_none_below() -> None:
    """J22: a snapshot held past horizon_alarm (default 300 s), the runs table's dead tuples
    past max(10,000, 10 x live) and fewer than 2 partitions ready ahead are alarms, each with
    its fix; below every bound the health is healthy."""
    assert _health(age=299.0, dead=10_000, ahead=2).status == "healthy"
    assert _health(live=5_000, dead=50_000).status == "healthy"
    kinds = [a.kind for a in _health(age=301.0, dead=10_001, ahead=1).alarms()]
    assert kinds == ["horizon", "dead_tuples", "partitions"]
    for alarm in _health(age=301.0, dead=10_001, ahead=1).alarms():
        assert "Fix:" in alarm.message
    [horizon] = _health(age=301.0).alarms()
    assert "pid 4242" in horizon.message
    assert "'nightly-report'" in horizon.message
    assert _health(age=61.0, bounds=HealthBounds(horizon_alarm=60)).status == "alarm"


def test_j22_an_unknown_health_is_never_an_alarm() -> None:
    """J22: a store that reads no health (in memory) answers unknown, with no alarm."""
    assert UNKNOWN_HEALTH.status == "unknown"
    assert UNKNOWN_HEALTH.alarms() == ()
    assert UNKNOWN_HEALTH.to_dict()["status"] == "unknown"


@pytest.mark.parametrize("value", [0, -1, True, "5m", float("nan")])
def test_j22_bounds_refuse_what_is_not_a_positive_number(value: object) -> None:
    """J22: a bound that is not a positive number is refused with a fix."""
    with pytest.raises(ConfigurationError, match="Fix:"):
        HealthBounds(horizon_alarm=value)  # type: ignore[arg-type]


def test_j22_held_snapshot_warning_names_the_holder_and_is_throttled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """J22: past the bound the warning names the holder (pid, application_name, age) at once,
    then at most once per warn_every for the same holder; a new holder is named at once; a
    healthy read resets it."""
    clock = FrozenClock()
    warning = HorizonWarning(clock)
    held = _health(age=400.0)
    with caplog.at_level(logging.WARNING, logger="ship_sqla.jobs"):
        assert warning.observe(held)
        clock.advance(299)
        assert not warning.observe(held)
        clock.advance(1)
        assert warning.observe(held)
        other = StorageHealth(
            horizon=HorizonHolder(7, "psql", 500.0), bounds=HealthBounds(), known=True
        )
        assert warning.observe(other)
        assert not warning.observe(_health(age=10.0))
        assert warning.observe(held)
    lines = [r.getMessage() for r in caplog.records if HORIZON_HELD in r.getMessage()]
    assert len(lines) == 4
    assert "pid 4242" in lines[0]
    assert "'nightly-report'" in lines[0]
    assert "400 s" in lines[0]
    assert "pid 7" in lines[2]


def _collected(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, object], float]]]:
    found: dict[str, list[tuple[dict[str, object], float]]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found[metric.name] = [
                    (dict(p.attributes or {}), p.value)  # type: ignore[union-attr]
                    for p in metric.data.data_points
                ]
    return found


def test_j22_storage_gauges_report_the_latest_health_and_partitions_stay_absent() -> None:
    """J22: the storage gauges carry the latest health per table (ship.db.table), the horizon's
    age with its scope; partitions ahead is absent until J17; an unknown health reports none."""
    reader = InMemoryMetricReader()
    metrics = JobMetrics(MeterProvider(metric_readers=[reader]))
    metrics.set_storage_health(_health(age=42.0, live=7, dead=3))
    found = _collected(reader)
    assert found["ship.db.table.live_tuples"] == [({"ship.db.table": "runs"}, 7)]
    assert found["ship.db.table.dead_tuples"] == [({"ship.db.table": "runs"}, 3)]
    assert found["ship.db.table.size"] == [({"ship.db.table": "runs"}, 8192)]
    assert found["ship.db.autovacuum.age"] == [({"ship.db.table": "runs"}, 12.0)]
    assert found["ship.db.horizon.age"] == [({"ship.db.horizon.scope": "all"}, 42.0)]
    assert "ship.job.history.partitions_ahead" not in found
    assert set(found) <= set(STORAGE_METRIC_NAMES)
    metrics.set_storage_health(UNKNOWN_HEALTH)
    assert not set(_collected(reader)) & set(STORAGE_METRIC_NAMES)


def test_j22_banner_escapes_and_is_absent_when_healthy() -> None:
    """J22: the dashboard's banner lists each alarm, escaped; nothing when there is none."""
    assert health_banner([]) == ""
    html = health_banner([("horizon", "pid 1 ('<script>') held")])
    assert 'id="health-banner"' in html
    assert "<script>" not in html
    assert "&lt;script&gt;" in html


def test_j21_factories_declare_their_storage_options() -> None:
    """J21: every churning ship table declares the autovacuum options it needs; the runs table
    (live runs only, J16) index cleanup on every vacuum too; the state table (HOT updates) a
    fillfactor too, and no other table; schema_sql sets them after each
    CREATE TABLE; storage_options_ddl renders the migration's statement."""
    metadata = MetaData()
    runs = ship_job_runs_table(metadata, schema="q")
    state = ship_job_state_table(metadata)
    assert storage_options(runs) == dict(LIVE_RUNS_OPTIONS)
    assert storage_options(runs)["vacuum_index_cleanup"] == "on"
    for table in (
        ship_job_workers_table(metadata),
        ship_job_steps_table(metadata),
        ship_job_events_table(metadata),
        ship_outbox_table(metadata),
    ):
        assert storage_options(table) == dict(CHURN_OPTIONS), table.name
    assert storage_options(state) == dict(HOT_ROW_OPTIONS)
    assert storage_options(state)["fillfactor"] == 50
    assert storage_options_ddl(runs) == (
        "ALTER TABLE q.ship_job_runs SET (autovacuum_vacuum_scale_factor = 0,"
        " autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_insert_scale_factor = 0,"
        " autovacuum_vacuum_insert_threshold = 1000, autovacuum_vacuum_cost_delay = 0,"
        " vacuum_index_cleanup = on)"
    )
    ddl = schema_sql(metadata, tables=[state])
    assert "ALTER TABLE ship_job_state SET (" in ddl
    assert "fillfactor = 50" in ddl
