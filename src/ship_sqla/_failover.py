"""Following the primary across a failover (J24), on the application's own engine.

:func:`follow_primary` wires three things into an engine, once (every ship store, unit of work and
:func:`ship_sqla.create_engine` calls it on the engine it is given):

- **a bounded connect per host** (``do_connect``): a multi-host URL
  (``postgresql+asyncpg://u@/db?host=h1:5432&host=h2:5432&target_session_attrs=read-write``)
  is connected to by :func:`connect_first_writable` instead of asyncpg's own loop. asyncpg
  tries the hosts in order under ONE total connect timeout (60 s by default), so a first host
  that never answers (a network partition, a stopped node) uses all of it and the next host is
  never tried. Here each host gets at most ``host_connect_timeout`` seconds (default
  :data:`HOST_CONNECT_TIMEOUT`) of the total, and the host that last accepted a connection is
  tried first: after a failover, new connections go straight to the new primary, and a hung
  old primary costs one bounded attempt, not one per connection;
- **a read-only server drops its connection** (``handle_error``): a write refused with SQLSTATE
  25006 on a server that is read-only for every session (``default_transaction_read_only`` or
  ``in_hot_standby`` reported on, as PostgreSQL 14+ reports both to the client: a standby, or
  a primary made read-only by a switchover) is a disconnect: SQLAlchemy invalidates the
  connection and the pool's older ones, and the next checkout connects again, to whichever
  host now accepts writes. A 25006 in a transaction the application itself began READ ONLY
  (the server reports both settings off) is left alone. The error is then
  :class:`~ship_sqla.errors.DatabaseUnavailableError` (:mod:`ship_sqla._sql_errors`), and so is
  asyncpg's "None of the hosts match the target attribute requirement";
- **a hung host is found and left** (:meth:`Hosts.watch`, :meth:`Hosts.check`): a server that
  stops answering (a network partition, a stopped node) leaves every statement on it waiting for
  its operation timeout (30 s by default), and a process holding several connections to it pays
  that more than once. So every operation of a ship store
  (:class:`~ship_sqla._scope.StoreConnections`), every statement, COMMIT and ROLLBACK of a
  unit of work, and a listener's health probe, on an engine of a multi-host URL, is watched:
  one that has waited ``hang_check_after`` seconds (default :data:`HANG_CHECK_AFTER`) has the
  hosts the engine is connected to checked, each by a NEW connection (any answer, even a
  refusal, is alive: a slow or busy server answers a connect; a long statement is no sign of a
  hang). A host that gives
  no answer within ``hang_probe_timeout`` seconds (default :data:`HANG_PROBE_TIMEOUT`, counted
  so that a stall of this process's own event loop does not count, :func:`answers`) is hung:
  every connection the engine (and its listener) holds to it is terminated at once (checked-in
  and checked-out alike: the statements waiting on them fail at once as a lost connection,
  :class:`~ship_sqla.errors.DatabaseUnavailableError`, and are retried by their callers; no
  graceful close waits on the hung server), the pool is invalidated, and the host is tried
  last by the next connects until it accepts one again. A hung primary then costs about
  ``hang_check_after + hang_probe_timeout`` (4 s) from the hang, whatever the operation
  timeouts. A merely slow server (a long statement, a lock wait, a pause shorter than those
  4 s) answers the probe and keeps its connections. A single-host URL is not watched (there is
  no other host to follow; its statements are bounded by the operation timeouts), nor is a
  unit of work made with ``operation_timeout=None``. Behind a pooler (PgBouncer) the pooler
  answers the probe itself: a hung server behind it costs the operation timeouts.

The ``handle_error`` listener is marked :data:`~ship_sqla._direct.OWN_LISTENER`: it does not
keep the direct statement path off, which applies the same rule itself
(:func:`~ship_sqla._sql_errors.server_read_only`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from typing import TYPE_CHECKING, Any, ClassVar, Final, cast

import asyncpg
from asyncpg.exceptions import PostgresError, TargetServerAttributeNotMatched
from sqlalchemy import event

from ship_sqla._direct import OWN_LISTENER
from ship_sqla._sql_errors import OUTAGE_SQLSTATES, server_read_only, sqlstate_of
from ship_sqla.kernel._durations import require_duration

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.engine import ExceptionContext
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = [
    "HANG_CHECK_AFTER",
    "HANG_PROBE_TIMEOUT",
    "HOST_CONNECT_TIMEOUT",
    "Hosts",
    "Overdue",
    "answers",
    "connect_any",
    "connect_first_writable",
    "follow_primary",
    "hosts_of",
]

HOST_CONNECT_TIMEOUT: Final = 3.0
"""Seconds one host of a multi-host URL may take to accept a connection before the next host
is tried (J24)."""

HANG_CHECK_AFTER: Final = 2.0
"""Seconds an operation on a multi-host engine's connections may wait before the hosts it is
connected to are checked for a hang (J24)."""

HANG_PROBE_TIMEOUT: Final = 2.0
"""Seconds a host being checked has to answer a new connection (any answer) before it is
declared hung and every connection to it is dropped (J24)."""

_STEP: Final = 0.1
"""The probe's wait is counted in steps of this many seconds (:func:`answers`)."""

