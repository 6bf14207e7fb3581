"""A private primary and a streaming standby for failover tests (issue 34, SPEC J24): start both,
kill, hang or demote the primary, promote the standby; always cleaned up.

:func:`failover_pair` starts the primary with :func:`pg_cluster.private_cluster` (initdb on a free
port of 127.0.0.1 under /tmp, run as the postgres user when root), makes the standby from it with
``pg_basebackup -R`` on a port of its own, and starts it streaming. ``sync=True`` makes the
replication synchronous (``synchronous_standby_names = '*'``, ``synchronous_commit = on``): a
commit is acknowledged once the standby has it on disk. Both run with ``synchronous_commit = on``
locally, so what a test finds missing after a failover was lost by the replication mode or by
ship_sqla, never by the test server's settings.

The faults, on the primary (:class:`FailoverPair`):

- :meth:`~FailoverPair.kill_primary`: SIGKILL to the postmaster and every child (a crash: its
  address then refuses connections);
- :meth:`~FailoverPair.hang_primary`: SIGSTOP to the postmaster and every child (a partition:
  the kernel still accepts TCP connections, nothing answers on a new or an open one). Each
  child of a postmaster is a session of its own, so signalling the postmaster's process group
  would stop the postmaster alone and leave the open connections' backends serving;
- :meth:`~FailoverPair.demote_primary`: a read-only switchover's old side, the primary kept up
  with ``default_transaction_read_only = on`` (reloaded, so open sessions turn read-only at
  their next transaction), after the standby has replayed all it wrote;
- :meth:`~FailoverPair.pause_replication`: the standby stops receiving (its ``primary_conninfo``
  emptied and reloaded): under async replication every commit from then on is acknowledged by
  the primary and absent on the standby (the "forced lag" of the chaos matrix);

and :meth:`~FailoverPair.promote_standby` (``pg_ctl promote -w``). Clean-up continues a hung
primary's group before stopping it, and stops and removes both clusters whatever happened.

Unlike the fault tests' single private cluster, nothing here is ever skipped: a missing
``initdb``, ``pg_ctl`` or ``pg_basebackup`` fails the test (issue 34: a failover proof that
silently skipped did not run). The binaries are the newest /usr/lib/postgresql/<major>/bin that
has all three, else :func:`pg_cluster.find_pg_bin`'s.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import attrs
import pytest
from pg_cluster import Cluster, find_pg_bin, free_port, private_cluster

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["FailoverPair", "failover_pair", "find_failover_bin"]

NEEDED = ("initdb", "pg_ctl", "pg_basebackup", "postgres", "psql")


def find_failover_bin() -> Path:
    """PostgreSQL's binaries with everything a primary and standby need; fails (not skips)
    when there are none."""
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    if (found := find_pg_bin()) is not None:
        candidates.insert(0, found)
    for candidate in candidates:
        if all((candidate / name).exists() for name in NEEDED):
            return candidate
    pytest.fail(
        f"no PostgreSQL binaries with {', '.join(NEEDED)} (looked in"
        f" {', '.join(map(str, candidates)) or '/usr/lib/postgresql/*/bin'}): the failover test"
        " needs a primary and a streaming standby. Fix: install the PostgreSQL server package"
        " (Debian: postgresql) or set SHIP_SQLA_PG_BIN to its bin directory."
    )


def _postmaster_pid(cluster: Cluster) -> int:
    return int((cluster.data / "postmaster.pid").read_text().split("\n", 1)[0])


def _children(pid: int) -> list[int]:
    """The live children of ``pid`` (a postmaster's backends, walsenders, checkpointer...)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def _signal_cluster(cluster: Cluster, signum: int) -> int:
    """``signum`` to the postmaster, then to each of its children: every child of a postmaster
    is a session leader of its own (setsid), so the postmaster's process group is itself alone.
    Stopped or killed first, the postmaster forks no child after the list is read."""
    pid = _postmaster_pid(cluster)
    os.kill(pid, signum)
    for child in _children(pid):
        with suppress(ProcessLookupError):
            os.kill(child, signum)
    return pid


def _gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie counts: nobody here reaps the postmaster)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return "\nState:\tZ" in status


