"""D7 by property: random workflow programs (plain and transactional steps, sleeps, branches on
earlier results, loops with indexed names) recorded up to random crash points in memory,
then replayed with one mutation (rename, insert, delete, swap, kind change, codec change). The
divergence is reported at exactly the first position where the mutated program's calls differ
from the recorded ones, when that is below the history's frontier; at or past it (or when the
mutation changes no call at all) the replay is clean: never a false positive.

A program is a tree of ops, each with a stable id that names its step (``s<id>``, plus the loop
indices around it), so an edit changes only the calls it touches. A branch's condition is the
stored result of its own step: replayed from the history, computed fresh past it.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import zlib
from typing import Any

import attrs
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from workflow_helpers import FakeUnitOfWork, execute_once

from ship_sqla import define_job
from ship_sqla.errors import WorkflowDivergedError
from ship_sqla.jobs import RetryPolicy
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.testing import FrozenClock

LARGE = os.environ.get("SHIP_SQLA_HYPOTHESIS_PROFILE") == "large"
SETTINGS = settings(
    max_examples=2000 if LARGE else 300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@attrs.define
class Call:
    kind: str  # "step" | "transaction" | "sleep"
    codec: bool = False  # True: the result= codec changed (V2)
    tag: str = ""  # a rename appends to the name
    id: int = 0


@attrs.define
class Branch:
    then: list[Any]
    otherwise: list[Any]
    id: int = 0


@attrs.define
class Loop:
    times: int
    body: list[Any]
    id: int = 0


class V2:
    """The changed codec: it decodes only what it encoded."""

    def encode(self, value: Any) -> Any:
        return {"v2": value}

    def decode(self, data: Any) -> Any:
        if not isinstance(data, dict) or "v2" not in data:
            raise ValueError(f"{data!r} is not a v2 result")
        return data["v2"]


def ops() -> st.SearchStrategy[list[Any]]:
    call = st.builds(Call, kind=st.sampled_from(KINDS))
    tree = st.recursive(
        call,
        lambda children: st.one_of(
            st.builds(
                Branch,
                then=st.lists(children, max_size=3),
                otherwise=st.lists(children, max_size=3),
            ),
            st.builds(Loop, times=st.integers(0, 3), body=st.lists(children, max_size=2)),
        ),
        max_leaves=10,
    )
    # A plain step first: a program of empty loops and branches makes no call to record.
    return st.lists(tree, min_size=1, max_size=5).map(lambda program: [Call("step"), *program])


def number(program: list[Any], start: int = 0) -> int:
    """Give every op a stable id (depth first); the next free id."""
    for op in program:
        op.id = start
        start += 1
        if isinstance(op, Branch):
            start = number(op.then, number(op.otherwise, start))
        elif isinstance(op, Loop):
            start = number(op.body, start)
    return start


def lists(program: list[Any]) -> list[list[Any]]:
    """Every op list of the program (the top one first), where an edit can land."""
    found = [program]
    for op in program:
        if isinstance(op, Branch):
            found += lists(op.then) + lists(op.otherwise)
        elif isinstance(op, Loop):
            found += lists(op.body)
    return found


def condition(name: str) -> bool:
    """A branch step's first-computed result (any value would do: replays read it back)."""
    return zlib.crc32(name.encode()) % 2 == 0


def trace(program: list[Any], suffix: str = "") -> list[tuple[str, str, bool]]:
    """The calls the program makes on a run that computes every result fresh: (name, kind,
    codec changed). A branch step's result is :func:`condition` of its name."""
    out: list[tuple[str, str, bool]] = []
    for op in program:
        if isinstance(op, Call):
            out.append((f"s{op.id}{suffix}{op.tag}", op.kind, op.codec))
        elif isinstance(op, Branch):
            name = f"b{op.id}{suffix}"
            out.append((name, "step", False))
            out += trace(op.then if condition(name) else op.otherwise, suffix)
        else:
            for i in range(op.times):
                out += trace(op.body, f"{suffix}.{op.id}-{i}")
    return out


@attrs.define
class Interpreter:
    """The handler: runs ``program`` through ctx, stopping (raising) after ``crash`` calls."""

    program: list[Any]
    crash: int | None = None
    made: int = 0
    ran: list[str] = attrs.Factory(list)
    uow: FakeUnitOfWork = attrs.Factory(FakeUnitOfWork)

    async def handler(self, ctx: Any, _payload: Any) -> None:
        self.made = 0
        await self.run(ctx, self.program, "")
        self.stop()

    def stop(self) -> None:
        if self.crash is not None and self.made == self.crash:
            raise CrashError(self.made)

    async def call(self, ctx: Any, name: str, kind: str, codec: bool) -> Any:
        self.stop()
        self.made += 1

        async def fn() -> Any:
            self.ran.append(name)
            return condition(name) if name.startswith("b") else name

        async def tx(repositories: Any) -> Any:
            return await fn()

        if kind == "sleep":
            return await ctx.sleep(name, 0)  # suspends the first time, due at the replay
        result = V2() if codec else None
        if kind == "step":
            return await ctx.step(name, fn, result=result)
        return await ctx.transaction(name, self.uow, tx, result=result)

    async def run(self, ctx: Any, program: list[Any], suffix: str) -> None:
        for op in program:
            if isinstance(op, Call):
                await self.call(ctx, f"s{op.id}{suffix}{op.tag}", op.kind, op.codec)
            elif isinstance(op, Branch):
                taken = await self.call(ctx, f"b{op.id}{suffix}", "step", False)
                await self.run(ctx, op.then if taken else op.otherwise, suffix)
            else:
                for i in range(op.times):
                    await self.run(ctx, op.body, f"{suffix}.{op.id}-{i}")