_PROBE_NAME: Final = "ship_sqla hang check"
"""The ``application_name`` of the hang check's probe connections."""

logger = logging.getLogger("ship_sqla")

_DEFAULT_TOTAL: Final = 60.0
"""asyncpg's own total connect timeout, when the engine sets none."""

_WHERE: Final = ("host", "port", "timeout")


Host = tuple[str, Any]
"""A host of a multi-host URL and its port."""


class Hosts:
    """The hosts of one engine's multi-host URL (J24): which last accepted a connection (tried
    first next time), which were found hung (tried last until one accepts a connection again),
    the connections open to each (weakly held), and the hang check (module docstring)."""

    __slots__ = (
        "__weakref__",
        "_checked_at",
        "_open",
        "_options",
        "_probes",
        "check_after",
        "checks",
        "host_connect_timeout",
        "last_good",
        "on_drop",
        "probe_timeout",
        "suspect",
    )

    def __init__(
        self,
        host_connect_timeout: float = HOST_CONNECT_TIMEOUT,
        *,
        check_after: float = HANG_CHECK_AFTER,
        probe_timeout: float = HANG_PROBE_TIMEOUT,
    ) -> None:
        self.host_connect_timeout = host_connect_timeout
        self.check_after = check_after
        self.probe_timeout = probe_timeout
        self.last_good: Host | None = None
        self.suspect: set[Host] = set()
        """Hosts found hung, tried last until one accepts a connection again."""
        self.on_drop: list[Callable[[], object]] = []
        """Called after a hung host's connections were dropped (the engine's pool invalidated)."""
        self._open: dict[Host, weakref.WeakSet[asyncpg.Connection]] = {}
        self._options: dict[str, Any] | None = None
        self._checked_at: dict[Host, float] = {}
        self._probes: dict[Host, asyncio.Task[None]] = {}
        self.checks = 0
        """How many hang checks (probes of a host) ran so far."""

    def order(self, hosts: list[Host]) -> list[Host]:
        good = self.last_good
        first = [good] if good is not None and good in hosts else []
        rest = [h for h in hosts if h not in first]
        return (
            first
            + [h for h in rest if h not in self.suspect]
            + [h for h in rest if h in self.suspect]
        )

    def opened(self, host: Host, connection: asyncpg.Connection, options: dict[str, Any]) -> None:
        """``connection`` was made to ``host`` with asyncpg's connect ``options``."""
        self.last_good = host
        self.suspect.discard(host)
        self._open.setdefault(host, weakref.WeakSet()).add(connection)
        self._options = options

    def connected_to(self) -> list[Host]:
        """The hosts this engine holds open connections to."""
        return [h for h, open_ in self._open.items() if any(not c.is_closed() for c in open_)]

    # -- the hang check -------------------------------------------------------------------------

    def watch(self) -> Overdue | None:
        """Watch one operation (cancel the answer when it ends): each ``check_after`` seconds it
        still waits, :meth:`check`. None (nothing to watch) before any connection of a multi-host
        URL was made."""
        if not self._open:
            return None
        return Overdue(self)

    def check(self) -> None:
        """An operation is overdue: probe each host this engine is connected to (at most one
        probe per host at a time, and per ``check_after`` seconds)."""
        options = self._options
        if options is None:
            return
        loop = asyncio.get_running_loop()
        for host in self.connected_to():
            running = self._probes.get(host)
            if running is not None and not running.done() and running.get_loop() is loop:
                continue  # one probe per host at a time (one left on a closed loop is forgotten)
            if loop.time() - self._checked_at.get(host, -1e9) < self.check_after:
                continue
            self._checked_at[host] = loop.time()
            self.checks += 1
            task = loop.create_task(self._probe(host, options), name=f"ship_sqla hang check {host}")
            self._probes[host] = task

    async def _probe(self, host: Host, options: dict[str, Any]) -> None:
        try:
            alive = await answers(host, options, self.probe_timeout)
        finally:
            if self._probes.get(host) is asyncio.current_task():
                del self._probes[host]
            self._checked_at[host] = asyncio.get_running_loop().time()
        if not alive:
            self.drop(host)

    def drop(self, host: Host) -> int:
        """``host`` is hung: terminate every connection to it (no graceful close), invalidate
        the pool (:attr:`on_drop`) and try it last from now on; how many were open."""
        self.suspect.add(host)
        if self.last_good == host:
            self.last_good = None
        dropped = 0
        for connection in list(self._open.pop(host, ())):
            if not connection.is_closed():
                dropped += 1
                with contextlib.suppress(RuntimeError):  # one left on a closed event loop
                    connection.terminate()
        for callback in self.on_drop:
            callback()
        logger.warning(
            "ship_sqla: %s:%s did not answer a new connection within %g s while an operation on"
            " it waited %g s: it is taken as hung and its %d connections were dropped; the other"
            " hosts are tried first (J24)",
            *host,
            self.probe_timeout,
            self.check_after,
            dropped,
        )
        return dropped


