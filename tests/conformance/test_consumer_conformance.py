"""Consumers (SPEC §15 C1-C3) on every backend: a table-like stream per key, each batch's effects
and the cursor past it committed in one fenced transaction (J13's fence, no completion).

Each test runs the real runtime on the backend (through the recording spy), arms the consumer
through its supervisor, and stops the runtime before reading, so every batch has committed or
rolled back. The stream, cursors and effects are tests/support/consumer_kit.py's (PostgreSQL:
tables; the effects table has no unique constraint, so "once" comes from the transaction).
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import attrs
import pytest
from consumer_kit import consumer_kit_for
from job_helpers import ErrorLog, claim_request
from jobs_conformance_support import single_runner_locks
from spy_backend import SpyBackend

from ship_sqla import JobContext, define_job, start_job_runtime
from ship_sqla.consumers import define_consumer
from ship_sqla.errors import ConsumerCursorError, ConsumerRunEnqueueError, JobLeaseStaleError
from ship_sqla.jobs import EnqueueRequest, RetryPolicy
from ship_sqla.kernel._browse import RunQuery
from ship_sqla.kernel._transactional import SettlesApart

LIMIT = 15.0


def _consumer(kit: Any, name: str, handle: Any = None, **options: Any) -> Any:
    async def keys(ctx: Any) -> list[str]:
        return ["k"]

    async def open_stream(ctx: Any, key: str, cursor: int | None) -> Any:
        async for item in kit.read(key, cursor):
            yield item

    async def apply(ctx: Any, key: str, items: list[tuple[int, str]], repositories: Any) -> int:
        for _, body in items:
            await repositories.add_effect(body)
        return items[-1][0]

    options.setdefault("keys", keys)
    options.setdefault("open", open_stream)
    return define_consumer(
        name,
        handle=handle or apply,
        cursor=kit.cursors,
        transaction=kit.uow,
        **options,
    )


async def _runs(backend: Any, job_id: str, state: str) -> list[Any]:
    page = await backend.admin.list_runs(RunQuery(state=state, limit=50, job_id=job_id), max_jobs=5)
    return [browsed.record for browsed in page]


async def _serve(backend: SpyBackend, consumer: Any, clock: Any, until: Any) -> None:
    """Run a runtime with the consumer's jobs, arm it by enqueuing its supervisor's run, until
    ``until()`` holds (checked after every recorded call), then stop it (drained)."""
    async with await start_job_runtime(
        list(consumer.jobs),
        backend=backend,
        worker_id="w1",
        lock_provider=single_runner_locks(backend, clock),
    ):
        await backend.enqueue(consumer.supervisor, {})
        with anyio.fail_after(LIMIT):
            while not await until():
                with anyio.move_on_after(0.2):
                    await backend._changed.wait()


def _completed(backend: Any, job_id: str, count: int = 1) -> Any:
    async def until() -> bool:
        return len(await _runs(backend, job_id, "completed")) >= count

    return until


async def test_c1_batches_and_cursor_commit_together(clock, job_backend_factory):
    """C1, C3: seven items in batches of three: three fenced transactions, each committing its
    effects and the cursor past it; the run completes when the stream ends; the key's progress
    (lag, last batch time, batches, items) is recorded after each batch."""
    errors = ErrorLog()
    backend = SpyBackend(job_backend_factory(clock, on_error=errors))
    kit = await consumer_kit_for(backend)
    await kit.append("k", *[f"a{n}" for n in range(1, 8)])
    lags: list[tuple[str, int]] = []

    async def lag(ctx: Any, key: str, cursor: int) -> int:
        lags.append((key, cursor))
        return 0

    consumer = _consumer(kit, "c1.together", batch=3, lag=lag)
    await _serve(backend, consumer, clock, _completed(backend, consumer.id))
    assert await kit.effects() == [f"a{n}" for n in range(1, 8)]
    last = await kit.cursor_of("k")
    assert last is not None
    assert len(backend.calls["fence"]) == 3
    progress = consumer.progress("k")
    assert progress is not None
    assert (progress.batches, progress.items, progress.lag, progress.cursor) == (3, 7, 0, last)
    assert progress.last_batch_at == clock.now()
    assert [key for key, _ in lags] == ["k"] * 3
    assert errors.errors == []


async def test_c1_a_failed_batch_rolls_back_whole_and_only_it_is_delivered_again(
    clock, job_backend_factory
):
    """C1, K4: the second batch's handle writes two effects, then raises: that batch's effects
    and cursor roll back, the attempt fails; the next attempt reloads the committed cursor, so
    only that batch is delivered again; every item's effect is committed exactly once."""
    backend = SpyBackend(job_backend_factory(clock))
    kit = await consumer_kit_for(backend)
    await kit.append("k", *[f"b{n}" for n in range(1, 8)])
    delivered: list[list[str]] = []

    async def handle(ctx: Any, key: str, items: list[tuple[int, str]], repositories: Any) -> int:
        delivered.append([body for _, body in items])
        for _, body in items:
            await repositories.add_effect(body)
        if ctx.attempt == 1 and len(delivered) == 2:
            raise RuntimeError("boom mid-batch")
        return items[-1][0]

    consumer = _consumer(
        kit,
        "c1.redeliver",
        handle=handle,
        batch=3,
        retry=RetryPolicy(attempts=3, base_delay=1.0, jitter="none"),
    )

    async def done() -> bool:
        if backend.settled("fail"):
            clock.advance(1.0)  # the retry falls due
        return len(await _runs(backend, consumer.id, "completed")) >= 1

    await _serve(backend, consumer, clock, done)
    assert delivered == [["b1", "b2", "b3"], ["b4", "b5", "b6"], ["b4", "b5", "b6"], ["b7"]]
    assert await kit.effects() == [f"b{n}" for n in range(1, 8)]
    [run] = await _runs(backend, consumer.id, "completed")
    assert run.attempt == 2
    assert "boom mid-batch" in run.history[0]["error"]


