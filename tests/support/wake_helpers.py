"""What the push-wake tests (K1) share: a spy that listens on a channel with a plain asyncpg
connection and can prove that nothing else arrived (a marker notification, delivered after
every notification committed before it), a TCP proxy that behaves like PgBouncer in
transaction mode for LISTEN (it forwards everything but notifications), an ``on_error`` that
lets a test wait for an error of one type, what a handler or a sink received (``Recorded``), and
the server-side view of listener connections.

``tests/support`` is on pytest's ``pythonpath``, so tests import this module by its name.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from typing import TYPE_CHECKING, Any, Self

import anyio
import anyio.lowlevel
import asyncpg
from sqlalchemy.engine import make_url

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sqlalchemy.engine import URL


def plain_dsn(url: str | URL) -> str:
    """``url`` (SQLAlchemy's ``postgresql+asyncpg://``) as asyncpg's own DSN."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class Recorded:
    """What a handler or a sink was given, in order, and a wait until there are ``count``."""

    def __init__(self) -> None:
        self.payloads: list[Any] = []
        self._changed = anyio.Event()

    def record(self, payload: Any) -> None:
        self.payloads.append(payload)
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def wait_for(self, count: int, within: float = 15) -> None:
        with anyio.fail_after(within):
            while len(self.payloads) < count:
                await self._changed.wait()


class Spy:
    """A LISTEN of its own on ``channel``: every payload, in delivery order."""

    def __init__(self, connection: asyncpg.Connection, channel: str) -> None:
        self.connection = connection
        self.channel = channel
        self.payloads: list[str] = []
        self._changed = asyncio.Event()

    def _heard(self, _c: object, _pid: int, _channel: str, payload: str) -> None:
        self.payloads.append(payload)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def keys(self) -> list[str]:
        """The announced keys (job or outbox ids) heard, markers left out."""
        return [p.partition("/")[2] for p in self.payloads if not p.startswith("marker:")]

    async def wait_for(self, payload_suffix: str, within: float = 10) -> None:
        with anyio.fail_after(within):
            while not any(p.endswith(payload_suffix) for p in self.payloads):
                await self._changed.wait()

    async def everything_before_now(self) -> list[str]:
        """The keys heard once every notification committed before this call has arrived: a
        marker is sent (and committed) now, and PostgreSQL delivers notifications to each
        listener in commit order, so when the marker is back, nothing earlier is still on its
        way."""
        marker = f"marker:{secrets.token_hex(4)}"
        await self.connection.execute("SELECT pg_notify($1, $2)", self.channel, marker)
        await self.wait_for(marker)
        return self.keys()


@contextlib.asynccontextmanager
async def spy_on(url: str, channel: str) -> AsyncIterator[Spy]:
    connection = await asyncpg.connect(plain_dsn(url))
    try:
        spy = Spy(connection, channel)
        await connection.add_listener(channel, spy._heard)
        yield spy
    finally:
        await connection.close()


class Errors(list[BaseException]):
    """An ``on_error`` that records errors and lets a test wait for one of a type."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = asyncio.Event()

    def __call__(self, error: BaseException) -> None:
        self.append(error)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def of(self, kind: type[BaseException]) -> list[BaseException]:
        return [e for e in self if isinstance(e, kind)]

    async def wait_for(self, kind: type[BaseException], count: int = 1, within: float = 15) -> None:
        with anyio.fail_after(within):
            while len(self.of(kind)) < count:
                await self._changed.wait()


async def listener_pids(url: str) -> list[int]:
    """Server processes of ship_sqla listeners on ``url``'s database, as pg_stat_activity
    shows them."""
    connection = await asyncpg.connect(plain_dsn(url))
    try:
        rows = await connection.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name LIKE 'ship_sqla listener%'"
        )
    finally:
        await connection.close()
    return [row["pid"] for row in rows]


async def until_no_listener(url: str, within: float = 10) -> None:
    """Until the server shows no listener connection (a closed connection's server process
    leaves pg_stat_activity a moment after the client closed it)."""
    with anyio.fail_after(within):
        while await listener_pids(url):
            await anyio.lowlevel.checkpoint()


async def terminate(url: str, pid: int) -> None:
    connection = await asyncpg.connect(plain_dsn(url))
    try:
        assert await connection.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await connection.close()


@contextlib.asynccontextmanager
async def connections_refused(url: str) -> AsyncIterator[asyncpg.Connection]:
    """While inside: the database of ``url`` refuses new connections (open ones stay); yields
    a connection to the server's ``postgres`` database (e.g. to terminate backends with)."""
    parsed = make_url(url)
    admin = await asyncpg.connect(plain_dsn(parsed.set(database="postgres")))
    name = '"' + str(parsed.database).replace('"', '""') + '"'
    try:
        await admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
        try:
            yield admin
        finally:
            await admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
    finally:
        await admin.close()


class NotificationDroppingProxy:
    """A TCP proxy in front of PostgreSQL that forwards every protocol message but the
    server's NotificationResponse ('A'): LISTEN succeeds and nothing is ever delivered, which
    is what PgBouncer in transaction mode does to a listener (SPEC §10). Clients must not ask
    for TLS (``?ssl=disable``), so every server message is a typed one."""

    def __init__(self, host: str, port: int) -> None:
        self._upstream = (host, port)
        self.dropped = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def url_for(self, url: str) -> str:
        """``url`` pointed at this proxy, without TLS."""
        parsed = make_url(url).set(host="127.0.0.1", port=self.port)
        return parsed.update_query_dict({"ssl": "disable"}).render_as_string(hide_password=False)

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        pumps = [
            asyncio.ensure_future(self._pump(reader, up_writer)),
            asyncio.ensure_future(self._server_messages(up_reader, writer)),
        ]
        for pump in pumps:
            self._tasks.add(pump)
            pump.add_done_callback(self._tasks.discard)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            for stream in (writer, up_writer):
                stream.close()

    @staticmethod
    async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()

    async def _server_messages(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter
    ) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                header = await source.readexactly(5)
                body = await source.readexactly(int.from_bytes(header[1:5], "big") - 4)
                if header[:1] == b"A":
                    self.dropped += 1
                    continue
                sink.write(header + body)
                await sink.drain()


def waiting_loops(backend: Any) -> int:
    """How many loops wait in ``backend.wait_for_work`` right now (its local wake's waiters):
    a test enqueues once the runtime is parked, so only a wake can start the run."""
    return int(backend._wakeup._waiters)


async def parked(backend: Any, within: float = 10) -> None:
    with anyio.fail_after(within):
        while not waiting_loops(backend):
            await anyio.lowlevel.checkpoint()
