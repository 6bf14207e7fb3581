"""A real PgBouncer in transaction pooling mode in front of the test server (SPEC F7).

:func:`running_pgbouncer` writes a ``pgbouncer.ini`` of its own in a temporary directory, starts
the machine's ``pgbouncer`` (the Debian package) on a free port of 127.0.0.1, in the foreground
as a child process, and waits until it answers a query; it always stops it afterwards. Every
database of the server is reachable through it under its own name (``* = host=... port=...``),
so a test database the ship_sqla plugin made is reachable as soon as it exists.

``pool_mode = transaction`` with a few server connections per database and
``server_round_robin = 1``, so consecutive transactions of one client connection land on
different server connections as often as possible: what does not survive a change of server
connection (session state, named prepared statements, LISTEN, session advisory locks) fails
here instead of passing by luck. One more database, :data:`SINGLE` (the server's ``postgres``
database through ONE server connection), makes that handover deterministic for the tests that
show it.

PgBouncer refuses to run as root: as root it is started with ``-u postgres`` (it drops to that
user after reading its configuration; the temporary directory is handed to that user).

When ``pgbouncer`` is not installed (or cannot start), the test is skipped with the reason,
unless ``SHIP_SQLA_REQUIRE_PGBOUNCER`` is set (``.ci/run`` sets it): then it fails, because a
PgBouncer suite that silently skipped did not run in CI.

``tests/support`` is on pytest's ``pythonpath`` (pyproject.toml): import this module by its name.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn

import asyncpg
import attrs
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ship_sqla.testing import ResolvedServer

__all__ = ["CONNECT_ARGS", "SINGLE", "PgBouncer", "find_pgbouncer", "running_pgbouncer"]

CONNECT_ARGS: Final[dict[str, Any]] = {
    "statement_cache_size": 0,
    "prepared_statement_cache_size": 0,
}
"""What an engine behind PgBouncer 1.18 in transaction mode needs (docs/production.md): asyncpg's
statement cache off (its statements are then unnamed, parsed again in the same round trip as
they run) and SQLAlchemy's prepared-statement cache off. No ``prepared_statement_name_func``: a
NAMED statement prepared by an autocommitted statement is executed after PgBouncer may have
handed the server connection to someone else ("prepared statement ... does not exist")."""

SINGLE: Final = "single"
"""A database of the bouncer: the server's ``postgres`` database through one server connection,
so every client of it shares that one connection, a transaction at a time."""

POOL_SIZE: Final = 5
"""Server connections per (database, user): fewer than a worker's engine may open, so clients
share them."""

START_TIMEOUT: Final = 15.0
"""Seconds PgBouncer may take to answer its first query."""


def find_pgbouncer() -> Path | None:
    """The ``pgbouncer`` binary ($SHIP_SQLA_PGBOUNCER, then PATH, then Debian's /usr/sbin)."""
    for candidate in (
        os.environ.get("SHIP_SQLA_PGBOUNCER"),
        shutil.which("pgbouncer"),
        "/usr/sbin/pgbouncer",
    ):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def unavailable(reason: str) -> NoReturn:
    """Skip (fail when SHIP_SQLA_REQUIRE_PGBOUNCER is set): no PgBouncer here."""
    if os.environ.get("SHIP_SQLA_REQUIRE_PGBOUNCER"):
        pytest.fail(f"{reason} (SHIP_SQLA_REQUIRE_PGBOUNCER is set: the PgBouncer tests must run)")
    pytest.skip(reason)


@attrs.frozen
class PgBouncer:
    """A running PgBouncer of this test session, in transaction pooling mode."""

    root: Path
    port: int
    user: str

    @property
    def log(self) -> Path:
        return self.root / "pgbouncer.log"

    def url_of(self, database: str) -> str:
        """The asyncpg URL of ``database`` through the bouncer."""
        return f"postgresql+asyncpg://{self.user}@127.0.0.1:{self.port}/{database}"

    def engine(self, database: str, **options: Any) -> AsyncEngine:
        """An engine on ``database`` through the bouncer, with :data:`CONNECT_ARGS`."""
        return create_async_engine(self.url_of(database), connect_args=CONNECT_ARGS, **options)

    def log_tail(self) -> str:
        log = self.log
        return log.read_text(errors="replace")[-2000:] if log.exists() else "(no pgbouncer log)"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _upstream(server: ResolvedServer) -> str:
    """The [databases] connection fields that reach ``server`` (TCP, or a socket directory)."""
    url = server.url
    socket_dir = url.query.get("host")
    host = socket_dir if isinstance(socket_dir, str) else (url.host or "127.0.0.1")
    fields = f"host={host} port={url.port or 5432}"
    if url.password:
        fields += f" password={url.password}"
    return fields


def _ini(server: ResolvedServer, root: Path, port: int, user: str) -> str:
    upstream = _upstream(server)
    return f"""\
[databases]
{SINGLE} = {upstream} dbname=postgres pool_size=1
* = {upstream}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {root / "userlist.txt"}
pool_mode = transaction
default_pool_size = {POOL_SIZE}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
server_round_robin = 1
query_wait_timeout = 30
admin_users = {user}
pidfile =
logfile =
"""


async def _answers(bouncer: PgBouncer) -> bool:
    try:
        connection = await asyncpg.connect(
            host="127.0.0.1",
            port=bouncer.port,
            user=bouncer.user,
            database=SINGLE,
            statement_cache_size=0,
            timeout=2,
        )
    except (OSError, TimeoutError, asyncpg.PostgresError):
        return False
    try:
        return bool(await connection.fetchval("SELECT 1") == 1)
    finally:
        await connection.close()


def _wait_until_answering(process: subprocess.Popen[bytes], bouncer: PgBouncer) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            unavailable(f"pgbouncer exited {process.returncode} at start:\n{bouncer.log_tail()}")
        try:
            with socket.create_connection(("127.0.0.1", bouncer.port), timeout=1):
                pass
        except OSError:
            time.sleep(0.02)  # not listening yet: look again (bounded by the deadline)
            continue
        if asyncio.run(_answers(bouncer)):
            return
        time.sleep(0.02)
    unavailable(f"pgbouncer did not answer within {START_TIMEOUT} s:\n{bouncer.log_tail()}")


@contextmanager
def running_pgbouncer(server: ResolvedServer) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode in front of ``server``, answering; stopped on exit."""
    binary = find_pgbouncer()
    if binary is None:
        unavailable("pgbouncer is not installed (Debian: apt-get install -y pgbouncer)")
    run_as: list[str] = []
    owner = None
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            unavailable("running as root and no postgres user to run pgbouncer as")
        run_as = ["-u", "postgres"]
    user = server.url.username or "postgres"
    root = Path(tempfile.mkdtemp(prefix="ship_sqla_pgbouncer_"))
    bouncer = PgBouncer(root, _free_port(), user)
    process: subprocess.Popen[bytes] | None = None
    try:
        (root / "userlist.txt").write_text(f'"{user}" ""\n')
        (root / "pgbouncer.ini").write_text(_ini(server, root, bouncer.port, user))
        if owner is not None:
            for path in (root, root / "userlist.txt", root / "pgbouncer.ini"):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        with bouncer.log.open("wb") as log:
            # Foreground, logging to stderr (our file): the process is ours to stop.
            process = subprocess.Popen(
                [str(binary), *run_as, str(root / "pgbouncer.ini")],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        _wait_until_answering(process, bouncer)
        yield bouncer
    finally:
        try:
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
        finally:
            shutil.rmtree(root, ignore_errors=True)