@pytest.mark.parametrize("answer", ["backwards", "none"])
async def test_c1_a_cursor_never_moves_backwards(clock, job_backend_factory, answer):
    """C1: a handle that returns a cursor before its batch's start (or none) is refused
    (ConsumerCursorError): the batch rolls back whole, the committed cursor stays."""
    backend = SpyBackend(job_backend_factory(clock))
    kit = await consumer_kit_for(backend)
    await kit.append("k", "c1", "c2", "c3", "c4")

    async def handle(ctx: Any, key: str, items: list[tuple[int, str]], repositories: Any) -> Any:
        for _, body in items:
            await repositories.add_effect(body)
        if items[0][1] == "c1":
            return items[-1][0]
        return None if answer == "none" else items[0][0] - 5

    consumer = _consumer(
        kit, f"c1.backwards.{answer}", handle=handle, batch=2, retry=RetryPolicy(attempts=1)
    )

    async def dead() -> bool:
        return len(await _runs(backend, consumer.id, "dead")) >= 1

    await _serve(backend, consumer, clock, dead)
    assert await kit.effects() == ["c1", "c2"]
    [run] = await _runs(backend, consumer.id, "dead")
    assert ConsumerCursorError.__name__ in run.last_error
    assert await kit.cursor_of("k") is not None


async def test_c2_supervisor_arms_one_run_per_key_and_a_live_key_once(clock, job_backend_factory):
    """C2, J1: the supervisor enqueues one run per key its keys() lists; armed again while
    those runs are live, it starts none (deduplicated by key)."""
    backend = SpyBackend(job_backend_factory(clock))
    kit = await consumer_kit_for(backend)

    async def keys(ctx: Any) -> list[str]:
        return ["p0", "p1", "p2", "p1"]

    consumer = _consumer(kit, "c2.arm", keys=keys)
    # Only the supervisor is served: the per-key runs stay waiting.
    async with await start_job_runtime([consumer.supervisor], backend=backend, worker_id="w1"):
        for _ in range(2):
            await backend.enqueue(consumer.supervisor, {})
            with anyio.fail_after(LIMIT):
                while len(backend.settled("complete")) < _ + 1:
                    await backend._changed.wait()
    waiting = await _runs(backend, consumer.id, "waiting")
    assert sorted(record.key for record in waiting) == ["p0", "p1", "p2"]
    assert sorted(record.payload["key"] for record in waiting) == ["p0", "p1", "p2"]


