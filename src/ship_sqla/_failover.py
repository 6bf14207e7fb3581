"""Following the primary across a failover (J24), on the application's own engine.

:func:`follow_primary` wires two hooks into an engine, once (every ship store, unit of work and
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
  asyncpg's "None of the hosts match the target attribute requirement".

The ``handle_error`` listener is marked :data:`~ship_sqla._direct.OWN_LISTENER`: it does not
keep the direct statement path off, which applies the same rule itself
(:func:`~ship_sqla._sql_errors.server_read_only`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, ClassVar, Final

import asyncpg
from asyncpg.exceptions import PostgresError, TargetServerAttributeNotMatched
from sqlalchemy import event

from ship_sqla._direct import OWN_LISTENER
from ship_sqla._sql_errors import OUTAGE_SQLSTATES, server_read_only, sqlstate_of
from ship_sqla.kernel._durations import require_duration

if TYPE_CHECKING:
    from sqlalchemy.engine import ExceptionContext
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = [
    "HOST_CONNECT_TIMEOUT",
    "Hosts",
    "connect_any",
    "connect_first_writable",
    "follow_primary",
]

HOST_CONNECT_TIMEOUT: Final = 3.0
"""Seconds one host of a multi-host URL may take to accept a connection before the next host
is tried (J24)."""

_DEFAULT_TOTAL: Final = 60.0
"""asyncpg's own total connect timeout, when the engine sets none."""

_WHERE: Final = ("host", "port", "timeout")


class Hosts:
    """Which host of a multi-host URL last accepted a connection: tried first next time."""

    __slots__ = ("host_connect_timeout", "last_good")

    def __init__(self, host_connect_timeout: float = HOST_CONNECT_TIMEOUT) -> None:
        self.host_connect_timeout = host_connect_timeout
        self.last_good: tuple[str, Any] | None = None

    def order(self, hosts: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        good = self.last_good
        if good is None or good not in hosts:
            return hosts
        return [good, *(h for h in hosts if h != good)]


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
        hosts.last_good = (host, port)
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


_FOLLOWERS: Final = "ship_sqla_follows_primary"

assert OWN_LISTENER == "ship_sqla_own_listener"  # noqa: S101 - the marker's name, spelled above


def follow_primary(
    engine: AsyncEngine, *, host_connect_timeout: float = HOST_CONNECT_TIMEOUT
) -> None:
    """Make ``engine`` follow the primary (see the module docstring), once: a second call on
    the same engine (or one sharing its dialect) changes nothing."""
    timeout = require_duration(host_connect_timeout, "host_connect_timeout", maximum=3600.0)
    dialect = engine.sync_engine.dialect
    if getattr(dialect, _FOLLOWERS, None) is not None:
        return
    hosts = Hosts(timeout)
    event.listen(engine.sync_engine, "do_connect", _Connecting(hosts))
    event.listen(engine.sync_engine, "handle_error", _ReadOnlyIsDisconnect())
    setattr(dialect, _FOLLOWERS, hosts)
