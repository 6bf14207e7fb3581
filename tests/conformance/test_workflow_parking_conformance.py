"""D10 on every backend: a divergence parks the run.

A workflow run sleeps under one handler; a deploy swaps in a handler that reorders its steps.
When the run wakes, the diverging step never runs and spends no attempt: the run waits parked
(no slot, lease or attempt held), the divergence in its history. An operator's unpark after a
compatible deploy completes it with one effect per step; ``on_divergence="fail"`` dead-letters
instead; a new build's first worker unparks parked runs once. Time moves only through the
FrozenClock; the runtime (its executor) is what parks.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from job_helpers import ErrorLog, record_of
from spy_backend import SpyBackend

from ship_sqla import create_job_operations, define_job, start_job_runtime
from ship_sqla.errors import JobOperationRefusedError, WorkflowDivergedError
from ship_sqla.jobs import Concurrency
from ship_sqla.kernel._settlement import DIVERGED, PARKED_UNTIL

JOB = "conf.parking"


def allow_all(permission: str, operation: str) -> bool:
    return True


class Effects:
    """Each step function's runs, and an event set when the handler completes."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.done = anyio.Event()

    def step(self, name: str) -> Any:
        async def run() -> str:
            self.ran.append(name)
            return name.upper()

        return run


def handler(effects: Effects, order: tuple[str, str]) -> Any:
    async def run(ctx: Any, payload: Any) -> None:
        for name in order:
            await ctx.step(name, effects.step(name))
        await ctx.sleep("nap", 60)
        await ctx.step("c", effects.step("c"))
        effects.done.set()

    return run


def define(effects: Effects, order: tuple[str, str], **options: Any) -> Any:
    return define_job(
        JOB, handler(effects, order), payload=dict, concurrency=Concurrency(lease=30), **options
    )


async def _sleeping_run(clock: Any, backend: Any, effects: Effects) -> str:
    """A run of the v1 handler (a, b, then a sleep), executed up to its sleep."""
    v1 = define(effects, ("a", "b"))
    run_id = (await backend.enqueue(v1, {})).run_id
    async with await start_job_runtime([v1], backend=backend, worker_id="w-v1"):
        with anyio.fail_after(20):
            while (await record_of(backend, run_id)).wait_for is None and effects.ran != [
                "a",
                "b",
            ]:
                await anyio.lowlevel.checkpoint()
    assert effects.ran == ["a", "b"]
    return run_id


async def _diverge(clock: Any, backend: Any, errors: ErrorLog, job: Any) -> None:
    """Wake the sleeping run on ``job`` (a reordering deploy) and wait for its divergence."""
    clock.advance(61)
    async with await start_job_runtime([job], backend=backend, worker_id="w-v2"):
        await errors.wait_for(lambda e: isinstance(e, WorkflowDivergedError), limit=20)


async def test_d10_a_diverging_run_parks_and_an_unpark_after_the_fix_completes_it(
    clock, job_backend_factory
):
    """D10, D7, S1: the reordered handler's first call (b at position 0) diverges: no step
    function runs, the run waits parked for '#diverged' (due never) with the same attempt, its
    last history entry the divergence (position 0, recorded a, asked b, as JSON too);
    list_parked finds it; an unpark is refused for a run that is not parked; after the fix (v1's
    order back) ops.unpark makes it due and it completes, each step's effect exactly once. The
    parked gauge's count follows it."""
    errors = ErrorLog()
    backend = job_backend_factory(clock, on_error=errors)
    effects = Effects()
    run_id = await _sleeping_run(clock, backend, effects)
    before = await record_of(backend, run_id)
    await _diverge(clock, backend, errors, define(effects, ("b", "a")))
    assert effects.ran == ["a", "b"]
    record = await record_of(backend, run_id)
    assert (record.state, record.wait_for, record.run_at) == ("waiting", DIVERGED, PARKED_UNTIL)
    assert record.attempt == before.attempt
    entry = record.history[-1]
    assert entry["kind"] == "diverged"
    assert "SHIP_SQLA_WORKFLOW_DIVERGED" in entry["error"]
    found = json.loads(entry["error"].rsplit("\n", 1)[-1])
    assert (found["position"], found["recorded"]["name"], found["requested"]["name"]) == (
        0,
        "a",
        "b",
    )

    assert await backend.parked_counts([JOB, "other"]) == {JOB: 1}
    ops = create_job_operations(backend, authorizer=allow_all)
    assert [r.run_id for r in await ops.list_parked(job_id=JOB)] == [run_id]
    assert await ops.list_parked(job_id="other") == []
    fixed = define(effects, ("a", "b"))
    unparked = await ops.unpark(run_id)
    assert (unparked.wait_for, unparked.state) == (None, "waiting")
    with pytest.raises(JobOperationRefusedError, match="parked"):
        await ops.unpark(run_id)
    async with await start_job_runtime([fixed], backend=backend, worker_id="w-fix"):
        with anyio.fail_after(20):
            await effects.done.wait()
    assert effects.ran == ["a", "b", "c"]
    assert await ops.list_parked() == []
    assert await backend.parked_counts([JOB]) == {}


async def test_d10_on_divergence_fail_keeps_the_dead_letter(clock, job_backend_factory):
    """D10: on_divergence="fail" dead-letters a diverging run at once (the earlier behaviour),
    with no step function run."""
    errors = ErrorLog()
    backend = job_backend_factory(clock, on_error=errors)
    effects = Effects()
    run_id = await _sleeping_run(clock, backend, effects)
    clock.advance(61)
    spy = SpyBackend(backend)
    failing = define(effects, ("b", "a"), on_divergence="fail")
    async with await start_job_runtime([failing], backend=spy, worker_id="w-fail"):
        await spy.wait_calls("settle", 1, limit=20)
    assert effects.ran == ["a", "b"]
    record = await record_of(backend, run_id)
    assert (record.state, record.wait_for) == ("dead", None)


