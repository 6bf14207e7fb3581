"""C3 on every backend: a consumer's lag and last batch time recorded on its run, in the batch's
own transaction (``FencedRuns.record_progress``), fenced on the claim's token (J5, J13) and kept
when the run ends."""

from __future__ import annotations

from typing import Any

import anyio
import attrs
import pytest
from consumer_kit import consumer_kit_for
from job_helpers import claim_request
from jobs_conformance_support import single_runner_locks
from spy_backend import SpyBackend

from ship_sqla import define_job, start_job_runtime
from ship_sqla.consumers import define_consumer
from ship_sqla.errors import ConfigurationError
from ship_sqla.jobs import Concurrency, IdempotencyPolicy
from ship_sqla.kernel import completed
from ship_sqla.kernel._browse import RunQuery

LIMIT = 15.0


async def _runs(backend: Any, job_id: str, state: str) -> list[Any]:
    page = await backend.admin.list_runs(RunQuery(state=state, limit=50, job_id=job_id), max_jobs=5)
    return [browsed.record for browsed in page]


async def test_c3_each_batch_records_lag_and_time_on_the_run(clock, job_backend_factory):
    """C3: seven items in batches of three: the run's progress is the last batch's (lag, time,
        its items) and the run's totals, recorded in the batch's transaction and kept once the run
        completed; the lag is asked inside the transaction, past the batch's cursor. The
    supervisor's runs record none."""
    backend = SpyBackend(job_backend_factory(clock))
    kit = await consumer_kit_for(backend)
    await kit.append("k", *[f"p{n}" for n in range(1, 8)])

    async def keys(ctx: Any) -> list[str]:
        return ["k"]

    async def open_stream(ctx: Any, key: str, cursor: int | None) -> Any:
        async for item in kit.read(key, cursor):
            yield item

    async def handle(ctx: Any, key: str, items: list[tuple[int, str]], repositories: Any) -> int:
        for _, body in items:
            await repositories.add_effect(body)
        return items[-1][0]

    async def lag(ctx: Any, key: str, cursor: int) -> int:
        return 1_000 - cursor  # the stream's own unit (a made-up total here)

    consumer = define_consumer(
        "c3.progress",
        keys=keys,
        open=open_stream,
        handle=handle,
        cursor=kit.cursors,
        transaction=kit.uow,
        batch=3,
        lag=lag,
    )
    async with await start_job_runtime(
        list(consumer.jobs),
        backend=backend,
        worker_id="w1",
        lock_provider=single_runner_locks(backend, clock),
    ):
        await backend.enqueue(consumer.supervisor, {})
        with anyio.fail_after(LIMIT):
            while not await _runs(backend, consumer.id, "completed"):
                with anyio.move_on_after(0.2):
                    await backend._changed.wait()
    [run] = await _runs(backend, consumer.id, "completed")
    assert run.key == "k"
    last = await kit.cursor_of("k")
    assert last is not None
    assert run.progress == {
        "lag": 1_000 - last,  # past the last batch's cursor
        "last_batch_at": clock.now().isoformat(),
        "batch_items": 1,
        "batches": 3,
        "items": 7,
    }
    fetched = await backend.admin.get_run(run.run_id)
    assert fetched is not None
    assert fetched.progress == run.progress
    supervisor = await _runs(backend, consumer.supervisor.id, "completed")
    assert all(record.progress is None for record in supervisor)


async def _claimed(backend: Any, name: str) -> Any:
    async def noop(ctx: Any, payload: Any) -> None:
        pass

    job = define_job(name, noop, payload=dict)
    await backend.enqueue(job, {})
    [run] = await backend.claim(claim_request(job, worker="w1"))
    return run