async def test_c2_a_hand_enqueue_is_refused(clock, job_backend_factory):
    """C2: enqueuing a consumer's run by hand raises ConsumerRunEnqueueError and writes
    nothing; the supervisor's run may be enqueued by hand (to arm at once)."""
    backend = job_backend_factory(clock)
    kit = await consumer_kit_for(backend)
    consumer = _consumer(kit, "c2.hand")
    with pytest.raises(ConsumerRunEnqueueError, match="supervisor"):
        await backend.enqueue(consumer.job, {"key": "k"})
    with pytest.raises(ConsumerRunEnqueueError):
        await backend.enqueue_many(consumer.job, [EnqueueRequest({"key": "k"}, dedupe_key="x")])
    assert await _runs(backend, consumer.id, "waiting") == []
    assert (await backend.enqueue(consumer.supervisor, {})).accepted


async def test_c2_one_runner_per_key_a_busy_key_waits(clock, job_backend_factory):
    """C2, J4, J7: two workers, one key: while one worker's run of the key is in a batch, no
    other run of that key executes; the supervisor's second arm starts no second run, and no
    attempt is spent."""
    backend = SpyBackend(job_backend_factory(clock))
    kit = await consumer_kit_for(backend)
    await kit.append("k", "d1", "d2")
    inside = anyio.Event()
    release = anyio.Event()
    running = 0
    most = 0

    async def handle(ctx: Any, key: str, items: list[tuple[int, str]], repositories: Any) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        inside.set()
        await release.wait()
        for _, body in items:
            await repositories.add_effect(body)
        running -= 1
        return items[-1][0]

    consumer = _consumer(kit, "c2.single", handle=handle)
    locks = single_runner_locks(backend, clock)
    async with (
        await start_job_runtime(
            list(consumer.jobs), backend=backend, worker_id="w1", lock_provider=locks
        ),
        await start_job_runtime(
            list(consumer.jobs), backend=backend, worker_id="w2", lock_provider=locks
        ),
    ):
        await backend.enqueue(consumer.supervisor, {})
        with anyio.fail_after(LIMIT):
            await inside.wait()
        await backend.enqueue(consumer.supervisor, {})
        with anyio.fail_after(LIMIT):
            while len(backend.settled("complete")) < 2:
                await backend._changed.wait()
        assert len(await _runs(backend, consumer.id, "running")) == 1
        release.set()
        with anyio.fail_after(LIMIT):
            while not await _completed(backend, consumer.id)():
                await backend._changed.wait()
    assert most == 1
    [run] = await _runs(backend, consumer.id, "completed")
    assert run.attempt == 1
    assert await kit.effects() == ["d1", "d2"]


async def test_c2_a_drain_commits_the_batch_in_hand(clock, job_backend_factory):
    """C2, J12: a drain that begins while a batch is being taken commits the items in hand
    (not the rest of the batch, not half of it) and the run ends before the deadline."""
    backend = SpyBackend(job_backend_factory(clock))
    kit = await consumer_kit_for(backend)
    taken = anyio.Event()
    go_on = anyio.Event()
    contexts: list[Any] = []

    async def open_stream(ctx: Any, key: str, cursor: int | None) -> Any:
        contexts.append(ctx)
        yield (1, "e1")
        yield (2, "e2")
        taken.set()
        await go_on.wait()
        yield (3, "e3")
        yield (4, "e4")

    consumer = _consumer(kit, "c2.drain", open=open_stream, batch=10)
    runtime = await start_job_runtime(
        list(consumer.jobs),
        backend=backend,
        worker_id="w1",
        lock_provider=single_runner_locks(backend, clock),
    )
    await backend.enqueue(consumer.supervisor, {})
    with anyio.fail_after(LIMIT):
        await taken.wait()
    async with anyio.create_task_group() as group:
        group.start_soon(runtime.stop, 600.0)
        with anyio.fail_after(LIMIT):
            while not contexts[0].draining:
                await anyio.lowlevel.checkpoint()
        go_on.set()
    assert await kit.effects() == ["e1", "e2", "e3"]
    assert await kit.cursor_of("k") == 3
    [run] = await _runs(backend, consumer.id, "completed")
    assert run.history == ()


