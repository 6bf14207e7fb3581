"""One database URL for every entry point: ``create_engine`` reads the URL the CLI reads.

``ship-sqla`` takes ``SHIP_SQLA_DATABASE_URL`` (or ``--database-url``) as ``postgresql://``,
``postgres://`` or ``postgresql+asyncpg://`` alike and drives it through asyncpg. SQLAlchemy's
own ``create_async_engine`` reads a bare ``postgresql://`` as psycopg's (``No module named
'psycopg'``), so an application, a handler a worker runs or a dashboard that built its engine
from the same variable needed a converter. This is it: the one normalisation (``_server``'s
``to_async_url``), then ``create_async_engine``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ship_sqla._failover import (
    HANG_CHECK_AFTER,
    HANG_PROBE_TIMEOUT,
    HOST_CONNECT_TIMEOUT,
    follow_primary,
)
from ship_sqla._server import to_async_url
from ship_sqla.kernel._errors import ConfigurationError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

__all__ = ["create_engine"]


def create_engine(
    url: str | URL,
    *,
    host_connect_timeout: float = HOST_CONNECT_TIMEOUT,
    hang_check_after: float = HANG_CHECK_AFTER,
    hang_probe_timeout: float = HANG_PROBE_TIMEOUT,
    **options: Any,  # noqa: ANN401 - create_async_engine's options
) -> AsyncEngine:
    """An ``AsyncEngine`` through asyncpg for ``url``: ``postgresql://``, ``postgres://`` and
    ``postgresql+asyncpg://`` mean the same server (as ``ship-sqla`` reads them), so one
    ``SHIP_SQLA_DATABASE_URL`` serves the CLI, the application, the worker's handlers and the
    dashboard. ``options`` go to ``create_async_engine`` (``pool_size``, ``echo``...).

    The engine follows the primary (J24, docs/production.md "Failover"): with a multi-host URL
    (``?host=h1:5432&host=h2:5432&target_session_attrs=read-write``) each host gets at most
    ``host_connect_timeout`` seconds to accept a connection before the next one is tried (the
    host that last accepted first), and a connection to a server that turned read-only is
    dropped so the pool reconnects. An operation of a ship store or unit of work that has waited
    ``hang_check_after`` seconds has the hosts checked with a new connection; one that does not
    answer within ``hang_probe_timeout`` seconds is hung: every connection to it is dropped at
    once and the other hosts are tried first. Every ship store and unit of work does the same
    to an engine built elsewhere, with the default bounds.

    A malformed URL, or one of another database (``sqlite://``, ``mysql://``), raises
    ``ConfigurationError``.
    """
    try:
        async_url = to_async_url(url)
    except (ArgumentError, ValueError) as exc:
        if isinstance(exc, ConfigurationError):
            raise
        raise ConfigurationError(
            f"{url!r} is not a database URL ({exc}).",
            fix="pass a URL such as postgresql://user:password@host:5432/dbname.",
        ) from exc
    engine = create_async_engine(async_url, **options)
    follow_primary(
        engine,
        host_connect_timeout=host_connect_timeout,
        hang_check_after=hang_check_after,
        hang_probe_timeout=hang_probe_timeout,
    )
    return engine
