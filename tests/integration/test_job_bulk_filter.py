"""S1, J8, K2, J16, issue 36 item 5 on PostgreSQL: a bulk action by filter acts in batches of
1,000 runs, ONE statement per batch (the admin port's ``*_batch``: ``_jobs/_sql/bulk.py``), each
batch its own transaction (a unit of work per batch), progress after each, one audit entry;
an interrupted one leaves the committed batches done, the rest untouched, and says so; one
action takes at most 100,000 runs (the preview says when more match).

2,500 runs: two full batches and a partial one. J16: the backend has a history table (the
default shape), so a retried dead run moves back into the runs table, a discarded waiting run
and a cancelled one move into history, a discarded dead run stays there.

The 100,000 limit is shown at a scaled-down limit (the same code, ``MAX_BULK_RUNS`` patched to
2,000); ``SHIP_SQLA_BULK_FILTER_RUNS=100001`` runs it at the real one (opt-in: about a minute
on a 2-core machine, 100 batches)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest
from job_helpers import claim_request, default_job_backend
from sqlalchemy import event, text
from tests.integration.test_job_queue_cap import hold_then_commit

from ship_sqla import create_job_operations, create_unit_of_work, define_job
from ship_sqla._jobs._admin import PostgresRunAdmin
from ship_sqla._jobs._sql import bulk as bulk_sql
from ship_sqla._jobs._sql import live as live_sql
from ship_sqla.jobs import EnqueueRequest, RunFilter
from ship_sqla.kernel import _search, failed
from ship_sqla.kernel._backend_base import MAX_ENQUEUE_BATCH
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.operators import InMemoryAuditLog

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

    from sqlalchemy.ext.asyncio import AsyncEngine

    from ship_sqla._sql import Template

RUNS = 2500
BATCH = 1000
"""The operations' default batch (MAX_BULK_BATCH): one transaction, one statement each."""


async def _noop(payload: dict[str, Any]) -> None:
    return None


BULK = define_job("bulkfilter.mail", _noop, payload=dict)


@pytest.fixture
async def backend(ship_engine: AsyncEngine) -> Any:
    return await default_job_backend(ship_engine)


async def _enqueue(backend: Any, count: int, *, dedupe: str | None = None) -> None:
    for start in range(0, count, MAX_ENQUEUE_BATCH):
        size = min(MAX_ENQUEUE_BATCH, count - start)
        requests = [EnqueueRequest({"n": start + n}, dedupe_key=dedupe) for n in range(size)]
        await backend.enqueue_many(BULK, requests)


async def _dead(backend: Any, count: int) -> None:
    """``count`` dead runs of BULK (each failed on its only attempt: in history, J16)."""
    await _enqueue(backend, count)
    left = count
    while left:
        claimed = await backend.claim(claim_request(BULK, worker="w", limit=min(left, BATCH)))
        outcomes = await backend.settle([failed(r, "boom", retry_at=None) for r in claimed])
        assert set(outcomes) == {"dead"}
        left -= len(claimed)


