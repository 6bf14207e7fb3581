"""J19 for J6: the claim's lapsed-lease probe under a held MVCC horizon. A REPEATABLE READ
snapshot held on a second connection keeps the ``<runs>_lease_idx`` entries of runs that ran and
ended since (dead, but not removable); once their leases are past, a probe from the index's
start reads all of them, one from the backend's lapsed floor (kernel ``LapsedFloors``) reads
only the leases that expired after it."""

from __future__ import annotations

from typing import Any

import pytest
from explain_helpers import buffers, check_plan, claim_params, explain, nodes
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._jobs import ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._sql import JobStatements, claim

metadata = MetaData()
runs = ship_job_runs_table(metadata, name="lapse_job_runs")
state = ship_job_state_table(metadata, name="lapse_job_state")
JOB = "lapse.job"
ENDED = 20_000
LIMIT = 100


def _params(window: float | None) -> dict[str, Any]:
    return claim_params(JOB, limit=LIMIT, lapsed_window=window)


async def _probe_buffers(engine: AsyncEngine, window: float | None) -> int:
    """Buffers of the claim's lapsed probe (its scan of <runs>_lease_idx), EXPLAIN ANALYZE."""
    statement = JobStatements(runs=runs.name, state=state.name)[claim.CLAIM_UNCAPPED]
    async with engine.connect() as connection, connection.begin() as transaction:
        plan = await explain(connection, statement, _params(window), generic=False)
        await transaction.rollback()
    check_plan(plan, runs, uses={"lease_idx"})
    probes = [node for node in nodes(plan) if node.get("Index Name") == f"{runs.name}_lease_idx"]
    assert len(probes) == 1, probes
    return buffers(probes[0])


@pytest.mark.timeout(300)
async def test_j6_j19_lapsed_probe_reads_from_its_floor_under_a_held_snapshot(
    ship_engine: AsyncEngine,
) -> None:
    """J6, J19: 20,000 runs that ran (leases expired over the last 20 s) and ended while a
    second connection holds a REPEATABLE READ snapshot: the probe from the start (every sweep)
    reads every dead entry; the probe from a lapsed floor 1 s back reads at most a tenth of
    that (measured: 2 buffers against 485)."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await connection.execute(
            text(
                f"INSERT INTO {runs.name} (id, job_id, payload, max_attempts, run_at, state,"
                "  attempt, lease_token, lease_expires_at)"
                " SELECT 'r' || lpad(g::text, 9, '0'), :job, '{}', 5, now() - interval '1 hour',"
                "  'running', 1, 1, now() - interval '21 seconds' + g * interval '1 millisecond'"
                " FROM generate_series(1, :n) g"
            ),
            {"job": JOB, "n": ENDED},
        )
    async with ship_engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        await connection.execute(text(f"VACUUM (ANALYZE) {runs.name}"))
    async with ship_engine.connect() as holder:
        await holder.execution_options(isolation_level="REPEATABLE READ")
        await holder.begin()
        await holder.execute(text("SELECT count(*) FROM pg_class"))
        async with ship_engine.begin() as connection:  # the runs end (J16 moves them out)
            await connection.execute(
                text(f"DELETE FROM {runs.name} WHERE job_id = :job"), {"job": JOB}
            )
        full = await _probe_buffers(ship_engine, None)
        floored = await _probe_buffers(ship_engine, 1.0)
        await holder.rollback()
    print({"lapsed probe buffers, from the start": full, "from the floor": floored})  # noqa: T201
    assert full > 10 * floored, (full, floored)
