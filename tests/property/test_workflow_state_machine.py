"""Durable workflow runs on PostgreSQL against the in-memory model, step by step (D1-D6).

Hypothesis drives both backends with the same calls: enqueue workflow runs of one fixed handler
shape (a plain step, a transactional step, an optional sleep, an optional event wait with or
without a timeout, an optional spawn of child runs and the wait for them, a last plain step that
may fail), executions by worker A or B (claim, replay the handler, settle; or crash: stop at a
point of the handler and never settle, so the lease lapses on the FrozenClock), a stale holder (a
claim whose lease lapsed and was retaken, or that settled) storing a plain or a transactional
step, clock advances, ``publish_event`` committed (alone or in a unit of work) or inside a unit
of work that rolls back, operator cancel, and ``rerun_from_step``. After every step it checks
that PostgreSQL's runs and steps equal the model's and that the workflow invariants hold:

- D1 no step is stored twice, and a stored step's function never runs again (a replay returns
  the stored result); a stale holder stores nothing.
- D2 the transactional step's effect (a row written through a real unit of work on PostgreSQL,
  ``create_unit_of_work``; a counter committed with the step in memory) happened exactly once
  per stored transactional step (plus once per stored one an operator dropped, D6).
- D3 no suspended run is claimable before its wake time, its event or its children's end.
- D4 a wait is matched only by an event committed after it began (the first such), never by a
  rolled-back one, and never misses one committed after it began and before its timeout.
- D5 children are enqueued once; a parent whose children all ended is due.
- D6 cancel and rerun_from_step answer alike and leave both stores alike.

Hypothesis has no async rules, so the sync rules drive the async backends through one event loop
kept for the whole test (an anyio blocking portal); one engine per test on a database created
for it; the tables are truncated between examples. ``SHIP_SQLA_HYPOTHESIS_PROFILE=large`` runs
many more examples.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import Coroutine, Iterator
from typing import Any, ClassVar, TypeVar

import attrs
import pytest
from anyio.from_thread import BlockingPortal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)
from job_helpers import claim_request
from machine_support import Claim, module_database, normalized, replay_machine, run_machine
from sqlalchemy import Column, Integer, MetaData, Table, Text, func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine
from workflow_helpers import Execution, execute_once

from ship_sqla import (
    JobContext,
    create_job_backend,
    create_unit_of_work,
    define_job,
    ship_job_events_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
)
from ship_sqla._jobs._admin import run_record
from ship_sqla._jobs._sql import JobStatements
from ship_sqla._jobs._sql.admin import GET_RUN
from ship_sqla._sql import Template
from ship_sqla.errors import JobLeaseStaleError
from ship_sqla.jobs import Concurrency, RetryPolicy
from ship_sqla.kernel._memory.jobs import InMemoryJobBackend
from ship_sqla.kernel._operations import JobOperations, create_job_operations
from ship_sqla.kernel._ports import TERMINAL_STATES, ClaimedRun, RunRecord
from ship_sqla.kernel._workflows import StepRecord
from ship_sqla.testing import FrozenClock, ResolvedServer

# Private on purpose: databases made here carry the pytest plugin's own prefix.

T = TypeVar("T")

LARGE = os.environ.get("SHIP_SQLA_HYPOTHESIS_PROFILE") == "large"
SETTINGS = settings(
    max_examples=300 if LARGE else 20,
    report_multiple_bugs=False,
    stateful_step_count=50 if LARGE else 40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
LEASE = 10.0
EVENT = "sm.go"
KEYS = ("k1", "k2")
STEP_NAMES = ("a", "tx", "nap", "ev", "kids", "join", "b")
MAX_RUNS = 6
PARENT_ID = "wf.sm"
CHILD_ID = "wf.sm.child"

metadata = MetaData()
runs_table = ship_job_runs_table(metadata)
state_table = ship_job_state_table(metadata)
steps_table = ship_job_steps_table(metadata)
events_table = ship_job_events_table(metadata)
effects_table = Table(
    "wf_sm_effects",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("run_id", Text, nullable=False),
)
ALL_RUNS = JobStatements(runs="ship_job_runs", state="ship_job_state")[
    Template(GET_RUN.sql.replace("WHERE r.id = :id", "ORDER BY r.id"))
]


class CrashError(Exception):
    """The handler stops here and its execution is never settled: the worker died."""


class AbortError(Exception):
    """Rolls a publishing unit of work back."""


class MemoryUnitOfWork:
    """The in-memory side of a transactional step: the step's function appends its effect to a
    pending list, applied only when the whole ``run`` (the step's storage included) returned,
    as a commit would be."""

    def __init__(self) -> None:
        self.effects: Counter[str] = Counter()

    async def run(self, handler: Any) -> Any:
        pending: list[str] = []
        result = await handler(pending)
        self.effects.update(pending)
        return result


def scope_only(scope: Any) -> Any:
    return scope


@attrs.frozen
class Published:
    """A committed event: its key and the id each backend gave it."""

    key: str
    pg_id: int
    model_id: int


def _claimed_view(run: ClaimedRun) -> tuple[Any, ...]:
    return (
        run.run_id,
        run.job_id,
        run.payload,
        run.attempt,
        run.max_attempts,
        run.lease_expires_at,
        run.created_at,
    )


def _execution_view(execution: Execution) -> tuple[Any, ...]:
    error = execution.error
    return (execution.ended, execution.outcome, None if error is None else repr(error))


class WorkflowMachine(RuleBasedStateMachine):
    portal: ClassVar[BlockingPortal]
    engine: ClassVar[AsyncEngine]

    def __init__(self) -> None:
        super().__init__()
        self.run(self._truncate())
        self.clock = FrozenClock()
        self.pg = create_job_backend(
            database=self.engine,
            table=runs_table,
            state_table=state_table,
            steps_table=steps_table,
            events_table=events_table,
            clock=self.clock,
        )
        workflows = self.pg.workflows
        assert workflows is not None
        self.pg_workflows = workflows
        self.model = InMemoryJobBackend(clock=self.clock, live_only=False)
        self.pg_ops: JobOperations = create_job_operations(self.pg, authorizer=_allow)
        self.model_ops: JobOperations = create_job_operations(self.model, authorizer=_allow)
        self.pg_uow = create_unit_of_work(self.engine, repositories=scope_only)
        self.model_uow = MemoryUnitOfWork()
        self.jobs = {side: self._jobs(side) for side in ("pg", "model")}
        self.claims: list[Claim] = []
        self.counter = 0
        self.crash_at: str | None = None
        # D1: how often each side ran each step's function, per (run, step).
        self.ran: Counter[tuple[str, str, str]] = Counter()
        # D1: the run count of a step's function when it was first seen stored.
        self.ran_when_stored: dict[tuple[str, str, str], int] = {}
        # D2: transactional steps an operator dropped (their effects stay, D6).
        self.dropped_tx: Counter[str] = Counter()
        # D4: committed events in commit order; where each wait began in that order.
        self.log: list[Published] = []
        self.began: dict[str, int] = {}
        self.done_waits: set[str] = set()

    # --- the workflow -----------------------------------------------------------------------

    def _jobs(self, side: str) -> dict[str, Any]:
        """The two jobs, one definition per side (the same ids): the transactional step writes
        through the side's unit of work."""
        machine = self
        uow: Any = self.pg_uow if side == "pg" else self.model_uow

        def counted(run_id: str, name: str, value: Any) -> Any:
            async def body() -> Any:
                machine.ran[side, run_id, name] += 1
                return value

            return body

        async def child(ctx: JobContext, payload: dict[str, Any]) -> None:
            await ctx.step("c", counted(ctx.run_id, "c", 1))
            if payload["fail"]:
                raise RuntimeError("child failed")

        child_job = define_job(
            CHILD_ID,
            child,
            payload=dict,
            concurrency=Concurrency(max=3, lease=LEASE),
            retry=RetryPolicy(attempts=1, jitter="none"),
        )

        def crash(point: str) -> None:
            if machine.crash_at == point:
                raise CrashError(point)

        async def parent(ctx: JobContext, payload: dict[str, Any]) -> None:
            run_id = ctx.run_id
            await ctx.step("a", counted(run_id, "a", payload["n"]))
            crash("a")

            async def write(repositories: Any) -> str:
                machine.ran[side, run_id, "tx"] += 1
                if side == "pg":
                    await repositories.connection.execute(
                        insert(effects_table).values(run_id=run_id)
                    )
                else:
                    repositories.append(run_id)
                return run_id

            assert await ctx.transaction("tx", uow, write) == run_id
            crash("tx")
            if payload["sleep"] is not None:
                await ctx.sleep("nap", payload["sleep"])
            if payload["wait"]:
                await ctx.wait_for_event(
                    "ev", EVENT, key=payload["key"], timeout=payload["timeout"]
                )
            if payload["kids"]:
                kids = [{"fail": payload["kid_fails"]}] * payload["kids"]
                await ctx.spawn("kids", child_job, kids)
                await ctx.wait_for_children("join")
            crash("join")

            async def last() -> int:
                machine.ran[side, run_id, "b"] += 1
                if ctx.attempt <= payload["fails"]:
                    msg = f"b failed on attempt {ctx.attempt}"
                    raise RuntimeError(msg)
                return 0

            await ctx.step("b", last)

        parent_job = define_job(
            PARENT_ID,
            parent,
            payload=dict,
            concurrency=Concurrency(max=3, lease=LEASE),
            retry=RetryPolicy(attempts=2, jitter="none"),
        )
        return {PARENT_ID: parent_job, CHILD_ID: child_job}

    # --- plumbing ---------------------------------------------------------------------------

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        async def awaited() -> T:
            return await coroutine

        return self.portal.call(awaited)

    async def _truncate(self) -> None:
        async with self.engine.begin() as connection:
            await connection.execute(
                text(
                    "TRUNCATE ship_job_runs, ship_job_state, ship_job_steps, ship_job_events,"
                    " wf_sm_effects"
                )
            )

    async def _pg_state(self) -> tuple[list[RunRecord], dict[str, int]]:
        async with self.engine.connect() as connection:
            records = [run_record(row) for row in await connection.execute(ALL_RUNS)]
            counts = select(effects_table.c.run_id, func.count()).group_by(effects_table.c.run_id)
            effects = {row[0]: int(row[1]) for row in await connection.execute(counts)}
        return records, effects

    async def _background_done(self) -> None:
        """Wait for the PostgreSQL backend's own tasks (D5: an operator's cancel of a child
        wakes its parent in a task after the commit), so the next check compares settled
        state. Private on purpose: the test waits for exactly what the backend started."""
        await asyncio.gather(*self.pg._room_tasks)

    def model_current(self, claim: Claim) -> bool:
        return self.model.current_run(claim.model) is not None

    # --- enqueue ----------------------------------------------------------------------------

    @precondition(lambda self: self.counter < MAX_RUNS)
    @rule(
        sleep=st.sampled_from([None, None, 0, 5, 30]),
        wait=st.booleans(),
        key=st.sampled_from(KEYS),
        timeout=st.sampled_from([None, 20]),
        kids=st.sampled_from([0, 0, 1, 2]),
        kid_fails=st.booleans(),
        fails=st.sampled_from([0, 0, 1, 2]),
    )
    def enqueue(  # noqa: PLR0917 - Hypothesis draws each argument
        self,
        sleep: int | None,
        wait: bool,
        key: str,
        timeout: int | None,
        kids: int,
        kid_fails: bool,
        fails: int,
    ) -> None:
        """A workflow run of the fixed shape (its payload picks the optional parts)."""
        self.counter += 1
        payload = {
            "n": self.counter,
            "sleep": sleep,
            "wait": wait,
            "key": key,
            "timeout": timeout,
            "kids": kids,
            "kid_fails": kid_fails,
            "fails": fails,
        }
        run_id = f"r{self.counter:03d}"
        expected = self.run(
            self.model.enqueue(self.jobs["model"][PARENT_ID], payload, run_id=run_id)
        )
        actual = self.run(self.pg.enqueue(self.jobs["pg"][PARENT_ID], payload, run_id=run_id))
        assert actual == expected

    # --- executions ---------------------------------------------------------------------------

    @rule(
        plan=st.lists(
            st.tuples(
                st.sampled_from([PARENT_ID, PARENT_ID, CHILD_ID]),
                st.sampled_from(["A", "B"]),
                st.sampled_from([*[None] * 8, "a", "tx", "join", "settle"]),
            ),
            min_size=1,
            max_size=6,
        )
    )
    def execute(self, plan: list[tuple[str, str, str | None]]) -> None:
        """Executions, one after the other: claim one due run of the job as the worker on
        both, replay its handler, settle how it ended (or crash: stop at the point and never
        settle; the lease then lapses, J6)."""
        for job_id, worker, crash_at in plan:
            self.execute_one(job_id, worker, crash_at)

    def execute_one(self, job_id: str, worker: str, crash_at: str | None) -> None:
        model_job, pg_job = self.jobs["model"][job_id], self.jobs["pg"][job_id]
        expected = self.run(self.model.claim(claim_request(model_job, worker=worker)))
        actual = self.run(self.pg.claim(claim_request(pg_job, worker=worker)))
        assert [_claimed_view(r) for r in actual] == [_claimed_view(r) for r in expected]
        assert sorted(actual.buried, key=str) == sorted(expected.buried, key=str)
        if not actual:
            return
        [pg_run], [model_run] = actual, expected
        self.check_claimable(model_run.run_id)
        self.claims.append(Claim(pg_run, model_run, worker))
        self.crash_at = crash_at
        settle = crash_at is None
        try:
            done_model = self.run(
                execute_once(self.model, model_job, self.clock, run=model_run, settle=settle)
            )
            done_pg = self.run(execute_once(self.pg, pg_job, self.clock, run=pg_run, settle=settle))
        finally:
            self.crash_at = None
        assert _execution_view(done_pg) == _execution_view(done_model)

    def check_claimable(self, run_id: str) -> None:
        """D3, D4: a claimed run with a waiting step was due: its sleep's wake time (or its
        wait's timeout) passed, an event for its wait came, or it waits for children (woken by
        their end, or looked at again after the recheck)."""
        steps = self.run(self.model.workflows.load_steps(run_id))
        now = self.clock.now()
        for step in steps:
            if step.state != "waiting":
                continue
            due = step.wake_at is not None and step.wake_at <= now
            if step.kind == "event":
                due = due or self.first_event_after(step, self.began[run_id]) is not None
            assert due or step.kind == "children", (run_id, step)

    def first_event_after(self, step: StepRecord, began: int) -> int | None:
        for index in range(began, len(self.log)):
            if self.log[index].key == step.event_key:
                return index
        return None

    @precondition(lambda self: self.claims)
    @rule(
        pick=st.integers(0, 1000),
        kind=st.sampled_from(["step", "transaction"]),
        fresh=st.booleans(),
    )
    def stale_holder(self, pick: int, kind: str, fresh: bool) -> None:
        """D1, D2: a holder whose claim is no longer current (its lease lapsed and the run was
        retaken, or it settled) stores a step (``fresh``: one no holder stored yet): refused on
        both, its transaction (and its effect row) rolled back; a step stored already replays
        its stored result and stores nothing."""
        stale = [c for c in self.claims if not self.model_current(c)]
        if not stale:
            return
        claim = stale[pick % len(stale)]
        if claim.pg.job_id != PARENT_ID:
            return
        answers = []
        for side, run in (("model", claim.model), ("pg", claim.pg)):
            backend: Any = self.model if side == "model" else self.pg
            uow: Any = self.model_uow if side == "model" else self.pg_uow
            ctx = JobContext.standalone(run, worker_id=claim.worker)
            # By name: this holder calls one step out of its handler's order; the fence is what
            # is checked here (D1, D2), positions are D7's (test_workflow_evolution.py).
            ctx.bind_workflows(backend.workflows, backend, self.clock, determinism="by-name")
            run_id = run.run_id

            async def body(side: str = side, run_id: str = run_id) -> str:
                self.ran[side, run_id, "late" if fresh else "a"] += 1
                return "stale"

            async def write(repositories: Any, side: str = side, run_id: str = run_id) -> str:
                self.ran[side, run_id, "late-tx" if fresh else "tx"] += 1
                if side == "pg":
                    await repositories.connection.execute(
                        insert(effects_table).values(run_id=run_id)
                    )
                else:
                    repositories.append(run_id)
                return run_id

            async def store(ctx: JobContext = ctx, uow: Any = uow) -> Any:
                try:
                    if kind == "step":
                        return await ctx.step("late" if fresh else "a", body)
                    return await ctx.transaction("late-tx" if fresh else "tx", uow, write)
                except JobLeaseStaleError:
                    return "refused"

            answers.append(self.run(store()))
        assert answers[0] == answers[1], answers
        if fresh:
            assert answers == ["refused", "refused"], answers  # D1: it stores nothing

    @rule(seconds=st.sampled_from([1, 5, 11, 25, 61]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    # --- events -------------------------------------------------------------------------------

    @rule(
        key=st.sampled_from(["k1", "k1", "k2"]),
        how=st.sampled_from(["direct", "uow", "rolled-back"]),
    )
    def publish(self, key: str, how: str) -> None:
        """D4: publish an event committed (alone, or in a unit of work), or in a unit of work
        that rolls back (on PostgreSQL only: the model has no transactions, and must match what
        PostgreSQL did, i.e. nothing)."""
        payload = {"seq": len(self.log)}
        if how == "direct":
            pg_id = self.run(self.pg.publish_event(EVENT, payload, key=key))
        else:
            got: list[int] = []

            async def publish(scope: Any) -> None:
                got.append(await self.pg.publish_event(EVENT, payload, key=key))
                if how == "rolled-back":
                    raise AbortError

            try:
                self.run(self.pg_uow.run(publish))
            except AbortError:
                return
            [pg_id] = got
        model_id = self.run(self.model.publish_event(EVENT, payload, key=key))
        self.log.append(Published(key, pg_id, model_id))

    # --- operators ------------------------------------------------------------------------------

    @rule(
        op=st.sampled_from(["cancel", "rerun", "rerun", "rerun"]),
        pick=st.integers(0, 1000),
        prefer=st.sampled_from(["running", "waiting", "any"]),
        step=st.sampled_from(STEP_NAMES),
    )
    def operate(self, op: str, pick: int, prefer: str, step: str) -> None:
        """D6: an operator cancels a run, or (more often: a cancel ends a run for good)
        re-runs one from a step."""
        if op == "cancel":
            self.cancel(pick, prefer)
        else:
            self.rerun_from_step(pick, step)

    def cancel(self, pick: int, prefer: str) -> None:
        """D6 (K2): cancel a run (a running, suspended or finished one) on both."""
        runs = sorted(self.model.runs(), key=lambda r: r.run_id)
        if not runs:
            return
        chosen = [r for r in runs if r.state == prefer] or runs
        run_id = chosen[pick % len(chosen)].run_id
        expected = self.run(self.model_ops.cancel(run_id))
        actual = self.run(self.pg_ops.cancel(run_id))
        self.run(self._background_done())
        assert actual.outcome == expected.outcome
        assert normalized(actual.record) == normalized(expected.record)

    def rerun_from_step(self, pick: int, step: str) -> None:
        """D6: re-run a run (a dead or waiting one preferably) from a step; both answer alike.
        A dropped transactional step keeps its committed effect (counted for D2)."""
        runs = sorted(self.model.runs(), key=lambda r: r.run_id)
        runs = [r for r in runs if r.job_id == PARENT_ID]
        if not runs:
            return
        chosen = [r for r in runs if r.state in ("dead", "waiting")] or runs
        run_id = chosen[pick % len(chosen)].run_id
        before = {s.name: s for s in self.run(self.model.workflows.load_steps(run_id))}
        expected = self.run(self.model.workflows.rerun_from_step(run_id, step))
        actual = self.run(self.pg_workflows.rerun_from_step(run_id, step))
        assert (actual is None) == (expected is None)
        if actual is None or expected is None:
            return
        assert normalized(actual) == normalized(expected)
        named = before[step]
        for name, stored in before.items():
            if stored.seq >= named.seq:
                for side in ("pg", "model"):
                    self.ran_when_stored.pop((side, run_id, name), None)
                if name == "tx":
                    self.dropped_tx[run_id] += 1
                if name == "ev":
                    self.began.pop(run_id, None)
                    self.done_waits.discard(run_id)

    # --- invariants -----------------------------------------------------------------------------

    @invariant()
    def database_equals_model_and_invariants_hold(self) -> None:
        pg_records, effects = self.run(self._pg_state())
        model_records = sorted(self.model.runs(), key=lambda r: r.run_id)
        assert [r.run_id for r in pg_records] == [r.run_id for r in model_records]
        for pg_record, model_record in zip(pg_records, model_records, strict=True):
            assert normalized(pg_record) == normalized(model_record), pg_record.run_id
        records = {r.run_id: r for r in model_records}
        for run_id, record in records.items():
            pg_steps = self.run(self.pg_workflows.list_steps(run_id))
            model_steps = self.run(self.model.workflows.list_steps(run_id))
            assert [self.step_view(s, "pg") for s in pg_steps] == [
                self.step_view(s, "model") for s in model_steps
            ], run_id
            self.check_run(record, {s.name: s for s in model_steps}, effects.get(run_id, 0))

    def step_view(self, step: StepRecord, side: str) -> tuple[Any, ...]:
        """A stored step, its event ids replaced by the event's place in commit order (each
        backend numbers its events its own way; PostgreSQL's rolled-back ones spend ids)."""
        result = step.result
        if step.kind == "event" and isinstance(result, dict) and "event" in result:
            event_id = result["event"]["id"]
            places = [
                i
                for i, p in enumerate(self.log)
                if (p.pg_id if side == "pg" else p.model_id) == event_id
            ]
            # D4: a rolled-back publish matches nothing.
            assert len(places) == 1, (side, step, "matched an event never committed")
            result = {**result, "event": {**result["event"], "id": places[0]}}
        return (
            step.run_id,
            step.name,
            step.seq,
            step.kind,
            step.state,
            json.dumps(result, sort_keys=True),
            step.wake_at,
            step.created_at,
            step.finished_at,
            step.event_name,
            step.event_key,
            step.due,
        )

    def check_run(self, record: RunRecord, steps: dict[str, StepRecord], pg_effects: int) -> None:
        run_id = record.run_id
        now = self.clock.now()
        # D1: one step per name, one per position.
        assert len({s.seq for s in steps.values()}) == len(steps), steps
        for name, stored in steps.items():
            if stored.state != "done":
                continue
            for side in ("pg", "model"):
                ran = self.ran[side, run_id, name]
                first = self.ran_when_stored.setdefault((side, run_id, name), ran)
                # D1: a stored step's function never runs again.
                assert ran == first, (side, run_id, name, ran, first)
        # D2: the effect once per stored transactional step (and per one an operator dropped).
        tx = steps.get("tx")
        stored_tx = int(tx is not None and tx.state == "done") + self.dropped_tx[run_id]
        assert pg_effects == stored_tx, (run_id, pg_effects, stored_tx)
        assert self.model_uow.effects[run_id] == stored_tx, run_id
        self.check_wait(record, steps.get("ev"))
        nap = steps.get("nap")
        if nap is not None and nap.state == "waiting" and record.state == "waiting":
            # D3: not claimable before its wake time.
            assert record.run_at == nap.wake_at, (record, nap)
        join = steps.get("join")
        if join is not None and join.state == "waiting" and record.state == "waiting":
            live = [
                r
                for r in self.model.runs()
                if r.parent_id == run_id and r.state not in TERMINAL_STATES
            ]
            if not live:
                # D5: a parent whose children all ended is due.
                assert record.run_at <= now, (record, join)

    def check_wait(self, record: RunRecord, wait: StepRecord | None) -> None:
        """D3, D4 for the run's event wait (if it has one)."""
        if wait is None:
            return
        run_id = record.run_id
        now = self.clock.now()
        # D4: a wait began when its step was first stored (no publish runs inside a suspend).
        began = self.began.setdefault(run_id, len(self.log))
        first = self.first_event_after(wait, began)
        if wait.state == "done" and run_id not in self.done_waits:
            self.done_waits.add(run_id)
            got = wait.result
            if "timeout" in got:
                # D4: never missing an event committed after it began.
                assert first is None, (run_id, got, first)
                assert wait.wake_at is not None
                assert wait.wake_at <= now
            else:
                # D4: the first event committed after it began, none earlier.
                place = next(i for i, p in enumerate(self.log) if p.model_id == got["event"]["id"])
                assert place == first, (run_id, got, place, first)
        if wait.state == "waiting" and record.state == "waiting":
            if first is None:
                # D3, D4: not claimable before its event or its timeout.
                assert record.run_at == wait.wake_at, (record, wait)
            else:
                assert record.run_at <= now, (record, wait)


def _allow(permission: str, operation: str) -> bool:
    return True


@pytest.fixture(scope="module")
def workflow_database(ship_server: ResolvedServer) -> Iterator[str]:
    """A database of this module's own (created and dropped synchronously)."""
    yield from module_database(ship_server, "wfsm")


@pytest.mark.timeout(900 if LARGE else 300)
def test_postgres_workflows_match_the_model(workflow_database: str) -> None:
    """D1-D6 against the model: after every step PostgreSQL's runs and steps equal the model's;
    no step is stored twice and a stored step never runs again, a stale holder stores nothing
    (D1); the transactional step's effect happened once per stored transactional step (D2); no
    suspended run is claimed before its wake time, its event or its children's end (D3); a wait
    is matched only by the first event committed after it began, never by a rolled-back one,
    and times out only when none came (D4); children are enqueued once and their parent is due
    once they all ended (D5); cancel and rerun_from_step answer alike (D6)."""
    run_machine(WorkflowMachine, workflow_database, metadata, SETTINGS)


def test_a_child_ending_while_its_parent_runs_again_marks_the_parent_alike(
    workflow_database: str,
) -> None:
    """D5, as the machine found it: a parent suspended for its child, claimed again after the
    children recheck and crashed (still running, its lease held), then the child completes:
    both backends mark the running parent (``#children-done``) and leave its ``updated_at``
    (J18: a running run's updated_at is its attempt's start)."""

    def steps(state: WorkflowMachine) -> None:
        state.enqueue(
            fails=0, key="k1", kid_fails=False, kids=1, sleep=None, timeout=None, wait=False
        )
        state.execute(plan=[("wf.sm", "A", None)])
        state.advance(seconds=61)
        state.execute(plan=[("wf.sm", "A", "a")])
        state.advance(seconds=1)
        state.execute(plan=[("wf.sm.child", "A", None)])
        state.database_equals_model_and_invariants_hold()

    replay_machine(WorkflowMachine, workflow_database, metadata, steps)
