"""What the PostgreSQL-against-the-model state machines share (tests/property): the claim both
backends answered, the history normalisation, a database of the module's own, and the run of a
machine on one event loop (Hypothesis has no async rules: the sync rules call the async
backends through an anyio blocking portal kept for the whole test, SPEC §10)."""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import attrs
from anyio.from_thread import start_blocking_portal
from hypothesis.stateful import run_state_machine_as_test
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ship_sqla.testing import DatabaseFactory
from ship_sqla.testing._databases import new_database_name

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from hypothesis import settings
    from sqlalchemy import MetaData

    from ship_sqla.jobs import RunRecord
    from ship_sqla.kernel import ClaimedRun
    from ship_sqla.testing import ResolvedServer

__all__ = ["Claim", "module_database", "normalized", "replay_machine", "run_machine"]


@attrs.frozen
class Claim:
    """One claim as both backends answered it: their tokens differ, the run is the same."""

    pg: ClaimedRun
    model: ClaimedRun
    worker: str


def normalized(record: RunRecord) -> RunRecord:
    """History ``at`` (and J18's ``started``) texts differ in format (microseconds); compare
    them as instants."""
    history = tuple(
        {
            **entry,
            **{
                key: datetime.fromisoformat(entry[key])
                for key in ("at", "started")
                if entry.get(key) is not None
            },
        }
        for entry in record.history
    )
    return attrs.evolve(record, history=history)


def module_database(ship_server: ResolvedServer, prefix: str) -> Iterator[str]:
    """A database of the calling module's own (created and dropped synchronously): the body of
    a module-scoped fixture."""
    factory = DatabaseFactory(ship_server)
    name = new_database_name(prefix)
    url = asyncio.run(factory.create(name))
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        asyncio.run(factory.drop(name))


def run_machine(machine: Any, url: str, metadata: MetaData, machine_settings: settings) -> None:
    """Run ``machine`` as a test on one event loop: an engine on ``url`` with ``metadata``'s
    tables created, handed to the machine class with the portal, disposed at the end."""
    with _machine_set_up(machine, url, metadata):
        run_state_machine_as_test(machine, settings=machine_settings)


def replay_machine(
    machine: Any, url: str, metadata: MetaData, steps: Callable[[Any], None]
) -> None:
    """Run ``steps`` on one instance of ``machine``, set up as :func:`run_machine` sets it up: a
    sequence the machine once found, kept as a test of its own (Hypothesis has no explicit
    examples for state machines)."""
    with _machine_set_up(machine, url, metadata):
        steps(machine())


@contextmanager
def _machine_set_up(machine: Any, url: str, metadata: MetaData) -> Iterator[None]:
    with start_blocking_portal(backend="asyncio") as portal:

        async def setup() -> AsyncEngine:
            engine = create_async_engine(url, pool_size=3)
            async with engine.begin() as connection:
                await connection.run_sync(metadata.create_all)
            return engine

        engine = portal.call(setup)
        machine.portal = portal
        machine.engine = engine
        try:
            yield
        finally:
            portal.call(engine.dispose)
