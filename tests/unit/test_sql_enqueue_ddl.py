"""The SQL enqueue API's DDL (SPEC §18), rendered without a database: E5's stable build hash,
E7's hardened variant, and names PostgreSQL would cut."""

from __future__ import annotations

import pytest
from sqlalchemy import MetaData, Table

from ship_sqla._jobs import ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._sql_api import build_of, ship_job_definitions_table, sql_enqueue_ddl
from ship_sqla._jobs._tables import ship_job_history_table
from ship_sqla.errors import ConfigurationError


def _tables(name: str = "ship_job_runs", schema: str | None = None) -> tuple[Table, Table, Table]:
    metadata = MetaData()
    runs = ship_job_runs_table(metadata, name=name, schema=schema)
    state = ship_job_state_table(metadata, schema=schema)
    return runs, state, ship_job_definitions_table(metadata, schema=schema)


def test_the_build_hash_is_stable_and_names_the_body() -> None:
    """E5, E6: the same tables render the same statements and build hash (what the schema
    check compares); another table set another hash; every function is CREATE OR REPLACE."""
    first, second = sql_enqueue_ddl(*_tables()), sql_enqueue_ddl(*_tables())
    assert first == second
    assert build_of(first) != build_of(sql_enqueue_ddl(*_tables("other_runs")))
    creates = [s for s in first if "CREATE" in s and "FUNCTION" in s.split("(")[0]]
    assert creates
    assert all("CREATE OR REPLACE FUNCTION" in s for s in creates)


def test_the_definer_variant_is_hardened() -> None:
    """E7: SECURITY DEFINER with a fixed search_path, every name schema-qualified, EXECUTE
    revoked from PUBLIC and granted to the named role; the default is SECURITY INVOKER."""
    plain = "\n".join(sql_enqueue_ddl(*_tables()))
    assert "SECURITY INVOKER" in plain
    assert "SECURITY DEFINER" not in plain
    hardened = sql_enqueue_ddl(*_tables(), definer_role="app_enqueuer")
    text = "\n".join(hardened)
    assert "SECURITY DEFINER SET search_path = pg_catalog, pg_temp" in text
    assert "INSERT INTO public.ship_job_runs" in text
    assert "FROM public.ship_job_definitions" in text
    assert any(
        s.startswith("REVOKE ALL ON FUNCTION public.ship_job_runs_enqueue_v1(") for s in hardened
    )
    assert any('TO "app_enqueuer"' in s for s in hardened)


def test_a_runs_table_name_too_long_for_the_functions_is_refused() -> None:
    """E1: PostgreSQL would cut <runs>_enqueue_versions at 63 bytes: such a name is refused
    with the fix, before any DDL runs."""
    with pytest.raises(ConfigurationError, match="too long for the SQL enqueue functions"):
        sql_enqueue_ddl(*_tables("r" * 47))
    assert sql_enqueue_ddl(*_tables("r" * 46))


def test_a_history_table_is_probed_for_durable_ids() -> None:
    """J1, J16, E2: with the backend's history table, the function's durable-id probe reads it
    too (a run id that ended deduplicates, as ENQUEUE_MANY_EITHER does); without, it is not
    named."""
    runs, state, definitions = _tables()
    history = ship_job_history_table(runs.metadata)
    with_history = "\n".join(sql_enqueue_ddl(runs, state, definitions, history=history))
    assert "FROM ship_job_history h WHERE h.id = a_id" in with_history
    assert "ship_job_history" not in "\n".join(sql_enqueue_ddl(runs, state, definitions))