class _Batches:
    """Each batch in one unit of work (the admin port's statements join it, U1), counted."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.transactions = 0
        self._uow = create_unit_of_work(engine, repositories=lambda scope: scope)

    async def __call__(self, work: Callable[[], Awaitable[None]]) -> None:
        self.transactions += 1

        async def handler(_scope: object) -> None:
            await work()

        await self._uow.run(handler)


class _Executed:
    """How many times each of ``templates`` ran on ``engine`` (its rendered text)."""

    def __init__(self, engine: AsyncEngine, backend: Any, *templates: Template) -> None:
        self._texts = {
            str(backend.statements[t].compile(dialect=engine.dialect)): t for t in templates
        }
        self.counts: dict[Template, int] = dict.fromkeys(templates, 0)

    def __call__(self, *args: Any) -> None:
        template = self._texts.get(args[2])
        if template is not None:
            self.counts[template] += 1


def _counting(engine: AsyncEngine, executed: _Executed) -> Iterator[None]:
    event.listen(engine.sync_engine, "before_cursor_execute", executed)
    try:
        yield
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", executed)


async def _states(engine: AsyncEngine) -> dict[tuple[str, str], int]:
    """(table, state) -> runs of BULK: where each run is (J16: exactly one table)."""
    async with engine.connect() as connection:
        rows = await connection.execute(
            text(
                "SELECT 'runs', state, count(*) FROM ship_job_runs WHERE job_id = :j GROUP BY 2"
                " UNION ALL SELECT 'history', state, count(*) FROM ship_job_history"
                " WHERE job_id = :j GROUP BY 2"
            ),
            {"j": BULK.id},
        )
        return {(table, state): runs for table, state, runs in rows.all()}


async def _act(
    engine: AsyncEngine,
    backend: Any,
    action: str,
    state: str,
    batch: Template,
    *single: Template,
) -> tuple[Any, InMemoryAuditLog, _Batches, _Executed, list[Any]]:
    audit = InMemoryAuditLog()
    ops = create_job_operations(backend, authorizer=lambda *_: True, audit=audit, actor="ann")
    flt = RunFilter.parse([f"job={BULK.id}", f"state={state}"])
    preview = await ops.preview_matching(action, flt)  # type: ignore[arg-type]
    assert (preview.count, preview.capped) == (RUNS, False)
    batches = _Batches(engine)
    executed = _Executed(engine, backend, batch, *single)
    steps: list[Any] = []
    counting = _counting(engine, executed)
    next(counting)
    try:
        result = await getattr(ops, f"{action}_filtered")(
            flt, token=preview.token, transaction=batches, progress=steps.append
        )
    finally:
        next(counting, None)
    assert len(result.changed) == RUNS
    assert result.complete
    return result, audit, batches, executed, steps


def _three_batches(batches: _Batches, executed: _Executed, steps: list[Any]) -> None:
    """2,500 runs: 3 transactions, 3 batch statements, no single-run statement, progress
    after each batch."""
    counts = list(executed.counts.values())
    assert batches.transactions == 3
    assert counts[0] == 3  # ONE statement per batch
    assert counts[1:] == [0] * (len(counts) - 1)  # no run acted on one by one
    assert [(s.done, s.batches) for s in steps] == [(1000, 1), (2000, 2), (2500, 3)]


async def _entry(audit: InMemoryAuditLog, operation: str) -> Any:
    [entry] = await audit.list_entries(limit=5)
    assert entry.operation == operation
    assert entry.count == RUNS
    assert entry.details["batches"] == 3
    assert entry.details["filter"][0] == ["job", BULK.id]
    assert entry.details["links"]["search"].startswith("/search?job=")
    assert entry.details["complete"] is True
    return entry


async def test_s1_j16_retry_of_2500_dead_runs_takes_3_statements_in_3_transactions(
    ship_engine: AsyncEngine, backend: Any
) -> None:
    """S1, J8, J16, issue 36 item 5: 2,500 dead runs (in history) retried in 3 batches, ONE
    statement each (RETRY_DEAD_BATCH_BACK), each its own transaction: all move back into the
    runs table, waiting, each with exactly one more attempt; one audit entry."""
    await _dead(backend, RUNS)
    assert await _states(ship_engine) == {("history", "dead"): RUNS}
    _, audit, batches, executed, steps = await _act(
        ship_engine,
        backend,
        "retry",
        "dead",
        bulk_sql.RETRY_DEAD_BATCH_BACK,
        live_sql.RETRY_DEAD_BACK,
    )
    _three_batches(batches, executed, steps)
    assert await _states(ship_engine) == {("runs", "waiting"): RUNS}
    async with ship_engine.connect() as connection:
        row = (
            await connection.execute(
                text(
                    "SELECT min(max_attempts - attempt), max(max_attempts - attempt)"
                    " FROM ship_job_runs"
                )
            )
        ).one()
    assert tuple(row) == (1, 1)
    await _entry(audit, "jobs.retry_filtered")


async def test_s1_j16_discard_of_2500_dead_runs_takes_3_statements(
    ship_engine: AsyncEngine, backend: Any
) -> None:
    """S1, J8, J16: 2,500 dead runs discarded in 3 batch statements (DISCARD_BATCH_MOVING):
    they stay in history, discarded."""
    await _dead(backend, RUNS)
    _, audit, batches, executed, steps = await _act(
        ship_engine,
        backend,
        "discard",
        "dead",
        bulk_sql.DISCARD_BATCH_MOVING,
        live_sql.DISCARD_DEAD_IN_HISTORY,
    )
    _three_batches(batches, executed, steps)
    assert await _states(ship_engine) == {("history", "discarded"): RUNS}
    await _entry(audit, "jobs.discard_filtered")


async def test_s1_k2_j16_cancel_of_2500_waiting_runs_takes_3_statements(
    ship_engine: AsyncEngine, backend: Any
) -> None:
    """S1, K2, J16: 2,500 waiting runs cancelled in 3 batch statements (CANCEL_BATCH_MOVING):
    each moved into history, cancelled, in the statement that cancels it."""
    await _enqueue(backend, RUNS)
    _, audit, batches, executed, steps = await _act(
        ship_engine,
        backend,
        "cancel",
        "waiting",
        bulk_sql.CANCEL_BATCH_MOVING,
        live_sql.CANCEL_MOVING,
    )
    _three_batches(batches, executed, steps)
    assert await _states(ship_engine) == {("history", "cancelled"): RUNS}
    await _entry(audit, "jobs.cancel_filtered")


async def test_s1_an_action_that_fails_midway_keeps_what_committed_and_says_so(
    ship_engine: AsyncEngine, backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S1, issue 36 item 5: the second batch fails after its statement ran: that batch rolls
    back whole, the first stays committed, the rest is untouched; the error reaches the caller
    and the audit entry records the count done (1,000), the batches (1) and the error."""
    await _enqueue(backend, RUNS)
    audit = InMemoryAuditLog()
    ops = create_job_operations(backend, authorizer=lambda *_: True, audit=audit, actor="ann")
    flt = RunFilter.parse([f"job={BULK.id}"])
    preview = await ops.preview_matching("cancel", flt)
    original = PostgresRunAdmin.cancel_batch
    calls = 0

    async def failing(self: PostgresRunAdmin, run_ids: list[str]) -> list[str]:
        nonlocal calls
        calls += 1
        changed = await original(self, run_ids)
        if calls == 2:
            raise RuntimeError("the operator's laptop went to sleep")
        return changed

    monkeypatch.setattr(PostgresRunAdmin, "cancel_batch", failing)
    with pytest.raises(RuntimeError, match="laptop"):
        await ops.cancel_filtered(flt, token=preview.token, transaction=_Batches(ship_engine))
    assert await _states(ship_engine) == {
        ("history", "cancelled"): BATCH,
        ("runs", "waiting"): RUNS - BATCH,
    }
    [entry] = await audit.list_entries(limit=5)
    assert entry.count == BATCH
    assert entry.details["batches"] == 1
    assert entry.details["complete"] is False
    assert "laptop" in entry.details["error"]


