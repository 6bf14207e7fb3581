"""D7, D8 in the kernel: each divergence case of a workflow run whose handler changed under it,
on the in-memory backend (the kernel's model), driven one execution at a time. The same cases on
PostgreSQL: tests/conformance/test_workflow_evolution_conformance.py; the pure rule:
test_workflow_divergence_rule.py; random programs: tests/property/test_workflow_divergence.py."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import attrs
import pytest
from workflow_helpers import FakeUnitOfWork, execute_once

from ship_sqla import define_job
from ship_sqla.errors import ConfigurationError, WorkflowDivergedError, WorkflowMisuseError
from ship_sqla.jobs import Concurrency, RetryPolicy
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.testing import FrozenClock
from ship_sqla.workflows import StepCall

RETRY_WAIT = 86400.0


class CrashError(Exception):
    """The handler stopped after some calls (a crash point): the attempt fails, steps stay."""


@attrs.define
class Program:
    """What the handler calls, in order: (kind, name) pairs; ``crash`` stops it (raising) once
    that many calls were made; ``ran`` the step functions that really ran."""

    calls: list[tuple[str, str]]
    crash: int | None = None
    ran: list[str] = attrs.Factory(list)
    codec: Any = None


class V2:
    """A result codec that changed: it decodes only what it encoded (``{"v2": ...}``)."""

    def encode(self, value: Any) -> Any:
        return {"v2": value}

    def decode(self, data: Any) -> Any:
        if not isinstance(data, dict) or "v2" not in data:
            raise ValueError(f"{data!r} is not a v2 result")
        return data["v2"]


def job_of(program: Program, uow: FakeUnitOfWork, **options: Any):
    async def handler(ctx, payload):
        for made, (kind, name) in enumerate([*program.calls, ("end", "")]):
            if program.crash is not None and made == program.crash:
                raise CrashError(f"after {made} calls")
            if kind != "end":
                await call(ctx, kind, name, program, uow)

    return define_job(
        "wf.evolve",
        handler,
        payload=dict,
        concurrency=Concurrency(lease=30.0),
        retry=RetryPolicy(attempts=20),
        **options,
    )


async def call(ctx: Any, kind: str, name: str, program: Program, uow: FakeUnitOfWork) -> Any:
    async def fn() -> str:
        program.ran.append(name)
        return name

    async def tx(repositories: Any) -> str:
        program.ran.append(name)
        return name

    if kind == "step":
        return await ctx.step(name, fn, result=program.codec)
    if kind == "transaction":
        return await ctx.transaction(name, uow, tx, result=program.codec)
    if kind == "sleep":
        return await ctx.sleep(name, 0)
    if kind == "patch":
        return await ctx.patched(name)
    raise AssertionError(kind)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


async def record(
    clock: FrozenClock, calls: list[tuple[str, str]], crash: int, **options: Any
) -> tuple[Any, Any, Program]:
    """A run whose first execution made ``crash`` calls (stored) and crashed."""
    backend = InMemoryJobBackend(clock=clock)
    program = Program(list(calls), crash=crash)
    job = job_of(program, FakeUnitOfWork(), **options)
    await backend.enqueue(job, {})
    first = await execute_once(backend, job, clock)
    assert isinstance(first.error, CrashError) or first.ended == "suspended", first
    program.crash = None
    program.ran.clear()
    clock.advance(RETRY_WAIT)
    return backend, job, program


async def diverged(backend: Any, job: Any, clock: FrozenClock) -> WorkflowDivergedError:
    execution = await execute_once(backend, job, clock)
    assert isinstance(execution.error, WorkflowDivergedError), execution
    return execution.error


ABC = [("step", "a"), ("transaction", "b"), ("step", "c")]


async def test_d7_a_renamed_step_is_a_divergence_at_its_position(clock) -> None:
    """D7 rename: the history holds b at 1, the code asks for b2 there: a divergence at 1
    naming both and the handler's file:line; nothing ran."""
    backend, job, program = await record(clock, ABC, crash=3)
    program.calls[1] = ("transaction", "b2")
    error = await diverged(backend, job, clock)
    d = error.divergence
    assert (d.position, d.reason) == (1, "changed")
    assert (d.recorded, d.requested) == (
        StepCall("b", "transaction"),
        StepCall("b2", "transaction"),
    )
    assert d.location is not None
    assert d.location.startswith(__file__)
    assert program.ran == []
    for part in ("'b'", "'b2'", "position 1", d.location):
        assert part in error.message


