"""J16: live runs only is the default shape, decided by the application's declaration.

The backend moves ended runs into history when the history table is given or declared beside
the runs table (``ship_job_history_table(metadata)`` in the runs table's metadata and schema);
without a declaration (an application whose database was built before the history) runs end in
place. The steps table declares its foreign key to the runs table only when no history table is
declared before it (a move would take a finished workflow's steps with it). No database here.
"""

from __future__ import annotations

import pytest
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import create_async_engine

from ship_sqla import (
    create_job_backend,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_steps_table,
)
from ship_sqla._cli._tables import job_tables
from ship_sqla._jobs._tables import declared_history
from ship_sqla.errors import ConfigurationError
from ship_sqla.kernel import InMemoryJobBackend

ENGINE = create_async_engine("postgresql+asyncpg://u@127.0.0.1:1/none")


def test_j16_history_declared_beside_the_runs_table_turns_the_move_on() -> None:
    """J16: the history table in the runs table's metadata makes the backend live-only, with
    that table; the steps table declared after it has no foreign key to the runs table."""
    metadata = MetaData()
    runs = ship_job_runs_table(metadata)
    history = ship_job_history_table(metadata, "app_history")
    steps = ship_job_steps_table(metadata)
    assert not steps.foreign_keys
    assert declared_history(runs) is history
    backend = create_job_backend(database=ENGINE, table=runs, steps_table=steps)
    assert backend.history
    assert backend.history_table is history


def test_j16_no_history_declared_keeps_runs_in_place() -> None:
    """J16: without a declaration (a database built before the history) runs end in place, and
    the steps table keeps its cascading foreign key."""
    metadata = MetaData()
    runs = ship_job_runs_table(metadata)
    steps = ship_job_steps_table(metadata)
    assert [fk.ondelete for fk in steps.foreign_keys] == ["CASCADE"]
    assert declared_history(runs) is None
    assert not create_job_backend(database=ENGINE, table=runs, steps_table=steps).history


def test_j16_no_tables_given_means_the_tables_schema_apply_creates() -> None:
    """J16 (the tutorial's ``create_job_backend(database=engine)``): no runs table given means
    the tables ``ship-sqla schema apply`` creates, the history included: live runs only, the
    default history beside the default runs table, the steps table without the cascading key
    (a finished workflow keeps its steps, D5)."""
    backend = create_job_backend(database=ENGINE)
    assert backend.history
    assert backend.history_table is not None
    assert (backend.history_table.schema, backend.history_table.name) == (
        None,
        "ship_job_history",
    )
    assert backend._steps_table is not None
    assert not backend._steps_table.foreign_keys


def test_j16_history_given_explicitly_still_wins() -> None:
    """J16: ``history_table=`` given turns the move on whatever the metadata declares."""
    runs = ship_job_runs_table(MetaData())
    history = ship_job_history_table(MetaData())
    backend = create_job_backend(database=ENGINE, table=runs, history_table=history)
    assert backend.history
    assert backend.history_table is history


def test_j16_a_history_in_another_schema_is_not_this_runs_tables() -> None:
    """J16: a history table of another schema in the same metadata is not declared beside
    this runs table."""
    metadata = MetaData()
    runs = ship_job_runs_table(metadata)
    ship_job_history_table(metadata, schema="elsewhere")
    assert declared_history(runs) is None


def test_j16_two_histories_beside_one_runs_table_are_refused() -> None:
    """J16: two history tables beside the runs table: which one is ambiguous (give it)."""
    metadata = MetaData()
    runs = ship_job_runs_table(metadata)
    ship_job_history_table(metadata, "history_a")
    ship_job_history_table(metadata, "history_b")
    with pytest.raises(ConfigurationError, match="several history tables"):
        create_job_backend(database=ENGINE, table=runs)


def test_j16_steps_declared_before_the_history_are_refused_with_the_fix() -> None:
    """J16: a steps table declared before the history keeps its cascading key; the backend
    refuses it (a move would delete a finished workflow's steps) naming runs_fkey=False."""
    metadata = MetaData()
    runs = ship_job_runs_table(metadata)
    steps = ship_job_steps_table(metadata)
    ship_job_history_table(metadata)
    with pytest.raises(ConfigurationError, match="runs_fkey=False"):
        create_job_backend(database=ENGINE, table=runs, steps_table=steps)


def test_j16_the_cli_moves_to_the_history_schema_apply_creates() -> None:
    """J16: the commands' backend, told the database holds the history table (what
    ``JobTables.backend`` probes), moves ended runs into ``ship_job_history`` in the runs
    table's schema; told it does not, runs end in place (a database built before the
    history keeps working)."""
    tables = job_tables(schema="app")
    assert declared_history(tables.runs) is None
    live = tables.shaped_backend(ENGINE, history=True)
    assert live.history
    assert live.history_table is not None
    assert (live.history_table.schema, live.history_table.name) == ("app", "ship_job_history")
    assert not tables.shaped_backend(ENGINE, history=False).history


def test_j16_the_in_memory_backend_is_live_only_by_default() -> None:
    """J16, J18: the in-memory reference backend matches the default shape; ``live_only=False``
    is the legacy in-place one."""
    assert InMemoryJobBackend().live_only
    assert not InMemoryJobBackend(live_only=False).live_only