async def test_j1_a_retried_batch_revives_one_run_per_dedupe_key(
    ship_engine: AsyncEngine, backend: Any
) -> None:
    """J1, J8: three dead runs of one dedupe key in one batch: the batch statement revives the
    first only (a single-run retry of each would too); once it waits, a second action revives
    none (a live run holds the key)."""
    for _ in range(3):
        await _enqueue(backend, 1, dedupe="same")
        [run] = await backend.claim(claim_request(BULK, worker="w"))
        assert await backend.settle([failed(run, "boom", retry_at=None)]) == ["dead"]
    ops = create_job_operations(backend, authorizer=lambda *_: True, actor="ann")
    flt = RunFilter.parse([f"job={BULK.id}", "state=dead"])
    preview = await ops.preview_matching("retry", flt)
    result = await ops.retry_filtered(flt, token=preview.token)
    assert (len(result.changed), len(result.unchanged)) == (1, 2)
    assert await _states(ship_engine) == {("runs", "waiting"): 1, ("history", "dead"): 2}
    preview = await ops.preview_matching("retry", flt)
    result = await ops.retry_filtered(flt, token=preview.token)
    assert (len(result.changed), len(result.unchanged)) == (0, 2)


async def test_j1_an_enqueue_that_wins_the_dedupe_race_sends_the_batch_one_by_one(
    ship_engine: AsyncEngine, backend: Any
) -> None:
    """J1, J8: a unit of work enqueues a run with a dead run's dedupe key and holds its
    transaction while a batch retry (in a unit of work of its own) runs: the batch statement
    waits on the unique index, and when the enqueue commits it trips it (23505). Its savepoint
    rolls back, the batch goes run by run: the other dead run is retried, the one whose key is
    live again is left dead (unchanged), and nothing is half done."""
    for key in ("k", None):
        await _enqueue(backend, 1, dedupe=key)
        [run] = await backend.claim(claim_request(BULK, worker="w"))
        assert await backend.settle([failed(run, "boom", retry_at=None)]) == ["dead"]
    ops = create_job_operations(backend, authorizer=lambda *_: True, actor="ann")
    flt = RunFilter.parse([f"job={BULK.id}", "state=dead"])
    preview = await ops.preview_matching("retry", flt)
    assert preview.count == 2

    async def enqueue_the_key(scope: Any) -> Any:
        return await backend.enqueue(BULK, {"n": "again"}, dedupe_key="k", scope=scope)

    async def retry() -> Any:
        return await ops.retry_filtered(flt, token=preview.token, transaction=_Batches(ship_engine))

    uow = create_unit_of_work(ship_engine, repositories=lambda scope: scope)
    batch, single = bulk_sql.RETRY_DEAD_BATCH_BACK, live_sql.RETRY_DEAD_BACK
    executed = _Executed(ship_engine, backend, batch, single)
    counting = _counting(ship_engine, executed)
    next(counting)
    try:
        enqueued, result = await hold_then_commit(ship_engine, uow, enqueue_the_key, retry)
    finally:
        next(counting, None)
    assert enqueued.run_id is not None
    assert executed.counts == {batch: 1, single: 2}  # the batch, then each run alone
    assert (len(result.changed), len(result.unchanged)) == (1, 1)
    assert await _states(ship_engine) == {("runs", "waiting"): 2, ("history", "dead"): 1}


