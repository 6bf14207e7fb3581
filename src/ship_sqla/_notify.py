"""Push wake across processes (K1, K8): announcements, and one listener.

Sending. A store that enqueues (the job backend, the outbox) announces new due work with
``pg_notify(channel, key)``, which PostgreSQL delivers only when the transaction that sent it
commits: a rolled-back enqueue wakes nobody. When and how is the kernel's rule
(:mod:`ship_sqla.kernel._plans.announce`), carried out by an :class:`Announcer`: either in the
enqueue's own transaction (a "fold": the plain enqueues put the NOTIFY into their one INSERT,
:func:`~ship_sqla._sql.notify.announcing`, no round trip added; the others send
:data:`~ship_sqla._sql.notify.NOTIFY` in the same transaction), or after the enqueue committed,
in a notify-only transaction of the announcer's own that carries every key committed meanwhile
and commits without waiting for its WAL flush.

Listening. A :class:`Listener` holds ONE dedicated asyncpg connection (not a pooled one: a
pooled connection goes back to the pool and its LISTEN with it), made from the engine's URL or
a URL of its own (``listen="postgresql://..."``). Every interested part of a process subscribes
to a channel on it (:meth:`Listener.subscribe`): the job backend's wake, the outbox relay's
wake, a cancel channel. Guarantees:

- A listener is **live** only once a probe notification sent from ANOTHER session (a second,
  short-lived connection made like the listener's) has come back on its idle connection:
  what other processes' commits need. PgBouncer in transaction mode accepts ``LISTEN`` and
  delivers nothing to an idle client (its own NOTIFY can come back, when PgBouncer happens to
  run it on the session that ran the LISTEN: a self-sent probe would be fooled); such a
  listener never goes live, reports :class:`ListenerNotLiveError` (fix: ``listen=False``, or
  a direct URL) and retries slowly; polling covers it. A live listener probes again every
  :data:`HEALTH_INTERVAL` seconds on its own connection, so a connection that went silent is
  found and replaced.
- A lost connection (``pg_terminate_backend``, a restart, a network cut found by the probe) is
  reported (:class:`ListenerLostError`) and replaced with the one backoff
  (:data:`~ship_sqla.kernel._plans.backoff.ERROR_BACKOFF`: 0.1 s doubling to 1 s).
- K1, no gap: each time a subscription's channel is listened on a live connection, the first
  time as after a reconnect, its ``on_gap`` runs: whatever was announced while nothing
  listened is looked for at once, not at the next poll. The first time covers the start: a
  job runtime claims before its listener is live (the connect, LISTEN and probe take a few
  round trips), and an enqueue committed between that claim and the first live LISTEN was
  announced to nobody. One extra look per start; a subscriber joining a channel that is
  already listened on a live connection is covered from ``subscribe`` on and gets no call.
- Bursts are debounced: notifications that arrive together are delivered once per (channel,
  payload), after the burst has been read.
- Nothing raises out of the listener: every error goes to ``report_error`` (J11's rule).

Announcements carry their sender (:func:`announcement`): a store ignores its own, since its
local enqueues already woke its waiters at commit (and a recheck for them would be wasted).

A listener's waits (probe replies, backoffs, health probes) are connection management, on the
wall clock by default like any I/O timeout (a test may pass a clock); each socket operation is
also bounded in real time (:data:`IO_TIMEOUT`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
from typing import TYPE_CHECKING, Any, Final

import asyncpg
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._failover import Hosts, connect_any, hosts_of
from ship_sqla._naming import MAX_IDENTIFIER_BYTES
from ship_sqla._sql.notify import LISTENER_PROBE
from ship_sqla.kernel._clock import SystemClock
from ship_sqla.kernel._errors import ConfigurationError, DatabaseUnavailableError
from ship_sqla.kernel._plans.announce import RECHECKS, AnnouncePlan
from ship_sqla.kernel._plans.backoff import ERROR_BACKOFF, Backoff
from ship_sqla.kernel._waiting import wait_event

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sqlalchemy.engine import URL, Dialect

    from ship_sqla._scope import Database
    from ship_sqla.kernel._clock import Clock

__all__ = [
    "ANNOUNCER_TASK",
    "ANNOUNCE_ATTEMPTS",
    "HEALTH_INTERVAL",
    "IO_TIMEOUT",
    "PROBE_TIMEOUT",
    "Announcer",
    "Listen",
    "Listener",
    "ListenerLostError",
    "ListenerNotLiveError",
    "Recheck",
    "Subscription",
    "announced_key",
    "announcement",
    "announcements_sent",
    "channel_name",
    "check_listen",
    "listener_for",
    "sender_token",
]

logger = logging.getLogger("ship_sqla")

Listen = bool | str
"""The ``listen=`` option: True (a listener from the engine's URL), False (none: polling
only, for transaction-mode poolers), or a ``postgresql://`` URL the listener connects to
instead (e.g. the server itself, behind a pooler)."""

PROBE_TIMEOUT: Final = 5.0
"""Seconds (on the listener's clock) a probe notification may take to come back before the
listener is judged not live."""
HEALTH_INTERVAL: Final = 30.0
"""Seconds (on the listener's clock) between probes of a live listener."""
WRITABLE_HEALTH_INTERVAL: Final = 2.0
"""Seconds between probes of a live listener whose URL asks for a writable server (J24): a
server that turned read-only reports it in the replies of the next two probes, so the listener
moves to the new primary within a few seconds of a switchover."""
IO_TIMEOUT: Final = 10.0
"""Real seconds any one socket operation of the listener (connect, LISTEN, probe, close) may
take before the connection is given up and replaced."""

NOT_LIVE_BACKOFF: Final = Backoff(
    kind="exponential", base=1.0, factor=2.0, max_delay=60.0, jitter="equal"
)
"""After a listener that connected but never heard its probe (a transaction-mode pooler): 1 s
doubling to a minute, since a misconfiguration does not heal in a second."""

_ASYNCPG_DIALECT: Final = PGDialect_asyncpg()  # type: ignore[no-untyped-call]
"""Turns a ``listen=`` URL into asyncpg's connect arguments, as an engine's dialect does."""
_APPLICATION_NAME_PREFIX: Final = "ship_sqla listener"
_PROBE_APPLICATION_NAME_PREFIX: Final = "ship_sqla probe"
"""The short-lived connection that sends a new listener connection's first probe."""
_SQLALCHEMY_ONLY_ARGS: Final = (
    "async_creator_fn",
    "prepared_statement_cache_size",
    "prepared_statement_name_func",
)


class ListenerLostError(DatabaseUnavailableError):
    """A listener's connection could not be made or was lost; notifications on it may have been
    missed. It reconnects with backoff; meanwhile every waiter polls (K1). An outage like any
    other (:class:`~ship_sqla.errors.DatabaseUnavailableError`, so a ``ConnectionError``), with
    a code of its own; the driver's error is chained."""

    code = "SHIP_SQLA_LISTENER_LOST"


class ListenerNotLiveError(ConfigurationError, RuntimeError):
    """A listener's connection accepted LISTEN but its own probe notification never came back:
    nothing would be delivered on it (PgBouncer in transaction mode does exactly this). It is
    not trusted; every waiter polls (K1)."""

    code = "SHIP_SQLA_LISTENER_NOT_LIVE"


def channel_name(kind: str, table_name: str) -> str:
    """The notification channel of one table: ``<kind>:<table>``, or, when that would pass
    PostgreSQL's 63-byte limit (``pg_notify`` refuses longer names), ``<kind>:`` and a hash of
    the table's name. Every process builds the same name from the same table."""
    name = f"{kind}:{table_name}"
    if len(name.encode()) <= MAX_IDENTIFIER_BYTES:
        return name
    digest = hashlib.sha256(table_name.encode()).hexdigest()[:24]
    return f"{kind}:{digest}"


def sender_token() -> str:
    """A new store's sender id: 16 hex characters, never containing ``/``."""
    return secrets.token_hex(8)


def announcement(sender: str, key: str) -> str:
    """The payload announcing ``key`` (a job id, an outbox id) from ``sender``."""
    return f"{sender}/{key}"


def announced_key(payload: str, sender: str) -> str | None:
    """The key an announcement payload names, or None when ``sender`` sent it itself (or it is
    no announcement)."""
    origin, _, key = payload.partition("/")
    if not key or origin == sender:
        return None
    return key


def check_listen(listen: object, what: str) -> Listen:
    """Refuse a ``listen=`` that is not a bool or a PostgreSQL URL (before anything runs)."""
    if isinstance(listen, bool):
        return listen
    if isinstance(listen, str):
        _connect_args(_parsed(listen, what), _ASYNCPG_DIALECT, what)
        return listen
    raise ConfigurationError(
        f"{what}: listen= must be True, False or a postgresql:// URL, got {type(listen).__name__}.",
        fix="pass listen=False behind a transaction-mode pooler (PgBouncer), or the URL of a"
        " direct connection to the server.",
    )


def _parsed(listen: str, what: str) -> URL:
    try:
        url = make_url(listen)
    except ArgumentError as exc:
        raise ConfigurationError(
            f"{what}: listen= is not a database URL ({exc}).",
            fix="pass a URL such as 'postgresql://user@host:5432/db', True or False.",
        ) from exc
    if url.get_backend_name() != "postgresql":
        raise ConfigurationError(
            f"{what}: listen= must name a PostgreSQL server, got {url.drivername!r}.",
            fix="pass a 'postgresql://' or 'postgresql+asyncpg://' URL.",
        )
    return url


def _connect_args(url: URL, dialect: Dialect, what: str) -> dict[str, Any]:
    args, kwargs = dialect.create_connect_args(url)
    if args:  # pragma: no cover - the asyncpg dialect passes keywords only
        raise ConfigurationError(f"{what}: cannot build a listener connection from {url!r}.")
    options = dict(kwargs)
    for name in _SQLALCHEMY_ONLY_ARGS:
        options.pop(name, None)
    return options


def _read_only(connection: asyncpg.Connection | None) -> bool:
    """Whether the server of ``connection`` reported itself read-only (``in_hot_standby`` or
    ``default_transaction_read_only`` on: PostgreSQL 14+ reports both whenever they change)."""
    if connection is None:
        return False
    settings = connection.get_settings()
    return "on" in (
        getattr(settings, "in_hot_standby", None),
        getattr(settings, "default_transaction_read_only", None),
    )


def listener_for(
    database: Database,
    listen: Listen,
    *,
    name: str,
    report_error: Callable[[BaseException], None],
    clock: Clock | None = None,
    probe_timeout: float = PROBE_TIMEOUT,
) -> Listener | None:
    """The listener a store's ``listen=`` asks for, or None: ``listen=False``, or True on an
    ``AsyncConnection`` (the test path: work committed elsewhere is not this transaction's)."""
    if listen is False:
        return None
    hosts: Hosts | None = None
    if listen is True:
        if not isinstance(database, AsyncEngine):
            return None
        options = _connect_args(database.url, database.dialect, name)
        # J24: the engine's hosts: the hang check that drops its connections to a hung host
        # drops the listener's too, and the listener connects where the engine does.
        hosts = hosts_of(database)
    else:
        options = _connect_args(_parsed(listen, name), _ASYNCPG_DIALECT, name)
    if hosts is None:
        hosts = Hosts()  # J24: each host of a multi-host URL tried with a bounded connect
    settings = dict(options.pop("server_settings", None) or {})
    # Unnamed statements only: a pooler may hand the session's prepared statements to others.
    options["statement_cache_size"] = 0

    def connector(prefix: str) -> Callable[[], Awaitable[asyncpg.Connection]]:
        named = {"application_name": f"{prefix}: {name}"[:MAX_IDENTIFIER_BYTES]}
        connect_options = {**options, "server_settings": {**settings, **named}}

        async def connect() -> asyncpg.Connection:
            return await connect_any(connect_options, hosts)

        return connect

    return Listener(
        connector(_APPLICATION_NAME_PREFIX),
        name=name,
        clock=clock,
        report_error=report_error,
        probe_timeout=probe_timeout,
        probe_connect=connector(_PROBE_APPLICATION_NAME_PREFIX),
        writable_only=str(options.get("target_session_attrs")) in ("read-write", "primary"),
        hosts=hosts,
    )


class Subscription:
    """One subscriber's interest in one channel of a :class:`Listener`; ends with
    :meth:`close`."""

    __slots__ = ("_listener", "channel", "closed", "on_gap", "on_notify")

    def __init__(
        self,
        listener: Listener,
        channel: str,
        on_notify: Callable[[str], object],
        on_gap: Callable[[], object] | None,
    ) -> None:
        self._listener = listener
        self.channel = channel
        self.on_notify = on_notify
        self.on_gap = on_gap
        self.closed = False

    async def close(self) -> None:
        """Stop delivering to this subscriber. The last subscription of a listener closes its
        connection (and waits for that); the listener starts again at the next subscribe."""
        if self.closed:
            return
        self.closed = True
        await self._listener._unsubscribe(self)  # noqa: SLF001 - the listener's own half


_ABANDONED: Final[set[asyncio.Task[asyncpg.Connection]]] = set()
"""Connects a listener stopped waiting for, let finish (:func:`_whole_connect`): held here so
none is collected before it ends."""


async def _whole_connect(
    connect: Callable[[], Awaitable[asyncpg.Connection]],
) -> asyncpg.Connection:
    """``connect()``, never cancelled halfway: a caller cancelled meanwhile (its listener stops,
    or IO_TIMEOUT) returns at once and leaves the connect to end in the background, bounded by
    IO_TIMEOUT; the connection it makes then is closed. asyncpg's connect cancelled between its
    TCP connect and its first answer (``sslmode=prefer``, its default, asks for TLS first) fails
    a future nobody reads, ``ConnectionError('unexpected connection_lost() call')``, which
    asyncio hands to the event loop's exception handler ("Future exception was never
    retrieved"), and anyio's test runner raises (J11: nothing leaves the loop)."""
    task = asyncio.ensure_future(_bounded_connect(connect))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        _ABANDONED.add(task)
        task.add_done_callback(_abandoned_connect_ended)
        raise


async def _bounded_connect(
    connect: Callable[[], Awaitable[asyncpg.Connection]],
) -> asyncpg.Connection:
    async with asyncio.timeout(IO_TIMEOUT):
        return await connect()


def _abandoned_connect_ended(task: asyncio.Task[asyncpg.Connection]) -> None:
    """A connect nobody waits for any more ended: its error read (so never logged as never
    retrieved), its connection closed."""
    _ABANDONED.discard(task)
    if task.cancelled() or task.exception() is not None:
        return
    task.result().terminate()


class Listener:
    """One dedicated LISTEN connection shared by a process's subscribers (see the module
    docstring). Runs while it has subscriptions: the first :meth:`subscribe` starts it (from
    a running event loop), the last :meth:`Subscription.close` stops it.

    Subscriber callbacks run on the event loop, one call per distinct (channel, payload) of a
    burst; they must not block. A callback that raises is reported and the others still run.
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        *,
        name: str,
        report_error: Callable[[BaseException], None],
        clock: Clock | None = None,
        probe_timeout: float = PROBE_TIMEOUT,
        health_interval: float = HEALTH_INTERVAL,
        backoff: Backoff = ERROR_BACKOFF,
        not_live_backoff: Backoff = NOT_LIVE_BACKOFF,
        probe_connect: Callable[[], Awaitable[asyncpg.Connection]] | None = None,
        writable_only: bool = False,
        hosts: Hosts | None = None,
    ) -> None:
        self.name = name
        self._hosts = hosts
        """J24: the hosts whose hang check a health probe that waits keeps
        (:meth:`~ship_sqla._failover.Hosts.watch`)."""
        self._writable_only = writable_only
        """J24: the URL asks for a server that accepts writes (``target_session_attrs``
        read-write or primary): a connection whose server turned read-only is replaced."""
        self._connect = connect
        self._probe_connect = probe_connect if probe_connect is not None else connect
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._report_error = report_error
        self._probe_timeout = probe_timeout
        self._health_interval = (
            min(health_interval, WRITABLE_HEALTH_INTERVAL) if writable_only else health_interval
        )
        self._backoff = backoff
        self._not_live_backoff = not_live_backoff
        self._probe_channel = f"ship_sqla.probe:{secrets.token_hex(8)}"
        self._subscriptions: dict[str, list[Subscription]] = {}
        self._listened: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._attention = asyncio.Event()
        self._stopped = asyncio.Event()
        self._live = asyncio.Event()
        self._connection: asyncpg.Connection | None = None
        self._lost = False
        self._probe_token: str | None = None
        self._probe_heard = False
        self._probe_event = asyncio.Event()
        self._pending: dict[str, dict[str, None]] = {}
        self._flush_scheduled = False
        self._went_live = False
        self.connects = 0
        """How many connections were proven live so far (a reconnect adds one)."""

    # --- what subscribers and tests see --------------------------------------------------------

    @property
    def live(self) -> bool:
        """Whether the connection is proven to deliver notifications right now."""
        return self._live.is_set()

    @property
    def backend_pid(self) -> int | None:
        """The server process id of the live connection (None when not live): what an operator
        or a test passes to ``pg_terminate_backend``."""
        connection = self._connection
        if connection is None or not self.live:
            return None
        return int(connection.get_server_pid())

    async def wait_live(self) -> None:
        """Return once the listener is live (bound it with a timeout of your own)."""
        await self._live.wait()

    def subscribe(
        self,
        channel: str,
        on_notify: Callable[[str], object],
        *,
        on_gap: Callable[[], object] | None = None,
    ) -> Subscription:
        """Deliver every notification on ``channel`` to ``on_notify(payload)`` from now on.

        ``on_gap()`` runs each time the channel is listened on a live connection: the first
        time (K1: what committed before the listener was live was announced to nobody) and
        after each reconnect (notifications sent meanwhile may have been missed); look for
        their work then. Not when the channel is already listened on a live connection: it is
        covered from now on. Must be called from a running event loop.
        """
        _check_channel(channel)
        loop = asyncio.get_running_loop()
        subscription = Subscription(self, channel, on_notify, on_gap)
        self._subscriptions.setdefault(channel, []).append(subscription)
        self._attention.set()
        if self._task is None:
            self._start(loop)
        return subscription

    async def close(self) -> None:
        """Close every subscription and the connection."""
        for subscriptions in list(self._subscriptions.values()):
            for subscription in list(subscriptions):
                subscription.closed = True
        self._subscriptions.clear()
        await self._stop()

    # --- lifecycle ---------------------------------------------------------------------------

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._stopping = False
        self._stopped = asyncio.Event()
        self._task = loop.create_task(self._run(), name=f"ship_sqla listener [{self.name}]")

    async def _unsubscribe(self, subscription: Subscription) -> None:
        subscriptions = self._subscriptions.get(subscription.channel, [])
        if subscription in subscriptions:
            subscriptions.remove(subscription)
        if not subscriptions:
            self._subscriptions.pop(subscription.channel, None)
        if self._subscriptions:
            self._attention.set()  # UNLISTEN what nobody wants any more
            return
        await self._stop()

    async def _stop(self) -> None:
        task = self._task
        if task is None:
            return
        self._stopping = True
        self._wake_all()
        await asyncio.shield(task)
        if self._task is task:
            self._task = None
        if self._subscriptions and self._task is None:
            # Subscribed again while it was stopping: serve the newcomers.
            self._start(asyncio.get_running_loop())

    def _wake_all(self) -> None:
        self._stopped.set()
        self._attention.set()
        self._probe_event.set()

    # --- the connection loop -------------------------------------------------------------------

    async def _run(self) -> None:
        failures = 0
        while self._subscriptions and not self._stop_requested():
            self._went_live = False
            error: BaseException | None = None
            try:
                await self._serve()
            except Exception as exc:  # noqa: BLE001 - reported; the loop reconnects (J11)
                error = exc
            if self._stop_requested() or not self._subscriptions:
                break
            if error is not None:
                self._report(error)
            failures = 1 if self._went_live else failures + 1
            never_live = isinstance(error, ListenerNotLiveError)
            delay = (self._not_live_backoff if never_live else self._backoff).delay(failures)
            await wait_event(self._stopped, self._clock, delay)

    def _stop_requested(self) -> bool:
        # A call, not an attribute test: type checkers must not assume it cannot change across
        # the awaits between two reads.
        return self._stopping

    async def _serve(self) -> None:
        """One connection, from connect to its loss (raises) or the listener's stop (returns);
        ``_went_live`` says whether it was proven live."""
        connection = await self._io(_whole_connect(self._connect), "connect")
        self._lost = False
        self._connection = connection
        connection.add_termination_listener(self._on_terminated)
        try:
            await self._io(
                connection.add_listener(self._probe_channel, self._on_notification), "LISTEN"
            )
            await self._sync(connection)
            await self._probe(connection, from_elsewhere=True)
            if self._stop_requested():
                return
            self._went_live = True
            self.connects += 1
            self._live.set()
            self._gaps(self._listened)
            while True:
                self._raise_if_lost()
                if self._stop_requested():
                    return
                self._attention.clear()
                if self._dirty():
                    self._gaps(await self._sync(connection))
                    continue
                if not await wait_event(self._attention, self._clock, self._health_interval):
                    await self._probe(connection)
        except BaseException as exc:
            if self._went_live and isinstance(exc, ListenerNotLiveError):
                raise ListenerLostError(
                    f"the {self.name} listener's connection stopped delivering notifications"
                    " (its health probe did not come back).",
                    fix="nothing: it reconnects; check the network to the database if it repeats.",
                ) from exc
            raise
        finally:
            self._live.clear()
            self._connection = None
            self._listened = set()
            await self._close(connection)

    def _dirty(self) -> bool:
        return set(self._subscriptions) != self._listened

    async def _sync(self, connection: asyncpg.Connection) -> set[str]:
        """LISTEN every subscribed channel and UNLISTEN the rest; the channels newly listened."""
        wanted = set(self._subscriptions)
        for channel in sorted(self._listened - wanted):
            await self._io(connection.remove_listener(channel, self._on_notification), "UNLISTEN")
            self._listened.discard(channel)
        added: set[str] = set()
        for channel in sorted(wanted - self._listened):
            await self._io(connection.add_listener(channel, self._on_notification), "LISTEN")
            self._listened.add(channel)
            added.add(channel)
        return added

    async def _probe(self, connection: asyncpg.Connection, *, from_elsewhere: bool = False) -> None:
        """Send a notification to ourselves and wait for it: the only proof that this
        connection delivers (a transaction-mode pooler accepts LISTEN and delivers nothing).

        ``from_elsewhere`` (a new connection's first probe): send it from a short-lived
        connection of its own, another server session, as other processes' commits are. Sent
        on the listening connection itself, the probe could come back through a transaction-
        mode pooler that happened to run it on the session holding the LISTEN, while nothing
        sent by anyone else would ever reach the idle client. Once that is ruled out, the
        health probes go on the listening connection (no connection of their own)."""
        token = secrets.token_hex(8)
        self._probe_token, self._probe_heard = token, False
        self._probe_event.clear()
        overdue = None if self._hosts is None else self._hosts.watch()
        try:
            if from_elsewhere:
                await self._io(self._send_probe_from_elsewhere(token), "probe")
            else:
                await self._io(
                    connection.execute(LISTENER_PROBE.sql, self._probe_channel, token), "probe"
                )
            await wait_event(self._probe_event, self._clock, self._probe_timeout)
        finally:
            if overdue is not None:
                overdue.cancel()
        self._raise_if_lost()
        if self._stopping or self._probe_heard:
            return
        raise ListenerNotLiveError(
            f"the {self.name} listener's connection accepted LISTEN, but its probe"
            f" notification did not come back within {self._probe_timeout:g} s: notifications"
            " would not be delivered on it (a connection pooler in transaction mode, such as"
            " PgBouncer, does this). Waiters poll instead.",
            fix="pass listen=False behind a transaction-mode pooler, or listen='postgresql://"
            "...' with a direct connection to the server (or a session-mode pool).",
        )

    async def _send_probe_from_elsewhere(self, token: str) -> None:
        sender = await _whole_connect(self._probe_connect)
        try:
            await sender.execute(LISTENER_PROBE.sql, self._probe_channel, token)
        finally:
            await asyncio.shield(self._close(sender))

    def _raise_if_lost(self) -> None:
        if self._lost and not self._stopping:
            raise ListenerLostError(
                f"the {self.name} listener's connection was closed by the server or the"
                " network; notifications sent until it is back may be missed (the poll and"
                " the reconnect cover them).",
                fix="nothing: it reconnects with backoff. Check the database if it repeats.",
            )
        if self._writable_only and not self._stopping and _read_only(self._connection):
            raise ListenerLostError(
                f"the {self.name} listener's server became read-only (a standby, or a primary"
                " demoted by a failover or a switchover): commits happen elsewhere now, and"
                " their notifications would never reach it (J24).",
                fix="nothing: it reconnects to the host that accepts writes; list every host"
                " in the URL with target_session_attrs=read-write (docs/production.md,"
                " Failover).",
            )

    async def _io(self, operation: Awaitable[Any], what: str) -> Any:  # noqa: ANN401 - the driver's
        """``operation``, bounded by IO_TIMEOUT and abandoned (cancelled) when the listener
        stops meanwhile: a stop never waits for a connect to an unreachable server."""
        try:
            async with asyncio.timeout(IO_TIMEOUT):
                work = asyncio.ensure_future(operation)
                stop = asyncio.ensure_future(self._stopped.wait())
                try:
                    await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop.cancel()
                    if not work.done():
                        work.cancel()
                        await asyncio.gather(work, return_exceptions=True)
                if work.cancelled():
                    raise _StopRequestedError
                return work.result()
        except TimeoutError as exc:
            raise ListenerLostError(
                f"the {self.name} listener's {what} did not finish within {IO_TIMEOUT:g} s.",
                fix="check that the database is reachable; the listener retries with backoff.",
            ) from exc
        except _DRIVER_ERRORS as exc:
            self._raise_if_lost()
            raise ListenerLostError(
                f"the {self.name} listener's {what} failed: {type(exc).__name__}: {exc}",
                fix="check that the database is reachable with the listener's URL (the"
                " engine's, or listen=); the listener retries with backoff.",
            ) from exc

    async def _close(self, connection: asyncpg.Connection) -> None:
        if connection.is_closed():
            return
        try:
            async with asyncio.timeout(IO_TIMEOUT):
                await connection.close()
        except (TimeoutError, *_DRIVER_ERRORS):
            connection.terminate()

    # --- callbacks from the driver -------------------------------------------------------------

    def _on_terminated(self, connection: asyncpg.Connection) -> None:
        if connection is self._connection:
            self._lost = True
            self._attention.set()
            self._probe_event.set()

    def _on_notification(
        self, _connection: asyncpg.Connection, _pid: int, channel: str, payload: str
    ) -> None:
        if channel == self._probe_channel:
            if payload == self._probe_token:
                self._probe_heard = True
                self._probe_event.set()
            return
        self._pending.setdefault(channel, {})[payload] = None
        if not self._flush_scheduled:
            # The driver queued one call per notification read; this runs after all of them.
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending = self._pending, {}
        for channel, payloads in pending.items():
            for subscription in list(self._subscriptions.get(channel, ())):
                for payload in payloads:
                    if not subscription.closed:
                        self._call(subscription.on_notify, payload)

    def _gaps(self, channels: set[str]) -> None:
        """K1: ``channels`` were just listened on a live connection (its first live LISTEN, a
        reconnect's, or a channel subscribed since): their subscribers look for what was
        announced while nothing listened."""
        for channel in sorted(channels):
            for subscription in list(self._subscriptions.get(channel, ())):
                if not subscription.closed:
                    self._call(subscription.on_gap)

    def _call(self, callback: Callable[..., object] | None, *args: str) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception as exc:  # noqa: BLE001 - one subscriber must not silence the others
            self._report(exc)

    def _report(self, error: BaseException) -> None:
        try:
            self._report_error(error)
        except Exception:
            logger.exception("ship_sqla listener %s: report_error raised on %r", self.name, error)


_DRIVER_ERRORS: Final = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    # A connection the server ended mid-operation can leave the driver's protocol busy
    # ("cannot switch to state ...; another operation is in progress"): the connection is lost.
    asyncpg.InternalClientError,
)
"""What the driver raises when the listener's connection failed: reported as a lost listener."""


class _StopRequestedError(Exception):
    """The listener stopped while an operation of its connection was under way."""


def _check_channel(channel: object) -> None:
    if not isinstance(channel, str) or not channel:
        raise ConfigurationError(
            f"a notification channel must be a non-empty str, got {channel!r}.",
            fix="build it with channel_name(kind, table_name).",
        )
    if len(channel.encode()) > MAX_IDENTIFIER_BYTES:
        raise ConfigurationError(
            f"notification channel {channel[:70]!r} is over PostgreSQL's"
            f" {MAX_IDENTIFIER_BYTES} bytes (pg_notify refuses it).",
            fix="build it with channel_name(kind, table_name), which shortens long names.",
        )


ANNOUNCER_TASK: Final = "ship_sqla announcer"
"""The name of an :class:`Announcer`'s sending task."""

ANNOUNCE_ATTEMPTS: Final = 3
"""Sends of one announcement before an :class:`Announcer` gives it up (the poll covers it)."""


async def announcements_sent(timeout: float = 1.0) -> None:  # noqa: ASYNC109 - a bound, given
    """Wait, at most ``timeout`` seconds, until every announcer of this event loop has sent what
    waits (each task ends when nothing does): for a test harness about to drop its database,
    which would make the sends fail."""
    tasks = [task for task in asyncio.all_tasks() if task.get_name() == ANNOUNCER_TASK]
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)


class Announcer:
    """The sending half of K1 and K8 for one store in one process: the kernel's
    :class:`~ship_sqla.kernel._plans.announce.AnnouncePlan`, and the task that sends its
    post-commit announcements with ``send`` (the store's
    :data:`~ship_sqla._sql.notify.ANNOUNCE_AFTER_COMMIT` on a connection of its own).

    The store asks :meth:`fold` before an enqueue's statement (a (channel, payload) to NOTIFY
    in that transaction, or None) and calls :meth:`committed` after its commit. The task lives
    while something waits to be sent and ends when nothing does; it waits on the monotonic wall
    clock (an announcement is I/O, like a listener's waits), or on ``clock`` when given. A send
    that fails is reported (J11) and its keys wait again, after the error backoff, up to
    :data:`ANNOUNCE_ATTEMPTS` sends; then they are given up: a listener still finds them by
    its poll (K1). ``concurrent=False`` (a store on one test connection,
    where statements run one at a time in its transaction and no notification is ever
    delivered): folds only, nothing sent after commit.
    """

    __slots__ = (
        "_clock",
        "_concurrent",
        "_failures",
        "_pool",
        "_pool_at_commit",
        "_report_error",
        "_send",
        "_sender",
        "_task",
        "channel",
        "plan",
    )

    def __init__(
        self,
        *,
        channel: str,
        sender: str,
        send: Callable[[list[str]], Awaitable[object]],
        report_error: Callable[[BaseException], object],
        concurrent: bool = True,
        clock: Clock | None = None,
        pool: Callable[[], object] | None = None,
    ) -> None:
        self.channel = channel
        self.plan = AnnouncePlan()
        self._sender = sender
        self._send = send
        self._report_error = report_error
        self._concurrent = concurrent
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._task: asyncio.Task[None] | None = None
        self._failures = 0
        self._pool = pool
        self._pool_at_commit: object = None

    def fold(self, key: str) -> tuple[str, str] | None:
        """The (channel, payload) an enqueue of ``key`` starting now announces in its own
        transaction, or None (:meth:`committed` announces it after the commit)."""
        if not self.plan.fold(self._clock.monotonic()):
            return None
        return self.channel, announcement(self._sender, key)

    def wants_fleet_sample(self) -> bool:
        """Whether the store's next enqueue should read the table's sequence for the plan."""
        return self.plan.wants_fleet_sample(self._clock.monotonic())

    def committed(self, key: str, *, folded: bool, fleet_seq: int | None = None) -> None:
        """An enqueue of due work under ``key`` committed (``folded``: it announced itself;
        ``fleet_seq``: the table's sequence as its statement read it, or None)."""
        self.plan.committed(key, self._clock.monotonic(), folded=folded, fleet_seq=fleet_seq)
        if folded or not self._concurrent:
            return
        if self._pool is not None:
            self._pool_at_commit = self._pool()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=ANNOUNCER_TASK)

    async def _run(self) -> None:
        plan, clock = self.plan, self._clock
        try:
            while (at := plan.next_send_at(clock.monotonic())) is not None:
                delay = at - clock.monotonic()
                if delay > 0:
                    await clock.sleep(delay)
                keys = plan.take(clock.monotonic())
                if self._pool is not None and self._pool() is not self._pool_at_commit:
                    # The engine was disposed after these commits: sending would give it a
                    # new pool nobody disposes. Dropped; the listeners' polls find them (K1).
                    plan.sent(keys, ok=True)
                    continue
                try:
                    await self._send([announcement(self._sender, k) for k in keys])
                except Exception as exc:  # noqa: BLE001 - J11: reported; the poll covers them
                    self._failures += 1
                    # Tried again after the backoff, a few times; then given up: the
                    # listeners' polls find what they announced (K1).
                    retry = self._failures < ANNOUNCE_ATTEMPTS
                    plan.sent(keys, ok=not retry)
                    self._report_error(exc)
                    await clock.sleep(ERROR_BACKOFF.delay(self._failures))
                    continue
                self._failures = 0
                plan.sent(keys, ok=True)
        finally:
            self._task = None

    async def flush(self) -> None:
        """Return once everything committed so far has been sent (or given up on)."""
        while (task := self._task) is not None:
            await asyncio.shield(task)

    async def close(self) -> None:
        """Stop sending (what waits is dropped: the listeners' polls find it)."""
        task, self._task = self._task, None
        await _cancelled(task)


class Recheck:
    """A listener's second look: after the last :meth:`arm`, ``wake`` again at each of ``afters``
    seconds (on ``clock``), for the enqueues whose announcement a sender of an earlier version
    skipped (it silenced a window; :mod:`ship_sqla.kernel._plans.announce`). An
    :meth:`arm` while the rechecks are pending starts them over from the new announcement."""

    __slots__ = ("_afters", "_armed_at", "_clock", "_rearmed", "_task", "_wake")

    def __init__(
        self, wake: Callable[[], object], clock: Clock, afters: tuple[float, ...] = RECHECKS
    ) -> None:
        self._wake = wake
        self._clock = clock
        self._afters = afters
        self._armed_at = 0.0
        self._rearmed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def arm(self) -> None:
        self._armed_at = self._clock.monotonic()
        self._rearmed.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="ship_sqla listener recheck"
            )

    async def _run(self) -> None:
        try:
            armed_at, step = self._armed_at, 0
            while step < len(self._afters):
                self._rearmed.clear()
                if self._armed_at != armed_at:
                    armed_at, step = self._armed_at, 0
                remaining = armed_at + self._afters[step] - self._clock.monotonic()
                if remaining > 0:
                    await wait_event(self._rearmed, self._clock, remaining)
                    continue
                step += 1
                self._wake()
        finally:
            self._task = None

    async def close(self) -> None:
        task, self._task = self._task, None
        await _cancelled(task)


async def _cancelled(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has ended."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
