"""InMemoryJobBackend specifics: inspection, its admin port (the operator model), payload storage,
waking.

The JobBackend contract itself (J1-J7) is tested for every backend in tests/conformance.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import anyio
import pytest
from job_helpers import claim_request

from ship_sqla import create_job_operations, define_job
from ship_sqla.errors import (
    BoundExceededError,
    ConfigurationError,
    InvalidKeyError,
    InvalidPayloadError,
)
from ship_sqla.jobs import EnqueueRequest, Retention, RetryPolicy
from ship_sqla.kernel import InMemoryJobBackend, completed, failed
from ship_sqla.operators import InMemoryAuditLog
from ship_sqla.testing import FrozenClock


async def _noop(ctx, payload):
    return None


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
def backend(clock) -> InMemoryJobBackend:
    return InMemoryJobBackend(clock=clock)


JOB = define_job(
    "mem.job",
    _noop,
    payload=dict,
    retry=RetryPolicy(attempts=1),
    retention=Retention(completed=timedelta(hours=1), dead=timedelta(days=1)),
)


def test_options_are_validated(clock):
    with pytest.raises(ConfigurationError, match="queue_depth_limit"):
        InMemoryJobBackend(clock=clock, queue_depth_limit=0)


async def test_inspection(backend, clock):
    first = await backend.enqueue(JOB, {"n": 1})
    other = define_job("mem.other", _noop, payload=dict)
    await backend.enqueue(other, {"n": 2})
    assert await backend.admin.get_run("missing") is None
    record = await backend.admin.get_run(first.run_id)
    assert record.state == "waiting"
    assert record.payload == {"n": 1}
    assert record.created_at == clock.now()
    assert record.run_at == clock.now()
    assert [r.job_id for r in backend.runs()] == ["mem.job", "mem.other"]
    assert [r.run_id for r in backend.runs("mem.job")] == [first.run_id]
    assert backend.waiting_count("mem.job") == 1


async def test_payloads_are_stored_as_json_copies(backend):
    """The stored payload is the codec's JSON text: later mutation by the caller or a handler
    never changes it, and non-JSON values are refused before anything is written."""
    payload = {"items": [1, 2]}
    result = await backend.enqueue(JOB, payload)
    payload["items"].append(3)
    [claimed] = await backend.claim(claim_request(JOB, worker="A", limit=1))
    claimed.payload["items"].append(4)
    assert (await backend.admin.get_run(result.run_id)).payload == {"items": [1, 2]}
    with pytest.raises(InvalidPayloadError, match="not JSON"):
        await backend.enqueue(JOB, {"when": datetime.now()})  # noqa: DTZ005 - not JSON is the point
    with pytest.raises(InvalidPayloadError, match="not JSON"):
        await backend.enqueue(JOB, {"x": float("nan")})
    assert len(backend.runs()) == 1


async def test_enqueue_many_writes_nothing_when_one_payload_is_invalid(backend):
    with pytest.raises(InvalidPayloadError):
        await backend.enqueue_many(JOB, [EnqueueRequest({"ok": 1}), EnqueueRequest(["bad"])])
    assert backend.runs() == []


async def test_naive_times_are_refused(backend):
    with pytest.raises(ConfigurationError, match="timezone-aware"):
        await backend.enqueue(JOB, {}, run_at=datetime(2030, 1, 1))  # noqa: DTZ001 - the point


async def test_scope_is_accepted_and_ignored(backend):
    result = await backend.enqueue(JOB, {}, scope=object())
    assert result.accepted


async def test_wake_reaches_every_waiting_loop(backend):
    """J3: one enqueue wakes every loop waiting on this backend."""
    woke = 0
    both = anyio.Event()

    async def waiter():
        nonlocal woke
        await backend.wait_for_work(3600)
        woke += 1
        if woke == 2:
            both.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        tg.start_soon(waiter)
        await anyio.lowlevel.checkpoint()
        await backend.enqueue(JOB, {})
        with anyio.fail_after(5):
            await both.wait()


async def test_delayed_enqueue_does_not_wake(backend, clock):
    """J3: waking is for due work; a run due later is found by the poll."""
    await backend.enqueue(JOB, {}, run_at=clock.now() + timedelta(hours=1))
    returned = anyio.Event()

    async def waiter():
        await backend.wait_for_work(5)
        returned.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        for _ in range(20):
            await anyio.lowlevel.checkpoint()
        assert not returned.is_set()
        clock.advance(5)
        with anyio.fail_after(5):
            await returned.wait()


async def test_report_error_never_raises(clock, caplog):
    def broken(error):
        message = "handler bug"
        raise RuntimeError(message)

    backend = InMemoryJobBackend(clock=clock, on_error=broken)
    with caplog.at_level(logging.ERROR, logger="ship_sqla.jobs"):
        backend.report_error(ValueError("absorbed"))
    assert "on_error raised" in caplog.text
    quiet = InMemoryJobBackend(clock=clock)
    with caplog.at_level(logging.ERROR, logger="ship_sqla.jobs"):
        quiet.report_error(ValueError("logged instead"))
    assert "logged instead" in caplog.text


async def test_operator_retry_gives_a_dead_run_one_more_attempt(backend):
    """J8 model: retry turns a dead run into a waiting one with one more attempt."""
    result = await backend.enqueue(JOB, {}, dedupe_key="d")
    [claimed] = await backend.claim(claim_request(JOB, worker="A", limit=1))
    assert await backend.settle([failed(claimed, "boom", retry_at=None)]) == ["dead"]
    assert await backend.admin.retry_dead("missing") is None
    assert await backend.admin.retry_dead(result.run_id) is not None
    record = await backend.admin.get_run(result.run_id)
    assert record.state == "waiting"
    assert record.max_attempts == 2
    assert record.finished_at is None
    assert await backend.admin.retry_dead(result.run_id) is None
    assert (await backend.enqueue(JOB, {}, dedupe_key="d")).deduplicated
    [again] = await backend.claim(claim_request(JOB, worker="A", limit=1))
    assert again.attempt == 2
    assert await backend.settle([failed(again, "boom", retry_at=None)]) == ["dead"]
    assert len((await backend.admin.get_run(result.run_id)).history) == 2


async def test_operator_retry_refuses_to_break_dedupe(backend):
    """J1 holds across operator retry: a dead run whose dedupe key a live run now holds stays
    dead."""
    first = await backend.enqueue(JOB, {}, dedupe_key="d")
    [claimed] = await backend.claim(claim_request(JOB, worker="A", limit=1))
    await backend.settle([failed(claimed, "boom", retry_at=None)])
    await backend.enqueue(JOB, {}, dedupe_key="d")
    assert await backend.admin.retry_dead(first.run_id) is None
    assert (await backend.admin.get_run(first.run_id)).state == "dead"


async def test_s2_an_unstorable_run_id_is_refused_before_any_run_changes_issue_32(backend):
    """S2, issue 32: a run id no run can have (a NUL, a lone surrogate, over 255 characters)
    is refused by every operation taking run ids with the typed ``InvalidKeyError`` before any
    statement; in a bulk operation before the first id, so the good ids beside it stay as
    they were (one caller's bad id never half-does the batch), and nothing is audited."""
    audit = InMemoryAuditLog()
    ops = create_job_operations(backend, authorizer=lambda *_: True, audit=audit)
    good = await backend.enqueue(JOB, {})
    [claimed] = await backend.claim(claim_request(JOB, worker="A", limit=1))
    assert await backend.settle([failed(claimed, "boom", retry_at=None)]) == ["dead"]
    for bad in ("\x00", "a\ud800", "r" * 256):
        for single in (ops.get_run, ops.retry, ops.discard, ops.cancel):
            with pytest.raises(InvalidKeyError, match="run id"):
                await single(bad)
        for bulk in (ops.retry_many, ops.discard_many, ops.cancel_many):
            with pytest.raises(InvalidKeyError, match="run id"):
                await bulk([good.run_id, bad])
    assert (await backend.admin.get_run(good.run_id)).state == "dead"
    assert audit.entries == []


async def test_operator_discard(backend):
    """J8 model: waiting and dead runs can be discarded (terminal); running ones cannot."""
    waiting = await backend.enqueue(JOB, {}, dedupe_key="w")
    running = await backend.enqueue(JOB, {"n": 2})
    await backend.claim(claim_request(JOB, worker="A", limit=1))
    assert (await backend.admin.get_run(waiting.run_id)).state == "running"
    assert await backend.admin.discard(waiting.run_id) is None
    assert await backend.admin.discard(running.run_id) is not None
    assert (await backend.admin.get_run(running.run_id)).state == "discarded"
    assert await backend.admin.discard(running.run_id) is None
    assert backend.waiting_count("mem.job") == 0
    assert await backend.claim(claim_request(JOB, worker="A", limit=5)) == []


async def test_cleanup_applies_retention_in_bounded_batches(clock):
    """J8 model: cleanup (the operator surface over the memory admin port) deletes terminal runs
    past their retention, at most ``batch_size * max_batches``. In the legacy in-place shape
    (``live_only=False``): with a history (J16) finished runs leave by partitions (J17)."""
    backend = InMemoryJobBackend(clock=clock, live_only=False)
    ops = create_job_operations(backend, authorizer=lambda *_: True)
    results = await backend.enqueue_many(JOB, [EnqueueRequest({"n": n}) for n in range(3)])
    done = await backend.claim(claim_request(JOB, worker="A", limit=3))
    await backend.settle([completed(r) for r in done[:2]])
    await backend.settle([failed(done[2], "boom", retry_at=None)])
    live = await backend.enqueue(JOB, {"n": 9})
    assert (await ops.cleanup([JOB]))[JOB.id] == 0
    clock.advance(timedelta(hours=1))
    assert (await ops.cleanup([JOB], batch_size=1, max_batches=1))[JOB.id] == 1
    assert (await ops.cleanup([JOB]))[JOB.id] == 1
    assert (await backend.admin.get_run(results[2].run_id)).state == "dead"
    clock.advance(timedelta(days=1))
    assert (await ops.cleanup([JOB]))[JOB.id] == 1
    assert [r.run_id for r in backend.runs()] == [live.run_id]
    with pytest.raises(BoundExceededError):
        await ops.cleanup([JOB], batch_size=0)


def test_s1_an_actor_the_audit_log_cannot_store_is_refused_before_any_action_issue_32(backend):
    """S1, issue 32: an actor with a NUL or another non-printable character is refused when
    the operations are bound to it, not after an action ran and its audit entry failed."""
    ops = create_job_operations(backend, authorizer=lambda *_: True)
    for actor in ("a\x00b", "a\nb", "\ud800", "", "a" * 201):
        with pytest.raises(ConfigurationError, match="actor must be"):
            ops.acting_as(actor)
    assert ops.acting_as("Zoë Åberg (ops)").actor == "Zoë Åberg (ops)"