async def test_j1_a_single_retry_that_loses_the_dedupe_race_leaves_the_callers_unit_of_work_usable(
    ship_engine: AsyncEngine, backend: Any
) -> None:
    """J1, J8, U1: a unit of work enqueues a run with a dead run's dedupe key and holds its
    transaction while another unit of work retries that dead run: the retry waits on the unique
    index, and when the enqueue commits it trips it (23505). The retry answers None (the run
    stays dead) and only its own statement rolls back (a savepoint): the same unit of work
    enqueues another run and commits it."""
    await _enqueue(backend, 1, dedupe="k")
    [run] = await backend.claim(claim_request(BULK, worker="w"))
    assert await backend.settle([failed(run, "boom", retry_at=None)]) == ["dead"]

    async def enqueue_the_key(scope: Any) -> Any:
        return await backend.enqueue(BULK, {"n": "again"}, dedupe_key="k", scope=scope)

    async def retry_then_enqueue() -> Any:
        async def work(scope: Any) -> Any:
            retried = await backend.admin.retry_dead(run.run_id)
            after = await backend.enqueue(BULK, {"n": "after"}, scope=scope)
            return retried, after

        return await create_unit_of_work(ship_engine, repositories=lambda scope: scope).run(work)

    uow = create_unit_of_work(ship_engine, repositories=lambda scope: scope)
    enqueued, (retried, after) = await hold_then_commit(
        ship_engine, uow, enqueue_the_key, retry_then_enqueue
    )
    assert enqueued.run_id is not None
    assert retried is None
    assert after.run_id is not None
    assert await _states(ship_engine) == {("runs", "waiting"): 2, ("history", "dead"): 1}


async def test_k2_a_batch_cancel_requests_running_runs_and_tells_their_holder(
    ship_engine: AsyncEngine, backend: Any
) -> None:
    """K2: running runs in a batch get their request recorded (not ended: the holder ends
    them) and their holder told in the batch's transaction; waiting ones end at once."""
    await _enqueue(backend, 5)
    claimed = await backend.claim(claim_request(BULK, worker="w", limit=2))
    told: list[str] = []
    backend.watch_cancel_requests(told.append)
    ops = create_job_operations(backend, authorizer=lambda *_: True, actor="ann")
    flt = RunFilter.parse([f"job={BULK.id}"])
    preview = await ops.preview_matching("cancel", flt)
    result = await ops.cancel_filtered(flt, token=preview.token, transaction=_Batches(ship_engine))
    assert len(result.changed) == 5
    assert await _states(ship_engine) == {("runs", "running"): 2, ("history", "cancelled"): 3}
    for run in claimed:
        record = await backend.admin.get_run(run.run_id)
        assert record.cancel_requested_at is not None
    assert sorted(told) == sorted(run.run_id for run in claimed)  # after the commit