class Overdue:
    """One watched operation (:meth:`Hosts.watch`): checks the hosts each ``check_after``
    seconds until :meth:`cancel`."""

    __slots__ = ("_handle", "_hosts")

    def __init__(self, hosts: Hosts) -> None:
        self._hosts = hosts
        self._handle = asyncio.get_running_loop().call_later(hosts.check_after, self._fire)

    def _fire(self) -> None:
        self._hosts.check()
        self._handle = asyncio.get_running_loop().call_later(self._hosts.check_after, self._fire)

    def cancel(self) -> None:
        self._handle.cancel()


async def answers(host: Host, options: dict[str, Any], within: float) -> bool:
    """Whether ``host`` answers a new connection (made with asyncpg's connect ``options``, any
    server kind) within ``within`` seconds: a connection, or any refusal from the server (too
    many clients, starting up, a wrong password) is an answer; no answer, a refused or
    unreachable address is not. The wait is counted in steps of at most twice :data:`_STEP`: a
    stall of this process's own event loop (a loaded machine) does not count as the server's."""
    rest = {k: v for k, v in options.items() if k not in _WHERE}
    rest["target_session_attrs"] = "any"
    settings = dict(rest.get("server_settings") or {})
    rest["server_settings"] = {**settings, "application_name": _PROBE_NAME}
    loop = asyncio.get_running_loop()
    rest["timeout"] = within + _DEFAULT_TOTAL  # bounded below, by the counted wait
    attempt = loop.create_task(asyncpg.connect(host=host[0], port=host[1], **rest))
    waited = 0.0
    try:
        while waited < within:
            start = loop.time()
            done, _ = await asyncio.wait({attempt}, timeout=_STEP)
            if done:
                break
            waited += min(loop.time() - start, 2 * _STEP)
    finally:
        if not attempt.done():
            attempt.cancel()
            await asyncio.gather(attempt, return_exceptions=True)
    if attempt.cancelled():
        return False
    error = attempt.exception()
    if error is None:
        probe = attempt.result()
        try:
            await probe.close(timeout=within)
        except (OSError, TimeoutError, PostgresError, asyncpg.InterfaceError):
            probe.terminate()
        return True
    return isinstance(error, PostgresError)


