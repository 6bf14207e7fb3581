"""D9 on every backend: pinned handler versions.

A run records the handler version it was enqueued under; only that version's handler executes
it; a worker without it hands the run back with its attempt unspent; the stores count live runs
per version (the gauges' and the deploy check's input). Time moves only through the FrozenClock.
"""

from __future__ import annotations

from datetime import timedelta

import anyio
from job_helpers import ErrorLog, record_of

from ship_sqla import define_job, start_job_runtime
from ship_sqla.errors import JobVersionUnavailableError
from ship_sqla.kernel._jobs import VERSION_RECHECK
from ship_sqla.kernel._versions import VersionCount, stranded_runs

JOB = "conf.versions"


def _handlers(seen: list[tuple[str, int]], done: anyio.Event, total: int):
    def handler(version: int):
        async def run(ctx, payload) -> None:
            seen.append((payload["name"], version))
            if len(seen) == total:
                done.set()

        return run

    return handler


async def test_d9_each_run_executes_on_the_version_it_was_enqueued_under(
    clock, job_backend_factory
):
    """D9: runs enqueued before the v2 deploy keep executing v1's handler (kept as previous=),
    new runs execute v2's, and a run stored before versions existed runs on the lowest version
    served; each run's record carries its version, and the store counts live runs per (job,
    version, state) before they run."""
    backend = job_backend_factory(clock)
    seen: list[tuple[str, int]] = []
    done = anyio.Event()
    handler = _handlers(seen, done, 3)
    unversioned = define_job(JOB, handler(0), payload=dict)
    v1 = define_job(JOB, handler(1), payload=dict, version=1)
    v2 = define_job(JOB, handler(2), payload=dict, version=2, previous={1: handler(1)})
    legacy = (await backend.enqueue(unversioned, {"name": "legacy"})).run_id
    old = (await backend.enqueue(v1, {"name": "old"})).run_id
    new = (await backend.enqueue(v2, {"name": "new"})).run_id
    assert [(await record_of(backend, r)).handler_version for r in (legacy, old, new)] == [
        None,
        1,
        2,
    ]
    assert await backend.version_counts([JOB]) == [
        VersionCount(JOB, 1, "waiting", 1),
        VersionCount(JOB, 2, "waiting", 1),
    ]
    assert await backend.version_counts(["other"]) == []
    async with await start_job_runtime([v2], backend=backend, worker_id="w-v2"):
        with anyio.fail_after(20):
            await done.wait()
    assert sorted(seen) == [("legacy", 1), ("new", 2), ("old", 1)]
    assert await backend.version_counts() == []


async def test_d9_a_claimer_without_the_version_hands_the_run_back_attempt_unspent(
    clock, job_backend_factory, caplog
):
    """D9: a v2-only worker claims a v1 run: its handler never runs, JobVersionUnavailableError
    goes to on_error, and the run is back to waiting with its attempt unspent, the refusal in
    its history, due VERSION_RECHECK seconds later, and the worker's start warned naming the job,
    the version and the count; a worker that registers v1 then executes it
    with v1's handler. The stranded rule counts it while no one serves v1."""
    errors = ErrorLog()
    backend = job_backend_factory(clock, on_error=errors)
    seen: list[tuple[str, int]] = []
    done = anyio.Event()
    handler = _handlers(seen, done, 1)
    v1 = define_job(JOB, handler(1), payload=dict, version=1)
    v2_only = define_job(JOB, handler(2), payload=dict, version=2)
    run_id = (await backend.enqueue(v1, {"name": "old"})).run_id
    counts = await backend.version_counts([JOB])
    assert [
        (s.job_id, s.version, s.runs) for s in stranded_runs(counts, {JOB: frozenset({2})})
    ] == [(JOB, 1, 1)]
    assert stranded_runs(counts, {JOB: frozenset({1, 2})}) == []
    before = clock.now()
    async with await start_job_runtime([v2_only], backend=backend, worker_id="w-v2"):
        refusal = await errors.wait_for(lambda e: isinstance(e, JobVersionUnavailableError))
    assert "version 1" in str(refusal)
    assert f"job {JOB!r} has 1 live run of version 1" in caplog.text
    assert seen == []
    record = await record_of(backend, run_id)
    assert (record.state, record.attempt, record.handler_version) == ("waiting", 0, 1)
    assert record.history[-1]["kind"] == "released"
    assert "SHIP_SQLA_JOB_VERSION_UNAVAILABLE" in record.history[-1]["error"]
    assert record.run_at >= before + timedelta(seconds=VERSION_RECHECK)
    v1_worker = define_job(JOB, handler(2), payload=dict, version=2, previous={1: handler(1)})
    clock.advance(VERSION_RECHECK)
    async with await start_job_runtime([v1_worker], backend=backend, worker_id="w-v1"):
        with anyio.fail_after(20):
            await done.wait()
    assert seen == [("old", 1)]
    record = await record_of(backend, run_id)
    assert (record.state, record.attempt) == ("completed", 1)
