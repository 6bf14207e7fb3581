"""A private, throwaway PostgreSQL cluster for fault tests: initdb, start, restart, stop.

The fault tests stop and restart PostgreSQL; they must never touch the shared server other
suites use (127.0.0.1:5432). :func:`private_cluster` creates a cluster in a temporary directory
with ``initdb``, starts it with ``pg_ctl`` on a free port of 127.0.0.1 (its socket in its own
directory), and always stops (``-m immediate``) and removes it afterwards. Running as root, every
command runs as the ``postgres`` user through ``runuser`` (initdb and postgres refuse root).

When PostgreSQL's binaries, the postgres user or runuser are missing, the test is skipped with
the reason (never run against another server instead), unless ``SHIP_SQLA_REQUIRE_PRIVATE_CLUSTER``
is set (``.ci/run`` sets it): then it fails, because a fault suite that silently skipped did not
run in CI.

The server log carries millisecond UTC timestamps (``log_line_prefix = '%m '``), so a test can
read when the server went down and when it accepted connections again (:meth:`Cluster.events`)
on the same clock as ``time.time()`` and the database's own ``now()``.

``tests/support`` is on pytest's ``pythonpath`` (pyproject.toml): import this module by its name.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import anyio
import attrs
import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

__all__ = [
    "DEFAULT_SETTINGS",
    "Cluster",
    "find_pg_bin",
    "free_port",
    "private_cluster",
    "unavailable",
]

DEFAULT_SETTINGS: Mapping[str, str] = {
    "fsync": "off",
    "full_page_writes": "off",
    "synchronous_commit": "off",
    "max_connections": "40",
    "shared_buffers": "32MB",
}
"""Fast and good enough for a cluster that is thrown away. ``fsync``/``full_page_writes`` off
only matter if the machine crashes; ``synchronous_commit = off`` may lose the last commits on
``-m immediate`` (a test of what was committed must turn it on)."""

_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) UTC (?:\[\d+\] )?(\w+):\s+(.*)$")


def find_pg_bin() -> Path | None:
    """PostgreSQL's server binaries: $SHIP_SQLA_PG_BIN, ``pg_config --bindir``, the newest
    Debian-style /usr/lib/postgresql/<major>/bin, or pgserver's; None when there are none."""
    candidates: list[Path] = []
    if configured := os.environ.get("SHIP_SQLA_PG_BIN"):
        candidates.append(Path(configured))
    if pg_config := shutil.which("pg_config"):
        try:
            found = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=False
            )
            candidates.append(Path(found.stdout.strip()))
        except (OSError, subprocess.TimeoutExpired):
            pass
    candidates.extend(
        sorted(
            Path("/usr/lib/postgresql").glob("*/bin"),
            key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
            reverse=True,
        )
    )
    # Last: the binaries the `embedded` extra's pgserver wheel ships (a dev dependency), so the
    # fault tests run wherever the test suite's embedded fallback does.
    if (spec := importlib.util.find_spec("pgserver")) is not None and spec.origin is not None:
        candidates.append(Path(spec.origin).parent / "pginstall" / "bin")
    for candidate in candidates:
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            return candidate
    return None


@attrs.frozen
class ServerEvent:
    """One line of the server log that matters to a fault test."""

    at: datetime
    message: str