async def test_d7_an_inserted_step_before_the_frontier_is_a_divergence(clock) -> None:
    """D7 insert: a new step inserted before the history's frontier takes the position of a
    stored one: a divergence there (it never runs)."""
    backend, job, program = await record(clock, ABC, crash=3)
    program.calls.insert(1, ("step", "new"))
    d = (await diverged(backend, job, clock)).divergence
    assert (d.position, d.recorded, d.requested) == (
        1,
        StepCall("b", "transaction"),
        StepCall("new", "step"),
    )
    assert program.ran == []


async def test_d7_a_step_inserted_past_the_frontier_runs(clock) -> None:
    """D7: a step inserted at or past the frontier (the first position the history does not
    hold) is new: it runs, and the run completes."""
    backend, job, program = await record(clock, ABC, crash=2)
    program.calls.insert(2, ("step", "new"))
    execution = await execute_once(backend, job, clock)
    assert execution.ended == "completed", execution
    assert program.ran == ["new", "c"]


async def test_d7_a_deleted_step_is_a_divergence(clock) -> None:
    """D7 delete: the call after a deleted one takes its position: a divergence there."""
    backend, job, program = await record(clock, ABC, crash=3)
    del program.calls[1]
    d = (await diverged(backend, job, clock)).divergence
    assert (d.position, d.recorded, d.requested) == (
        1,
        StepCall("b", "transaction"),
        StepCall("c", "step"),
    )


async def test_d7_reordered_steps_are_a_divergence_at_the_first(clock) -> None:
    """D7 reorder: two stored steps swapped: a divergence at the first of them (by name each
    would replay its own result, computed from the old inputs)."""
    backend, job, program = await record(clock, ABC, crash=3)
    program.calls[1], program.calls[2] = program.calls[2], program.calls[1]
    d = (await diverged(backend, job, clock)).divergence
    assert (d.position, d.recorded, d.requested) == (
        1,
        StepCall("b", "transaction"),
        StepCall("c", "step"),
    )
    assert program.ran == []


async def test_d7_a_kind_change_is_a_divergence(clock) -> None:
    """D7 kind change: the same name called as another kind (a transaction now a plain step)."""
    backend, job, program = await record(clock, ABC, crash=3)
    program.calls[1] = ("step", "b")
    d = (await diverged(backend, job, clock)).divergence
    assert (d.position, d.recorded, d.requested) == (
        1,
        StepCall("b", "transaction"),
        StepCall("b", "step"),
    )


async def test_d7_a_premature_return_is_a_divergence(clock) -> None:
    """D7 premature return: the handler returns after two calls while the history holds three:
    a divergence at position 2 naming the step left and the handler's definition."""
    backend, job, program = await record(clock, ABC, crash=3)
    del program.calls[2]
    error = await diverged(backend, job, clock)
    d = error.divergence
    assert (d.position, d.reason, d.recorded, d.requested, d.remaining) == (
        2,
        "returned",
        StepCall("c", "step"),
        None,
        1,
    )
    assert d.location is not None
    assert d.location.startswith(__file__)
    assert "returned" in error.message


async def test_d7_a_handler_making_no_workflow_call_is_not_checked(clock) -> None:
    """D7's documented limit: a handler that now returns before its first workflow call reads
    no history (a read per run of every job otherwise), so its run completes; the replayer
    (D11) and `workflows replay` catch it before the deploy."""
    backend, job, program = await record(clock, ABC, crash=3)
    program.calls.clear()
    execution = await execute_once(backend, job, clock)
    assert execution.ended == "completed", execution


async def test_d7_a_completing_transaction_before_stored_steps_is_a_divergence(clock) -> None:
    """D7 and J13: a completes_run transaction with stored steps after its position is a
    premature return, caught before it commits (the run is not completed)."""
    backend, job, _ = await record(clock, ABC, crash=3)
    uow = FakeUnitOfWork()

    async def handler(ctx, payload):
        async def fn():
            return 1

        await ctx.step("a", fn)

        async def tx(repositories):
            return 2

        await ctx.transaction("b", uow, tx, completes_run=True)

    changed = attrs.evolve(job, handler=handler)
    d = (await diverged(backend, changed, clock)).divergence
    assert (d.position, d.reason, d.recorded) == (2, "returned", StepCall("c", "step"))
    assert uow.runs == 0


