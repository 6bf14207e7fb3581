"""Durable workflows (SPEC §13, D1-D6), on every backend: the in-memory model and PostgreSQL
answer the same. Each execution is driven by hand (``execute_once``: claim, run the handler with
its context bound to the backend's workflow store, settle), so time moves only through the
FrozenClock and nothing waits on a runtime's loop.
"""

from __future__ import annotations

from datetime import timedelta

import anyio
import attrs
import pytest
from job_helpers import claim_request, record_of
from workflow_helpers import FakeUnitOfWork, execute_once

from ship_sqla import JobContext, create_job_operations, define_job
from ship_sqla.errors import (
    ChildJobUnservedError,
    ChildRunsRefusedError,
    JobLeaseStaleError,
    StepNameReusedError,
    WorkflowChangedError,
)
from ship_sqla.jobs import Concurrency, RetryPolicy
from ship_sqla.kernel import WorkerEntry, failed
from ship_sqla.workflows import StepRetry

LEASE = 30.0


def workflow(job_id: str, handler, *, attempts: int = 5):
    return define_job(
        job_id,
        handler,
        payload=dict,
        concurrency=Concurrency(lease=LEASE),
        retry=RetryPolicy(attempts=attempts),
    )


async def nothing(ctx, payload):
    return None


def allow_all(permission, operation):
    return True


@attrs.frozen
class Receipt:
    order: str
    cents: int


# --- D1: steps ----------------------------------------------------------------------------------


async def test_d1_a_step_runs_once_and_replays_its_stored_result(clock, job_backend_factory):
    """D1: a step's result is stored before the step returns; the next attempt (the handler
    failed after the step) replays it without running the step, decoded by its declared type;
    the first execution returns the decoded form too."""
    backend = job_backend_factory(clock)
    calls: list[str] = []
    seen: list[Receipt] = []

    async def handler(ctx, payload):
        async def charge():
            calls.append("charge")
            return Receipt("o1", 1250)

        receipt = await ctx.step("charge", charge, result=Receipt)
        seen.append(receipt)
        if ctx.attempt == 1:
            raise RuntimeError("after the step")

    job = workflow("wf.d1", handler)
    result = await backend.enqueue(job, {})
    first = await execute_once(backend, job, clock)
    assert (first.ended, first.outcome) == ("failed", "retrying")
    second = await execute_once(backend, job, clock)
    assert (second.ended, second.outcome) == ("completed", "completed")
    assert calls == ["charge"]
    assert seen == [Receipt("o1", 1250), Receipt("o1", 1250)]
    steps = await backend.workflows.list_steps(result.run_id)
    assert [(s.name, s.kind, s.state, s.result) for s in steps] == [
        ("charge", "step", "done", {"order": "o1", "cents": 1250})
    ]


async def test_d1_a_step_name_used_twice_is_a_typed_error(clock, job_backend_factory):
    """D1: one name twice in one execution is StepNameReusedError (its replay would return the
    first step's result); the attempt fails."""
    backend = job_backend_factory(clock)

    async def handler(ctx, payload):
        async def one():
            return 1

        await ctx.step("same", one)
        await ctx.step("same", one)

    job = workflow("wf.d1.reuse", handler)
    await backend.enqueue(job, {})
    execution = await execute_once(backend, job, clock)
    assert isinstance(execution.error, StepNameReusedError)
    assert execution.error.code == "SHIP_SQLA_STEP_NAME_REUSED"


async def test_d1_a_holder_that_lost_its_claim_stores_nothing(clock, job_backend_factory):
    """D1: step writes are fenced on the claim token: once the lease lapsed and another worker
    retook the run, the old holder's step is refused (JobLeaseStaleError) and only the new
    holder's result is stored."""
    backend = job_backend_factory(clock)
    job = workflow("wf.d1.fence", nothing)
    result = await backend.enqueue(job, {})
    [old] = await backend.claim(claim_request(job, worker="old"))
    clock.advance(LEASE + 1)
    [new] = await backend.claim(claim_request(job, worker="new"))
    assert new.token != old.token

    async def value(v):
        return v

    stale = JobContext.standalone(old, worker_id="old")
    stale.bind_workflows(backend.workflows, backend, clock)
    with pytest.raises(JobLeaseStaleError):
        await stale.step("s", lambda: value("old"))
    current = JobContext.standalone(new, worker_id="new")
    current.bind_workflows(backend.workflows, backend, clock)
    assert await current.step("s", lambda: value("new")) == "new"
    [step] = await backend.workflows.list_steps(result.run_id)
    assert step.result == "new"