def hosts_of(engine: AsyncEngine) -> Hosts | None:
    """The :class:`Hosts` :func:`follow_primary` gave ``engine`` (None before)."""
    hosts = getattr(engine.sync_engine.dialect, _FOLLOWERS, None)
    return hosts if isinstance(hosts, Hosts) else None


def multi_host(options: dict[str, Any]) -> bool:
    """Whether asyncpg connect ``options`` name several hosts."""
    hosts = options.get("host")
    return isinstance(hosts, list | tuple) and len(hosts) > 1


def _host_list(options: dict[str, Any]) -> list[tuple[str, Any]]:
    hosts = list(options["host"])
    ports = options.get("port")
    if not isinstance(ports, list | tuple):
        ports = [ports] * len(hosts)
    return list(zip(hosts, ports, strict=True))


def _next_host(exc: BaseException) -> bool:
    """Whether a failed connect to one host means: try the next one (unreachable, timed out,
    not the wanted kind of server, starting up or shutting down); any other error (a wrong
    password, an unknown database) is the configuration's and is raised."""
    if isinstance(exc, OSError | TargetServerAttributeNotMatched):
        return True  # TimeoutError is an OSError
    if isinstance(exc, PostgresError):
        state = sqlstate_of(exc) or ""
        return state in OUTAGE_SQLSTATES or state.startswith("08")
    return False


async def connect_first_writable(options: dict[str, Any], hosts: Hosts) -> asyncpg.Connection:
    """An asyncpg connection to the first host of ``options`` (asyncpg's connect arguments,
    ``host`` and ``port`` lists) that accepts one matching its ``target_session_attrs``: each
    host bounded by ``hosts.host_connect_timeout`` within the total ``timeout``, the host that
    last accepted tried first. None accepting raises the last host's error, or asyncpg's
    :class:`~asyncpg.exceptions.TargetServerAttributeNotMatched` when one answered but did not
    match, naming what each host did."""
    rest = {key: value for key, value in options.items() if key not in _WHERE}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + float(options.get("timeout") or _DEFAULT_TOTAL)
    failures: list[str] = []
    last: BaseException | None = None
    unmatched = False
    for host, port in hosts.order(_host_list(options)):
        bound = min(hosts.host_connect_timeout, deadline - loop.time())
        if bound <= 0:
            failures.append(f"{host}:{port} not tried (connect timeout spent)")
            continue
        try:
            connection = await asyncpg.connect(host=host, port=port, timeout=bound, **rest)
        except Exception as exc:
            if not _next_host(exc):
                raise
            last = exc
            unmatched = unmatched or isinstance(exc, TargetServerAttributeNotMatched)
            what = "timed out" if isinstance(exc, TimeoutError) else type(exc).__name__
            failures.append(f"{host}:{port} {what}")
            continue
        hosts.opened((host, port), connection, options)
        return connection
    if unmatched or last is None:
        attrs = options.get("target_session_attrs", "any")
        raise TargetServerAttributeNotMatched(
            f"None of the hosts match the target attribute requirement {attrs!r}"
            f" ({'; '.join(failures)})"
        ) from last
    raise last


