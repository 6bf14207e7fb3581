"""S1, issue 36 item 5 on PostgreSQL: a bulk action by filter runs in transactions of 1,000
(a unit of work per batch), reports progress after each, writes one audit entry, and an
interrupted one leaves no half-done batch: every batch committed whole or not at all.

The default size is 1,001 runs (CI: a full batch and a partial one, the fewest that show two
transactions; 2,000 took twice as long for no other path); ``SHIP_SQLA_BULK_FILTER_RUNS=100000``
runs the issue's 100,000-run figure (opt-in: minutes on a 2-core machine)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest
from job_helpers import default_job_backend

from ship_sqla import create_job_operations, create_unit_of_work, define_job
from ship_sqla._jobs._admin import PostgresRunAdmin
from ship_sqla.jobs import EnqueueRequest, RunFilter
from ship_sqla.kernel._backend_base import MAX_ENQUEUE_BATCH
from ship_sqla.operators import InMemoryAuditLog

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sqlalchemy.ext.asyncio import AsyncEngine

RUNS = int(os.environ.get("SHIP_SQLA_BULK_FILTER_RUNS", "1001"))
BATCH = 1000
"""The operations' default batch (MAX_BULK_BATCH): one transaction each."""


async def _noop(payload: dict[str, Any]) -> None:
    return None


BULK = define_job("bulkfilter.mail", _noop, payload=dict)


@pytest.fixture
async def backend(ship_engine: AsyncEngine) -> Any:
    return await default_job_backend(ship_engine)


async def _enqueue(backend: Any, count: int) -> None:
    for start in range(0, count, MAX_ENQUEUE_BATCH):
        size = min(MAX_ENQUEUE_BATCH, count - start)
        requests = [EnqueueRequest({"n": start + n}) for n in range(size)]
        await backend.enqueue_many(BULK, requests)


def _batches(engine: AsyncEngine) -> Callable[[Callable[[], Awaitable[None]]], Awaitable[None]]:
    """Each batch in one unit of work: the admin port's statements join it (U1)."""
    uow = create_unit_of_work(engine, repositories=lambda scope: scope)

    async def transaction(work: Callable[[], Awaitable[None]]) -> None:
        async def handler(_scope: object) -> None:
            await work()

        await uow.run(handler)

    return transaction


async def _count(backend: Any, state: str) -> int:
    counts = await backend.admin.state_counts(limit=100)
    return sum(c.runs for c in counts if c.state == state and c.job_id == BULK.id)


async def test_s1_a_bulk_cancel_by_filter_runs_in_transactions_of_1000(
    ship_engine: AsyncEngine, backend: Any
) -> None:
    """S1, K2, issue 36 item 5: the preview counts every matching run; the action, with its
    token, cancels them all in batches of 1,000 (progress after each) and writes ONE audit
    entry with the filter and the count."""
    await _enqueue(backend, RUNS)
    audit = InMemoryAuditLog()
    ops = create_job_operations(backend, authorizer=lambda *_: True, audit=audit, actor="ann")
    flt = RunFilter.parse([f"job={BULK.id}", "state=waiting"])
    preview = await ops.preview_matching("cancel", flt)
    assert preview.count == RUNS
    steps: list[Any] = []
    result = await ops.cancel_filtered(
        flt, token=preview.token, transaction=_batches(ship_engine), progress=steps.append
    )
    assert len(result.changed) == RUNS
    assert result.complete
    # Progress after each batch: every full one, then the partial last one.
    assert [s.done for s in steps] == [min(n, RUNS) for n in range(BATCH, RUNS + BATCH, BATCH)]
    assert await _count(backend, "cancelled") == RUNS
    [entry] = await audit.list_entries(limit=5)
    assert entry.operation == "jobs.cancel_filtered"
    assert entry.count == RUNS
    assert entry.details["batches"] == -(-RUNS // BATCH)


async def test_s1_an_interrupted_bulk_action_leaves_no_half_batch(
    ship_engine: AsyncEngine, backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S1, issue 36 item 5: a failure in the middle of the second batch rolls that batch back
    whole; the first batch stays committed; the audit entry says what committed and why it
    stopped."""
    # Two batches, the second cut short in its middle (its 100th of 200 runs).
    await _enqueue(backend, BATCH + 200)
    audit = InMemoryAuditLog()
    ops = create_job_operations(backend, authorizer=lambda *_: True, audit=audit, actor="ann")
    flt = RunFilter.parse([f"job={BULK.id}"])
    preview = await ops.preview_matching("cancel", flt)
    original = PostgresRunAdmin.cancel
    calls = 0

    async def failing(self: PostgresRunAdmin, run_id: str) -> Any:
        nonlocal calls
        calls += 1
        if calls == BATCH + 100:
            raise RuntimeError("the operator's laptop went to sleep")
        return await original(self, run_id)

    monkeypatch.setattr(PostgresRunAdmin, "cancel", failing)
    with pytest.raises(RuntimeError, match="laptop"):
        await ops.cancel_filtered(flt, token=preview.token, transaction=_batches(ship_engine))
    assert await _count(backend, "cancelled") == BATCH
    assert await _count(backend, "waiting") == 200
    [entry] = await audit.list_entries(limit=5)
    assert entry.count == BATCH
    assert entry.details["batches"] == 1
    assert "laptop" in entry.details["error"]