async def test_d1_a_step_retries_under_its_own_policy(clock, job_backend_factory):
    """D1: a step with its own StepRetry is tried again in the same attempt; only its last
    failure fails the attempt."""
    backend = job_backend_factory(clock)
    tries: list[int] = []

    async def handler(ctx, payload):
        async def flaky():
            tries.append(1)
            if len(tries) < 3:
                raise ConnectionError("flaky")
            return "ok"

        assert await ctx.step("flaky", flaky, retry=StepRetry(attempts=3, delay=0)) == "ok"

    job = workflow("wf.d1.retry", handler)
    await backend.enqueue(job, {})
    execution = await execute_once(backend, job, clock)
    assert (execution.ended, len(tries)) == ("completed", 3)


async def test_d1_a_step_whose_kind_changed_dead_letters_the_run(clock, job_backend_factory):
    """D1 (the determinism contract): a stored step the handler now calls as another kind is
    WorkflowChangedError, terminal: the run is dead at once."""
    backend = job_backend_factory(clock)
    version = {"v": 1}

    async def handler(ctx, payload):
        if version["v"] == 1:

            async def one():
                return 1

            await ctx.step("s", one)
            raise RuntimeError("retry me")
        await ctx.sleep("s", 1)

    job = workflow("wf.d1.changed", handler)
    result = await backend.enqueue(job, {})
    await execute_once(backend, job, clock)
    version["v"] = 2
    execution = await execute_once(backend, job, clock)
    assert isinstance(execution.error, WorkflowChangedError)
    # The executor dead-letters a TerminalError; the helper only records it.
    assert (await record_of(backend, result.run_id)).state == "waiting"


# --- D2: transactional steps ---------------------------------------------------------------------


async def test_d2_a_transactional_step_replays_without_running_again(clock, job_backend_factory):
    """D2: ctx.transaction runs its function inside the unit of work and stores the result in
    it; a replay returns the stored result and opens no unit of work. (Exactly-once against a
    real transaction, and a rolled-back one, on PostgreSQL: test_workflows.py.)"""
    backend = job_backend_factory(clock)
    uow = FakeUnitOfWork()
    effects: list[str] = []

    async def handler(ctx, payload):
        async def reserve(repositories):
            effects.append("reserve")
            return {"reservation": "r-1"}

        got = await ctx.transaction("reserve", uow, reserve)
        assert got == {"reservation": "r-1"}
        if ctx.attempt == 1:
            raise RuntimeError("after the transaction")

    job = workflow("wf.d2", handler)
    await backend.enqueue(job, {})
    await execute_once(backend, job, clock)
    execution = await execute_once(backend, job, clock)
    assert execution.ended == "completed"
    assert effects == ["reserve"]
    assert uow.runs == 1


# --- D3: durable sleep ---------------------------------------------------------------------------


async def test_d3_a_sleep_suspends_without_a_slot_lease_or_attempt(clock, job_backend_factory):
    """D3: a sleep releases the run (waiting, no lease, its attempt unspent) and it is not
    claimable before its wake time; once due it is claimed, replays, and continues; the wake
    time is the one stored at the first call."""
    backend = job_backend_factory(clock)
    after: list[int] = []

    async def handler(ctx, payload):
        await ctx.sleep("nap", timedelta(seconds=60))
        after.append(ctx.attempt)

    job = workflow("wf.d3", handler)
    result = await backend.enqueue(job, {})
    first = await execute_once(backend, job, clock)
    assert (first.ended, first.outcome) == ("suspended", "suspended")
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt, record.lease_expires_at) == ("waiting", 0, None)
    clock.advance(59)
    assert (await execute_once(backend, job, clock)).run is None
    clock.advance(2)
    done = await execute_once(backend, job, clock)
    assert (done.ended, after) == ("completed", [1])
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt) == ("completed", 1)
    [nap] = await backend.workflows.list_steps(result.run_id)
    assert (nap.kind, nap.state) == ("sleep", "done")


