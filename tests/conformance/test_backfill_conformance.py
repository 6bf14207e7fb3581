"""Paced backfills (SPEC §15, C4, C5) on every backend: the in-memory model (a list source, the
in-memory ledger and unit of work) and PostgreSQL (a table read by ``selectable_source``, the
ledger table, a real unit of work). Time is a FrozenClock: no test waits in real time.

Most tests call the backfill's job handler on a run claimed from the backend (so the pacer is
the only task parked on the clock and each wait can be read); two run it through the worker
runtime, as an application does.
"""

from __future__ import annotations

import asyncio
import contextvars
from datetime import timedelta
from typing import Any

import anyio
import anyio.lowlevel
import attrs
import pytest
from backfill_kit import BackfillKit, backfill_kit
from job_helpers import claim_request, record_of
from spy_backend import SpyBackend

from ship_sqla import JobContext, start_job_runtime
from ship_sqla.backfills import create_backfill_operations, define_backfill
from ship_sqla.errors import JobLeaseStaleError
from ship_sqla.testing import FrozenClock

IDS = list(range(1, 24))  # 23 rows: pages of 5, 5, 5, 5, 3
PAGE = 5


class RecordingClock(FrozenClock):
    """A FrozenClock that keeps every sleep asked of it (the pacer's waits)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.asked.append(seconds)
        await super().sleep(seconds)

    async def until_asked(self, count: int, *, at_most: float) -> None:
        """Yield until ``count`` sleeps of at most ``at_most`` seconds were asked (the pacer's,
        among a runtime's longer ones); never a real sleep."""
        while sum(1 for s in self.asked if s <= at_most) < count:
            await anyio.lowlevel.checkpoint()


@pytest.fixture
def clock() -> RecordingClock:
    return RecordingClock()


def _allow(*_: Any) -> bool:
    return True


async def _kit(job_backend_factory: Any, clock: FrozenClock, ids: list[int] = IDS) -> Any:
    backend = job_backend_factory(clock)
    return backend, await backfill_kit(backend, clock, ids)


def _backfill(kit: BackfillKit, *, transactional: bool = True, pace: float = 2.0, **more: Any):
    async def handle(ctx: Any, rows: Any, repositories: Any) -> None:
        for row in rows:
            await repositories.visit(row.id)

    return define_backfill(
        "bf.emails",
        source=kit.source,
        handle=more.pop("handle", handle),
        pace=pace,
        ledger=kit.ledger,
        transaction=kit.uow if transactional else None,
        page_size=PAGE,
        **more,
    )


async def _claimed(backend: Any, backfill: Any) -> Any:
    await backend.enqueue(backfill.job, {})
    [run] = await backend.claim(claim_request(backfill.job, worker="w1"))
    return run


async def _until_parked(clock: FrozenClock, task: asyncio.Task[Any]) -> bool:
    """Yield until the pass parks on the clock (True) or ends (False); never a real sleep."""
    while clock.sleepers < 1:
        if task.done():
            return False
        await anyio.lowlevel.checkpoint()
    return True


async def _drive(clock: FrozenClock, ctx: JobContext[Any], backfill: Any, step: float) -> None:
    """Run the pass, moving the clock by ``step`` each time it parks, until it ends."""
    task = asyncio.ensure_future(backfill.job.handler(ctx, {}))
    with anyio.fail_after(20):
        while await _until_parked(clock, task):
            clock.advance(step)
        await task


async def test_c4_every_row_is_visited_once_in_key_order_one_checkpoint_per_page(
    clock, job_backend_factory
):
    """C4: a pass visits every row of the source once, in key order (the rows were inserted
    in reverse), one page at a time; the ledger records each page: pages, rows, the last key,
    started and finished, completed."""
    backend, kit = await _kit(job_backend_factory, clock)
    backfill = _backfill(kit)
    ctx = JobContext.standalone(await _claimed(backend, backfill))
    started = clock.now()
    await _drive(clock, ctx, backfill, backfill.interval)
    assert await kit.effects() == IDS
    record = await kit.ledger.get("bf.emails")
    assert (record.state, record.pages, record.rows, record.last_key) == ("completed", 5, 23, (23,))
    assert record.started_at == started
    assert record.finished_at == clock.now()
    assert record.run_id == ctx.run_id


async def test_c4_the_pace_is_one_page_per_interval_on_the_injected_clock(
    clock, job_backend_factory
):
    """C4: paced on the injected clock: between two pages the pass asks the clock for exactly
    one interval (1 / pace) and reads nothing more until the clock gets there; the whole pass
    takes (pages - 1) intervals of frozen time and no real time."""
    backend, kit = await _kit(job_backend_factory, clock)
    backfill = _backfill(kit, pace=0.5)  # a page every 2 s
    ctx = JobContext.standalone(await _claimed(backend, backfill))
    task = asyncio.ensure_future(backfill.job.handler(ctx, {}))
    with anyio.fail_after(20):
        assert await _until_parked(clock, task)
        assert (await kit.ledger.get("bf.emails")).pages == 1
        clock.advance(1.999)  # not yet due: still parked, no second page
        await anyio.lowlevel.checkpoint()
        assert clock.sleepers == 1
        assert (await kit.ledger.get("bf.emails")).pages == 1
        clock.advance(0.001)
        while await _until_parked(clock, task):
            clock.advance(2.0)
        await task
    assert clock.asked == [2.0, 2.0, 2.0, 2.0]
    assert clock.monotonic() == pytest.approx(8.0)
    assert await kit.effects() == IDS


async def test_c4_slots_are_start_to_start_so_a_pages_work_does_not_slow_the_rate(
    clock, job_backend_factory
):
    """C4: the interval runs from one page's start to the next one's: a page whose work takes
    half a second of a two-second interval is followed by a wait of one and a half, and the
    pass keeps the declared rate (pages start every 2 s of the injected clock)."""
    backend, kit = await _kit(job_backend_factory, clock)
    starts: list[float] = []

    async def handle(ctx: Any, rows: Any, repositories: Any) -> None:
        starts.append(clock.monotonic())
        for row in rows:
            await repositories.visit(row.id)
        clock.advance(0.5)  # the page's own work

    backfill = _backfill(kit, pace=0.5, handle=handle)
    ctx = JobContext.standalone(await _claimed(backend, backfill))
    clock.asked.clear()
    await _drive(clock, ctx, backfill, 1.5)
    assert clock.asked == [1.5, 1.5, 1.5, 1.5]
    assert starts == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert await kit.effects() == IDS


async def test_c4_a_late_wake_up_does_not_slow_the_pace(clock, job_backend_factory):
    """C4: each slot is measured from the slot it was due at, not from the (late) wake-up, so a
    pass whose wake-ups come late keeps its declared pace on average (the lateness does not add
    up); a page that ran a whole interval past its slot starts the count from now, never a
    burst."""
    backend, kit = await _kit(job_backend_factory, clock)
    starts: list[float] = []

    async def handle(ctx: Any, rows: Any, repositories: Any) -> None:
        starts.append(clock.monotonic())
        for row in rows:
            await repositories.visit(row.id)

    backfill = _backfill(kit, pace=0.5, handle=handle)
    ctx = JobContext.standalone(await _claimed(backend, backfill))
    clock.asked.clear()
    await _drive(clock, ctx, backfill, 2.1)  # every wake-up comes 0.1 s past the end of its wait
    assert starts == pytest.approx([0.0, 2.1, 4.2, 6.3, 8.4])
    # Each wait asked only for what was left of its slot (due at 2, 4, 6, 8): the lateness was
    # paid back, not added up (measured from the wake-ups, each would have asked for 2.0).
    assert clock.asked == pytest.approx([2.0, 1.9, 1.8, 1.7])
    assert await kit.effects() == IDS


async def test_c4_a_crash_resumes_from_the_last_checkpoint_each_page_committed_once(
    clock, job_backend_factory
):
    """C4: an attempt that fails mid-page (after writing some of the page) rolls that page back
    with its checkpoint; the next attempt (a new claim token) resumes after the last committed
    checkpoint and keeps the pace from it: every row visited, each page's effect committed
    exactly once. The first holder's late checkpoint is refused."""
    backend, kit = await _kit(job_backend_factory, clock)
    crashed: list[int] = []

    async def handle(ctx: Any, rows: Any, repositories: Any) -> None:
        for row in rows:
            await repositories.visit(row.id)
            if row.id == 12 and not crashed:
                crashed.append(row.id)
                raise ConnectionError("the worker lost its database mid-page")

    backfill = _backfill(kit, handle=handle)
    run = await _claimed(backend, backfill)
    first = JobContext.standalone(run)
    with pytest.raises(ConnectionError):
        await _drive(clock, first, backfill, backfill.interval)
    record = await kit.ledger.get("bf.emails")
    assert (record.state, record.pages, record.last_key) == ("running", 2, (10,))
    assert await kit.effects() == IDS[:10]
    retaken = JobContext.standalone(attrs.evolve(run, token=run.token + 1, attempt=2))
    clock.asked.clear()
    await _drive(clock, retaken, backfill, backfill.interval)
    assert await kit.effects() == IDS
    assert (await kit.ledger.get("bf.emails")).pages == 5
    # The resumed pass waited for the slot after the last checkpoint before its first page.
    assert clock.asked[0] == pytest.approx(backfill.interval)
    stale = await kit.ledger.checkpoint(
        "bf.emails", run_id=run.run_id, token=run.token, pages_before=5, last_key=(99,), rows=1
    )
    assert stale is None


async def test_c4_without_a_transaction_a_crash_hands_the_page_over_again(
    clock, job_backend_factory
):
    """C4: without ``transaction=`` a page's effect and its checkpoint are apart: a crash
    between them hands that page to the next attempt again (at least once), and no row is
    skipped."""
    backend, kit = await _kit(job_backend_factory, clock)
    seen: list[int] = []

    async def handle(ctx: Any, rows: Any) -> None:
        seen.extend(row.id for row in rows)
        if rows[0].id == 11 and seen.count(11) == 1:
            raise ConnectionError("crashed before the checkpoint")

    backfill = _backfill(kit, transactional=False, handle=handle)
    run = await _claimed(backend, backfill)
    with pytest.raises(ConnectionError):
        await _drive(clock, JobContext.standalone(run), backfill, backfill.interval)
    retaken = JobContext.standalone(attrs.evolve(run, token=run.token + 1, attempt=2))
    await _drive(clock, retaken, backfill, backfill.interval)
    assert seen == IDS[:15] + IDS[10:]
    assert sorted(set(seen)) == IDS


async def test_c4_a_cancel_ends_the_pacers_wait_at_once(clock, job_backend_factory):
    """C4: the run's cancellation ends the pacer's wait at once: the clock never moves, the
    pass ends (CancelledError), and no page is read after the cancel."""
    backend, kit = await _kit(job_backend_factory, clock)
    backfill = _backfill(kit, pace=1 / 3600)  # a page an hour
    ctx = JobContext.standalone(await _claimed(backend, backfill))
    task = asyncio.ensure_future(backfill.job.handler(ctx, {}))
    with anyio.fail_after(10):
        assert await _until_parked(clock, task)
        before = clock.now()
        ctx.cancellation.cancel("cancelled")
        with pytest.raises(asyncio.CancelledError):
            await task
    assert clock.now() == before
    assert clock.sleepers == 0
    assert await kit.effects() == IDS[:PAGE]
    assert (await kit.ledger.get("bf.emails")).pages == 1


async def test_c4_c5_an_operator_start_runs_the_pass_as_a_job_and_cancel_stops_it(
    clock, job_backend_factory
):
    """C4, C5: ``start`` records the backfill pending (with its declared pace and migration)
    and enqueues one run (a second start adds none); a worker runtime runs it; an operator's
    ``cancel`` marks the ledger cancelled and cancels the run (K2), which ends the pacer's
    wait at once: the run ends cancelled without the clock moving; ``verify`` names the
    required backfill throughout (cancelled is not done)."""
    inner, kit = await _kit(job_backend_factory, clock)
    backend = SpyBackend(inner)
    first_page = anyio.Event()

    async def handle(ctx: Any, rows: Any, repositories: Any) -> None:
        for row in rows:
            await repositories.visit(row.id)
        first_page.set()

    backfill = _backfill(kit, pace=1 / 3600, handle=handle, required_by="0042_emails")
    ops = create_backfill_operations(kit.ledger, backend, authorizer=_allow)
    started = await ops.start(backfill)
    assert started.outcome == "enqueued"
    assert (started.record.state, started.record.required_by) == ("pending", "0042_emails")
    assert (await ops.start(backfill)).outcome == "running"
    assert [(b.backfill_id, b.reason) for b in await ops.verify()] == [("bf.emails", "pending")]
    before = clock.now()
    async with await start_job_runtime([backfill.job], backend=backend, worker_id="w1"):
        with anyio.fail_after(10):
            await first_page.wait()
            # handle() returned before its page committed: a cancel landing in between rolls
            # the page back (its effects with it), so cancel only once the page is in.
            while await kit.effects() != IDS[:PAGE]:
                await anyio.lowlevel.checkpoint()
        holder = (await kit.ledger.get("bf.emails")).run_id
        cancelled = await ops.cancel("bf.emails")
        assert cancelled.changed
        assert cancelled.record.state == "cancelled"
        await backend.wait_settled(None, 1)
    assert (await record_of(backend, holder)).state == "cancelled"
    assert clock.now() == before
    assert await kit.effects() == IDS[:PAGE]
    assert [(b.backfill_id, b.reason) for b in await ops.verify()] == [("bf.emails", "cancelled")]
    assert not (await ops.cancel("bf.emails")).changed


async def test_c4_c5_a_pass_through_the_runtime_completes_and_clears_the_gate(
    clock, job_backend_factory
):
    """C4, C5: started by id (as ``ship-sqla backfill start`` does, without the definition),
    the run executes in a worker runtime with the real definition (single-runner, one pass),
    visits every row once and completes; ``verify`` for that id held the deploy until then
    and clears it after; a start of a completed backfill adds no run."""
    inner, kit = await _kit(job_backend_factory, clock)
    backend = SpyBackend(inner)
    done = anyio.Event()
    backfill: Any = None

    async def handle(ctx: Any, rows: Any, repositories: Any) -> None:
        for row in rows:
            await repositories.visit(row.id)
        if rows[-1].id == IDS[-1]:
            done.set()

    backfill = _backfill(kit, pace=10.0, handle=handle, required_by="0042_emails")
    ops = create_backfill_operations(kit.ledger, backend, authorizer=_allow)
    assert (await ops.start("bf.emails")).outcome == "enqueued"
    gate = await ops.verify(backfill_ids=("bf.emails", "bf.other"))
    assert [(b.backfill_id, b.reason) for b in gate] == [
        ("bf.emails", "pending"),
        ("bf.other", "unknown"),
    ]
    async with await start_job_runtime([backfill.job], backend=backend, worker_id="w1"):
        with anyio.fail_after(20):
            for waits in range(1, 5):  # the pacer parks between pages: move the clock on
                await clock.until_asked(waits, at_most=backfill.interval)
                clock.advance(backfill.interval)
            await done.wait()
        await backend.wait_settled(None, 1)
    record = await kit.ledger.get("bf.emails")
    assert (record.state, record.pages, record.rows) == ("completed", 5, 23)
    assert record.required_by == "0042_emails"  # recorded when the run began
    assert await kit.effects() == IDS
    assert await ops.verify(backfill_ids=("bf.emails",)) == []
    assert (await ops.start(backfill)).outcome == "completed"


async def test_c4_a_pass_with_no_progress_for_stall_after_is_stalled(clock, job_backend_factory):
    """C4: a live backfill with no checkpoint for ``stall_after`` seconds is stalled from
    then on (``stalled_since``, the status ``stalled``); a checkpoint clears it; a finished
    one is never stalled."""
    _, kit = await _kit(job_backend_factory, clock)
    ledger = kit.ledger
    record = await ledger.begin(
        "bf.slow", run_id="r1", token=1, pace=1.0, stall_after=60.0, required_by=None
    )
    assert record.stalled_since(clock.now()) is None
    clock.advance(59)
    assert (await ledger.get("bf.slow")).status(clock.now()) == "running"
    clock.advance(2)
    record = await ledger.get("bf.slow")
    assert record.stalled_since(clock.now()) == record.updated_at + timedelta(seconds=60)
    assert record.status(clock.now()) == "stalled"
    record = await ledger.checkpoint(
        "bf.slow", run_id="r1", token=1, pages_before=0, last_key=(1,), rows=1
    )
    assert record.status(clock.now()) == "running"
    assert await ledger.finish("bf.slow", run_id="r1", token=1, state="completed")
    clock.advance(3600)
    assert (await ledger.get("bf.slow")).stalled_since(clock.now()) is None


async def test_c4_the_ledger_fences_checkpoints_on_holder_state_and_page_count(
    clock, job_backend_factory
):
    """C4: a checkpoint is a compare-and-set: refused for another holder, a page count that
    moved on, or a cancelled backfill; a cancelled one is not begun again until a start
    reopens it (pending, resuming from its last key); a failed one is begun again."""
    _, kit = await _kit(job_backend_factory, clock)
    ledger = kit.ledger
    common = {"pace": 1.0, "stall_after": 60.0, "required_by": None}
    await ledger.begin("bf.x", run_id="r1", token=1, **common)
    args = {"last_key": (5,), "rows": 5}
    assert await ledger.checkpoint("bf.x", run_id="r1", token=2, pages_before=0, **args) is None
    assert await ledger.checkpoint("bf.x", run_id="r2", token=1, pages_before=0, **args) is None
    assert await ledger.checkpoint("bf.x", run_id="r1", token=1, pages_before=0, **args)
    assert await ledger.checkpoint("bf.x", run_id="r1", token=1, pages_before=0, **args) is None
    assert (await ledger.cancel("bf.x")).state == "cancelled"
    assert await ledger.checkpoint("bf.x", run_id="r1", token=1, pages_before=1, **args) is None
    assert await ledger.begin("bf.x", run_id="r1", token=3, **common) is None
    reopened = await ledger.request("bf.x")
    assert (reopened.state, reopened.pages, reopened.last_key) == ("pending", 1, (5,))
    resumed = await ledger.begin("bf.x", run_id="r9", token=1, **common)
    assert (resumed.state, resumed.run_id, resumed.last_key) == ("running", "r9", (5,))
    assert await ledger.finish("bf.x", run_id="r9", token=1, state="failed", error="boom")
    assert (await ledger.get("bf.x")).error == "boom"
    again = await ledger.begin("bf.x", run_id="r9", token=2, **common)
    assert (again.state, again.error, again.finished_at) == ("running", None, None)
    assert [r.id for r in await ledger.list_backfills(limit=10)] == ["bf.x"]
    assert await ledger.cancel("bf.unknown") is None


async def test_c4_a_refused_checkpoint_rolls_the_page_back(clock, job_backend_factory):
    """C4: a holder whose checkpoint is refused (the backfill was cancelled meanwhile) has its
    page's transaction rolled back (JobLeaseStaleError): nothing of that page commits."""
    backend, kit = await _kit(job_backend_factory, clock)

    async def handle(ctx: Any, rows: Any, repositories: Any) -> None:
        for row in rows:
            await repositories.visit(row.id)
        if rows[0].id == 6:
            # An operator's cancel, from outside the page's transaction (a context of its own).
            cancel = kit.ledger.cancel("bf.emails")
            await asyncio.get_running_loop().create_task(cancel, context=contextvars.Context())

    backfill = _backfill(kit, handle=handle)
    ctx = JobContext.standalone(await _claimed(backend, backfill))
    with pytest.raises(JobLeaseStaleError):
        await _drive(clock, ctx, backfill, backfill.interval)
    assert await kit.effects() == IDS[:PAGE]
    record = await kit.ledger.get("bf.emails")
    assert (record.state, record.pages) == ("cancelled", 1)
