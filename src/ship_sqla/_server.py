"""Finding a PostgreSQL server: configured, local, or embedded (the ``embedded`` extra).

Order: ``SHIP_SQLA_DATABASE_URL``; else the local server on 127.0.0.1:5432 if it answers (unless
the caller prefers the embedded one); else an embedded PostgreSQL started from the ``pgserver``
package; else :class:`NoServerError` saying how to get one. Used by the test plugin, the demo
and the examples.

A generic ``DATABASE_URL`` is never read: it usually names the application's own database, and
the test plugin and the demo create and drop scratch databases on the server they use. Point
``SHIP_SQLA_DATABASE_URL`` at a server (or pass ``--database-url "$DATABASE_URL"``) to mean it.

The embedded server keeps its data in :func:`embedded_dir` (reused across runs; ``ship-sqla
demo --clean`` removes it). Run as root, pgserver runs PostgreSQL as a system user ``pgserver``
(created with ``useradd`` when missing) and adds ``g+rx,o+rx`` to every parent directory of the
data directory and of its own binaries; :func:`start_embedded` then keeps the data under the
temporary directory (whose parents are already traversable) and prints, before anything
changes, exactly which user and directories will change and how to undo it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

import attrs
from sqlalchemy.engine import URL, make_url

from ship_sqla.kernel._errors import ConfigurationError

__all__ = [
    "NoServerError",
    "ResolvedServer",
    "asyncpg_dsn",
    "clean_embedded",
    "directory_bytes",
    "embedded_dir",
    "resolve_server",
    "start_embedded",
    "stop_embedded",
    "to_async_url",
]

logger = logging.getLogger("ship_sqla")

LOCAL_HOST = "127.0.0.1"
LOCAL_PORT = 5432


class NoServerError(ConfigurationError, RuntimeError):
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
ROOT_EMBEDDED_DIR: Final = Path(tempfile.gettempdir()) / "ship_sqla-embedded-root"
"""The same, run as root: under the temporary directory, whose parents every user may already
traverse, so pgserver widens no permissions of root's home directory for the data."""
EMBEDDED_SYSTEM_USER: Final = "pgserver"
_TRAVERSE: Final = stat.S_IRGRP | stat.S_IROTH | stat.S_IXGRP | stat.S_IXOTH


def _as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def embedded_dir() -> Path:
    """The embedded server's default data directory for this user."""
    return ROOT_EMBEDDED_DIR if _as_root() else DEFAULT_EMBEDDED_DIR