@attrs.frozen
class Cluster:
    """A throwaway PostgreSQL cluster of this test alone (the shared server is never touched)."""

    root: Path
    port: int
    bin: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    @property
    def url(self) -> str:
        """The asyncpg URL of its ``postgres`` database."""
        return self.url_of("postgres")

    def url_of(self, database: str) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}"

    @property
    def dsn(self) -> str:
        """A plain libpq/asyncpg DSN of its ``postgres`` database (for ``asyncpg.connect``)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def command(self, *argv: str) -> list[str]:
        """``argv`` as the cluster's owner: initdb and postgres refuse to run as root."""
        if os.geteuid() != 0:
            return list(argv)
        runuser = shutil.which("runuser")
        if runuser is None:
            unavailable("running as root without runuser: cannot run PostgreSQL as postgres")
        return [runuser, "-u", "postgres", "--", *argv]

    def pg_ctl(self, *argv: str) -> list[str]:
        return self.command(str(self.bin / "pg_ctl"), "-D", str(self.data), *argv)

    async def ctl(self, *argv: str) -> None:
        """Run ``pg_ctl argv`` (start and restart log to :attr:`log`; ``-w`` waits)."""
        if argv and argv[-1] in {"start", "restart"}:
            # -l: the server must not inherit our pipes (a reader would wait for their EOF).
            argv = ("-l", str(self.log), *argv)
        done = await anyio.run_process(self.pg_ctl(*argv), check=False)
        assert done.returncode == 0, (
            f"pg_ctl {' '.join(argv)} exited {done.returncode}:"
            f" {done.stderr.decode(errors='replace')}\n{self.log_tail()}"
        )

    def log_size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def events(self, since: int = 0) -> list[ServerEvent]:
        """The server log's lines from byte offset ``since`` (see :meth:`log_size`), parsed."""
        with self.log.open("rb") as log:
            log.seek(since)
            text = log.read().decode(errors="replace")
        events = []
        for line in text.splitlines():
            found = _LOG_LINE.match(line)
            if found is not None:
                at = datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
                events.append(ServerEvent(at, f"{found[2]}: {found[3]}"))
        return events

    def ready_at(self, since: int = 0) -> list[datetime]:
        """When the server accepted connections again, each time, after byte offset ``since``."""
        return [e.at for e in self.events(since) if "ready to accept connections" in e.message]

    def log_tail(self) -> str:
        log = self.log
        return log.read_text(errors="replace")[-2000:] if log.exists() else "(no server log)"


def unavailable(reason: str, *, required: bool = False) -> NoReturn:
    """Skip (fail when ``required`` or SHIP_SQLA_REQUIRE_PRIVATE_CLUSTER is set): no private
    cluster here."""
    if required:
        pytest.fail(f"{reason} (this test needs its private clusters: a failure, not a skip)")
    if os.environ.get("SHIP_SQLA_REQUIRE_PRIVATE_CLUSTER"):
        pytest.fail(f"{reason} (SHIP_SQLA_REQUIRE_PRIVATE_CLUSTER is set: fault tests must run)")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run(argv: list[str], what: str, cluster: Cluster, *, required: bool = False) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        unavailable(f"private PostgreSQL cluster: {what} failed to run: {exc}", required=required)
    if done.returncode != 0:
        unavailable(
            f"private PostgreSQL cluster: {what} exited {done.returncode}:"
            f" {done.stderr.strip()[-500:]}\n{cluster.log_tail()}",
            required=required,
        )


@contextmanager
def private_cluster(
    settings: Mapping[str, str] | None = None,
    *,
    required: bool = False,
    bin_dir: Path | None = None,
) -> Iterator[Cluster]:
    """A fresh, started cluster; ``settings`` are added to (and override) DEFAULT_SETTINGS in
    postgresql.conf. Always stopped and removed afterwards; skips when it cannot be had here
    (fails instead when ``required``). ``bin_dir``: these binaries rather than
    :func:`find_pg_bin`'s."""
    bin_dir = bin_dir or find_pg_bin()
    if bin_dir is None:
        unavailable(
            "no PostgreSQL server binaries (initdb, pg_ctl): cannot start a private one",
            required=required,
        )
    owner = None
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            unavailable(
                "running as root and no postgres user to own a private cluster"
                " (create one: useradd --system postgres)",
                required=required,
            )
    root = Path(tempfile.mkdtemp(prefix="ship_sqla_pg_"))
    cluster = Cluster(root, free_port(), bin_dir)
    started = False
    try:
        if owner is not None:
            os.chown(root, owner.pw_uid, owner.pw_gid)
        _run(
            cluster.command(
                str(bin_dir / "initdb"),
                "-D",
                str(cluster.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ),
            "initdb",
            cluster,
            required=required,
        )
        conf = {
            **DEFAULT_SETTINGS,
            **(settings or {}),
            "port": str(cluster.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{root}'",
            "log_line_prefix": "'%m '",
            "log_timezone": "'UTC'",
        }
        with (cluster.data / "postgresql.conf").open("a") as file:
            file.write("\n" + "".join(f"{key} = {value}\n" for key, value in conf.items()))
        started = True
        _run(
            cluster.pg_ctl("-l", str(cluster.log), "-w", "start"),
            "pg_ctl start",
            cluster,
            required=required,
        )
        yield cluster
    finally:
        try:
            if started and (cluster.data / "postmaster.pid").exists():
                subprocess.run(
                    cluster.pg_ctl("-m", "immediate", "-w", "-t", "30", "stop"),
                    capture_output=True,
                    timeout=60,
                    check=False,
                )
        finally:
            shutil.rmtree(root, ignore_errors=True)