# --- D4: events ----------------------------------------------------------------------------------


async def test_d4_an_event_committed_after_the_wait_began_is_its_result(clock, job_backend_factory):
    """D4: an event published before the wait began does not match it; one published after
    wakes the suspended run at once (due now, not at its timeout) and is the wait's stored
    result, replayed as such."""
    backend = job_backend_factory(clock)
    got: list[object] = []

    async def handler(ctx, payload):
        event = await ctx.wait_for_event(
            "shipped", "order.shipped", key=payload["order"], timeout=3600
        )
        got.append(None if event is None else event.payload)

    job = workflow("wf.d4", handler)
    await backend.publish_event("order.shipped", {"early": True}, key="o1")
    result = await backend.enqueue(job, {"order": "o1"})
    first = await execute_once(backend, job, clock)
    assert first.outcome == "suspended"
    assert (await execute_once(backend, job, clock)).run is None
    await backend.publish_event("order.shipped", {"tracking": "T1"}, key="other")
    assert (await execute_once(backend, job, clock)).run is None
    await backend.publish_event("order.shipped", {"tracking": "T2"}, key="o1")
    done = await execute_once(backend, job, clock)
    assert (done.ended, got) == ("completed", [{"tracking": "T2"}])
    [step] = await backend.workflows.list_steps(result.run_id)
    assert step.result["event"]["payload"] == {"tracking": "T2"}


async def test_d4_a_wait_times_out_by_the_clock_and_stores_it(clock, job_backend_factory):
    """D4: with no matching event the run stays suspended until its timeout, then the wait
    returns None, stored as a timeout."""
    backend = job_backend_factory(clock)
    got: list[object] = []

    async def handler(ctx, payload):
        got.append(await ctx.wait_for_event("w", "never.comes", timeout=30))

    job = workflow("wf.d4.timeout", handler)
    result = await backend.enqueue(job, {})
    await execute_once(backend, job, clock)
    clock.advance(29)
    assert (await execute_once(backend, job, clock)).run is None
    clock.advance(2)
    done = await execute_once(backend, job, clock)
    assert (done.ended, got) == ("completed", [None])
    [step] = await backend.workflows.list_steps(result.run_id)
    assert step.result == {"timeout": True}


async def test_d4_one_event_reaches_every_wait_that_began_before_it(clock, job_backend_factory):
    """D4: two runs waiting for the same (name, key) both receive one event."""
    backend = job_backend_factory(clock)
    got: list[object] = []

    async def handler(ctx, payload):
        event = await ctx.wait_for_event("w", "fan.out", key="k")
        got.append(event.payload if event else None)

    job = workflow("wf.d4.broadcast", handler)
    await backend.enqueue(job, {})
    await backend.enqueue(job, {})
    assert (await execute_once(backend, job, clock)).outcome == "suspended"
    assert (await execute_once(backend, job, clock)).outcome == "suspended"
    await backend.publish_event("fan.out", 7, key="k")
    assert (await execute_once(backend, job, clock)).ended == "completed"
    assert (await execute_once(backend, job, clock)).ended == "completed"
    assert got == [7, 7]


# --- D5: child runs and fan-in --------------------------------------------------------------------


