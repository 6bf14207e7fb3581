"""J23 on PostgreSQL: a settlement the database refuses (a value it cannot hold, injected past
the kernel's checks) affects its run alone: the settle statement is sent in halves until the
refused one is alone, in the same batch as runs that settle as if nothing happened. The same
for suspensions on every backend: tests/conformance/test_settle_refusal_conformance.py."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from job_helpers import claim_request
from sqlalchemy.ext.asyncio import AsyncEngine
from workflow_helpers import workflow_backend

from ship_sqla import define_job
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