async def test_d10_a_new_build_unparks_parked_runs_once(clock, job_backend_factory):
    """D10: the first worker of build B2 unparks the parked run (it still diverges on the same
    code: it parks again); the next worker of B2 does not unpark it; a worker of B3 does."""
    errors = ErrorLog()
    backend = job_backend_factory(clock, on_error=errors)
    effects = Effects()
    run_id = await _sleeping_run(clock, backend, effects)
    reordered = define(effects, ("b", "a"))
    await _diverge(clock, backend, errors, reordered)
    parks = sum(isinstance(e, WorkflowDivergedError) for e in errors.errors)
    async with await start_job_runtime(
        [reordered], backend=backend, worker_id="w-b2", build_id="B2"
    ):
        with anyio.fail_after(20):
            while sum(isinstance(e, WorkflowDivergedError) for e in errors.errors) == parks:
                await errors.wait_count(len(errors.errors) + 1, limit=20)
    record = await record_of(backend, run_id)
    assert record.wait_for == DIVERGED
    assert [h["kind"] for h in record.history].count("diverged") == 2
    async with await start_job_runtime(
        [reordered], backend=backend, worker_id="w-b2-again", build_id="B2"
    ):
        pass
    assert (await record_of(backend, run_id)).run_at == PARKED_UNTIL
    clock.advance(timedelta(seconds=1).total_seconds())
    fixed = define(effects, ("a", "b"))
    async with await start_job_runtime([fixed], backend=backend, worker_id="w-b3", build_id="B3"):
        with anyio.fail_after(20):
            await effects.done.wait()
    assert effects.ran == ["a", "b", "c"]


async def test_d10_d6_a_parked_run_is_rerun_from_a_step_or_discarded(clock, job_backend_factory):
    """D10, D6, S1: re-running a parked run from its first step drops every stored step and
    makes it due (no longer parked): the new code runs it from scratch (b, a, then c); a second
    parked run is discarded."""
    errors = ErrorLog()
    backend = job_backend_factory(clock, on_error=errors)
    effects = Effects()
    run_id = await _sleeping_run(clock, backend, effects)
    reordered = define(effects, ("b", "a"))
    await _diverge(clock, backend, errors, reordered)
    ops = create_job_operations(backend, authorizer=allow_all)
    rerun = await ops.rerun_from_step(run_id, "a")
    assert (rerun.state, rerun.wait_for) == ("waiting", None)
    async with await start_job_runtime([reordered], backend=backend, worker_id="w-rerun"):
        with anyio.fail_after(20):
            # The re-run goes to its own sleep (a real database answers in real time).
            while (await record_of(backend, run_id)).run_at <= clock.now():
                await anyio.lowlevel.checkpoint()
    assert effects.ran == ["a", "b", "b", "a"]
    clock.advance(61)
    async with await start_job_runtime([reordered], backend=backend, worker_id="w-woken"):
        with anyio.fail_after(20):
            await effects.done.wait()
    assert effects.ran == ["a", "b", "b", "a", "c"]
    assert (await record_of(backend, run_id)).state == "completed"

    other = Effects()
    second = await _sleeping_run(clock, backend, other)
    errors.errors.clear()
    await _diverge(clock, backend, errors, define(other, ("b", "a")))
    assert (await record_of(backend, second)).wait_for == DIVERGED
    assert (await ops.discard(second)).state == "discarded"
    assert await ops.list_parked() == []


async def test_d10_d11_a_parked_run_moves_to_a_version_it_replays_cleanly_on(
    clock, job_backend_factory
):
    """D10, D11, D9, S1: the fix keeps the old handler as version 1 beside the reordered
    version 2; moving the parked run to version 2 is refused (its history diverges there, and
    the refusal says where), moving it to version 1 is allowed (a clean replay, no effect run),
    records version 1 and unparks it, and version 1's handler completes it."""
    errors = ErrorLog()
    backend = job_backend_factory(clock, on_error=errors)
    effects = Effects()
    run_id = await _sleeping_run(clock, backend, effects)
    await _diverge(clock, backend, errors, define(effects, ("b", "a")))
    fixed = define(effects, ("b", "a"), version=2, previous={1: handler(effects, ("a", "b"))})
    ops = create_job_operations(backend, authorizer=allow_all)
    with pytest.raises(JobOperationRefusedError, match="diverged from its history at position 0"):
        await ops.move_version(run_id, 2, registry=[fixed])
    assert (await record_of(backend, run_id)).wait_for == DIVERGED
    moved = await ops.move_version(run_id, 1, registry=[fixed])
    assert (moved.handler_version, moved.wait_for) == (1, None)
    assert effects.ran == ["a", "b"]
    async with await start_job_runtime([fixed], backend=backend, worker_id="w-moved"):
        with anyio.fail_after(20):
            await effects.done.wait()
    assert effects.ran == ["a", "b", "c"]


async def test_d10_j16_a_run_parks_and_unparks_with_a_history_table(
    clock, live_only_backend_factory
):
    """D10 with J16: on a backend whose ending statement moves runs to history, a diverging
    run is parked (its wait_for kept by the moving settle) and an unpark completes it."""
    await test_d10_a_diverging_run_parks_and_an_unpark_after_the_fix_completes_it(
        clock, live_only_backend_factory
    )


async def test_d10_j16_a_new_build_unparks_once_with_a_history_table(
    clock, live_only_backend_factory
):
    """D10 with J16: a new build unparks the parked runs once, the moving settle alike."""
    await test_d10_a_new_build_unparks_parked_runs_once(clock, live_only_backend_factory)
