"""D7, D8 on every backend: the in-memory model and PostgreSQL detect the same divergences at
the same positions, and answer ``ctx.patched`` the same (positions as stored, markers as steps).
Driven one execution at a time (``execute_once``), time only through the FrozenClock."""

from __future__ import annotations

from typing import Any

import attrs
from workflow_helpers import FakeUnitOfWork, execute_once

from ship_sqla import define_job
from ship_sqla.errors import WorkflowDivergedError, WorkflowMisuseError
from ship_sqla.jobs import Concurrency, RetryPolicy
from ship_sqla.workflows import StepCall

RETRY_WAIT = 86400.0


def allow_all(permission: str, operation: str) -> bool:
    return True


class StopError(Exception):
    """A crash point: the attempt fails after the calls made so far, which stay stored."""


@attrs.define
class Script:
    calls: list[tuple[str, str]]
    stop: int | None = None
    ran: list[str] = attrs.Factory(list)
    result: Any = None
    answers: list[bool] = attrs.Factory(list)


class V2:
    def encode(self, value: Any) -> Any:
        return {"v2": value}

    def decode(self, data: Any) -> Any:
        if not isinstance(data, dict) or "v2" not in data:
            raise ValueError(f"{data!r} is not a v2 result")
        return data["v2"]


def scripted(job_id: str, script: Script, uow: FakeUnitOfWork, **options: Any):
    async def handler(ctx, payload):
        for made, (kind, name) in enumerate([*script.calls, ("end", "")]):
            if made == script.stop:
                raise StopError(made)
            if kind == "end":
                return

            async def fn(name: str = name) -> str:
                script.ran.append(name)
                return name

            async def tx(repositories: Any, name: str = name) -> str:
                script.ran.append(name)
                return name

            if kind == "step":
                await ctx.step(name, fn, result=script.result)
            elif kind == "transaction":
                await ctx.transaction(name, uow, tx, result=script.result)
            elif kind == "sleep":
                await ctx.sleep(name, 0)
            elif kind == "patch":
                script.answers.append(await ctx.patched(name))
            elif kind == "deprecate":
                await ctx.deprecate_patch(name)

    return define_job(
        job_id,
        handler,
        payload=dict,
        concurrency=Concurrency(lease=30.0),
        retry=RetryPolicy(attempts=20),
        **options,
    )


async def recorded(backend: Any, clock: Any, script: Script, stop: int, job_id: str) -> Any:
    job = scripted(job_id, script, FakeUnitOfWork())
    enqueued = await backend.enqueue(job, {})
    script.stop = stop
    first = await execute_once(backend, job, clock)
    assert isinstance(first.error, StopError), first
    script.stop = None
    script.ran.clear()
    clock.advance(RETRY_WAIT)
    return job, enqueued.run_id


ABC = [("step", "a"), ("transaction", "b"), ("step", "c")]


async def test_d7_a_reorder_diverges_at_its_first_position(clock, job_backend_factory):
    """D7: reordered stored steps diverge at the first of them, the same on both backends
    (WorkflowDivergedError: the run, the position, recorded and requested); nothing ran."""
    backend = job_backend_factory(clock)
    script = Script(list(ABC))
    job, run_id = await recorded(backend, clock, script, 3, "wf.d7.reorder")
    script.calls[1], script.calls[2] = script.calls[2], script.calls[1]
    execution = await execute_once(backend, job, clock)
    assert isinstance(execution.error, WorkflowDivergedError), execution
    d = execution.error.divergence
    assert (d.run_id, d.position, d.recorded, d.requested) == (
        run_id,
        1,
        StepCall("b", "transaction"),
        StepCall("c", "step"),
    )
    assert script.ran == []


async def test_d7_a_rename_past_the_frontier_runs(clock, job_backend_factory):
    """D7: a step renamed at or past the history's frontier is new: it runs and is stored at
    its position."""
    backend = job_backend_factory(clock)
    script = Script(list(ABC))
    job, run_id = await recorded(backend, clock, script, 2, "wf.d7.frontier")
    script.calls[2] = ("step", "c2")
    execution = await execute_once(backend, job, clock)
    assert execution.ended == "completed", execution
    assert script.ran == ["c2"]
    steps = await backend.workflows.list_steps(run_id)
    assert [(s.name, s.seq) for s in steps] == [("a", 0), ("b", 1), ("c2", 2)]