class CrashError(Exception):
    pass


MUTATIONS = ("rename", "insert", "delete", "swap", "kind", "codec")
KINDS = ("step", "transaction", "sleep")


def mutate(program: list[Any], how: str, data: st.DataObject, next_id: int) -> bool:
    """Apply one edit of kind ``how`` to ``program`` (a copy), at a place drawn among those
    where it applies; False when there is none."""
    places: list[tuple[list[Any], int]] = []
    for target in lists(program):
        if how == "insert":
            places += [(target, i) for i in range(len(target) + 1)]
        elif how == "delete":
            places += [(target, i) for i in range(len(target))]
        elif how == "swap":
            places += [(target, i) for i in range(len(target) - 1)]
        else:
            places += [
                (target, i)
                for i, op in enumerate(target)
                if isinstance(op, Call) and (how != "codec" or op.kind != "sleep")
            ]
    if not places:
        return False
    target, index = places[data.draw(st.integers(0, len(places) - 1), label="place")]
    if how == "insert":
        target.insert(index, Call("step", id=next_id))
    elif how == "delete":
        del target[index]
    elif how == "swap":
        target[index], target[index + 1] = target[index + 1], target[index]
    elif how == "rename":
        target[index].tag = "~renamed"
    elif how == "kind":
        target[index].kind = KINDS[(KINDS.index(target[index].kind) + 1) % len(KINDS)]
    else:
        target[index].codec = True
    return True


def first_difference(old: list[Any], new: list[Any]) -> int | None:
    for k, (a, b) in enumerate(zip(old, new, strict=False)):
        if a != b:
            return k
    return None if len(old) == len(new) else min(len(old), len(new))


async def scenario(
    program: list[Any], mutated: list[Any], crashes: tuple[int, int]
) -> tuple[list[tuple[str, str]], Any, list[str]]:
    """Record ``program`` up to two crash points (an execution also ends at a sleep it reaches
    first), then run ``mutated`` once: the history recorded (name, kind in position order), how
    the mutated execution ended, and the step functions it ran."""
    clock = FrozenClock()
    backend = InMemoryJobBackend(clock=clock)
    interpreter = Interpreter(program)
    job = define_job("wf.prop", interpreter.handler, payload=dict, retry=RetryPolicy(attempts=9))
    run_id = (await backend.enqueue(job, {})).run_id
    for crash in crashes:  # each replay of the same program is clean
        interpreter.crash = crash
        execution = await execute_once(backend, job, clock)
        assert isinstance(execution.error, CrashError) or execution.ended == "suspended", execution
        clock.advance(86400)
    history = [(step.name, step.kind) for step in await backend.workflows.list_steps(run_id)]
    interpreter.program = mutated
    interpreter.crash = None
    interpreter.ran.clear()
    return history, await execute_once(backend, job, clock), interpreter.ran


@SETTINGS
@given(
    program=ops(),
    how=st.sampled_from(MUTATIONS),
    data=st.data(),
)
def test_d7_a_mutation_is_reported_at_exactly_its_first_position(
    program: list[Any], how: str, data: st.DataObject
) -> None:
    """D7 (property): one mutation at position k of a random program's calls (steps,
    transactions and sleeps) is reported as a WorkflowDivergedError at exactly k when k is below
    the frontier (the history's length), with the reason its edit calls for (changed, returned,
    codec) and no step function run; at or past the frontier, or when the edit changes no call,
    the replay goes on (to its end, or to a sleep it reaches first): no false positive."""
    next_id = number(program)
    old = trace(program)
    assume(old)
    mutated = _copy(program)
    assume(mutate(mutated, how, data, next_id))
    new = trace(mutated)
    # A handler that now makes no workflow call at all is not checked at its return (that would
    # cost a read per run of every job; documented, and pinned by test_workflow_evolution.py).
    assume(new)
    first = data.draw(st.integers(0, len(old) - 1), label="first crash point")
    second = data.draw(st.integers(first, len(old) - 1), label="second crash point")
    history, execution, ran = asyncio.run(scenario(program, mutated, (first, second)))
    frontier = len(history)
    assert history == [(name, kind) for name, kind, _ in old[:frontier]]  # its first calls
    k = first_difference(old[:frontier], new)
    if k is not None and k >= frontier:
        k = None
    event(f"{how}: {'clean' if k is None else 'diverged'}")
    if k is None:
        assert execution.error is None, (old, new, frontier, execution)
        assert execution.ended in ("completed", "suspended"), execution
        fresh = list(itertools.takewhile(lambda call: call[1] != "sleep", new[frontier:]))
        assert ran == [name for name, _, _ in fresh]
        return
    assert isinstance(execution.error, WorkflowDivergedError), (old, new, frontier, k, execution)
    divergence = execution.error.divergence
    assert divergence.position == k, (old, new, frontier, divergence)
    assert ran == []
    if k == len(new):
        assert divergence.reason == "returned"
    elif (old[k][0], old[k][1]) == (new[k][0], new[k][1]):
        assert divergence.reason == "codec"
    else:
        assert divergence.reason == "changed"
        assert (divergence.requested.name, divergence.requested.kind) == new[k][:2]
    assert (divergence.recorded.name, divergence.recorded.kind) == old[k][:2]


def _copy(program: list[Any]) -> list[Any]:
    out: list[Any] = []
    for op in program:
        if isinstance(op, Branch):
            out.append(Branch(_copy(op.then), _copy(op.otherwise), op.id))
        elif isinstance(op, Loop):
            out.append(Loop(op.times, _copy(op.body), op.id))
        else:
            out.append(attrs.evolve(op))
    return out
