"""F1's held count on PostgreSQL (kernel ``_plans/held_count.py``): a capped claim reads the
job's running count off its state rows, not off ``<runs>_lease_idx``, so under a held MVCC
snapshot its cost does not grow with the runs that ran since (issue 39); a forgotten release
leaves the cap lower, never higher, until the next recount (J19's sweep)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from explain_helpers import buffers, check_plan, claim_params, explain, fill_waiting, nodes
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._sql import JobStatements, claim
from ship_sqla._jobs._tables import release_rows
from ship_sqla.kernel import completed
from ship_sqla.kernel._plans.claim_floor import DEFAULT_FLOOR_SWEEP
from ship_sqla.kernel._ports import MAX_CLAIM_BATCH, ClaimRequest
from ship_sqla.testing import FrozenClock

metadata = MetaData()
runs = ship_job_runs_table(metadata, name="held_job_runs")
state = ship_job_state_table(metadata, name="held_job_state")
JOB = "held.job"
CAP = 1_000
SETTLED = 20_000
LIMIT = 100
SWEPT = timedelta(seconds=DEFAULT_FLOOR_SWEEP + 1.0)
"""A sweep's recount comes at most this long after a claim (a claim a second)."""


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return ship_engine


async def _fill(engine: AsyncEngine, n: int) -> None:
    await fill_waiting(engine, runs, JOB, n)


def _params(clock: FrozenClock, backend: Any, *, sweep: bool) -> dict[str, Any]:
    floors = backend.claim_floors.floors(JOB, clock.now())
    return claim_params(
        JOB,
        limit=LIMIT,
        lapsed_limit=LIMIT + CAP,
        lapsed_window=None if sweep else 1.0,
        now=clock.now().isoformat(),
        floor_priorities=[floor.priority for floor in floors],
        floor_run_ats=[floor.run_at.isoformat() for floor in floors],
        floor_seqs=[floor.seq for floor in floors],
        max_running=CAP,
    )


async def _claim_buffers(engine: AsyncEngine, params: dict[str, Any]) -> tuple[int, int]:
    """The claim's buffers, and those of its reads of ``<runs>_lease_idx`` (the lapsed probe,
    and the running count when it counts)."""
    statement = JobStatements(runs=runs.name, state=state.name)[claim.CLAIM_GATED]
    async with engine.connect() as connection, connection.begin() as transaction:
        plan = await explain(connection, statement, params, generic=False)
        await transaction.rollback()
    check_plan(plan, runs, uses={"due_idx"})
    assert plan["Actual Rows"] == LIMIT
    lease = [n for n in nodes(plan) if n.get("Index Name") == f"{runs.name}_lease_idx"]
    return buffers(plan), sum(buffers(n) for n in lease)