async def test_d7_a_codec_change_is_a_divergence(clock) -> None:
    """D7 codec change: a stored result the step's result= codec no longer decodes."""
    backend, job, program = await record(clock, ABC, crash=3)
    program.codec = V2()
    d = (await diverged(backend, job, clock)).divergence
    assert (d.position, d.reason, d.recorded) == (0, "codec", StepCall("a", "step"))
    assert "not a v2 result" in d.detail
    assert d.location is not None
    assert d.location.startswith(__file__)


async def test_d7_two_calls_in_flight_at_once_are_a_misuse_error(clock) -> None:
    """D7 concurrent calls: two workflow calls under asyncio.gather: WorkflowMisuseError (their
    positions would depend on scheduling)."""
    backend = InMemoryJobBackend(clock=clock)

    async def handler(ctx, payload):
        async def slow():
            await asyncio.sleep(0)
            return 1

        await asyncio.gather(ctx.step("x", slow), ctx.step("y", slow))

    job = define_job("wf.gather", handler, payload=dict)
    await backend.enqueue(job, {})
    execution = await execute_once(backend, job, clock)
    assert isinstance(execution.error, WorkflowMisuseError), execution
    assert "in flight" in execution.error.message


async def test_d7_a_replay_of_the_same_code_is_clean_at_every_crash_point(clock) -> None:
    """D7: the unchanged handler replays cleanly whatever it stored before (no false
    positive), sleeps and patches included."""
    calls = [("step", "a"), ("patch", "p1"), ("sleep", "nap"), ("transaction", "b")]
    for crash in range(len(calls)):
        backend, job, _ = await record(clock, calls, crash=crash)
        for _ in range(3):
            execution = await execute_once(backend, job, clock)
            if execution.ended == "completed":
                break
            assert execution.ended == "suspended", execution
            clock.advance(1)
        assert execution.ended == "completed", (crash, execution)


async def test_d7_by_name_keeps_name_matching_with_a_warning(clock, caplog) -> None:
    """D7 by-name: determinism='by-name' replays reordered steps by name (the pre-D7 matching),
    one WARNING per out-of-order step; a kind change is still a divergence."""
    backend, job, program = await record(clock, ABC, crash=3, determinism="by-name")
    program.calls[1], program.calls[2] = program.calls[2], program.calls[1]
    with caplog.at_level(logging.WARNING, logger="ship_sqla.jobs"):
        execution = await execute_once(backend, job, clock)
    assert execution.ended == "completed", execution
    assert program.ran == []
    warned = [r for r in caplog.records if "replayed by name" in r.getMessage()]
    assert len(warned) == 2
    with pytest.raises(ConfigurationError, match="determinism"):
        define_job("wf.bad", job.handler, determinism="loose")  # type: ignore[arg-type]


# --- D8: patches ----------------------------------------------------------------------------------


async def test_d8_patched_takes_the_old_path_for_runs_past_it(clock) -> None:
    """D8: a run that passed the patch's position before the patch existed answers False and
    stores no marker (no position taken); a run that had not reached it, and a new run, answer
    True and store the marker; repeated calls answer the same and take no position."""
    backend, job, _ = await record(clock, ABC, crash=2)
    answers: list[bool] = []

    async def patched_handler(ctx, payload):
        async def fn():
            return 1

        await ctx.step("a", fn)
        answers.append(await ctx.patched("v2"))
        answers.append(await ctx.patched("v2"))  # memo: no position
        await ctx.transaction("b", FakeUnitOfWork(), lambda _repositories: fn())
        await ctx.step("c", fn)

    patched = attrs.evolve(job, handler=patched_handler)
    execution = await execute_once(backend, patched, clock)
    assert execution.ended == "completed", execution
    assert answers == [False, False]
    fresh = await backend.enqueue(patched, {})
    answers.clear()
    execution = await execute_once(backend, patched, clock)
    assert execution.ended == "completed", execution
    assert answers == [True, True]
    steps = await backend.workflows.list_steps(fresh.run_id)
    assert [(s.name, s.kind, s.seq) for s in steps] == [
        ("a", "step", 0),
        ("patch:v2", "patch", 1),
        ("b", "transaction", 2),
        ("c", "step", 3),
    ]


