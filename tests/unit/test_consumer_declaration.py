"""Consumer declarations (SPEC §15 C1-C3) without a database: what ``define_consumer`` refuses
and why, the two jobs it declares, the hand-enqueue refusal, and one key's loop on the in-memory
backend with its progress and metrics (C3)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from consumer_kit import consumer_kit_for
from global_meter import global_meter
from job_helpers import claim_request

from ship_sqla import JobContext
from ship_sqla.consumers import (
    CONSUMER_METRIC_NAMES,
    DEFAULT_CONSUMER_BATCH,
    MAX_CONSUMER_BATCH,
    define_consumer,
)
from ship_sqla.errors import ConfigurationError, ConsumerDeclarationError, ConsumerRunEnqueueError
from ship_sqla.jobs import JobRegistry
from ship_sqla.kernel import InMemoryJobBackend, InMemoryUnitOfWork, _consumer_metrics
from ship_sqla.testing import FrozenClock


class Cursors:
    async def load(self, key: str, repositories: Any) -> int | None:
        assert (key, repositories) is not None
        return None

    async def save(self, key: str, cursor: int, repositories: Any) -> None:
        assert (key, cursor, repositories) is not None


async def keys(ctx: Any) -> list[str]:
    return ["k"]


async def open_stream(ctx: Any, key: str, cursor: Any) -> Any:
    yield 1


async def handle(ctx: Any, key: str, items: list[Any], repositories: Any) -> int:
    return 1


def declare(**overrides: Any) -> Any:
    consumer_id = overrides.pop("id", "orders.feed")
    options: dict[str, Any] = {
        "keys": keys,
        "open": open_stream,
        "handle": handle,
        "cursor": Cursors(),
        "transaction": InMemoryUnitOfWork(),
    }
    options.update(overrides)
    return define_consumer(consumer_id, **options)


def test_c1_c2_defaults_and_the_two_jobs() -> None:
    """C1, C2: batch 100 and rearm 1 minute by default; the per-key job is single-runner per
    key, deduplicated by key, with no timeout; the supervisor is a UTC cron every minute."""
    consumer = declare()
    assert (consumer.batch, consumer.rearm) == (DEFAULT_CONSUMER_BATCH, 1) == (100, 1)
    job, supervisor = consumer.jobs
    assert list(consumer) == [job, supervisor]
    assert (job.id, supervisor.id) == ("orders.feed", "orders.feed.supervisor")
    assert job.concurrency.single_runner
    assert job.concurrency.key is not None
    assert job.concurrency.key({"key": "p1"}) == "p1"
    assert job.idempotency is not None
    assert job.idempotency.key({"key": "p1"}) == "p1"
    assert job.timeout is None
    assert supervisor.schedule is not None
    assert (supervisor.schedule.cron, supervisor.schedule.timezone) == ("* * * * *", "UTC")
    assert supervisor.concurrency.single_runner
    registry = JobRegistry([*consumer])
    assert [definition.id for definition in registry] == [job.id, supervisor.id]


@pytest.mark.parametrize(
    ("rearm", "cron"),
    [
        (2, "*/2 * * * *"),
        (15, "*/15 * * * *"),
        (timedelta(minutes=30), "*/30 * * * *"),
        (60, "0 * * * *"),
        (timedelta(hours=1), "0 * * * *"),
    ],
)
def test_c2_rearm_whole_minutes_dividing_an_hour(rearm: Any, cron: str) -> None:
    """C2: a rearm of whole minutes dividing an hour is the supervisor's UTC cron."""
    assert declare(rearm=rearm).supervisor.schedule.cron == cron


@pytest.mark.parametrize(
    "rearm", [0, 7, 45, 90, 1.5, True, "1m", timedelta(seconds=90), timedelta(hours=2)]
)
def test_c2_a_rearm_that_does_not_divide_an_hour_is_refused(rearm: Any) -> None:
    """C2: any other rearm is refused at declaration, naming the choices."""
    with pytest.raises(ConsumerDeclarationError, match="divide an hour"):
        declare(rearm=rearm)


def test_c2_a_timeout_is_refused() -> None:
    """C2: a consumer declares no timeout: it runs until its stream ends or a drain stops it."""
    with pytest.raises(ConsumerDeclarationError, match="timeout") as caught:
        declare(timeout=60)
    assert caught.value.fix is not None
    assert "drop timeout" in caught.value.fix


@pytest.mark.parametrize("cursor", [None, object(), {"load": 1, "save": 2}])
def test_c1_no_cursor_seam_is_refused(cursor: Any) -> None:
    """C1: without a cursor seam (load and save) a restart would read the stream from the start."""
    with pytest.raises(ConsumerDeclarationError, match="cursor seam"):
        declare(cursor=cursor)


@pytest.mark.parametrize("batch", [0, -1, MAX_CONSUMER_BATCH + 1, 2.0, True, "10", None])
def test_c1_a_batch_out_of_bounds_is_refused(batch: Any) -> None:
    """C1: a batch is a whole number of items from 1 to 10,000."""
    with pytest.raises(ConsumerDeclarationError, match="batch"):
        declare(batch=batch)
    assert declare(batch=1).batch == 1
    assert declare(batch=MAX_CONSUMER_BATCH).batch == MAX_CONSUMER_BATCH


@pytest.mark.parametrize("field", ["keys", "open", "handle", "lag"])
def test_c1_a_missing_function_is_refused(field: str) -> None:
    """C1: keys, open, handle (and lag when given) are functions."""
    with pytest.raises(ConsumerDeclarationError, match=field):
        declare(**{field: "not a function"})