async def connect_any(options: dict[str, Any], hosts: Hosts) -> asyncpg.Connection:
    """asyncpg's connect for ``options``: through :func:`connect_first_writable` when they name
    several hosts."""
    if multi_host(options):
        return await connect_first_writable(options, hosts)
    return await asyncpg.connect(**options)


class _Creator:
    """The ``async_creator_fn`` the asyncpg dialect connects with for a multi-host URL."""

    __slots__ = ("hosts",)

    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts

    async def __call__(self, **options: Any) -> asyncpg.Connection:  # noqa: ANN401 - asyncpg's
        return await connect_first_writable(options, self.hosts)


class _Connecting:
    """The ``do_connect`` listener: a multi-host URL connects through :class:`_Creator`."""

    __slots__ = ("__weakref__", "creator")

    def __init__(self, hosts: Hosts) -> None:
        self.creator = _Creator(hosts)

    def __call__(
        self, _dialect: object, _record: object, _cargs: object, cparams: dict[str, Any]
    ) -> None:
        if multi_host(cparams) and "async_creator_fn" not in cparams:
            cparams["async_creator_fn"] = self.creator


class _ReadOnlyIsDisconnect:
    """The ``handle_error`` listener: a write refused by a read-only server is a disconnect."""

    __slots__ = ("__weakref__",)
    ship_sqla_own_listener: ClassVar[bool] = True
    """:data:`~ship_sqla._direct.OWN_LISTENER`: it keeps no statement off the direct path."""

    def __call__(self, context: ExceptionContext) -> None:
        connection = context.connection
        driver = None
        if connection is not None and not connection.invalidated:
            driver = getattr(connection.connection, "driver_connection", None)
        if server_read_only(context.original_exception, driver):
            context.is_disconnect = True
            context.invalidate_pool_on_disconnect = True


class _PoolInvalidation:
    """After a hung host's connections were terminated: every connection the engine's pool
    made before now is replaced at its next checkout (as SQLAlchemy does after a disconnect),
    not handed out closed."""

    __slots__ = ("_engine",)

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = weakref.ref(engine.sync_engine)

    def __call__(self) -> None:
        engine = self._engine()
        if engine is not None:
            # Pool._invalidate with no connection: "every connection made before now"
            # (the mirrored internal, ship_sqla._direct._MIRRORED).
            cast("Any", engine.pool)._invalidate(None, None, _checkin=False)  # noqa: SLF001


_FOLLOWERS: Final = "ship_sqla_follows_primary"

assert OWN_LISTENER == "ship_sqla_own_listener"  # noqa: S101 - the marker's name, spelled above


def follow_primary(
    engine: AsyncEngine,
    *,
    host_connect_timeout: float = HOST_CONNECT_TIMEOUT,
    hang_check_after: float = HANG_CHECK_AFTER,
    hang_probe_timeout: float = HANG_PROBE_TIMEOUT,
) -> None:
    """Make ``engine`` follow the primary (see the module docstring), once: a second call on
    the same engine (or one sharing its dialect) changes nothing."""
    timeout = require_duration(host_connect_timeout, "host_connect_timeout", maximum=3600.0)
    check_after = require_duration(hang_check_after, "hang_check_after", maximum=3600.0)
    probe_timeout = require_duration(hang_probe_timeout, "hang_probe_timeout", maximum=3600.0)
    dialect = engine.sync_engine.dialect
    if getattr(dialect, _FOLLOWERS, None) is not None:
        return
    hosts = Hosts(timeout, check_after=check_after, probe_timeout=probe_timeout)
    hosts.on_drop.append(_PoolInvalidation(engine))
    event.listen(engine.sync_engine, "do_connect", _Connecting(hosts))
    event.listen(engine.sync_engine, "handle_error", _ReadOnlyIsDisconnect())
    setattr(dialect, _FOLLOWERS, hosts)
