"""The relay: the ``orders`` outbox's messages to a sink, at least once.

Run it (from the repository root, with the settings' ``SHIP_SQLA_DATABASE_URL``)::

    python -m examples.fastapi_service.relay            # into the service_deliveries table
    python -m examples.fastapi_service.relay --redis    # XADD to the orders.events stream
    python -m examples.fastapi_service.relay --burst    # drain what is there, then exit

The default sink is a consumer inside the service's own database: it records each message in
``service_deliveries`` (one row per message id, ``deliveries`` counting redeliveries), which is
what the end-to-end test counts. ``--redis`` publishes to a Redis stream instead (at
``SHIP_SQLA_REDIS_URL``, default ``redis://127.0.0.1:6379/0``; needs ``pip install redis``);
its consumers deduplicate on the ``message_id`` field. Either sink is a lifespan the relay
enters before its first claim and leaves after its drain. Ctrl-C (or SIGTERM) stops the relay
gracefully: the message in flight finishes, the rest of its batch goes back at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import signal
import uuid
from typing import TYPE_CHECKING

from sqlalchemy import inspect
from sqlalchemy.dialects.postgresql import insert

from examples.fastapi_service.settings import get_settings
from examples.fastapi_service.tables import deliveries, outbox_table
from ship_sqla import create_outbox, start_outbox_relay
from ship_sqla.outbox import OutboxRelay

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from ship_sqla.outbox import Outbox, OutboxMessage, OutboxSink


TABLES = (outbox_table, deliveries)
NO_REDIS = "relay --redis needs the redis client: pip install redis"
NO_TABLES = "relay: the service's tables do not exist yet: start the app first (it creates them)."


@contextlib.asynccontextmanager
async def table_sink() -> AsyncIterator[OutboxSink]:
    """Record each message in ``service_deliveries``: a repeat only counts up (idempotent)."""
    engine = get_settings().engine()

    async def record(message: OutboxMessage) -> None:
        statement = insert(deliveries).values(
            message_id=message.id,
            topic=message.topic,
            order_id=uuid.UUID(message.payload["order_id"]),
        )
        statement = statement.on_conflict_do_update(
            index_elements=[deliveries.c.message_id],
            set_={"deliveries": deliveries.c.deliveries + 1},
        )
        async with engine.begin() as connection:
            await connection.execute(statement)

    try:
        yield record
    finally:
        await engine.dispose()


@contextlib.asynccontextmanager
async def redis_sink() -> AsyncIterator[OutboxSink]:
    """Append each message to the settings' Redis stream (consumers dedupe on message_id)."""
    try:
        from redis.asyncio import Redis  # noqa: PLC0415 - optional: only --redis needs it
    except ImportError as exc:
        raise SystemExit(NO_REDIS) from exc
    settings = get_settings()
    client = Redis.from_url(settings.redis_url)

    async def publish(message: OutboxMessage) -> None:
        await client.xadd(
            settings.redis_stream,
            {
                "message_id": str(message.id),
                "topic": message.topic,
                "payload": json.dumps(message.payload),
            },
        )

    try:
        yield publish
    finally:
        await client.aclose()


async def drain(outbox: Outbox, outbox_id: str, *, redis: bool = False) -> int:
    """Publish every message due now, batch by batch, until a claim finds none (``--burst``);
    returns how many were delivered."""
    async with (redis_sink if redis else table_sink)() as sink:
        relay = OutboxRelay(outbox, outbox_id, sink, listen=False)
        while await relay.run_once():
            pass
        return relay.delivered


async def main(*, redis: bool = False, burst: bool = False) -> int:
    if redis and importlib.util.find_spec("redis") is None:
        raise SystemExit(NO_REDIS)
    settings = get_settings()
    engine = settings.engine()
    outbox = create_outbox(database=engine, table=outbox_table)
    try:
        if burst:
            async with engine.connect() as connection:  # start_outbox_relay checks this itself
                found = await connection.run_sync(
                    lambda sync: all(inspect(sync).has_table(t.name) for t in TABLES)
                )
            if not found:
                raise SystemExit(NO_TABLES)
            delivered = await drain(outbox, settings.outbox_id, redis=redis)
            print(f"relay: {delivered} messages delivered, none left due (--burst)")
            return 0
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        sink = redis_sink if redis else table_sink
        async with await start_outbox_relay(outbox, settings.outbox_id, lifespan=sink) as relay:
            where = settings.redis_stream if redis else deliveries.name
            print(f"relay: outbox {settings.outbox_id!r} -> {where}; Ctrl-C stops it")
            await stop.wait()
        print(f"relay: stopped after {relay.delivered} messages")
        return 0
    finally:
        await engine.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", action="store_true", help="publish to the Redis stream")
    parser.add_argument("--burst", action="store_true", help="drain what is due, then exit")
    arguments = parser.parse_args()
    raise SystemExit(asyncio.run(main(redis=arguments.redis, burst=arguments.burst)))