def test_c1_a_unit_of_work_an_id_and_a_lease_are_checked() -> None:
    """C1: the transaction is a unit of work; the id is a job id with room for the
    supervisor's; the lease is a positive duration."""
    with pytest.raises(ConsumerDeclarationError, match="unit of work"):
        declare(transaction=object())
    with pytest.raises(ConsumerDeclarationError, match="not valid"):
        declare(id="x" * 120)
    with pytest.raises(ConsumerDeclarationError, match="not valid"):
        declare(id="-bad")
    with pytest.raises(ConfigurationError, match="lease"):
        declare(lease=0)
    assert declare(lease=timedelta(minutes=2)).job.concurrency.lease == 120.0


def test_c2_the_per_key_job_encodes_for_its_supervisor_only() -> None:
    """C2: the per-key job's payload codec refuses to encode outside its supervisor, so a hand
    enqueue fails before anything is prepared or written."""
    consumer = declare()
    with pytest.raises(ConsumerRunEnqueueError, match="supervisor") as caught:
        consumer.job.encode({"key": "k"})
    assert caught.value.code == "SHIP_SQLA_CONSUMER_ENQUEUE_REFUSED"
    assert consumer.job.decode({"key": "k"}) == {"key": "k"}


async def test_c1_c3_one_keys_loop_records_progress_and_metrics(monkeypatch) -> None:
    """C1, C3: the supervisor's run enqueues the key's run; that run's loop commits each batch
    with its cursor, then reports the key's lag and last batch time (``progress``) and the
    ``ship.consumer.*`` metrics."""
    clock = FrozenClock()
    backend = InMemoryJobBackend(clock=clock)
    kit = await consumer_kit_for(backend)
    await kit.append("k", "x1", "x2", "x3")

    async def read(ctx: Any, key: str, cursor: int | None) -> Any:
        async for item in kit.read(key, cursor):
            yield item

    async def apply(ctx: Any, key: str, items: list[Any], repositories: Any) -> int:
        for _, body in items:
            await repositories.add_effect(body)
        return items[-1][0]

    async def lag(ctx: Any, key: str, cursor: int) -> int:
        return 3 - cursor

    consumer = declare(
        open=read, handle=apply, cursor=kit.cursors, transaction=kit.uow, batch=2, lag=lag
    )
    with global_meter() as meter:
        monkeypatch.setattr(_consumer_metrics, "_made", None)
        reader = meter.install()
        await backend.enqueue(consumer.supervisor, {})
        for job in (consumer.supervisor, consumer.job):
            [run] = await backend.claim(claim_request(job, worker="w1"))
            ctx: JobContext[Any] = JobContext.standalone(run)
            ctx.bind_backend(backend)
            await job.handler(ctx, job.decode(run.payload))
        assert await kit.effects() == ["x1", "x2", "x3"]
        progress = consumer.progress("k")
        assert progress is not None
        assert (progress.batches, progress.items, progress.lag) == (2, 3, 0)
        assert progress.last_batch_at == clock.now()
        collected = meter.collect()
        assert reader is meter.reader
    assert set(CONSUMER_METRIC_NAMES) <= set(collected)
    points = {name: list(collected[name].data.data_points) for name in CONSUMER_METRIC_NAMES}
    attributes = {"ship.job.id": consumer.id, "ship.job.key": "k"}
    assert [(p.value, dict(p.attributes)) for p in points["ship.consumer.items"]] == [
        (3, attributes)
    ]
    assert [p.value for p in points["ship.consumer.batches"]] == [2]
    assert [p.value for p in points["ship.consumer.lag"]] == [0]
    assert [p.value for p in points["ship.consumer.last_batch"]] == [clock.now().timestamp()]


async def test_j13_a_fenced_transaction_holds_heartbeats_while_open() -> None:
    """J13: while ``ctx.fenced_transaction`` is open the run is marked fenced (the runtime sends
    no heartbeat for it, a heartbeat would wait on the locked row); after it, it is not."""
    clock = FrozenClock()
    backend = InMemoryJobBackend(clock=clock)
    consumer = declare()
    await backend.enqueue(consumer.supervisor, {})
    [run] = await backend.claim(claim_request(consumer.supervisor, worker="w1"))
    ctx: JobContext[Any] = JobContext.standalone(run)
    ctx.bind_backend(backend)
    seen: list[bool] = []

    async def inside(repositories: Any) -> None:
        seen.append(ctx.cancellation.fenced)

    await ctx.fenced_transaction(InMemoryUnitOfWork(), inside)
    assert seen == [True]
    assert not ctx.cancellation.fenced
    with pytest.raises(ConfigurationError, match="no backend"):
        _ = JobContext.standalone(run).backend


async def test_c1_open_must_be_an_async_iterable() -> None:
    """C1: ``open`` returning something that is not an async iterable (an ``async def`` that
    returns a list) fails the run with ConsumerDeclarationError naming the fix."""
    clock = FrozenClock()
    backend = InMemoryJobBackend(clock=clock)

    async def returns_a_list(ctx: Any, key: str, cursor: Any) -> list[int]:
        return [1, 2]

    consumer = declare(open=returns_a_list)
    await backend.enqueue(consumer.supervisor, {})
    for job in (consumer.supervisor, consumer.job):
        [run] = await backend.claim(claim_request(job, worker="w1"))
        ctx: JobContext[Any] = JobContext.standalone(run)
        ctx.bind_backend(backend)
        if job is consumer.supervisor:
            await job.handler(ctx, {})
            continue
        with pytest.raises(ConsumerDeclarationError, match="async generator"):
            await job.handler(ctx, job.decode(run.payload))