async def test_c2_a_drain_deadline_rolls_the_batch_in_hand_back_whole(clock, job_backend_factory):
    """C2, J12: a batch still in its handle at the drain's deadline is cancelled: its
    transaction rolls back whole (no effect, no cursor), and the run goes back to waiting with
    its attempt unspent."""
    backend = SpyBackend(job_backend_factory(clock))
    kit = await consumer_kit_for(backend)
    await kit.append("k", "f1", "f2")
    inside = anyio.Event()

    async def handle(ctx: Any, key: str, items: list[tuple[int, str]], repositories: Any) -> int:
        await repositories.add_effect(items[0][1])
        inside.set()
        await anyio.Event().wait()  # never returns: the deadline cancels it
        return items[-1][0]

    consumer = _consumer(kit, "c2.deadline", handle=handle)
    runtime = await start_job_runtime(
        list(consumer.jobs),
        backend=backend,
        worker_id="w1",
        lock_provider=single_runner_locks(backend, clock),
    )
    await backend.enqueue(consumer.supervisor, {})
    with anyio.fail_after(LIMIT):
        await inside.wait()
    await runtime.stop(0)
    assert await kit.effects() == []
    assert await kit.cursor_of("k") is None
    [run] = await _runs(backend, consumer.id, "waiting")
    assert run.attempt == 0
    assert "drain deadline" in (run.last_error or "")


async def test_j14_a_fenced_transaction_of_a_stale_claim_commits_nothing(
    clock, job_backend_factory
):
    """J13, J14, C1: ``ctx.fenced_transaction`` fences the claim first: with the claim's token
    it commits; with a token no longer current it raises JobLeaseStaleError and its write rolls
    back; with a cancel requested it rolls back and the run is to end cancelled."""
    backend = job_backend_factory(clock)
    kit = await consumer_kit_for(backend)

    async def noop(ctx: Any, payload: Any) -> None:
        pass

    holder = define_job("c1.holder", noop, payload=dict)
    await backend.enqueue(holder, {})
    [run] = await backend.claim(claim_request(holder, worker="w1"))

    async def write(repositories: Any) -> str:
        await repositories.add_effect("kept")
        return "ok"

    ctx: JobContext[Any] = JobContext.standalone(run)
    ctx.bind_backend(backend)
    assert await ctx.fenced_transaction(kit.uow, write) == "ok"

    stale_ctx: JobContext[Any] = JobContext.standalone(attrs.evolve(run, token=run.token + 1))
    stale_ctx.bind_backend(backend)

    async def lost(repositories: Any) -> str:
        await repositories.add_effect("lost")
        return "no"

    with pytest.raises(JobLeaseStaleError):
        await stale_ctx.fenced_transaction(kit.uow, lost)
    await backend.admin.cancel(run.run_id)
    with pytest.raises(SettlesApart):
        await ctx.fenced_transaction(kit.uow, lost)
    assert await kit.effects() == ["kept"]


async def _advance(backend: SpyBackend, clock: Any) -> None:
    """Ten seconds of frozen time, then the runtime's next storage call (or a moment: not every
    advance wakes a loop)."""
    clock.advance(10)
    with anyio.move_on_after(0.2):
        await backend._changed.wait()


