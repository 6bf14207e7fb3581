"""Project-wide test configuration: every coroutine test runs on anyio's asyncio backend."""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

import pytest

ASYNCPG_CANCELLED_CONNECT = "unexpected connection_lost() call"
"""asyncpg's (0.32) report of a connect cancelled between its TCP connect and the server's first
answer (MagicStack/asyncpg#1310): see :func:`_asyncpg_cancelled_connect_logged`."""


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: Any) -> None:
    # Marking at collection (before parametrize expands the function) rather than afterwards
    # keeps anyio's backend parametrization working together with @pytest.mark.parametrize.
    if collector.funcnamefilter(name) and inspect.iscoroutinefunction(obj):  # type: ignore[attr-defined]
        pytest.mark.anyio(obj)
        pytest.mark.usefixtures("_asyncpg_cancelled_connect_logged")(obj)


@pytest.fixture
async def _asyncpg_cancelled_connect_logged() -> None:
    """asyncpg fails a future nobody reads when a connect is cancelled between its TCP connect
    and the server's first answer (its default ``sslmode=prefer`` asks for TLS first), and
    asyncio hands it to the loop's exception handler when it is collected ("Future exception
    was never retrieved"): an application's loop logs it; anyio's test runner raises it in
    whichever test is running then. The library never cancels its listener's connects
    halfway (``_notify._whole_connect``), but a pool connect of a task a stopping runtime
    cancels can still do it (seen in a consumer conformance test and in D10's). That report,
    and only it, is logged here as the application's loop would; every other one still fails
    the test. The filter stays on the runner's loop (the future may be collected later)."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    if previous is None or not getattr(previous, "ship_filters_cancelled_connects", False):

        def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            error = context.get("exception")
            if isinstance(error, ConnectionError) and str(error) == ASYNCPG_CANCELLED_CONNECT:
                logging.getLogger(__name__).warning(
                    "asyncpg: %s (%r)", context.get("message"), error
                )
                return
            if previous is None:
                loop.default_exception_handler(context)
            else:
                previous(loop, context)

        handler.ship_filters_cancelled_connects = True  # type: ignore[attr-defined]
        loop.set_exception_handler(handler)