async def test_d5_children_are_enqueued_once_and_the_parent_resumes_after_the_last(
    clock, job_backend_factory
):
    """D5: a spawn enqueues its children once however often it is replayed; waiting for them
    suspends the parent until all are terminal (the last one's end makes it due at once); the
    parent sees each child's outcome, and its continuation runs once."""
    backend = job_backend_factory(clock)
    continued: list[list[str]] = []

    async def child(ctx, payload):
        return None

    child_job = workflow("wf.d5.child", child, attempts=1)

    async def parent(ctx, payload):
        ids = await ctx.spawn("kids", child_job, [{"i": i} for i in range(3)])
        if ctx.attempt == 1:
            raise RuntimeError("replay the spawn")
        outcomes = await ctx.wait_for_children("join")
        assert [o.run_id for o in outcomes] == ids
        continued.append([o.state for o in outcomes])

    job = workflow("wf.d5", parent)
    result = await backend.enqueue(job, {})
    await execute_once(backend, job, clock)
    assert (await execute_once(backend, job, clock)).outcome == "suspended"
    assert len(await backend.workflows.children(result.run_id)) == 3
    assert (await execute_once(backend, child_job, clock)).outcome == "completed"
    # A child that fails for good ends too (dead is terminal).
    unsettled = await execute_once(backend, child_job, clock, settle=False)
    assert await backend.settle([failed(unsettled.run, "boom", None)]) == ["dead"]
    assert (await execute_once(backend, job, clock)).run is None
    assert (await execute_once(backend, child_job, clock)).outcome == "completed"
    done = await execute_once(backend, job, clock)
    assert (done.ended, continued) == ("completed", [["completed", "dead", "completed"]])
    assert len(await backend.workflows.children(result.run_id)) == 3


# --- D6: operations -------------------------------------------------------------------------------


async def test_d6_rerun_from_a_step_drops_it_and_every_later_step(clock, job_backend_factory):
    """D6: re-running a dead workflow from a named step drops that step and every later one,
    gives it one more attempt, and its handler replays the earlier steps and runs the rest."""
    backend = job_backend_factory(clock)
    ops = create_job_operations(backend, authorizer=allow_all)
    ran: list[str] = []
    fail = {"c": True}

    async def handler(ctx, payload):
        for name in ("a", "b", "c"):

            async def body(name=name):
                ran.append(name)
                if name == "c" and fail["c"]:
                    raise RuntimeError("c failed")
                return name

            await ctx.step(name, body)

    job = workflow("wf.d6", handler, attempts=1)
    result = await backend.enqueue(job, {})
    assert (await execute_once(backend, job, clock)).outcome == "dead"
    assert [s.name for s in await ops.list_steps(result.run_id)] == ["a", "b"]
    fail["c"] = False
    record = await ops.rerun_from_step(result.run_id, "b")
    assert (record.state, record.max_attempts) == ("waiting", 2)
    assert [s.name for s in await ops.list_steps(result.run_id)] == ["a"]
    ran.clear()
    assert (await execute_once(backend, job, clock)).ended == "completed"
    assert ran == ["b", "c"]


async def test_d6_cancelling_a_suspended_workflow_cancels_it(clock, job_backend_factory):
    """D6 (K2): a workflow suspended in a sleep is a waiting run: a cancel ends it cancelled at
    once, and it is never claimed again."""
    backend = job_backend_factory(clock)

    async def handler(ctx, payload):
        await ctx.sleep("nap", 5)

    job = workflow("wf.d6.cancel", handler)
    result = await backend.enqueue(job, {})
    await execute_once(backend, job, clock)
    ops = create_job_operations(backend, authorizer=allow_all)
    cancelled = await ops.cancel(result.run_id)
    assert cancelled.record.state == "cancelled"
    clock.advance(10)
    assert (await execute_once(backend, job, clock)).run is None


async def test_d5_a_child_an_operator_cancels_wakes_its_parent(clock, job_backend_factory):
    """D5 (K2): a child an operator cancels is terminal: when it was the last live child, the
    parent waiting for its children becomes due (after the cancel committed)."""
    backend = job_backend_factory(clock)
    ops = create_job_operations(backend, authorizer=allow_all)

    async def child(ctx, payload):
        return None

    child_job = workflow("wf.d5.cancel.child", child)

    async def parent(ctx, payload):
        await ctx.spawn("kids", child_job, [{}])
        await ctx.wait_for_children("join")

    job = workflow("wf.d5.cancel", parent)
    result = await backend.enqueue(job, {})
    assert (await execute_once(backend, job, clock)).outcome == "suspended"
    [kid] = await backend.workflows.children(result.run_id)
    assert (await execute_once(backend, job, clock)).run is None
    assert (await ops.cancel(kid.run_id)).record.state == "cancelled"
    for _ in range(200):  # PostgreSQL wakes the parent in a task once the cancel committed
        if (await record_of(backend, result.run_id)).run_at <= clock.now():
            break
        await anyio.sleep(0.01)
    done = await execute_once(backend, job, clock)
    assert done.ended == "completed"


