"""EXPLAIN helpers of the plan tests: a statement's plan as a prepared statement (custom or
generic), its nodes, its buffers, and the check that it reads the named indexes and never scans
the table."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Table, TextClause, text
from sqlalchemy.dialects.postgresql import asyncpg as asyncpg_dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ship_sqla._jobs._tables import state_row

__all__ = ["buffers", "check_plan", "claim_params", "explain", "fill_waiting", "nodes"]


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(_literal(v) for v in value) + "]" if value else "'{}'"
    return "'" + str(value).replace("'", "''") + "'"


async def explain(
    connection: AsyncConnection, statement: TextClause, params: dict[str, Any], *, generic: bool
) -> dict[str, Any]:
    """EXPLAIN ANALYZE of ``statement`` run as a prepared statement (its effects rolled back)."""
    compiled = statement.compile(dialect=asyncpg_dialect.dialect())
    names = list(compiled.positiontup or [])
    mode = "force_generic_plan" if generic else "force_custom_plan"
    await connection.execute(text(f"SET LOCAL plan_cache_mode = {mode}"))
    await connection.exec_driver_sql(f"PREPARE ship_explained AS {compiled.string}")
    types = (
        await connection.execute(
            text(
                "SELECT parameter_types::text[] FROM pg_prepared_statements"
                " WHERE name = 'ship_explained'"
            )
        )
    ).scalar_one()
    arguments = ", ".join(
        f"CAST({_literal(params[name])} AS {kind})" for name, kind in zip(names, types, strict=True)
    )
    raw = (
        await connection.exec_driver_sql(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE ship_explained({arguments})"
        )
    ).scalar_one()
    await connection.exec_driver_sql("DEALLOCATE ship_explained")
    document = json.loads(raw) if isinstance(raw, str) else raw
    return dict(document[0]["Plan"])


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += nodes(child)
    return found


def buffers(plan: dict[str, Any]) -> int:
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


def check_plan(plan: dict[str, Any], table: Table, *, uses: set[str]) -> None:
    seq_scans = [
        n
        for n in nodes(plan)
        if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == table.name
    ]
    assert not seq_scans, f"sequential scan of {table.name}: {seq_scans}"
    indexes = {n["Index Name"] for n in nodes(plan) if "Index Name" in n}
    expected = {f"{table.name}_{suffix}" for suffix in uses}
    assert expected <= indexes, f"expected {expected}, plan used {indexes}"


def due_index_entries(plan: dict[str, Any], table: Table) -> int:
    """Index entries the plan read from ``<table>_due_idx``: rows returned or filtered out, over
    every loop (EXPLAIN reports both per loop)."""
    return sum(
        round((n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"])
        for n in nodes(plan)
        if n.get("Index Name") == f"{table.name}_due_idx"
    )


def claim_params(job_id: str, *, limit: int, **given: Any) -> dict[str, Any]:
    """The bind parameters of a claim of ``limit`` runs of ``job_id``, as the backend passes
    them, for the plan tests: a full walk (no floors, J19) with no lapsed floor, no single-runner
    key left out, no lapse limit, no cap and no rate (``given`` sets any of them, and what the
    fair, partitioned and aged claims add). The state rows (pause, gate) are named by the
    backend's own ``state_row``."""
    return {
        "job_id": job_id,
        "limit": limit,
        "lapsed_limit": limit,
        "lapsed_window": None,
        "lease": 30.0,
        "worker": "explain",
        "exclude_keys": [],
        "lapsed_final": "lapsed on the final attempt",
        "lapsed": "lapsed",
        "cancel_lapsed": "cancelled, lapsed",
        "max_lapses": None,
        "crash_loop": None,
        "pause_row": state_row(job_id, "paused"),
        "gate_row": state_row(job_id, "claim-gate"),
        "max_running": None,
        "rate_limit": None,
        "rate_period": None,
        "tuned": False,
        "now": None,
        "floor_priorities": [],
        "floor_run_ats": [],
        "floor_seqs": [],
        **given,
    }


async def fill_waiting(engine: AsyncEngine, runs: Table, job_id: str, n: int) -> None:
    """``n`` waiting runs of ``job_id`` in ``runs``, due a millisecond apart over the last hour
    in creation order, then ``VACUUM (ANALYZE)`` so the planner sees them."""
    async with engine.begin() as connection:
        await connection.execute(
            text(
                f"INSERT INTO {runs.name} (id, job_id, payload, max_attempts, run_at)"
                " SELECT 'r' || lpad(g::text, 9, '0'), :job, '{}', 5,"
                "  now() - interval '1 hour' + g * interval '1 millisecond'"
                " FROM generate_series(1, :n) g"
            ),
            {"job": job_id, "n": n},
        )
    async with engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        await connection.execute(text(f"VACUUM (ANALYZE) {runs.name}"))
