"""Finding a PostgreSQL server: configured, local, or embedded (the ``embedded`` extra).

Order: ``SHIP_SQLA_DATABASE_URL`` (or ``DATABASE_URL``); else the local server on
127.0.0.1:5432 if it answers; else an embedded PostgreSQL started from the ``pgserver`` package;
else :class:`NoServerError` saying how to get one. Used by the test plugin, the demo and the CLI.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import attrs
from sqlalchemy.engine import URL, make_url

from ship_sqla.kernel import ShipError

__all__ = [
    "NoServerError",
    "ResolvedServer",
    "asyncpg_dsn",
    "resolve_server",
    "start_embedded",
    "stop_embedded",
    "to_async_url",
]

logger = logging.getLogger("ship_sqla")

LOCAL_HOST = "127.0.0.1"
LOCAL_PORT = 5432


class NoServerError(ShipError, RuntimeError):
    """No PostgreSQL server could be found or started."""

    code = "SHIP_SQLA_NO_DATABASE_SERVER"


@attrs.frozen
class ResolvedServer:
    """An admin URL (database ``postgres``) and where it came from."""

    url: URL
    source: str  # "environment" | "local" | "embedded"
    handle: Any = attrs.field(default=None, eq=False, repr=False)

    def database_url(self, database: str) -> URL:
        return self.url.set(database=database)


def to_async_url(url: str | URL) -> URL:
    """Normalise ``postgresql://`` / ``postgres://`` / ``postgresql+psycopg://`` to asyncpg."""
    text = str(url) if isinstance(url, URL) else url
    if text.startswith("postgres://"):
        text = "postgresql://" + text[len("postgres://") :]
    parsed = make_url(text)
    if parsed.get_backend_name() != "postgresql":
        raise NoServerError(
            f"the database URL names backend {parsed.get_backend_name()!r};"
            " ship_sqla needs PostgreSQL.",
            fix="set SHIP_SQLA_DATABASE_URL=postgresql+asyncpg://user@host:5432/dbname",
        )
    return parsed.set(drivername="postgresql+asyncpg")


def asyncpg_dsn(url: URL) -> dict[str, Any]:
    """Keyword arguments for ``asyncpg.connect`` equivalent to a SQLAlchemy URL."""
    kwargs: dict[str, Any] = {
        "user": url.username,
        "password": url.password,
        "database": url.database,
    }
    host = url.query.get("host")
    kwargs["host"] = host if isinstance(host, str) else (url.host or LOCAL_HOST)
    if url.port is not None:
        kwargs["port"] = url.port
    return kwargs


def _local_answers() -> bool:
    try:
        with socket.create_connection((LOCAL_HOST, LOCAL_PORT), timeout=1.0):
            pass
    except OSError:
        return False
    return asyncio.run(
        _can_connect(make_url(f"postgresql+asyncpg://postgres@{LOCAL_HOST}:{LOCAL_PORT}/postgres"))
    )


async def _can_connect(url: URL) -> bool:
    import asyncpg  # noqa: PLC0415 - only needed when probing

    try:
        connection = await asyncpg.connect(**asyncpg_dsn(url), timeout=5)
    except (TimeoutError, OSError, asyncpg.PostgresError):
        return False
    await connection.close()
    return True


DEFAULT_EMBEDDED_DIR = Path.home() / ".cache" / "ship_sqla" / "embedded"
"""Where the embedded server keeps its data unless told otherwise: reused across runs."""


def start_embedded(data_dir: Path | None = None, *, cleanup: str = "stop") -> ResolvedServer:
    """Start (or reuse) an embedded PostgreSQL from the ``pgserver`` package.

    ``cleanup="stop"`` stops the server when this process exits and keeps its data directory
    (the default one is reused by the next run); ``"delete"`` removes the directory too.
    """
    if "XDG_RUNTIME_DIR" not in os.environ:
        # pgserver's platformdirs warns when XDG_RUNTIME_DIR is unset (CI shells) or is not a
        # private directory: give it one of ours, mode 0700 as the XDG spec asks.
        runtime = Path(tempfile.gettempdir()) / f"ship_sqla-runtime-{os.getuid()}"
        runtime.mkdir(mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    try:
        import pgserver  # noqa: PLC0415 - optional extra
    except ImportError as exc:
        raise NoServerError(
            "no PostgreSQL server answers on 127.0.0.1:5432, SHIP_SQLA_DATABASE_URL is not set,"
            " and the embedded server is not installed.",
            fix="pip install 'ship-sqla[embedded]', or start PostgreSQL, or set"
            " SHIP_SQLA_DATABASE_URL=postgresql+asyncpg://user@host:5432/postgres",
        ) from exc
    data_dir = DEFAULT_EMBEDDED_DIR if data_dir is None else data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(str(data_dir), cleanup_mode=cleanup)
    url = to_async_url(server.get_uri())
    return ResolvedServer(url=url.set(database="postgres"), source="embedded", handle=server)


def resolve_server(
    *,
    embedded_dir: Path | None = None,
    embedded_cleanup: str = "stop",
    prefer_embedded: bool = False,
) -> ResolvedServer:
    """Find a server as the module docstring describes.

    ``prefer_embedded`` skips the local probe (the demo's default: it runs the same on a machine
    with or without a server); ``SHIP_SQLA_EMBEDDED=1`` does the same for the test plugin.
    """
    for variable in ("SHIP_SQLA_DATABASE_URL", "DATABASE_URL"):
        configured = os.environ.get(variable)
        if configured:
            return ResolvedServer(url=to_async_url(configured), source="environment")
    skip_local = prefer_embedded or os.environ.get("SHIP_SQLA_EMBEDDED") == "1"
    if not skip_local and _local_answers():
        return ResolvedServer(
            url=make_url(f"postgresql+asyncpg://postgres@{LOCAL_HOST}:{LOCAL_PORT}/postgres"),
            source="local",
        )
    return start_embedded(embedded_dir, cleanup=embedded_cleanup)


def stop_embedded(server: ResolvedServer) -> None:
    """Stop an embedded server this process started; a failure is logged, not raised."""
    if server.handle is None:
        return
    try:
        server.handle.cleanup()
    except Exception:
        logger.exception("ship_sqla: stopping the embedded PostgreSQL failed")
