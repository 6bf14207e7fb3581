"""Failover (issue 34; SPEC J24, with J5, J6, J11, K1 and the outbox's O1, O3, O4): real worker,
relay and writer processes on a multi-host URL follow a primary's kill, hang and read-only
switchover to a promoted standby, with no restart and nothing acknowledged lost.

The servers are a private primary and streaming standby (tests/support/pg_failover.py), never the
shared server. The processes (tests/support/failover_process.py) use the public API on the URL
``postgresql+asyncpg://postgres@/db?host=127.0.0.1:P1&host=127.0.0.1:P2&target_session_attrs=
read-write`` and nothing else: WORKERS job workers, one outbox relay, and one writer whose unit of
work commits, per transaction, an app row, an outbox message (O1) and a job run (K1: its wake in
the same transaction), all with the transaction's key, and prints each acknowledged commit.

Each scenario warms up, injects one fault on the primary, promotes the standby PROMOTE_AFTER
seconds later, lets the processes run on, stops the writer, waits until every run completed and
every message was delivered on the new primary, stops the rest, and asserts:

- J24, J11: every process follows: each one's first success after the promote (the writer's
  acknowledged commit, each worker's handler start, the relay's publication) within
  RECOVERY_BOUND (10 s: the 5 s target with a margin for a loaded CI machine; the figures
  are printed), at the library's default operation timeouts (30 s: a hang is followed through
  the hang check, not the timeouts); every loop was still running at the end, and every
  process exits 0 on SIGTERM;
- J24: under synchronous replication (claims and settles synchronous when this build has the
  option), no acknowledged commit lost: every acknowledged key has its row, its message and its
  run on the new primary. Under async replication with forced lag (the matrix), every loss is a
  whole transaction: row, message and run together or none of them;
- J5, J6, O3, O4: no run executed more often than its attempts (no attempt number above the
  retry policy's) and the re-executions (the same key executed again) within the in-flight batch
  (WORKERS x max_in_flight runs, the relay's batch_size messages); nothing dead, nothing stuck;
- J11: no exception reaching the writer, the relay or an ``on_error`` that is not a
  ``ShipError`` with a Fix line;
- K1: the workers' listeners reconnected: LISTEN sessions on the new primary.

The CI test runs the three shapes under synchronous replication. ``nox -s chaos`` also runs the
replication matrix (``SHIP_SQLA_FAILOVER_MATRIX=1``): sync and async (forced lag: the standby
stops receiving LAG_COMMITS acknowledged commits before the fault), printing one ``failover:``
line per scenario (the figures of docs/production.md's failover section).

Waiting: on the processes' output lines (events); on another server's state by polling it with a
deadline. The wall-clock waits are the fault itself (PROMOTE_AFTER: a failover takes time).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import asyncpg
import attrs
import pg_failover
import pytest
from failover_process import (
    app_table,
    metadata,
    outbox_table,
    runs_table,
)
from pg_failover import FailoverPair, failover_pair
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

PROCESS = Path(__file__).parents[1] / "support" / "failover_process.py"
DATABASE = "failover"
WORKERS = 2
PROMOTE_AFTER = 1.0
"""Seconds between the fault and the promote (a failover manager's detection time)."""
RECOVERY_BOUND = 10.0
"""The assertion's bound on each process's recovery after the promote: the target (5 s) with a
margin for a loaded 2-core CI machine; the measured figures are printed. A hang is the slowest
shape: an operation that waits HANG_CHECK_AFTER (2 s) has its host probed with a new
connection, which gets HANG_PROBE_TIMEOUT (2 s) to answer; then every connection to the hung
node is dropped at once and the next connects go to the other host first (about 3 s measured
after a promote 1 s after the hang)."""
RECOVERY_TARGET = 5.0
WARM_UP = 30
"""Acknowledged commits, handler starts and publications before the fault."""
AFTER = 30
"""Acknowledged commits after the writer's recovery, before it is stopped."""
LAG_COMMITS = 40
"""Async matrix: acknowledged commits the standby does not receive before the fault."""
DRAIN_WITHIN = 45.0
CONFIG: dict[str, Any] = {
    "poll_interval": 0.5,
    "max_in_flight": 4,
    "work_seconds": 0.01,
    "lease": 3.0,
    "attempts": 10,
    "batch_size": 10,
    "writer_pace": 0.01,
    "writer_backoff": 0.1,
    "operation_timeout": 30.0,
    "due_after": 2.5,
}
"""Lease 3 s: a run claimed on the lost primary (or hung on it) is retaken soon after.
Operation timeout 30 s: the library's default bound of each statement on the server (J24); a
hang is followed by the hang check well before it. Runs and messages fall due
2.5 s after their commit (more than PROMOTE_AFTER): those committed just before the fault fall
due after the promote, so each worker and the relay has work to show it followed whatever the
writer does."""
MATRIX = bool(os.environ.get("SHIP_SQLA_FAILOVER_MATRIX"))


# --- the processes -----------------------------------------------------------------------------


@attrs.define
class Processes:
    """The writer, the workers and the relay, and every line they printed."""

    tmp_path: Path
    running: dict[str, anyio.abc.Process] = attrs.field(factory=dict)
    lines: list[dict[str, Any]] = attrs.field(factory=list)
    ended: set[str] = attrs.field(factory=set)
    """The processes whose stdout closed: died, or stopped by :meth:`stop`."""
    stopping: set[str] = attrs.field(factory=set)
    _changed: anyio.Event = attrs.field(factory=anyio.Event)

    async def start(self, name: str, url: str, config: dict[str, Any]) -> anyio.abc.Process:
        role = name.rstrip("0123456789")
        with (self.tmp_path / f"{name}.stderr").open("wb") as errors:
            process = await anyio.open_process(
                [sys.executable, str(PROCESS), role, url, json.dumps(config)], stderr=errors
            )
        self.running[name] = process
        return process

    async def read(self, name: str) -> None:
        stdout = self.running[name].stdout
        assert stdout is not None
        buffer = b""
        async for chunk in stdout:
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for line in complete:
                self.lines.append({**json.loads(line), "name": name})
            self._signal()
        self.ended.add(name)
        self._signal()

    def _signal(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def until(self, condition: Callable[[], bool], within: float, what: str) -> None:
        """Until ``condition()`` holds, re-checked at each line; fails after ``within`` s, with
        the processes' errors and stderr."""
        try:
            with anyio.fail_after(within):
                while not condition():
                    if died := self.ended - self.stopping:
                        pytest.fail(f"{what}: {sorted(died)} died\n{self.stderr_tails()}")
                    await self._changed.wait()
        except TimeoutError:
            await self.dump_tasks()
            errors = Counter(f"{line['name']}:{line['type']}" for line in self.of("error"))
            samples = {line["type"]: line["text"][:200] for line in self.of("error")}
            pytest.fail(
                f"{what}: not within {within} s; errors {dict(errors)}, samples {samples}\n"
                f"{self.stderr_tails()}"
            )

    def of(self, event: str, name: str | None = None, after: float = 0.0) -> list[dict[str, Any]]:
        return [
            line
            for line in self.lines
            if line["event"] == event
            and (name is None or line["name"] == name)
            and line["at"] >= after
        ]

    async def stop(self, name: str) -> int:
        process = self.running[name]
        self.stopping.add(name)
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            return await process.wait()

    async def dump_tasks(self) -> None:
        """Ask every live process for its tasks' stacks (SIGUSR1), for the failure report."""
        alive = [name for name, process in self.running.items() if process.returncode is None]
        for name in alive:
            self.running[name].send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 3
        for name in alive:  # a file's contents have no event to wait on
            stderr = self.tmp_path / f"{name}.stderr"
            while "tasks dumped" not in stderr.read_text(errors="replace"):
                if time.monotonic() > deadline:
                    return
                await anyio.sleep(0.05)

    def kill_all(self) -> None:
        for process in self.running.values():
            if process.returncode is None:
                process.kill()

    def stderr_tails(self) -> str:
        tails = []
        for name in self.running:
            text = (self.tmp_path / f"{name}.stderr").read_text(errors="replace")
            if text.strip():
                tails.append(f"--- {name} stderr ---\n{text[-6000:]}")
        return "\n".join(tails)


def names() -> list[str]:
    return ["writer", "relay", *(f"worker{n}" for n in range(WORKERS))]


SUCCESS = {"writer": "ack", "relay": "publish", "worker": "exec"}


# --- the database ------------------------------------------------------------------------------


async def prepare(pair: FailoverPair) -> None:
    admin = await asyncpg.connect(pair.primary.dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        await admin.close()
    engine = create_async_engine(pair.primary.url_of(DATABASE), poolclass=NullPool)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(metadata.create_all)
    finally:
        await engine.dispose()


@attrs.frozen
class Stored:
    """What the new primary holds, by writer key."""

    rows: set[str]
    messages: set[str]
    runs: set[str]
    unfinished: Counter[str]
    listeners: int


async def stored(pair: FailoverPair) -> Stored:
    engine = create_async_engine(pair.writable.url_of(DATABASE), poolclass=NullPool)
    try:
        async with engine.connect() as connection:
            rows = set((await connection.execute(select(app_table.c.key))).scalars())
            messages = set(
                (await connection.execute(select(outbox_table.c.payload["key"].astext))).scalars()
            )
            runs = set(
                (await connection.execute(select(runs_table.c.payload["key"].astext))).scalars()
            )
            unfinished: Counter[str] = Counter()
            for table, done in ((runs_table, "completed"), (outbox_table, "delivered")):
                states = select(table.c.state, func.count()).where(table.c.state != done)
                for state, count in await connection.execute(states.group_by(table.c.state)):
                    unfinished[f"{table.name}:{state}"] = count
            listeners = (
                await connection.exec_driver_sql(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name LIKE 'ship_sqla listener%'"
                )
            ).scalar_one()
    finally:
        await engine.dispose()
    return Stored(rows, messages, runs, unfinished, int(listeners))


LISTENERS = WORKERS + 1
"""The listeners on the new primary once every process followed (K1): each worker's, the
relay's."""


async def until_drained(pair: FailoverPair, processes: Processes) -> Stored:
    """Until every run completed and every message was delivered on the new primary, and every
    listener is back (polled: another process's commits and connections have no event here);
    what is there after DRAIN_WITHIN s otherwise (:func:`check` reports it)."""
    deadline = time.monotonic() + DRAIN_WITHIN
    while (now := await stored(pair)).unfinished or now.listeners < LISTENERS:
        if time.monotonic() > deadline:
            await processes.dump_tasks()
            return now
        await anyio.sleep(0.2)
    return now


# --- one scenario ------------------------------------------------------------------------------


@attrs.frozen
class Figures:
    shape: str
    mode: str
    acknowledged: int
    lost: set[str]
    half_lost: set[str]
    recovery: dict[str, float]
    reexecutions: int
    republished: int
    max_attempt: int
    bad_errors: list[dict[str, Any]]
    errors: Counter[str]
    stopped: dict[str, Any]
    exit_codes: dict[str, int]
    listeners: int
    unfinished: Counter[str]
    stuck: str
    """The processes' task stacks when something did not drain (empty otherwise)."""

    def line(self) -> str:
        worst = max(self.recovery.values())
        target = "met" if worst <= RECOVERY_TARGET else "MISSED"
        spread = ", ".join(f"{name} {s:.2f}" for name, s in sorted(self.recovery.items()))
        return (
            f"failover: {self.mode} {self.shape}: {self.acknowledged} acknowledged commits,"
            f" {len(self.lost)} lost ({len(self.half_lost)} partly), {self.reexecutions}"
            f" re-executions, {self.republished} re-publications, recovery {worst:.2f} s after"
            f" the promote, target {RECOVERY_TARGET:g} s {target}"
            f" ({spread}); errors {dict(self.errors)}"
        )


async def fault(pair: FailoverPair, shape: str) -> None:
    if shape == "kill":
        pair.kill_primary()
    elif shape == "hang":
        pair.hang_primary()
    else:
        await pair.demote_primary()


async def scenario(shape: str, *, sync: bool, tmp_path: Path) -> Figures:
    config = {**CONFIG, "synchronous_claims": sync}
    processes = Processes(tmp_path)
    with failover_pair(sync=sync) as pair:
        await prepare(pair)
        url = pair.url_of(DATABASE)
        try:
            async with anyio.create_task_group() as group:
                for name in names():
                    await processes.start(name, url, config)
                    group.start_soon(processes.read, name)
                figures = await drive(pair, processes, shape, sync=sync)
                group.cancel_scope.cancel()
        finally:
            processes.kill_all()
    return figures


async def drive(pair: FailoverPair, processes: Processes, shape: str, *, sync: bool) -> Figures:
    def warm() -> bool:
        return (
            all(
                len(processes.of(SUCCESS["worker" if n.startswith("worker") else n], n))
                >= (WARM_UP if n in {"writer", "relay"} else 1)
                for n in names()
            )
            and len(processes.of("exec")) >= WARM_UP
        )

    await processes.until(warm, 30, "the processes' warm-up")
    if not sync and shape != "switchover":  # a switchover waits for the standby by design
        await pair.pause_replication()
        lagged = len(processes.of("ack")) + LAG_COMMITS
        await processes.until(lambda: len(processes.of("ack")) >= lagged, 30, "the lag")
    await fault(pair, shape)
    await anyio.sleep(PROMOTE_AFTER)  # the failover manager's detection time
    await pair.promote_standby()
    promoted = time.time()
    recovery: dict[str, float] = {}

    def followed() -> bool:
        for name in names():
            event = SUCCESS["worker" if name.startswith("worker") else name]
            if name not in recovery and (after := processes.of(event, name, promoted)):
                recovery[name] = after[0]["at"] - promoted
        return len(recovery) == len(names())

    await processes.until(
        followed, RECOVERY_BOUND, f"every process following the {shape} (followed: {recovery})"
    )
    acked = len(processes.of("ack"))
    await processes.until(lambda: len(processes.of("ack")) >= acked + AFTER, 30, "the writes")
    exit_codes = {"writer": await processes.stop("writer")}
    now = await until_drained(pair, processes)
    for name in names()[1:]:
        exit_codes[name] = await processes.stop(name)
    return judge(shape, processes, sync=sync, now=now, recovery=recovery, exit_codes=exit_codes)


def judge(
    shape: str,
    processes: Processes,
    *,
    sync: bool,
    now: Stored,
    recovery: dict[str, float],
    exit_codes: dict[str, int],
) -> Figures:
    acked = {line["key"] for line in processes.of("ack")}
    lost = {key for key in acked if key not in now.rows}
    half = {
        key for key in acked if len({key in now.rows, key in now.messages, key in now.runs}) > 1
    }
    executions: defaultdict[str, list[int]] = defaultdict(list)
    for line in processes.of("exec"):
        executions[line["key"]].append(line["attempt"])
    publications = Counter(line["key"] for line in processes.of("publish"))
    errors = processes.of("error")
    return Figures(
        shape=shape,
        mode="sync" if sync else "async",
        acknowledged=len(acked),
        lost=lost,
        half_lost=half,
        recovery=recovery,
        reexecutions=sum(len(attempts) - 1 for attempts in executions.values()),
        republished=sum(count - 1 for count in publications.values()),
        max_attempt=max((max(attempts) for attempts in executions.values()), default=0),
        bad_errors=[line for line in errors if not line["fixed"]],
        errors=Counter(f"{line['role']}:{line['type']}" for line in errors),
        stopped={line["name"]: line["running"] for line in processes.of("stopped")},
        exit_codes=exit_codes,
        listeners=now.listeners,
        unfinished=now.unfinished,
        stuck=processes.stderr_tails() if now.unfinished or now.listeners < LISTENERS else "",
    )


def check(figures: Figures, *, sync: bool) -> list[str]:
    """Every expectation, the failures reported together with the figures."""
    failures = []
    if sync and figures.lost:
        failures.append(f"J24: {len(figures.lost)} acknowledged commits lost under sync")
    if figures.half_lost:
        failures.append(f"J24: {len(figures.half_lost)} transactions partly lost")
    if figures.max_attempt > CONFIG["attempts"]:
        failures.append(f"J6: attempt {figures.max_attempt} > {CONFIG['attempts']}")
    if sync and figures.reexecutions > WORKERS * CONFIG["max_in_flight"]:
        failures.append(f"J5: {figures.reexecutions} re-executions > the in-flight batch")
    if sync and figures.republished > CONFIG["batch_size"]:
        failures.append(f"O3: {figures.republished} re-publications > the relay's batch")
    if figures.bad_errors:
        sample = {line["type"]: line["text"] for line in figures.bad_errors}
        failures.append(f"J11: errors that are not a ShipError with a Fix line: {sample}")
    if not all(figures.stopped.get(name) for name in names()):
        failures.append(f"J11: a loop had died: {figures.stopped}")
    if any(code != 0 for code in figures.exit_codes.values()):
        failures.append(f"exit codes {figures.exit_codes}")
    if figures.unfinished:
        failures.append(f"O4, J6: not drained in {DRAIN_WITHIN} s: {dict(figures.unfinished)}")
    if figures.listeners < LISTENERS:
        failures.append(
            f"K1: {figures.listeners} of {LISTENERS} listeners on the new primary after"
            f" {DRAIN_WITHIN} s"
        )
    if failures and figures.stuck:
        failures.append(figures.stuck)
    return failures


# --- the tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape",
    [
        "kill",
        "hang",
        "switchover",
    ],
)
async def test_processes_follow_a_failover(
    shape: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """J24, J5, J6, J11, K1, O1, O3, O4: under synchronous replication, writer, workers and relay
    on a multi-host URL follow the kill, hang or read-only switchover of the primary within the
    bound of the promote, lose no acknowledged commit, re-execute at most the in-flight batch and
    see only ShipErrors with a Fix line."""
    figures = await scenario(shape, sync=True, tmp_path=tmp_path)
    with capsys.disabled():  # the measured recovery, in the CI log whatever the capture
        print(f"\n{figures.line()}")  # noqa: T201 - the figure the issue asks CI to print
    failures = check(figures, sync=True)
    assert not failures, "\n".join([figures.line(), *failures])


MATRIX_SHAPES = [
    "kill",
    "hang",
    "switchover",
]


# The replication matrix runs in `nox -s chaos` (SHIP_SQLA_FAILOVER_MATRIX=1): not collected
# otherwise, so the CI run reports no skipped test.
if MATRIX:

    @pytest.mark.parametrize("shape", MATRIX_SHAPES)
    @pytest.mark.parametrize("mode", ["sync", "async"])
    async def test_failover_replication_matrix(mode: str, shape: str, tmp_path: Path) -> None:
        """J24, O1, J6: the sync/async replication matrix, one ``failover:`` line per cell (the
        figures of docs/production.md). Sync, with ``synchronous_claims=True``: 0 acknowledged
        commits lost. Async with forced lag (the standby stops receiving LAG_COMMITS commits before
        a kill or a hang; a switchover waits for the standby by design): acknowledged transactions
        lost, each whole (row, message and run together, never a part of one). Re-executions are
        counted (bounded by the in-flight batch under sync only: under async a lost completion runs
        again), recovery printed."""
        sync = mode == "sync"
        figures = await scenario(shape, sync=sync, tmp_path=tmp_path)
        print(figures.line())  # noqa: T201 - the matrix's figures, read with -s
        failures = check(figures, sync=sync)
        if not sync and shape != "switchover" and not figures.lost:
            failures.append("the forced lag lost nothing: the lag was not forced")
        assert not failures, "\n".join([figures.line(), *failures])


def test_missing_server_binaries_fail_not_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    """J24's proof cannot pass by not running: without initdb, pg_ctl or pg_basebackup the
    failover harness fails (issue 34), whatever SHIP_SQLA_REQUIRE_PRIVATE_CLUSTER says."""
    monkeypatch.delenv("SHIP_SQLA_REQUIRE_PRIVATE_CLUSTER", raising=False)
    monkeypatch.setattr(pg_failover, "NEEDED", ("initdb", "pg_basebackup-missing-here"))
    with pytest.raises(pytest.fail.Exception, match="Fix: install the PostgreSQL server"):
        pg_failover.find_failover_bin()
