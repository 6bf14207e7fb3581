"""J23 on every backend: a suspension the store cannot hold (injected past the workflow calls'
checks) fails its run alone; the other settlements of its batch land as if nothing happened."""

from __future__ import annotations

from datetime import timedelta, timezone
from typing import Any

from job_helpers import claim_request, record_of

from ship_sqla import define_job
from ship_sqla.errors import JobSettleRefusedError
from ship_sqla.jobs import Concurrency, EnqueueRequest, RetryPolicy
from ship_sqla.kernel import NewStep, Suspend, completed, failed

BEFORE_YEAR_ONE_IN_UTC = timezone(timedelta(hours=23))


async def _noop(_ctx: Any, _payload: Any) -> None:
    return None


async def test_j23_a_refused_suspension_fails_its_run_alone(clock, job_backend_factory):
    """J23, D3, J5: a batch of five holds a suspension whose step name is a lone surrogate and
    one whose wake time leaves the datetime range in UTC; both runs end dead with the typed
    refusal in their history (and on_error), the store answering "refused"; the three others
    land (completed, retrying) and nothing answers stale."""
    errors: list[BaseException] = []
    backend = job_backend_factory(clock, on_error=errors.append)
    job = define_job(
        "j23.conf", _noop, payload=dict, retry=RetryPolicy(attempts=5), concurrency=Concurrency()
    )
    await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(5)])
    runs = sorted(
        await backend.claim(claim_request(job, worker="w", limit=5)),
        key=lambda run: run.payload["n"],
    )
    now = clock.now()
    out_of_range = now.replace(year=1, month=1, day=1, tzinfo=BEFORE_YEAR_ONE_IN_UTC)
    outcomes = await backend.settle(
        [
            completed(runs[0]),
            Suspend(runs[1], NewStep("\ud800", 0, "sleep", "waiting", wake_at=now), "sleep"),
            failed(runs[2], "boom", now + timedelta(seconds=30)),
            Suspend(runs[3], NewStep("nap", 0, "sleep", "waiting", wake_at=out_of_range), "sleep"),
            completed(runs[4]),
        ]
    )
    assert outcomes == ["completed", "refused", "retrying", "refused", "completed"]
    for index in (1, 3):
        record = await record_of(backend, runs[index].run_id)
        assert record.state == "dead"
        [entry] = record.history
        assert entry["kind"] == "terminal"
        assert entry["error"].startswith(JobSettleRefusedError.code)
    assert [type(error) for error in errors] == [JobSettleRefusedError] * 2
    assert await backend.settle([completed(run) for run in runs]) == ["stale"] * 5
