"""D11, on every backend: ``JobOperations.export_history`` / ``export_histories`` write the same
history from the in-memory model and PostgreSQL (the run, its stored payload, its steps in
position order with their encoded results, the waits' outcomes); the export is a permissioned
read, keyset-paged and bounded; the redactor sees every payload and result; and the exported
histories replay clean on the code that ran them (the round trip of issue #38's check 6).
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from workflow_helpers import FakeUnitOfWork, execute_once

from ship_sqla import create_job_operations, define_job
from ship_sqla.errors import PermissionDeniedError, TerminalError
from ship_sqla.jobs import Concurrency, RetryPolicy
from ship_sqla.kernel._history import decode_history, encode_history
from ship_sqla.testing import Replayer, read_histories, write_history

UOW = FakeUnitOfWork()


@attrs.frozen
class Quote:
    cents: int


async def _value(value: Any) -> Any:
    return value


async def saga(ctx: Any, payload: Any) -> None:
    quote = await ctx.step("quote", lambda: _value(Quote(payload["cents"])), result=Quote)
    await ctx.transaction("charge", UOW, lambda _repositories: _value(f"charged {quote.cents}"))
    if payload["cents"] > 1000:
        await ctx.wait_for_event("approved", "order.approved", key=payload["id"], timeout=600)
    await ctx.sleep("cool-off", 3600)
    await ctx.step("notify", lambda: _value({"mail": payload["email"]}))


JOB = define_job(
    "wf.history",
    saga,
    payload=dict,
    concurrency=Concurrency(lease=30.0),
    retry=RetryPolicy(attempts=3),
)


def allow_all(permission: str, operation: str) -> bool:
    return True


async def _runs(backend: Any, clock: Any, count: int) -> list[str]:
    """``count`` runs, each executed once (to its wait or its sleep)."""
    ids = []
    for i in range(count):
        cents = 500 if i % 2 else 1500
        payload = {"id": f"o{i}", "cents": cents, "email": f"u{i}@example.com"}
        result = await backend.enqueue(JOB, payload, run_id=f"run-{i:02d}")
        assert result.run_id is not None
        ids.append(result.run_id)
    for _ in ids:
        assert (await execute_once(backend, JOB, clock)).outcome == "suspended"
    return ids


async def test_d11_export_writes_the_run_and_its_steps_in_position_order(
    clock, job_backend_factory
) -> None:
    """D11: one run's history holds its job, state, stored payload, and its steps in position
    order with their encoded results (the transactional one and a waiting event wait)."""
    backend = job_backend_factory(clock)
    [run_id] = await _runs(backend, clock, 1)
    ops = create_job_operations(backend, authorizer=allow_all)
    history = await ops.export_history(run_id)
    assert history is not None
    assert (history.run_id, history.job_id, history.state) == (run_id, "wf.history", "waiting")
    assert history.payload == {"id": "o0", "cents": 1500, "email": "u0@example.com"}
    assert [(s.position, s.name, s.kind, s.status, s.result) for s in history.steps] == [
        (0, "quote", "step", "done", {"cents": 1500}),
        (1, "charge", "transaction", "done", "charged 1500"),
        (2, "approved", "event", "waiting", None),
    ]
    assert (history.steps[2].event_name, history.steps[2].event_key) == ("order.approved", "o0")
    assert history.frontier == 3
    assert history.events == [
        {
            "position": 2,
            "step": "approved",
            "event_name": "order.approved",
            "event_key": "o0",
            "event_id": None,
            "timed_out": False,
        }
    ]
    assert await ops.export_history("no-such-run") is None
    assert decode_history(encode_history(history)) == history


async def test_d11_exported_histories_replay_clean_and_the_redactor_sees_every_value(
    clock, job_backend_factory
) -> None:
    """D11: histories exported page by page (keyset, bounded by ``limit``) replay clean on the
    code that ran them; the redactor rewrote every payload and result."""
    backend = job_backend_factory(clock)
    ids = await _runs(backend, clock, 5)
    # Runs with a stored event wait and sleep step: the next execution stores the suspension.
    for _ in ids:
        await execute_once(backend, JOB, clock)
    ops = create_job_operations(backend, authorizer=allow_all)
    seen: list[str] = []

    def redact(where: str, value: Any) -> Any:
        seen.append(where)
        if where == "payload":
            return {**value, "email": "redacted@example.com"}
        return value

    exported = []
    cursor = None
    while True:
        page = await ops.export_histories(
            state="waiting", job_id=JOB.id, limit=2, cursor=cursor, redact=redact
        )
        assert len(page.items) <= 2
        exported.extend(page.items)
        cursor = page.next_cursor
        if cursor is None:
            break
    assert sorted(h.run_id for h in exported) == ids
    assert all(h.payload["email"] == "redacted@example.com" and h.redacted for h in exported)
    assert seen.count("payload") == 5
    assert "result:quote" in seen
    assert "result:charge" in seen
    replayer = Replayer([JOB])
    for history in exported:
        result = await replayer.replay(history)
        assert result.clean, result.describe()
        assert result.replayed == result.frontier >= 2


async def test_d11_export_is_a_permissioned_read(clock, job_backend_factory) -> None:
    """D11, S1: export asks ``ship.jobs:read`` (or manage) for itself: refused, nothing read."""
    backend = job_backend_factory(clock)
    [run_id] = await _runs(backend, clock, 1)
    asked: list[tuple[str, str]] = []

    def refuse(permission: str, operation: str) -> bool:
        asked.append((permission, operation))
        return False

    ops = create_job_operations(backend, authorizer=refuse)
    with pytest.raises(PermissionDeniedError, match="export_history"):
        await ops.export_history(run_id)
    with pytest.raises(PermissionDeniedError, match="export_histories"):
        await ops.export_histories(state="waiting")
    assert ("ship.jobs:read", "export_history") in asked
    read_only = create_job_operations(
        backend, authorizer=lambda permission, _operation: permission == "ship.jobs:read"
    )
    assert await read_only.export_history(run_id) is not None


async def mixed(ctx: Any, payload: Any) -> None:
    await ctx.step("first", lambda: _value(payload["n"]))
    if payload["n"] % 4 == 1:
        raise TerminalError("dead after its first step")
    if payload["n"] % 4 == 2:
        await ctx.sleep("later", 3600)
    if payload["n"] % 4 == 3:
        await ctx.wait_for_event("go", "mixed.go", key=str(payload["n"]))
    await ctx.transaction("last", UOW, lambda _repositories: _value(payload["n"] * 10))


MIXED = define_job("wf.mixed", mixed, payload=dict, retry=RetryPolicy(attempts=1))


async def test_d11_runs_in_mixed_states_export_to_files_and_replay_clean(
    clock, job_backend_factory, tmp_path
) -> None:
    """D11 (issue #38 check 6, scaled down): runs in mixed states (completed, dead, waiting at
    a sleep, waiting at an event) export state by state to one file each; read back, every file
    replays clean on the code that ran them."""
    backend = job_backend_factory(clock)
    count = 12
    for n in range(count):
        await backend.enqueue(MIXED, {"n": n}, run_id=f"m-{n:02d}")
    for _ in range(count):
        await execute_once(backend, MIXED, clock)
    ops = create_job_operations(backend, authorizer=allow_all)
    written = 0
    for state in ("waiting", "completed", "dead"):
        page = await ops.export_histories(state=state, job_id=MIXED.id, limit=100)
        assert page.next_cursor is None
        for history in page.items:
            write_history(tmp_path, history)
        written += len(page.items)
    assert written == count
    files = read_histories(tmp_path)
    assert len(files) == count
    states = sorted({h.state for _, h in files if h.state is not None})
    assert states == ["completed", "dead", "waiting"]
    replayer = Replayer([MIXED])
    for path, history in files:
        result = await replayer.replay(history, origin=str(path))
        assert result.clean, result.describe()