def directory_bytes(path: Path) -> int:
    """The bytes of the files under ``path`` (0 when it does not exist; a file that vanishes
    meanwhile, or cannot be read, counts 0): what the demo says the embedded server keeps."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += (Path(root) / name).stat().st_size
            except OSError:
                continue
    return total


def _runtime_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"ship_sqla-runtime-{os.getuid()}"


def _parents_to_widen(path: Path) -> list[Path]:
    """The directories above ``path`` that pgserver, run as root, would chmod g+rx,o+rx."""
    found = []
    for parent in path.parents:
        try:
            mode = parent.stat().st_mode
        except OSError:
            continue
        if mode & _TRAVERSE != _TRAVERSE:
            found.append(parent)
    return found


def _root_notice(data_dir: Path, binaries: Path) -> str | None:
    """What pgserver is about to change outside its data directory when run as root, and how
    to undo it; None when it changes nothing there."""
    import pwd  # noqa: PLC0415 - POSIX only, and only as root

    lines = []
    try:
        pwd.getpwnam(EMBEDDED_SYSTEM_USER)
    except KeyError:
        lines.append(
            f"  - create the system user {EMBEDDED_SYSTEM_USER!r} (useradd) to run PostgreSQL;"
            f" undo: userdel {EMBEDDED_SYSTEM_USER}"
        )
    widened = sorted({*_parents_to_widen(data_dir), *_parents_to_widen(binaries)})
    if widened:
        lines.extend(
            f"  - add g+rx,o+rx to {p} (now {stat.filemode(p.stat().st_mode)});"
            f" undo: chmod go-rx {p}"
            for p in widened
        )
    lines.append(
        f"  - make {EMBEDDED_SYSTEM_USER!r} the owner of the data directory {data_dir};"
        " undo: ship-sqla demo --clean"
    )
    if len(lines) == 1 and not widened:
        return None
    return (
        "ship_sqla: starting the embedded PostgreSQL (pgserver) as root. Before it starts,"
        " pgserver will:\n" + "\n".join(lines) + "\nRun as another user to avoid this, or"
        " point SHIP_SQLA_DATABASE_URL at a server."
    )


def start_embedded(data_dir: Path | None = None, *, cleanup: str = "stop") -> ResolvedServer:
    """Start (or reuse) an embedded PostgreSQL from the ``pgserver`` package.

    ``cleanup="stop"`` stops the server when this process exits and keeps its data directory
    (the default one, :func:`embedded_dir`, is reused by the next run); ``"delete"`` removes
    the directory too. As root it first prints what pgserver changes outside that directory
    (see the module docstring).
    """
    if "XDG_RUNTIME_DIR" not in os.environ:
        # pgserver's platformdirs warns when XDG_RUNTIME_DIR is unset (CI shells) or is not a
        # private directory: give it one of ours, mode 0700 as the XDG spec asks.
        runtime = _runtime_dir()
        runtime.mkdir(mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    try:
        import pgserver  # noqa: PLC0415 - optional extra
    except ImportError as exc:
        raise NoServerError(
            "SHIP_SQLA_DATABASE_URL is not set, no local server was used, and the embedded"
            " server is not installed.",
            fix="pip install 'ship-sqla[embedded]', or start PostgreSQL on 127.0.0.1:5432, or"
            " set SHIP_SQLA_DATABASE_URL=postgresql+asyncpg://user@host:5432/postgres",
        ) from exc
    data_dir = embedded_dir() if data_dir is None else data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    if _as_root():
        notice = _root_notice(data_dir, Path(pgserver.__file__).parent)
        if notice is not None:
            print(notice, file=sys.stderr, flush=True)  # noqa: T201 - before anything changes
    server = pgserver.get_server(str(data_dir), cleanup_mode=cleanup)
    url = to_async_url(server.get_uri())
    return ResolvedServer(url=url.set(database="postgres"), source="embedded", handle=server)


def _stop_and_delete(data_dir: Path) -> None:
    """Attach to the server of ``data_dir`` (starting it if it is down), stop it and delete the
    directory: the one way pgserver stops a server other processes may share."""
    try:
        import pgserver  # noqa: PLC0415 - optional extra
    except ImportError:
        return  # no pgserver here, so no server of this directory runs from here: just remove
    pgserver.get_server(str(data_dir), cleanup_mode="delete").cleanup()


def clean_embedded(data_dir: Path | None = None) -> list[str]:
    """Stop the embedded server of ``data_dir`` (default: :func:`embedded_dir`) if it runs and
    remove its directory and this user's pgserver runtime directory; what was done, one line
    each (nothing when there was nothing to remove)."""
    data_dir = embedded_dir() if data_dir is None else data_dir
    done: list[str] = []
    if data_dir.exists():
        size = sum(f.stat().st_size for f in data_dir.rglob("*") if f.is_file())
        if (data_dir / "PG_VERSION").exists():
            _stop_and_delete(data_dir)
        if data_dir.exists():
            shutil.rmtree(data_dir)
        done.append(f"removed the embedded server's data {data_dir} ({size / 1e6:.1f} MB).")
    runtime = _runtime_dir()
    if runtime.exists():
        shutil.rmtree(runtime)
        done.append(f"removed the runtime directory {runtime}.")
    if _as_root():
        import pwd  # noqa: PLC0415 - POSIX only

        try:
            pwd.getpwnam(EMBEDDED_SYSTEM_USER)
        except KeyError:
            pass
        else:
            done.append(
                f"the system user {EMBEDDED_SYSTEM_USER!r} that pgserver created is left;"
                f" remove it with: userdel {EMBEDDED_SYSTEM_USER}"
            )
    return done


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
    configured = os.environ.get("SHIP_SQLA_DATABASE_URL")
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