async def test_d4_expect_event_begins_the_wait_before_the_step_that_causes_it(
    clock, job_backend_factory
):
    """D4: a wait begun with expect_event receives an event committed after it began, also
    one published before the handler reaches its wait (the answer to a request the next step
    sends): the run's suspend finds it and the run is due at once; an event committed before
    the wait began is still not its result."""
    backend = job_backend_factory(clock)
    got: list[object] = []

    async def handler(ctx, payload):
        shipped = await ctx.expect_event("shipped", "parcel.shipped", key="p1", timeout=3600)

        async def request_shipping():
            # The carrier answers at once: its webhook publishes before the wait below.
            await backend.publish_event("parcel.shipped", {"tracking": "fast"}, key="p1")
            return "requested"

        await ctx.step("request", request_shipping)
        event = await shipped.wait()
        got.append(event.payload if event else None)

    job = workflow("wf.d4.expect", handler)
    await backend.publish_event("parcel.shipped", {"tracking": "too early"}, key="p1")
    result = await backend.enqueue(job, {})
    first = await execute_once(backend, job, clock)
    # The event came before the wait: either the execution saw it at once, or its suspend
    # made the run due now.
    if first.ended == "suspended":
        assert (await execute_once(backend, job, clock)).ended == "completed"
    assert got == [{"tracking": "fast"}]
    steps = await backend.workflows.list_steps(result.run_id)
    assert [(s.name, s.kind, s.state) for s in steps] == [
        ("shipped", "event", "done"),
        ("request", "step", "done"),
    ]


async def test_d5_a_child_buried_by_a_lapse_wakes_its_parent(clock, job_backend_factory):
    """D5 (J6): a child whose lease lapsed on its final attempt is dead-lettered by the next
    claim: when it was the last live child, that claim wakes its parent at once."""
    backend = job_backend_factory(clock)

    async def child(ctx, payload):
        return None

    child_job = workflow("wf.d5.lapse.child", child, attempts=1)

    async def parent(ctx, payload):
        await ctx.spawn("kids", child_job, [{}])
        outcomes = await ctx.wait_for_children("join")
        assert [o.state for o in outcomes] == ["dead"]

    job = workflow("wf.d5.lapse", parent)
    result = await backend.enqueue(job, {})
    assert (await execute_once(backend, job, clock)).outcome == "suspended"
    [held] = await backend.claim(claim_request(child_job, worker="dies"))
    clock.advance(LEASE + 1)
    batch = await backend.claim(claim_request(child_job, worker="next"))
    assert [b.run_id for b in batch.buried] == [held.run_id]
    assert (await record_of(backend, result.run_id)).run_at <= clock.now()
    assert (await execute_once(backend, job, clock)).ended == "completed"


async def test_d5_a_settled_parent_waits_for_nothing(clock, job_backend_factory):
    """D5: what a run waited for ends with its settlement: a parent that spawned children and
    then failed (a retry), or that completed after its fan-in, has no ``wait_for`` left (as
    PostgreSQL's settle clears it), so a later child's end or an event finds nothing to wake."""
    backend = job_backend_factory(clock)
    child_job = workflow("wf.d5.settled.child", nothing)

    async def parent(ctx, payload):
        await ctx.spawn("kids", child_job, [{}])
        if ctx.attempt == 1:
            raise RuntimeError("after the spawn")
        await ctx.wait_for_children("join")

    job = workflow("wf.d5.settled", parent)
    result = await backend.enqueue(job, {})
    assert (await execute_once(backend, job, clock)).outcome == "retrying"
    record = await record_of(backend, result.run_id)
    assert (record.state, record.wait_for) == ("waiting", None)
    assert (await execute_once(backend, job, clock)).outcome == "suspended"
    assert (await execute_once(backend, child_job, clock)).outcome == "completed"
    assert (await execute_once(backend, job, clock)).outcome == "completed"
    record = await record_of(backend, result.run_id)
    assert (record.state, record.wait_for) == ("completed", None)