async def test_d7_premature_return_and_codec_change(clock, job_backend_factory):
    """D7: a return while stored steps remain, and a stored result its codec no longer
    decodes, are divergences (reasons ``returned`` and ``codec``) on both backends."""
    backend = job_backend_factory(clock)
    script = Script(list(ABC))
    job, _ = await recorded(backend, clock, script, 3, "wf.d7.return")
    script.calls.pop()
    execution = await execute_once(backend, job, clock)
    assert isinstance(execution.error, WorkflowDivergedError), execution
    assert (execution.error.divergence.reason, execution.error.divergence.position) == (
        "returned",
        2,
    )
    script.calls = list(ABC)
    script.result = V2()
    clock.advance(RETRY_WAIT)
    execution = await execute_once(backend, job, clock)
    assert isinstance(execution.error, WorkflowDivergedError), execution
    assert (execution.error.divergence.reason, execution.error.divergence.position) == ("codec", 0)


async def test_d7_concurrent_calls_are_a_misuse_error(clock, job_backend_factory):
    """D7: two workflow calls in flight at once (asyncio.gather) are WorkflowMisuseError."""
    import asyncio  # noqa: PLC0415 - this test alone

    backend = job_backend_factory(clock)

    async def handler(ctx, payload):
        async def one():
            await asyncio.sleep(0)
            return 1

        await asyncio.gather(ctx.step("x", one), ctx.step("y", one))

    job = define_job("wf.d7.gather", handler, payload=dict)
    await backend.enqueue(job, {})
    execution = await execute_once(backend, job, clock)
    assert isinstance(execution.error, WorkflowMisuseError), execution


async def test_d8_patched_old_runs_new_runs_and_deprecation(clock, job_backend_factory):
    """D8 on both backends: a run past the patch's position answers False and stores no marker;
    a new run answers True and stores the marker at the position (kind ``patch``); repeated
    calls take no position; after deprecate_patch, the run holding the marker replays cleanly
    and a new one stores none."""
    backend = job_backend_factory(clock)
    script = Script(list(ABC))
    job, old_run = await recorded(backend, clock, script, 2, "wf.d8")
    script.calls = [("step", "a"), ("patch", "v2"), ("patch", "v2"), *ABC[1:]]
    assert (await execute_once(backend, job, clock)).ended == "completed"
    assert script.answers == [False, False]
    new_run = (await backend.enqueue(job, {})).run_id
    script.answers.clear()
    script.stop = 3
    assert isinstance((await execute_once(backend, job, clock)).error, StopError)
    assert script.answers == [True, True]
    old_steps = await backend.workflows.list_steps(old_run)
    assert [(s.name, s.kind, s.seq) for s in old_steps] == [
        ("a", "step", 0),
        ("b", "transaction", 1),
        ("c", "step", 2),
    ]
    script.calls = [("step", "a"), ("deprecate", "v2"), *ABC[1:]]
    script.stop = None
    clock.advance(RETRY_WAIT)
    assert (await execute_once(backend, job, clock)).ended == "completed"
    new_steps = await backend.workflows.list_steps(new_run)
    assert [(s.name, s.kind, s.seq) for s in new_steps] == [
        ("a", "step", 0),
        ("patch:v2", "patch", 1),
        ("b", "transaction", 2),
        ("c", "step", 3),
    ]
    fresh = (await backend.enqueue(job, {})).run_id
    assert (await execute_once(backend, job, clock)).ended == "completed"
    assert [s.name for s in await backend.workflows.list_steps(fresh)] == ["a", "b", "c"]