async def test_c3_j5_record_progress_is_fenced_on_the_claim_and_joins_the_transaction(
    clock, job_backend_factory
):
    """C3, J5, J13: ``record_progress`` inside a unit of work writes the run's progress when its
    claim is current and the transaction commits; a stale holder's (an old token) writes
    nothing and is answered False; a rolled-back transaction leaves none."""
    backend = job_backend_factory(clock)
    kit = await consumer_kit_for(backend)
    run = await _claimed(backend, "c3.fenced")

    class Rollback(Exception):  # noqa: N818 - the test's own signal
        pass

    async def rolled_back(repositories: Any) -> None:
        assert await backend.record_progress(run, {"lag": 9, "items": 1}) is True
        raise Rollback

    with pytest.raises(Rollback):
        await kit.uow.run(rolled_back)
    record = await backend.admin.get_run(run.run_id)
    assert record is not None
    assert record.progress is None

    stale = attrs.evolve(run, token=run.token + 1)

    async def by_stale_holder(repositories: Any) -> bool:
        return bool(await backend.record_progress(stale, {"lag": 5}))

    assert await kit.uow.run(by_stale_holder) is False
    record = await backend.admin.get_run(run.run_id)
    assert record is not None
    assert record.progress is None

    async def by_holder(repositories: Any) -> bool:
        return bool(await backend.record_progress(run, {"lag": 2, "items": 3}))

    assert await kit.uow.run(by_holder) is True
    record = await backend.admin.get_run(run.run_id)
    assert record is not None
    assert record.progress == {"lag": 2, "items": 3}


async def test_c3_progress_outside_a_unit_of_work_or_not_json_is_refused(
    clock, job_backend_factory
):
    """C3: progress joins a batch's transaction, so outside a unit of work it is refused
    (ConfigurationError, nothing written); so is a value that is not a small JSON object."""
    backend = job_backend_factory(clock)
    kit = await consumer_kit_for(backend)
    run = await _claimed(backend, "c3.refused")
    with pytest.raises(ConfigurationError, match="unit of work"):
        await backend.record_progress(run, {"lag": 1})

    async def odd(repositories: Any) -> None:
        await backend.record_progress(run, {"lag": object()})

    with pytest.raises(ConfigurationError, match="JSON"):
        await kit.uow.run(odd)

    async def huge(repositories: Any) -> None:
        await backend.record_progress(run, {"cursor": "x" * 10_000})

    with pytest.raises(ConfigurationError, match="characters"):
        await kit.uow.run(huge)
    record = await backend.admin.get_run(run.run_id)
    assert record is not None
    assert record.progress is None


def _keyed(name: str) -> Any:
    """A job keyed as a consumer's per-key job is (C2): one live run per key (its dedupe key)
    and a single runner per key."""

    async def noop(ctx: Any, payload: Any) -> None:
        pass

    return define_job(
        name,
        noop,
        payload=dict,
        idempotency=IdempotencyPolicy(key=lambda p: p["key"]),
        concurrency=Concurrency(single_runner=True, key=lambda p: p["key"]),
    )


async def test_c3_consumer_progress_lists_each_keys_last_batch_and_live_run(
    clock, job_backend_factory
):
    """C3, S2: the dashboard's read lists each (consumer, key) that recorded progress, in
    (consumer, key) order: its newest run with progress (kept after it completed) and the key's
    live run (a newer one, before its first batch); a key without progress is not listed;
    ``after`` pages on."""
    backend = job_backend_factory(clock)
    kit = await consumer_kit_for(backend)
    job = _keyed("c3.keys")
    for key in ("b", "a", "quiet"):
        await backend.enqueue(job, {"key": key})
    claimed = await backend.claim(claim_request(job, worker="w1", limit=3))
    assert len(claimed) == 3
    by_key = {run.key: run for run in claimed}

    async def record(repositories: Any) -> None:
        for key in ("a", "b"):
            assert await backend.record_progress(by_key[key], {"lag": ord(key), "items": 2})

    await kit.uow.run(record)
    assert await backend.settle([completed(run) for run in claimed]) == ["completed"] * 3
    again = await backend.enqueue(job, {"key": "a"})  # the supervisor's next arm of key a
    assert again.accepted
    assert not again.deduplicated

    listed = await backend.admin.consumer_progress(limit=10)
    assert [(k.job_id, k.key) for k in listed] == [("c3.keys", "a"), ("c3.keys", "b")]
    a, b = listed
    assert (a.run_id, a.state, dict(a.progress)) == (
        by_key["a"].run_id,
        "completed",
        {"lag": ord("a"), "items": 2},
    )
    assert (a.live_run_id, a.live_state) == (again.run_id, "waiting")
    assert (b.live_run_id, b.live_state) == (None, None)
    assert await backend.admin.consumer_progress(limit=1) == [a]
    assert await backend.admin.consumer_progress(limit=10, after=("c3.keys", "a")) == [b]