def patch_program(answers: list[bool], *, deprecated: bool = False):
    async def handler(ctx, payload):
        async def fn():
            return 1

        async def tx(repositories):
            return 2

        await ctx.step("a", fn)
        if deprecated:
            await ctx.deprecate_patch("v2")
            await ctx.deprecate_patch("v2")
        else:
            answers.append(await ctx.patched("v2"))
        await ctx.transaction("b", FakeUnitOfWork(), tx)
        await ctx.step("c", fn)

    return handler


async def test_d8_a_run_not_yet_at_the_patch_takes_the_new_path(clock) -> None:
    """D8: a run whose history ends before the patch's position stores the marker there and
    answers True; its later steps take the positions after it."""
    backend, job, _ = await record(clock, ABC, crash=1)
    answers: list[bool] = []
    patched = attrs.evolve(job, handler=patch_program(answers))
    execution = await execute_once(backend, patched, clock)
    assert (execution.ended, answers) == ("completed", [True])


async def test_d8_deprecate_patch_consumes_a_marker_and_stores_nothing_else(clock) -> None:
    """D8: after deprecate_patch, a run holding the marker replays cleanly (the marker's position
    consumed) and a new run stores no marker."""
    backend = InMemoryJobBackend(clock=clock)
    answers: list[bool] = []

    async def first(ctx, payload):
        async def fn():
            return 1

        await ctx.step("a", fn)
        answers.append(await ctx.patched("v2"))
        raise CrashError("after the marker")

    job = define_job("wf.deprecate", first, payload=dict, retry=RetryPolicy(attempts=5))
    held = await backend.enqueue(job, {})
    assert isinstance((await execute_once(backend, job, clock)).error, CrashError)
    clock.advance(RETRY_WAIT)
    deprecated = attrs.evolve(job, handler=patch_program(answers, deprecated=True))
    assert (await execute_once(backend, deprecated, clock)).ended == "completed"
    fresh = await backend.enqueue(deprecated, {})
    assert (await execute_once(backend, deprecated, clock)).ended == "completed"
    held_steps = await backend.workflows.list_steps(held.run_id)
    fresh_steps = await backend.workflows.list_steps(fresh.run_id)
    assert [s.name for s in held_steps] == ["a", "patch:v2", "b", "c"]
    assert [s.name for s in fresh_steps] == ["a", "b", "c"]


async def test_d8_deleting_a_patch_call_diverges_a_run_holding_its_marker(clock) -> None:
    """D8 with D7: a run holding the marker whose handler no longer calls patched() diverges
    at the marker's position (why `workflows patches` must report 0 holders first)."""
    backend, job, _ = await record(clock, ABC, crash=1)
    answers: list[bool] = []
    patched = attrs.evolve(job, handler=patch_program(answers))

    async def crash_after_patch(ctx, payload):
        async def fn():
            return 1

        await ctx.step("a", fn)
        await ctx.patched("v2")
        raise CrashError("after the marker")

    assert isinstance(
        (await execute_once(backend, attrs.evolve(job, handler=crash_after_patch), clock)).error,
        CrashError,
    )
    clock.advance(RETRY_WAIT)
    d = (await diverged(backend, job, clock)).divergence
    assert (d.position, d.recorded, d.requested) == (
        1,
        StepCall("patch:v2", "patch"),
        StepCall("b", "transaction"),
    )
    assert patched is not None


def test_d8_a_step_may_not_take_a_patch_name() -> None:
    """D8: ``patch:`` names only markers, so a step can never be mistaken for one."""
    clock = FrozenClock()

    async def scenario() -> BaseException | None:
        backend = InMemoryJobBackend(clock=clock)

        async def handler(ctx, payload):
            async def fn():
                return 1

            await ctx.step("patch:x", fn)

        job = define_job("wf.patchname", handler, payload=dict)
        await backend.enqueue(job, {})
        return (await execute_once(backend, job, clock)).error

    assert isinstance(asyncio.run(scenario()), ConfigurationError)
