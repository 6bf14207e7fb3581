"""A listener stopped while it connects (J11, J12, K1): nothing reaches the event loop.

asyncpg's connect with the default ``sslmode=prefer`` first asks the server for TLS through a
protocol whose answer is a future; a connect cancelled between the TCP connect and that question
closes the socket, and the future is failed with ``ConnectionError('unexpected connection_lost()
call')`` that nobody retrieves: asyncio hands it to the loop's exception handler ("Future
exception was never retrieved"), which anyio's test runner re-raises (a D10 conformance test
failed so under load: a runtime started and stopped at once, its listener still connecting).
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import anyio.lowlevel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._notify import listener_for

ROUNDS = 30


async def test_j11_a_listener_stopped_while_connecting_leaves_nothing_to_the_event_loop(
    ship_engine: AsyncEngine,
) -> None:
    """J11, J12, K1: a listener closed right after its first subscription, at every point of its
    connect (0 to ROUNDS turns of the event loop after it began), raises nothing, reports
    nothing, and leaves no failed future or task behind for the loop's exception handler; its
    connects are not left open either (each ended before close returned or is closed on its
    own)."""
    loop = asyncio.get_running_loop()
    handed: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: handed.append(context))
    errors: list[BaseException] = []
    try:
        for turns in range(ROUNDS):
            listener = listener_for(
                ship_engine, True, name=f"stop-{turns}", report_error=errors.append
            )
            assert listener is not None
            listener.subscribe("ship_sqla_stop_test", lambda _payload: None)
            for _ in range(turns):
                await anyio.lowlevel.checkpoint()
            await listener.close()
            gc.collect()
        await _listener_connections_closed(ship_engine)
        gc.collect()
    finally:
        loop.set_exception_handler(previous)
    assert [(c.get("message"), repr(c.get("exception"))) for c in handed] == []
    assert errors == []


async def _listener_connections_closed(engine: AsyncEngine) -> None:
    """Until no listener connection of this test is open on the server (a connect that was
    let finish after its listener stopped closes its connection when it ends)."""
    query = text(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE '%stop-%'"
        " AND datname = current_database()"
    )
    with anyio.fail_after(20):
        while True:
            async with engine.connect() as connection:
                if (await connection.execute(query)).scalar_one() == 0:
                    return
            await anyio.lowlevel.checkpoint()