async def test_k2_j13_a_row_someone_holds_is_cancelled_the_single_run_way(
    ship_engine: AsyncEngine, backend: Any
) -> None:
    """K2, J13: the batch statement never waits for a row another transaction holds (it locks
    ``FOR UPDATE SKIP LOCKED``); it answers the row as skipped and the backend cancels it with
    the single-run path (told first, then requested), so the action still takes every run.
    Here a running run's row is held ``FOR KEY SHARE`` (which the single-run request does not
    wait for) while the action runs."""
    await _enqueue(backend, 3)
    [held] = await backend.claim(claim_request(BULK, worker="w"))
    ops = create_job_operations(backend, authorizer=lambda *_: True, actor="ann")
    flt = RunFilter.parse([f"job={BULK.id}"])
    preview = await ops.preview_matching("cancel", flt)
    executed = _Executed(ship_engine, backend, bulk_sql.CANCEL_BATCH_MOVING, live_sql.CANCEL_MOVING)
    counting = _counting(ship_engine, executed)
    async with ship_engine.connect() as holder, holder.begin():
        lock = "SELECT 1 FROM ship_job_runs WHERE id = :id FOR KEY SHARE"
        await holder.execute(text(lock), {"id": held.run_id})
        next(counting)
        try:
            result = await ops.cancel_filtered(
                flt, token=preview.token, transaction=_Batches(ship_engine)
            )
        finally:
            next(counting, None)
    assert len(result.changed) == 3
    assert list(executed.counts.values()) == [1, 1]  # the batch, then the held run alone
    record = await backend.admin.get_run(held.run_id)
    assert record.state == "running"
    assert record.cancel_requested_at is not None
    assert await _states(ship_engine) == {("runs", "running"): 1, ("history", "cancelled"): 2}


LIMIT_RUNS = int(os.environ.get("SHIP_SQLA_BULK_FILTER_RUNS", "0"))
"""Opt-in: the real limit's test (100,001 runs)."""


async def test_s1_one_action_takes_at_most_its_limit_of_runs(
    ship_engine: AsyncEngine, backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36 item 5 (the limit scaled down to 2,000: the same code): 2,500 runs match; the
    preview says at most 2,000 are taken (``capped``), the action cancels exactly 2,000 in 2
    batches and leaves the rest; a confirmation for more than the limit is refused before any
    statement, with a clear error."""
    monkeypatch.setattr(_search, "MAX_BULK_RUNS", 2000)
    await _enqueue(backend, RUNS)
    ops = create_job_operations(backend, authorizer=lambda *_: True, actor="ann")
    flt = RunFilter.parse([f"job={BULK.id}"])
    preview = await ops.preview_matching("cancel", flt)
    assert (preview.count, preview.capped) == (2000, True)
    result = await ops.cancel_filtered(flt, token=preview.token)
    assert len(result.changed) == 2000
    assert await _states(ship_engine) == {("history", "cancelled"): 2000, ("runs", "waiting"): 500}
    monkeypatch.setattr(_search, "MAX_BULK_RUNS", 3000)
    await _enqueue(backend, RUNS)
    preview = await ops.preview_matching("cancel", flt)  # 3,000 runs now match
    monkeypatch.setattr(_search, "MAX_BULK_RUNS", 2000)
    with pytest.raises(ConfigurationError, match="at most 2,000 runs"):
        await ops.cancel_filtered(flt, token=preview.token)
    assert await _states(ship_engine) == {("history", "cancelled"): 2000, ("runs", "waiting"): 3000}


@pytest.mark.skipif(LIMIT_RUNS <= 100_000, reason="opt-in: SHIP_SQLA_BULK_FILTER_RUNS=100001")
async def test_s1_one_action_takes_at_most_100000_runs(
    ship_engine: AsyncEngine, backend: Any
) -> None:
    """Issue 36 item 5: 100,001 waiting runs match; the preview says at most 100,000 are taken
    (``capped``), and the action cancels exactly 100,000 (100 batches), leaving one."""
    limit = _search.MAX_BULK_RUNS
    await _enqueue(backend, LIMIT_RUNS)
    ops = create_job_operations(backend, authorizer=lambda *_: True, actor="ann")
    flt = RunFilter.parse([f"job={BULK.id}"])
    preview = await ops.preview_matching("cancel", flt)
    assert (preview.count, preview.capped) == (limit, True)
    steps: list[Any] = []
    result = await ops.cancel_filtered(flt, token=preview.token, progress=steps.append)
    assert len(result.changed) == limit
    assert steps[-1].batches == limit // BATCH
    assert await _states(ship_engine) == {
        ("history", "cancelled"): limit,
        ("runs", "waiting"): LIMIT_RUNS - limit,
    }