async def test_d7_a_sleep_replays_cleanly_by_position(clock, job_backend_factory):
    """D7: a run suspended on a sleep replays its steps and the sleep by position, and
    completes: no false divergence across a suspension."""
    backend = job_backend_factory(clock)
    script = Script([("step", "a"), ("sleep", "nap"), ("transaction", "b")])
    job = scripted("wf.d7.sleep", script, FakeUnitOfWork())
    await backend.enqueue(job, {})
    assert (await execute_once(backend, job, clock)).ended == "suspended"
    clock.advance(1)
    assert (await execute_once(backend, job, clock)).ended == "completed"
    assert script.ran == ["a", "b"]


async def test_d8_patch_figures(clock, job_backend_factory):
    """D8 on both backends: per patch, the live runs holding its marker (a completed holder
    is not live) and the live runs created before its first marker that lack it (a run created
    after the marker is not counted); a patch named but never stored has no first marker; the
    read bound makes a figure a lower bound."""
    from ship_sqla import create_job_operations  # noqa: PLC0415 - this test alone

    backend = job_backend_factory(clock)
    ops = create_job_operations(backend, authorizer=allow_all)
    script = Script([("step", "a"), ("step", "b")], stop=2)
    job = scripted("wf.d8.figures", script, FakeUnitOfWork())
    old_run = (await backend.enqueue(job, {})).run_id
    assert isinstance((await execute_once(backend, job, clock)).error, StopError)  # retries later
    clock.advance(0.25)
    script.calls = [("step", "a"), ("patch", "v2"), ("step", "b")]
    # Priorities: a failed run is due again at once under execute_once, so each new run is
    # claimed first by its higher priority (K6).
    holder = (await backend.enqueue(job, {}, priority=5)).run_id
    script.stop = 2
    assert isinstance((await execute_once(backend, job, clock)).error, StopError)
    clock.advance(0.25)
    script.stop = None
    done = (await backend.enqueue(job, {}, priority=9)).run_id
    assert (await execute_once(backend, job, clock)).run.run_id == done
    clock.advance(0.25)
    await backend.enqueue(job, {})  # created after the first marker, not started: not counted

    [report] = await ops.patches(job.id)
    assert (report.patch_id, report.holding.runs, report.before_first.runs) == ("v2", 1, 1)
    assert report.holding.complete
    assert report.first_marker_at is not None
    assert not report.deletable
    assert not report.deprecatable
    assert {s.name for s in await backend.workflows.list_steps(holder)} == {"a", "patch:v2"}
    assert {s.name for s in await backend.workflows.list_steps(old_run)} == {"a", "b"}
    [missing] = await ops.patches(job.id, ["never"])
    assert (missing.first_marker_at, missing.holding.runs, missing.before_first.runs) == (
        None,
        0,
        0,
    )
    [bounded] = await ops.patches(job.id, ["v2"], read=1)
    assert (bounded.holding.read, bounded.holding.complete) == (1, False)
    assert str(bounded.holding).endswith("(first 1 live runs)")


async def test_d7_a_runtime_dead_letters_a_premature_return(clock, job_backend_factory):
    """D7 in a worker runtime, on both backends: a run whose history holds three steps, replayed
    by a handler that now returns after two, is dead-lettered at once under
    ``on_divergence="fail"`` (D10's opt-out of parking; terminal, whatever attempts it has
    left) with the divergence in its history; its step functions never ran."""
    from job_helpers import ErrorLog, record_of  # noqa: PLC0415 - this test alone
    from spy_backend import SpyBackend  # noqa: PLC0415

    from ship_sqla import start_job_runtime  # noqa: PLC0415

    errors = ErrorLog()
    backend = job_backend_factory(clock, on_error=errors)
    script = Script(list(ABC))
    job, run_id = await recorded(backend, clock, script, 3, "wf.d7.runtime")
    script.calls.pop()
    spy = SpyBackend(backend)
    job = attrs.evolve(job, on_divergence="fail")
    async with await start_job_runtime([job], backend=spy, poll_interval=0.05):
        await spy.wait_settled("fail", 1)
    record = await record_of(backend, run_id)
    assert record.state == "dead"
    assert record.attempt == 2
    assert "SHIP_SQLA_WORKFLOW_DIVERGED" in record.last_error
    assert "position 2" in record.last_error
    assert script.ran == []