@attrs.define
class FailoverPair:
    """A primary and its streaming standby, both private to the test."""

    primary: Cluster
    standby: Cluster
    sync: bool
    hung: bool = False
    promoted: bool = False

    def url_of(self, database: str, *, first: str = "primary") -> str:
        """The multi-host SQLAlchemy URL of ``database`` (J24): both hosts, ``first`` listed
        first, ``target_session_attrs=read-write``."""
        order = [self.primary, self.standby]
        if first == "standby":
            order.reverse()
        hosts = "&".join(f"host=127.0.0.1:{cluster.port}" for cluster in order)
        return f"postgresql+asyncpg://postgres@/{database}?{hosts}&target_session_attrs=read-write"

    @property
    def writable(self) -> Cluster:
        """The cluster that takes writes now: the standby once promoted."""
        return self.standby if self.promoted else self.primary

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster and every child; returns once the postmaster died."""
        pid = _signal_cluster(self.primary, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not _gone(pid):  # a signal's delivery has no event to wait on
            assert time.monotonic() < deadline, f"postmaster {pid} survived SIGKILL"
            time.sleep(0.01)

    def hang_primary(self) -> None:
        """SIGSTOP the primary's postmaster and every child: the kernel still accepts TCP
        connections, no process answers on any connection, old or new."""
        _signal_cluster(self.primary, signal.SIGSTOP)
        self.hung = True

    async def demote_primary(self) -> None:
        """Keep the primary up read-only, after the standby replayed everything it wrote."""
        primary = await asyncpg.connect(self.primary.dsn)
        try:
            await primary.execute("ALTER SYSTEM SET default_transaction_read_only = on")
            await primary.execute("SELECT pg_reload_conf()")
            written = await primary.fetchval("SELECT pg_current_wal_lsn()::text")
        finally:
            await primary.close()
        await self.replayed(written)

    async def replayed(self, lsn: str, *, within: float = 30.0) -> None:
        """Until the standby replayed up to ``lsn`` (polled: another server's progress has no
        local event)."""
        standby = await asyncpg.connect(self.standby.dsn)
        try:
            deadline = time.monotonic() + within
            while not await standby.fetchval(
                "SELECT pg_last_wal_replay_lsn() >= CAST($1::text AS pg_lsn)", lsn
            ):
                assert time.monotonic() < deadline, f"standby never replayed up to {lsn}"
                await standby.execute("SELECT pg_sleep(0.02)")
        finally:
            await standby.close()

    async def pause_replication(self) -> None:
        """The standby stops receiving WAL (and stays stopped through its promotion)."""
        assert not self.sync, "under sync replication a paused standby blocks every commit"
        standby = await asyncpg.connect(self.standby.dsn)
        try:
            await standby.execute("ALTER SYSTEM SET primary_conninfo = ''")
            await standby.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + 10
            while await standby.fetchval("SELECT count(*) FROM pg_stat_wal_receiver"):
                assert time.monotonic() < deadline, "the standby's walreceiver did not stop"
                await standby.execute("SELECT pg_sleep(0.02)")
        finally:
            await standby.close()

    async def promote_standby(self) -> None:
        """``pg_ctl promote -w``: returns once the standby accepts writes."""
        await self.standby.ctl("-w", "-t", "30", "promote")
        self.promoted = True

    def release(self) -> None:
        """Clean-up's first step: a hung primary is killed (a stopped one never stops)."""
        if self.hung and (self.primary.data / "postmaster.pid").exists():
            with suppress(ProcessLookupError):
                _signal_cluster(self.primary, signal.SIGKILL)
            self.hung = False


def _replication_settings(*, sync: bool) -> dict[str, str]:
    return {
        "wal_level": "replica",
        "max_wal_senders": "4",
        "hot_standby": "on",
        "synchronous_commit": "on",
        "synchronous_standby_names": "'*'" if sync else "''",
        "max_connections": "60",
        "wal_sender_timeout": "5s",
        "wal_receiver_status_interval": "1s",
    }


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        pytest.fail(f"{what} exited {done.returncode}: {done.stderr.strip()[-1000:]}")


@contextmanager
def _standby_of(primary: Cluster) -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="ship_sqla_standby_"))
    standby = Cluster(root, free_port(), primary.bin)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    try:
        _run(
            standby.command(
                str(primary.bin / "pg_basebackup"),
                *("-D", str(standby.data), "-h", "127.0.0.1", "-p", str(primary.port)),
                *("-U", "postgres", "-R", "-X", "stream", "--no-sync"),
            ),
            "pg_basebackup",
        )
        conf = {
            "port": str(standby.port),
            "unix_socket_directories": f"'{root}'",
            # Promoted, it has no standby of its own: a copied '*' would block every commit.
            "synchronous_standby_names": "''",
        }
        with (standby.data / "postgresql.conf").open("a") as file:
            file.write("\n" + "".join(f"{key} = {value}\n" for key, value in conf.items()))
        _run(standby.pg_ctl("-l", str(standby.log), "-w", "-t", "60", "start"), "standby start")
        yield standby
    finally:
        try:
            if (standby.data / "postmaster.pid").exists():
                subprocess.run(
                    standby.pg_ctl("-m", "immediate", "-w", "-t", "30", "stop"),
                    capture_output=True,
                    timeout=60,
                    check=False,
                )
        finally:
            shutil.rmtree(root, ignore_errors=True)


@contextmanager
def failover_pair(*, sync: bool) -> Iterator[FailoverPair]:
    """A started primary and its streaming standby (synchronous when ``sync``), stopped and
    removed afterwards whatever happened. Returns once the standby streams (and, under sync,
    is the primary's synchronous standby)."""
    bin_dir = find_failover_bin()
    with (
        private_cluster(
            _replication_settings(sync=sync), required=True, bin_dir=bin_dir
        ) as primary,
        _standby_of(primary) as standby,
    ):
        pair = FailoverPair(primary, standby, sync=sync)
        try:
            _until_streaming(primary, sync=sync)
            yield pair
        finally:
            pair.release()


def _until_streaming(primary: Cluster, *, sync: bool) -> None:
    wanted = "sync" if sync else "async"
    query = f"SELECT count(*) FROM pg_stat_replication WHERE sync_state = '{wanted}'"
    argv = primary.command(
        str(primary.bin / "psql"), "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres"
    )
    deadline = time.monotonic() + 60
    while True:  # the walsender's state has no event a test can wait on
        done = subprocess.run(
            [*argv, "-Atc", query], capture_output=True, text=True, timeout=30, check=False
        )
        if done.stdout.strip() == "1":
            return
        if time.monotonic() > deadline:
            pytest.fail(f"the standby never streamed ({wanted}): {done.stderr}")
        time.sleep(0.05)