@pytest.mark.timeout(300)
async def test_f1_j19_capped_claim_buffers_stay_flat_under_a_held_snapshot(
    engine: AsyncEngine,
) -> None:
    """F1 under J19 (issue 39): a job capped at 1,000 drains 20,000 runs (claims of
    MAX_CLAIM_BATCH, each batch completed) while a second connection holds a REPEATABLE READ
    snapshot; every settled run leaves a dead, unremovable ``<runs>_lease_idx`` entry. The
    capped claim of 100 between sweeps (EXPLAIN ANALYZE, BUFFERS) reads at most 1.25x its
    buffers at the start, and at most 10 off ``<runs>_lease_idx`` (its floored lapsed probe):
    its running count is the kept one, off the state rows. The same claim on the sweep (the
    recount, which counts the running runs) reads the dead entries there, which shows the
    snapshot is held; on main every capped claim counted so."""
    await _fill(engine, SETTLED + 10 * MAX_CLAIM_BATCH)
    clock = FrozenClock()
    backend = create_job_backend(
        database=engine, table=runs, state_table=state, listen=False, clock=clock
    )
    request = ClaimRequest(
        job_id=JOB, worker="w", limit=MAX_CLAIM_BATCH, max_running=CAP, lease=30.0
    )
    measured: list[tuple[int, int]] = []
    async with engine.connect() as holder:
        await holder.execution_options(isolation_level="REPEATABLE READ")
        await holder.begin()
        await holder.execute(text("SELECT count(*) FROM pg_class"))
        settled = 0
        for checkpoint in (0, SETTLED // 2, SETTLED):
            while settled < checkpoint or settled == 0:
                batch = await backend.claim(request)
                assert len(batch) == MAX_CLAIM_BATCH
                await backend.settle([completed(run) for run in batch])
                settled += len(batch)
            measured.append(await _claim_buffers(engine, _params(clock, backend, sweep=False)))
        recount = await _claim_buffers(engine, _params(clock, backend, sweep=True))
        assert (await holder.execute(text("SELECT count(*) FROM pg_class"))).scalar_one() > 0
        await holder.rollback()
    assert all(claimed <= 1.25 * measured[0][0] for claimed, _ in measured), measured
    assert all(lease <= 10 for _, lease in measured), measured
    assert recount[1] > 10 * max(10, measured[0][1]), (recount, measured)


async def test_f1_j19_a_forgotten_release_lowers_the_cap_until_the_sweep(
    engine: AsyncEngine,
) -> None:
    """F1, J19 (kernel held_count rule 5): a run taken out of ``running`` by a path that wrote
    no release (here a bare UPDATE) keeps its slot in the kept count: the claims between
    sweeps take nothing more (fewer grants, never more); the next sweep's recount gives the
    slot back, so the cap is stuck for at most ``sweep`` seconds plus one claim."""
    await _fill(engine, 5)
    clock = FrozenClock()
    backend = create_job_backend(
        database=engine, table=runs, state_table=state, listen=False, clock=clock
    )
    request = ClaimRequest(job_id=JOB, worker="w", limit=5, max_running=2, lease=30.0)
    first = await backend.claim(request)
    assert len(first) == 2
    async with engine.begin() as connection:
        await connection.execute(
            text(f"UPDATE {runs.name} SET state = 'completed' WHERE id = :id"),
            {"id": first[0].run_id},
        )
        rows = dict(
            (
                await connection.execute(
                    text(f"SELECT job_id, claim_granted FROM {state.name} WHERE job_id LIKE :p"),
                    {"p": f"{JOB}#%"},
                )
            ).all()
        )
    assert rows[f"{JOB}#held-base"] is not None  # the first claim's recount set the base
    started = clock.now()
    got: list[Any] = []
    while not got:
        clock.advance(1.0)
        sweep = backend.lapsed_floors.window(JOB, clock.now()) is None
        got = list(await backend.claim(request))
        assert sweep or got == [], "a claim between sweeps granted the unreleased slot"
        assert clock.now() - started <= SWEPT, "stuck past the sweep"
    assert len(got) == 1


async def test_f1_an_uncapped_jobs_settle_writes_no_state_row(engine: AsyncEngine) -> None:
    """F1's release is written only for a job whose held count is kept: an uncapped job's
    claims and settles leave the state table empty (the plain hot path pays one probe)."""
    await _fill(engine, 3)
    backend = create_job_backend(
        database=engine, table=runs, state_table=state, listen=False, clock=FrozenClock()
    )
    batch = await backend.claim(
        ClaimRequest(job_id=JOB, worker="w", limit=3, max_running=None, lease=30.0)
    )
    assert await backend.settle([completed(run) for run in batch]) == ["completed"] * 3
    async with engine.connect() as connection:
        count = (await connection.execute(text(f"SELECT count(*) FROM {state.name}"))).scalar()
    assert count == 0


async def _slots(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as connection:
        found = await connection.execute(
            text(
                f"SELECT job_id, claim_granted FROM {state.name}"
                " WHERE job_id = ANY(CAST(:rows AS text[]))"
            ),
            {"rows": release_rows(JOB)[:-1]},
        )
        return {str(job_id): int(n) for job_id, n in found.all()}


@pytest.mark.timeout(120)
async def test_f1_j13_a_settle_never_waits_on_a_slot_another_transaction_holds(
    engine: AsyncEngine,
) -> None:
    """F1 and J13 (kernel held_count): a transactional handler's settle holds the release slot it
    wrote until the user's transaction commits. Another settle of the job skips a held slot
    (``FOR UPDATE SKIP LOCKED``) and releases on a free one, so it does not wait, and the kept
    count stays exact: the next claim between sweeps grants both freed slots. With every slot
    held, the settle still does not wait; its release is dropped (rule 5's drift: the cap is
    lower until the next recount, never higher)."""
    await _fill(engine, 6)
    clock = FrozenClock()
    backend = create_job_backend(
        database=engine, table=runs, state_table=state, listen=False, clock=clock
    )
    request = ClaimRequest(job_id=JOB, worker="w", limit=2, max_running=2, lease=30.0)
    first = await backend.claim(request)  # the recount: sets the base
    assert len(first) == 2
    async with engine.begin() as connection:
        await connection.execute(
            text(
                f"INSERT INTO {state.name} (job_id, claim_granted)"
                " SELECT unnest(CAST(:rows AS text[])), 0"
                " ON CONFLICT (job_id) DO NOTHING"
            ),
            {"rows": release_rows(JOB)[:-1]},
        )
    assert await backend.settle([completed(first[0])]) == ["completed"]
    [used] = [slot for slot, n in (await _slots(engine)).items() if n == 1]
    async with engine.connect() as holder:
        await holder.begin()  # the user's transaction, its settle's slot row held
        await holder.execute(
            text(f"SELECT 1 FROM {state.name} WHERE job_id = :slot FOR UPDATE"), {"slot": used}
        )
        settled = await asyncio.wait_for(backend.settle([completed(first[1])]), timeout=30)
        assert settled == ["completed"]
        slots = await _slots(engine)
        assert sum(slots.values()) == 2, slots
        assert slots[used] == 1, slots
        clock.advance(1.0)
        assert backend.lapsed_floors.window(JOB, clock.now()) is not None  # not a sweep
        second = await backend.claim(request)
        assert len(second) == 2  # both slots given back, in the kept count
        await holder.execute(
            text(
                f"SELECT 1 FROM {state.name} WHERE job_id = ANY(CAST(:rows AS text[])) FOR UPDATE"
            ),
            {"rows": release_rows(JOB)[:-1]},
        )
        settled = await asyncio.wait_for(backend.settle([completed(second[0])]), timeout=30)
        assert settled == ["completed"]
        assert sum((await _slots(engine)).values()) == 2  # dropped: every slot held
        await holder.rollback()
