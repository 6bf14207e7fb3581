"""Outbox sinks for ``ship-sqla outbox relay`` run in a subprocess (tests/integration/
test_cli_relay.py): each writes what it published, one line each, to the file the
``RELAY_SINK_LOG`` environment variable names; the slow ones say on stderr when a publish
starts, so the test can signal the relay while a sink call is in flight."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from ship_sqla.outbox import OutboxMessage, OutboxSink


def note(line: str) -> None:
    with open(os.environ["RELAY_SINK_LOG"], "a", encoding="utf-8") as log:  # noqa: PTH123
        log.write(line + "\n")


def say(line: str) -> None:
    """A line on stderr, which the test reads as it comes (no polling of the file)."""
    print(f"sink: {line}", file=sys.stderr, flush=True)  # noqa: T201


async def record(message: OutboxMessage) -> None:
    """Publishes by writing the message down."""
    note(json.dumps({"id": str(message.id), "topic": message.topic, "payload": message.payload}))


async def failing(message: OutboxMessage) -> None:
    """The broker is down: every publish raises (the error names no payload)."""
    note(f"failing {message.id}")
    raise ConnectionError("the broker is down")


async def slow(message: OutboxMessage) -> None:
    """Takes a moment to publish: a drain lets it finish."""
    say(f"start {message.id}")
    await asyncio.sleep(0.5)  # a slow broker, not a wait for an event
    await record(message)


async def hang(message: OutboxMessage) -> None:
    """Never returns: only a cancellation ends it."""
    say(f"start {message.id}")
    await asyncio.Event().wait()


@contextlib.asynccontextmanager
async def lifespan() -> AsyncIterator[OutboxSink]:
    """Opens the sink's resources, yields the sink, closes them after the drain."""
    note("enter")
    try:
        yield record
    finally:
        note("exit")


not_a_sink = 42


@contextlib.asynccontextmanager
async def broken() -> AsyncIterator[OutboxSink]:
    """A lifespan whose resource cannot be opened."""
    raise ConnectionError("the broker refused the connection")
    yield record  # pragma: no cover - never reached