async def test_d6_rerun_of_a_suspended_run_drops_its_wait(clock, job_backend_factory):
    """D6: re-running a run suspended on an event wait from that step drops the wait: the run
    waits for nothing and is due now (even when its timeout had passed earlier); a later
    event of that wait wakes nothing, and the replay begins a new wait."""
    backend = job_backend_factory(clock)
    ops = create_job_operations(backend, authorizer=allow_all)

    async def handler(ctx, payload):
        await ctx.wait_for_event("ev", "rerun.ev", key="k", timeout=20)

    job = workflow("wf.d6.rerun.wait", handler)
    result = await backend.enqueue(job, {})
    assert (await execute_once(backend, job, clock)).outcome == "suspended"
    clock.advance(25)
    record = await ops.rerun_from_step(result.run_id, "ev")
    assert (record.state, record.wait_for, record.run_at) == ("waiting", None, clock.now())
    assert await ops.list_steps(result.run_id) == []
    assert (await execute_once(backend, job, clock)).outcome == "suspended"
    [wait] = await ops.list_steps(result.run_id)
    assert wait.wake_at == clock.now() + timedelta(seconds=20)


async def test_d5_a_spawn_the_queue_cap_refuses_fails_the_attempt(clock, job_backend_factory):
    """D5 (J2): a spawn whose child runs the child job's queue_depth_limit refuses is
    ChildRunsRefusedError: the attempt fails (nothing stored), and the retried spawn enqueues
    only what was not accepted before (durable ids)."""
    backend = job_backend_factory(clock, queue_depth_limit=2)

    async def child(ctx, payload):
        return None

    child_job = workflow("wf.d5.full.child", child)

    async def parent(ctx, payload):
        await ctx.spawn("kids", child_job, [{"i": i} for i in range(3)])

    job = workflow("wf.d5.full", parent)
    result = await backend.enqueue(job, {})
    failed = await execute_once(backend, job, clock)
    assert isinstance(failed.error, ChildRunsRefusedError)
    assert failed.error.code == "SHIP_SQLA_CHILD_RUNS_REFUSED"
    assert await backend.workflows.list_steps(result.run_id) == []
    assert len(await backend.workflows.children(result.run_id)) == 0


async def test_d5_a_spawn_of_a_job_no_live_worker_declares_is_refused(clock, job_backend_factory):
    """D5 (F6): a parent must never wait unseen. While the worker registry lists live workers
    and none of them declares the child job (a draining one does not count), the spawn is
    ChildJobUnservedError naming the job and the closest served id: the attempt fails with
    nothing stored or enqueued. Once a worker declaring it is live, the retried spawn goes
    ahead. With no live worker listed, nothing is known, and the spawn goes ahead (the
    by-hand executions of the other tests)."""
    backend = job_backend_factory(clock)
    child_job = workflow("wf.d5.unserved.child", nothing)

    async def parent(ctx, payload):
        await ctx.spawn("kids", child_job, [{"i": i} for i in range(2)])

    job = workflow("wf.d5.unserved", parent)

    async def live(worker_id, job_ids, *, draining=False):
        await backend.workers.heartbeat(
            WorkerEntry(worker_id, "host", 1, clock.now(), job_ids, 0, draining)
        )

    await live("w-parent", (job.id, "wf.d5.unserved.chld"))
    await live("w-leaving", (child_job.id,), draining=True)
    result = await backend.enqueue(job, {})
    refused = await execute_once(backend, job, clock)
    assert isinstance(refused.error, ChildJobUnservedError)
    assert refused.error.code == "SHIP_SQLA_CHILD_JOB_UNSERVED"
    assert child_job.id in str(refused.error)
    assert "wf.d5.unserved.chld" in refused.error.fix
    assert await backend.workflows.list_steps(result.run_id) == []
    assert len(await backend.workflows.children(result.run_id)) == 0

    await live("w-child", (child_job.id,))
    clock.advance(3600)
    spawned = await execute_once(backend, job, clock)
    assert spawned.error is None
    assert len(await backend.workflows.children(result.run_id)) == 2