async def test_c2_the_supervisor_rearms_on_its_utc_schedule(clock, job_backend_factory):
    """C2, J9: the supervisor's cron ticks every ``rearm`` minutes (UTC) and starts a run for a
    key whose last run ended (the stream ran dry, so it completed): the key is consumed again
    without anyone enqueuing by hand."""
    backend = SpyBackend(job_backend_factory(clock))
    kit = await consumer_kit_for(backend)
    await kit.append("k", "g1")
    consumer = _consumer(kit, "c2.rearm", rearm=2)
    assert consumer.supervisor.schedule.cron == "*/2 * * * *"
    assert consumer.supervisor.schedule.timezone == "UTC"
    async with await start_job_runtime(
        list(consumer.jobs),
        backend=backend,
        worker_id="w1",
        lock_provider=single_runner_locks(backend, clock),
    ):
        with anyio.fail_after(LIMIT):
            while len(await _runs(backend, consumer.id, "completed")) < 1:
                await _advance(backend, clock)
            await kit.append("k", "g2")
            while len(await _runs(backend, consumer.id, "completed")) < 2:
                await _advance(backend, clock)
    assert await kit.effects() == ["g1", "g2"]
    assert len(await _runs(backend, consumer.supervisor.id, "completed")) >= 2


async def test_c1_every_batch_starts_with_a_live_lease(clock, job_backend_factory):
    """C1, J5: a batch's transaction holds the run's row, so no heartbeat goes out while it is
    open; the loop renews the lease before a batch once a third of it has passed, so each batch
    starts with the lease alive, however long the run (here four batches of 12 s on a 30 s
    lease)."""
    backend = job_backend_factory(clock)
    kit = await consumer_kit_for(backend)
    await kit.append("k", "h1", "h2", "h3", "h4")
    alive: list[bool] = []

    async def handle(ctx: Any, key: str, items: list[tuple[int, str]], repositories: Any) -> int:
        record = await backend.admin.get_run(ctx.run_id)
        alive.append(record.lease_expires_at > clock.now())
        clock.advance(12)
        for _, body in items:
            await repositories.add_effect(body)
        return items[-1][0]

    consumer = _consumer(kit, "c1.lease", handle=handle, batch=1, lease=30.0)
    await backend.enqueue(consumer.supervisor, {})
    for job in (consumer.supervisor, consumer.job):
        [run] = await backend.claim(claim_request(job, worker="w1"))
        ctx: JobContext[Any] = JobContext.standalone(run)
        ctx.bind_backend(backend)
        await job.handler(ctx, job.decode(run.payload))
    assert alive == [True] * 4
    assert await kit.effects() == ["h1", "h2", "h3", "h4"]


async def test_c1_c2_keys_are_consumed_apart_each_with_its_cursor(clock, job_backend_factory):
    """C1, C2: three keys on two workers: each key's items are applied once, in order, and
    each key's cursor is its own."""
    backend = SpyBackend(job_backend_factory(clock))
    kit = await consumer_kit_for(backend)
    for key in ("k1", "k2", "k3"):
        await kit.append(key, *[f"{key}-{n}" for n in range(5)])

    async def keys(ctx: Any) -> list[str]:
        return ["k1", "k2", "k3"]

    consumer = _consumer(kit, "c2.keys", keys=keys, batch=2, lease=600.0)
    locks = single_runner_locks(backend, clock)
    async with (
        await start_job_runtime(
            list(consumer.jobs), backend=backend, worker_id="w1", lock_provider=locks
        ),
        await start_job_runtime(
            list(consumer.jobs), backend=backend, worker_id="w2", lock_provider=locks
        ),
    ):
        await backend.enqueue(consumer.supervisor, {})
        with anyio.fail_after(LIMIT):
            while len(await kit.effects()) < 15:
                await _advance(backend, clock)
    effects = await kit.effects()
    assert sorted(effects) == sorted(f"{key}-{n}" for key in ("k1", "k2", "k3") for n in range(5))
    for key in ("k1", "k2", "k3"):
        assert [body for body in effects if body.startswith(key)] == [
            f"{key}-{n}" for n in range(5)
        ]
        assert await kit.cursor_of(key) is not None
    assert len({await kit.cursor_of(key) for key in ("k1", "k2", "k3")}) == 3
