"""J23 on PostgreSQL: a settlement the database refuses (a value it cannot hold, injected past
the kernel's checks) affects its run alone: the settle statement is sent in halves until the
refused one is alone, in the same batch as runs that settle as if nothing happened. The same
for suspensions on every backend: tests/conformance/test_settle_refusal_conformance.py."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from job_helpers import claim_request
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncEngine
from workflow_helpers import workflow_backend

from ship_sqla import define_job, ship_job_runs_table
from ship_sqla.errors import JobSettleRefusedError
from ship_sqla.jobs import Concurrency, EnqueueRequest, RetryPolicy
from ship_sqla.kernel import NewStep, Suspend, completed, failed, released, snoozed

# A time PostgreSQL's driver cannot encode: in UTC it falls before year 1.
BEFORE_YEAR_ONE = datetime(1, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=23)))


async def _noop(_ctx: Any, _payload: Any) -> None:
    return None


async def test_j23_a_refused_settlement_or_suspension_fails_its_run_alone(
    ship_engine: AsyncEngine,
) -> None:
    """J23, J5, D3: one batch of eight settlements holds a release whose time the driver cannot
    encode (the plain settle statement: settled in halves until it is alone), a suspension whose
    step name is a lone surrogate and one whose wake time is out of range. Those three runs end
    dead, the typed refusal in their history and reported once each to on_error; the five
    others land exactly as they would have alone (completed, retrying, snoozed), and nothing is
    answered stale."""
    errors: list[BaseException] = []
    backend = await workflow_backend(ship_engine, on_error=errors.append)
    job = define_job(
        "j23.batch",
        _noop,
        payload=dict,
        retry=RetryPolicy(attempts=5),
        concurrency=Concurrency(lease=60),
    )
    await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(8)])
    runs = sorted(
        await backend.claim(claim_request(job, worker="w", limit=8)),
        key=lambda run: run.payload["n"],
    )
    now = datetime.now(UTC)
    # Injected: released() itself refuses this time (require_aware); a store must still not
    # let one bad row fail the rest of its batch.
    poisoned = copy.copy(released(runs[2], now, reason="lock-held"))
    object.__setattr__(poisoned, "run_at", BEFORE_YEAR_ONE)
    settlements = [
        completed(runs[0]),
        failed(runs[1], "boom", now + timedelta(seconds=30)),
        poisoned,
        completed(runs[3]),
        Suspend(runs[4], NewStep("\ud800", 0, "sleep", "waiting", wake_at=now), "sleep"),
        Suspend(runs[5], NewStep("nap", 0, "sleep", "waiting", wake_at=BEFORE_YEAR_ONE), "sleep"),
        completed(runs[6]),
        snoozed(runs[7], now + timedelta(seconds=30), "not yet"),
    ]
    outcomes = await backend.settle(settlements)
    assert outcomes == [
        "completed",
        "retrying",
        "refused",
        "completed",
        "refused",
        "refused",
        "completed",
        "snoozed",
    ]
    records = [await backend.admin.get_run(run.run_id) for run in runs]
    states = [record.state if record is not None else None for record in records]
    assert states == [
        "completed",
        "waiting",
        "dead",
        "completed",
        "dead",
        "dead",
        "completed",
        "waiting",
    ]
    for index in (2, 4, 5):
        record = records[index]
        assert record is not None
        [entry] = record.history
        assert entry["kind"] == "terminal"
        assert entry["error"].startswith(JobSettleRefusedError.code)
        assert record.last_error == entry["error"]
    refusals = [error for error in errors if isinstance(error, JobSettleRefusedError)]
    assert len(refusals) == 3
    assert errors == refusals
    # Settled once each: the claim tokens are spent, a repeat is stale for every run.
    assert await backend.settle([completed(run) for run in runs]) == ["stale"] * 8


async def test_j23_a_constraint_violation_fails_its_run_alone(ship_engine: AsyncEngine) -> None:
    """J23, J5: constraints the database enforces and the kernel knows nothing of (CHECKs the
    application added to the runs table) refuse two settlements of a batch of six (SQLSTATE
    23514). One refuses the failure's text (which the refusal quotes, so the bare refusal is
    stored): that run ends dead with the typed refusal in its history. One refuses every state
    but running: nothing of it can be stored, it stays claimed (its lease lapses later) and the
    refusal says so. The four others land as they would have alone, nothing is answered stale,
    and the statement never raises."""
    errors: list[BaseException] = []
    # J16: the in-place shape (the runs table given, no history declared): the application's
    # CHECKs are on the runs table, where a dead run stays (with a history it moves there).
    backend = await workflow_backend(
        ship_engine, on_error=errors.append, table=ship_job_runs_table(MetaData())
    )
    job = define_job(
        "j23.check",
        _noop,
        payload=dict,
        retry=RetryPolicy(attempts=5),
        concurrency=Concurrency(lease=60),
    )
    await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(6)])
    runs = sorted(
        await backend.claim(claim_request(job, worker="w", limit=6)),
        key=lambda run: run.payload["n"],
    )
    async with ship_engine.begin() as connection:
        await connection.exec_driver_sql(
            "ALTER TABLE ship_job_runs ADD CONSTRAINT j23_text"
            " CHECK (last_error IS NULL OR last_error NOT LIKE '%forbidden by a check%')"
        )
        await connection.exec_driver_sql(
            "ALTER TABLE ship_job_runs ADD CONSTRAINT j23_state"
            f" CHECK (id <> '{runs[5].run_id}' OR state = 'running')"
        )
    later = datetime.now(UTC) + timedelta(seconds=30)
    settlements = [
        completed(runs[0]),
        failed(runs[1], "an ordinary failure", later),
        completed(runs[2]),
        failed(runs[3], "ValueError: forbidden by a check", later),
        completed(runs[4]),
        snoozed(runs[5], later, "not yet"),
    ]
    outcomes = await backend.settle(settlements)
    assert outcomes == ["completed", "retrying", "completed", "refused", "completed", "refused"]
    refused = await backend.admin.get_run(runs[3].run_id)
    assert refused is not None
    assert refused.state == "dead"
    [entry] = refused.history
    assert entry["kind"] == "terminal"
    assert entry["error"].startswith(JobSettleRefusedError.code)
    # The refusal quoting the refused text was refused too: the bare one names the cause.
    assert "IntegrityError" in entry["error"]
    assert "forbidden" not in entry["error"]
    stuck = await backend.admin.get_run(runs[5].run_id)
    assert stuck is not None
    assert (stuck.state, list(stuck.history)) == ("running", [])
    [refusal, unstored] = errors
    assert isinstance(refusal, JobSettleRefusedError)
    assert isinstance(unstored, JobSettleRefusedError)
    assert "Not even its failure could be stored" in str(unstored)
    assert await backend.settle([completed(run) for run in runs[:5]]) == ["stale"] * 5
