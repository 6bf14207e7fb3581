"""The fault suite (issue #10 item 9): a job worker and an outbox relay, each in its own real
process, ride through PostgreSQL restarts and a 15 s stop of a cluster this module owns.

The server is a private cluster (tests/support/pg_cluster.py: initdb on a free port, run as the
postgres user when the suite runs as root), never the shared server on 5432. It keeps
``synchronous_commit = on`` so an immediate restart (a crash) loses no committed transaction:
what the suite counts as lost is lost by ship_sqla, not by the test's server settings.

Each test preloads runs and messages, starts a worker process (``start_job_runtime`` on
``create_job_backend``) and a relay process (``start_outbox_relay``), lets them work, injects
one fault, and asserts:

- nothing lost or stuck: every run completed and every message delivered, each with at least one
  side effect, within :data:`SETTLE_WITHIN` seconds of the server's return, nothing dead;
- duplicates: none for the fast restart; at most one in-flight batch (the relay's
  ``batch_size``, the worker's ``max_in_flight``) for the immediate restart and the stop;
- recovery: the first run completed and the first message completed after the server
  accepted connections again come within :data:`RECOVERY_WITHIN` (2 s). The server's return is
  read from its own log ("ready to accept connections"), the completions from ``finished_at`` /
  ``delivered_at``: all on the server's clock;
- no process dies: both are alive at the end, their runtime / relay still running, both exit 0
  on SIGTERM after a graceful stop, with no traceback on stderr.

Side effects are counted from the processes' stdout (one JSON line per handler end and per
published message, see tests/support/fault_process.py), not from the database being restarted.
Every expectation is checked and the failures are reported together, with the measured figures,
so a failure of the job runtime does not hide the relay's figures or the other way round.

Waiting: for processes' side effects by reading their output (events); for the final database
state by polling it with a deadline (another process's commits have no local event). The one
wall-clock wait is the fault itself: a 15 s stop lasts 15 s.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import asyncpg
import attrs
import pytest
from pg_cluster import Cluster, private_cluster
from sqlalchemy import MetaData, func, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from ship_sqla import (
    create_job_backend,
    create_outbox,
    define_job,
    ship_job_runs_table,
    ship_job_state_table,
    ship_outbox_table,
)
from ship_sqla.jobs import Concurrency, EnqueueRequest, RetryPolicy
from ship_sqla.outbox import OutboxIntent

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

PROCESS = Path(__file__).parents[1] / "support" / "fault_process.py"
OUTBOX_ID = "faults"
JOB_ID = "faults.work"

RUNS = 500
MESSAGES = 500
BEFORE_FAULT = 100
"""Side effects each process must have produced before the fault is injected."""
STOP_SECONDS = 15.0
RECOVERY_WITHIN = 2.0
SETTLE_WITHIN = 30.0

WORKER: dict[str, Any] = {
    "poll_interval": 0.2,
    "max_in_flight": 10,
    "work_seconds": 0.02,
    "lease": 5.0,
    "attempts": 20,
}
"""Lease 5 s: shorter than the 15 s stop, so in-flight leases lapse during it."""
RELAY: dict[str, Any] = {
    "batch_size": 20,
    "lease": 5.0,
    "poll_interval": 0.5,
    "work_seconds": 0.005,
}


# --- the cluster -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """One private cluster for the module; each test uses a database of its own on it."""
    with private_cluster({"synchronous_commit": "on", "max_connections": "60"}) as owned:
        yield owned


# --- the processes -----------------------------------------------------------------------------


@attrs.define
class Process:
    """A worker or relay process and what its stdout said."""

    role: str
    process: anyio.abc.Process
    stderr: Path
    effects: Counter[str] = attrs.field(factory=Counter)
    """id -> side effects (handler ends or publications)."""
    stopped: dict[str, Any] | None = None
    ready: anyio.Event = attrs.field(factory=anyio.Event)
    _changed: anyio.Event = attrs.field(factory=anyio.Event)

    def record(self, line: dict[str, Any]) -> None:
        event = line["event"]
        if event == "ready":
            self.ready.set()
        elif event == "stopped":
            self.stopped = line
        else:
            self.effects[line["id"]] += 1
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def read(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                self.record(json.loads(line))

    async def until_distinct(self, count: int) -> None:
        """Until side effects for ``count`` distinct ids arrived, re-checked at each line."""
        while self.distinct < count:
            await self._changed.wait()

    @property
    def distinct(self) -> int:
        return len(self.effects)

    @property
    def duplicates(self) -> int:
        return sum(count - 1 for count in self.effects.values())


async def start(role: str, url: str, config: dict[str, Any], tmp_path: Path) -> Process:
    stderr = tmp_path / f"{role}.stderr"
    with stderr.open("wb") as errors:
        process = await anyio.open_process(
            [sys.executable, str(PROCESS), role, url, json.dumps(config)], stderr=errors
        )
    return Process(role, process, stderr)


async def stop(process: Process) -> int | None:
    """SIGTERM, then the exit code (None: it had died already and was not asked)."""
    if process.process.returncode is not None:
        return None
    process.process.send_signal(signal.SIGTERM)
    with anyio.fail_after(30):
        return await process.process.wait()


# --- the database ------------------------------------------------------------------------------

metadata = MetaData()
outbox_table = ship_outbox_table(metadata)
runs_table = ship_job_runs_table(metadata)
state_table = ship_job_state_table(metadata)


async def prepare(cluster: Cluster, database: str) -> AsyncEngine:
    """A fresh database with the ship tables, RUNS runs and MESSAGES messages waiting."""
    admin = await asyncpg.connect(cluster.dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{database}"')
        await admin.execute(f'CREATE DATABASE "{database}"')
    finally:
        await admin.close()
    engine = create_async_engine(cluster.url_of(database), poolclass=NullPool)
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    outbox = create_outbox(database=engine, table=outbox_table)
    await outbox.enqueue_many(
        OUTBOX_ID, [OutboxIntent("faults.message", {"n": n}) for n in range(MESSAGES)]
    )
    backend = create_job_backend(database=engine, table=runs_table, state_table=state_table)

    async def work(ctx: Any, payload: Any) -> None:
        raise AssertionError

    job = define_job(
        JOB_ID,
        work,
        payload=dict,
        concurrency=Concurrency(max=WORKER["max_in_flight"], lease=WORKER["lease"]),
        retry=RetryPolicy(attempts=WORKER["attempts"]),
    )
    await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(RUNS)])
    return engine


@attrs.frozen
class Final:
    """The database once the processes settled (or the deadline passed)."""

    runs: dict[str, str]
    """run id -> state"""
    messages: dict[str, str]
    """message id -> state"""
    first_completed: datetime | None
    first_delivered: datetime | None


async def final_state(engine: AsyncEngine, after: datetime) -> Final:
    async with engine.connect() as connection:
        runs = dict((await connection.execute(select(runs_table.c.id, runs_table.c.state))).all())
        messages = {
            str(message_id): status
            for message_id, status in (
                await connection.execute(select(outbox_table.c.id, outbox_table.c.state))
            ).all()
        }
        first_completed = (
            await connection.execute(
                select(func.min(runs_table.c.finished_at)).where(
                    runs_table.c.state == "completed", runs_table.c.finished_at > after
                )
            )
        ).scalar_one()
        first_delivered = (
            await connection.execute(
                select(func.min(outbox_table.c.delivered_at)).where(
                    outbox_table.c.state == "delivered", outbox_table.c.delivered_at > after
                )
            )
        ).scalar_one()
    return Final(runs, messages, first_completed, first_delivered)


async def until_settled(engine: AsyncEngine, after: datetime) -> Final:
    """Poll the database (another process's commits raise no local event) until every run is
    completed and every message delivered, or SETTLE_WITHIN passed; the last state either way."""
    deadline = time.monotonic() + SETTLE_WITHIN
    while True:
        state = await final_state(engine, after)
        finished = set(state.runs.values()) == {"completed"} and set(state.messages.values()) == {
            "delivered"
        }
        if finished or time.monotonic() > deadline:
            return state
        await anyio.sleep(0.1)


# --- the faults --------------------------------------------------------------------------------


async def fast_restart(cluster: Cluster) -> None:
    await cluster.ctl("-m", "fast", "-w", "restart")


async def immediate_restart(cluster: Cluster) -> None:
    await cluster.ctl("-m", "immediate", "-w", "restart")


async def stop_for_15_seconds(cluster: Cluster) -> None:
    await cluster.ctl("-m", "fast", "-w", "stop")
    await anyio.sleep(STOP_SECONDS)  # the fault itself: the server stays down this long
    await cluster.ctl("-w", "start")


@attrs.frozen
class Fault:
    name: str
    inject: Callable[[Cluster], Awaitable[None]]
    duplicates_allowed: bool


FAULTS = [
    Fault("fast_restart", fast_restart, duplicates_allowed=False),
    Fault("immediate_restart", immediate_restart, duplicates_allowed=True),
    Fault("stop_15s", stop_for_15_seconds, duplicates_allowed=True),
]


# --- the checks --------------------------------------------------------------------------------


@attrs.frozen
class Outcome:
    worker: Process
    relay: Process
    state: Final
    back_at: datetime
    """When the server accepted connections again (its log, its clock)."""
    alive: dict[str, bool]
    """Per role: still running when the test was done (before SIGTERM)."""
    exits: dict[str, int | None]


def lost_or_stuck(outcome: Outcome) -> list[str]:
    """J6, O4: every run completed and every message delivered, each with a side effect."""
    state, problems = outcome.state, []
    not_completed = Counter(s for s in state.runs.values() if s != "completed")
    not_delivered = Counter(s for s in state.messages.values() if s != "delivered")
    if len(state.runs) != RUNS or not_completed:
        problems.append(f"worker: runs not completed {SETTLE_WITHIN:g} s after: {not_completed}")
    if len(state.messages) != MESSAGES or not_delivered:
        problems.append(f"relay: messages not delivered {SETTLE_WITHIN:g} s after: {not_delivered}")
    if missing := set(state.runs) - set(outcome.worker.effects):
        problems.append(f"worker: {len(missing)} runs never executed, e.g. {sorted(missing)[:3]}")
    if missing := set(state.messages) - set(outcome.relay.effects):
        problems.append(f"relay: {len(missing)} messages never published")
    return problems


def too_many_duplicates(outcome: Outcome, fault: Fault, figures: dict[str, Any]) -> list[str]:
    """None for a fast restart; at most one in-flight batch for the others."""
    worker, relay, problems = outcome.worker, outcome.relay, []
    figures["duplicates"] = {"runs": worker.duplicates, "messages": relay.duplicates}
    for process, bound in ((worker, WORKER["max_in_flight"]), (relay, RELAY["batch_size"])):
        allowed = bound if fault.duplicates_allowed else 0
        if process.duplicates > allowed:
            problems.append(
                f"{process.role}: {process.duplicates} duplicate side effects, more than"
                f" {allowed} ({'one in-flight batch' if allowed else 'none allowed'})"
            )
    return problems


def slow_recovery(outcome: Outcome, figures: dict[str, Any]) -> list[str]:
    """The first completion after the server's return within RECOVERY_WITHIN (server clock)."""
    problems, seconds_by_role = [], {}
    firsts = {"worker": outcome.state.first_completed, "relay": outcome.state.first_delivered}
    for role, first in firsts.items():
        if first is None:
            problems.append(f"{role}: nothing completed after the server's return")
            continue
        seconds = (first - outcome.back_at).total_seconds()
        seconds_by_role[role] = round(seconds, 3)
        if seconds > RECOVERY_WITHIN:
            problems.append(
                f"{role}: first completion {seconds:.2f} s after the server's return"
                f" (bound {RECOVERY_WITHIN:g} s)"
            )
    figures["recovery_s"] = seconds_by_role
    return problems


def died(outcome: Outcome, figures: dict[str, Any]) -> list[str]:
    """J11: both processes alive at the end, their loops running, a clean exit 0 on SIGTERM."""
    problems = []
    for process in (outcome.worker, outcome.relay):
        role, stopped = process.role, process.stopped or {}
        figures[f"{role}_errors"] = dict(stopped.get("errors", {}))
        stderr = process.stderr.read_text(errors="replace")
        if not outcome.alive[role] or outcome.exits[role] != 0:
            problems.append(
                f"{role}: alive {outcome.alive[role]}, exit {outcome.exits[role]}: {stderr[-1500:]}"
            )
        if not stopped.get("running"):
            problems.append(f"{role}: its loop was not running at the end: {stopped}")
        if "Traceback" in stderr:
            problems.append(f"{role}: a traceback on stderr:\n{stderr[-1500:]}")
    return problems


# --- the test ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
async def test_worker_and_relay_ride_through_the_fault(
    fault: Fault, cluster: Cluster, tmp_path: Path, record_property: Any
) -> None:
    """J6, J11, O3, O4 under faults: a worker process and a relay process run through a
    PostgreSQL fast restart, immediate restart, or 15 s stop. No run or message is lost or
    stuck; duplicates are 0 for the fast restart and at most one in-flight batch otherwise;
    each resumes within 2 s of the server's return; neither process dies."""
    database = f"faults_{fault.name}"
    engine = await prepare(cluster, database)
    url = cluster.url_of(database)
    worker = await start("worker", url, WORKER, tmp_path)
    relay = await start("relay", url, RELAY, tmp_path)
    processes = (worker, relay)
    figures: dict[str, Any] = {"fault": fault.name}
    try:
        async with anyio.create_task_group() as readers:
            for process in processes:
                readers.start_soon(process.read)
            with anyio.fail_after(60):
                for process in processes:
                    await process.ready.wait()
                    await process.until_distinct(BEFORE_FAULT)
            log_offset = cluster.log_size()
            await fault.inject(cluster)
            events = cluster.events(log_offset)
            ready = [e.at for e in events if "ready to accept connections" in e.message]
            assert ready, f"the server never came back:\n{cluster.log_tail()}"
            back_at = ready[-1]
            figures["outage_s"] = round((back_at - events[0].at).total_seconds(), 2)
            figures["left_at_return"] = {
                "runs": RUNS - worker.distinct,
                "messages": MESSAGES - relay.distinct,
            }
            state = await until_settled(engine, back_at)
            alive = {p.role: p.process.returncode is None for p in processes}
            exits = {p.role: await stop(p) for p in processes}
            # Leaving the task group waits for the readers to reach the end of each output.
    finally:
        for process in processes:
            if process.process.returncode is None:
                process.process.kill()
        await engine.dispose()

    outcome = Outcome(worker, relay, state, back_at, alive, exits)
    problems = [
        *lost_or_stuck(outcome),
        *too_many_duplicates(outcome, fault, figures),
        *slow_recovery(outcome, figures),
        *died(outcome, figures),
    ]
    record_property("figures", json.dumps(figures))
    print(f"fault suite figures: {json.dumps(figures)}")  # noqa: T201 - the documented figures
    assert not problems, "\n".join([json.dumps(figures), *problems])
