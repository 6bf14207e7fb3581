"""Fault tests under load with a real worker runtime: dropped connections, a restarted server
(J11), and no run lost (J6 at-least-once).

A runtime on the PostgreSQL backend executes thousands of runs while the database takes its
connections away: first with ``pg_terminate_backend`` every few hundred handler ends, then by
stopping and starting a private, throwaway PostgreSQL cluster (never the shared server other
suites use). The runtime is never restarted and its engine has no pre-ping: its loop,
heartbeater and completer report each failure to ``on_error``, back off and go on. Afterwards
every run is completed, every handler ran at least once, and a run whose handler ran twice is
explained: the backend answered "stale" to its earlier claim (the lease lapsed while the
connection was gone and a claim retook the run as a new attempt before the pending complete of
the earlier one could land).

Waiting is event-driven: the test waits for handler ends, for failed backend calls and for the
runtime's own claim passes (``anyio.fail_after`` bounds it all), never for wall-clock time.
"""

from __future__ import annotations

import re
from collections import Counter
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import anyio
import attrs
import pytest
from pg_cluster import Cluster
from pg_cluster import private_cluster as start_private_cluster
from sqlalchemy import MetaData, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from ship_sqla import start_job_runtime
from ship_sqla._jobs import (
    JobBackendTimeoutError,
    PostgresJobBackend,
    ship_job_runs_table,
    ship_job_state_table,
)

# Private on purpose: the shared SQLSTATE reader has no public name; the fault tests classify
# the driver errors an injected fault raised with the same reader the stores use.
from ship_sqla._sql_errors import sqlstate_of
from ship_sqla.kernel import Settlement
from ship_sqla.kernel._jobs import Concurrency, JobDefinition, RetryPolicy, define_job
from ship_sqla.kernel._ports import (
    ClaimBatch,
    ClaimedRun,
    ClaimRequest,
    EnqueueRequest,
    JobLeaseStaleError,
    SettleOutcome,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Iterator, Sequence

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)

LEASE = 2.0
"""Seconds. Short, so a claim whose answer a termination swallowed lapses and is retaken soon."""
POLL = 0.05


# --- observing the runtime ----------------------------------------------------------------------


class Progress:
    """Counters the test waits on, each wait ending at an event (no wall-clock polling)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._waiters: list[tuple[str, int, anyio.Event]] = []

    def bump(self, name: str) -> None:
        self.counts[name] += 1
        value = self.counts[name]
        for waiter in [w for w in self._waiters if w[0] == name and value >= w[1]]:
            self._waiters.remove(waiter)
            waiter[2].set()

    async def reach(self, name: str, value: int) -> None:
        if self.counts[name] >= value:
            return
        event = anyio.Event()
        self._waiters.append((name, value, event))
        await event.wait()


class ObservedBackend(PostgresJobBackend):
    """The real backend, telling the harness what each claim, heartbeat and settle did."""

    def __init__(self, harness: Harness, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.harness = harness

    @contextmanager
    def _observed(self, operation: str) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            self.harness.raised.append(exc)
            self.harness.progress.bump(f"{operation} failed")
            raise
        finally:
            self.harness.progress.bump(f"{operation} calls")

    async def claim(self, request: ClaimRequest) -> ClaimBatch:
        with self._observed("claim"):
            return await super().claim(request)

    async def settle(self, settlements: Sequence[Settlement]) -> list[SettleOutcome]:
        with self._observed("settle"):
            outcomes = await super().settle(settlements)
        self.harness.stale.update(
            (settlement.run.run_id, settlement.run.token)
            for settlement, outcome in zip(settlements, outcomes, strict=True)
            if outcome == "stale"
        )
        return outcomes

    async def heartbeat(self, runs: Sequence[ClaimedRun]) -> list[bool]:
        try:
            with self._observed("heartbeat"):
                alive = await super().heartbeat(runs)
        except Exception:
            self.harness.beat_failed(runs)
            raise
        self.harness.stale.update(
            (run.run_id, run.token) for run, ok in zip(runs, alive, strict=True) if not ok
        )
        return alive


@attrs.define
class Harness:
    engine: AsyncEngine
    """The runtime's engine: an ordinary pool, no pre-ping."""
    admin: AsyncEngine
    """A NullPool engine of the test's own: its checks never reuse a terminated connection."""
    work_time: float = 0.0
    """Seconds each handler spends working (0: one yield to the event loop)."""
    held: int = 0
    """The first ``held`` runs (payload n < held) end only once ``release`` is set."""
    release: anyio.Event = attrs.field(factory=anyio.Event)
    run_ids: list[str] = attrs.field(factory=list)
    """In enqueue order: ``run_ids[n]`` is the run of payload ``{"n": n}``."""
    failed_beats: Counter[tuple[str, int]] = attrs.field(factory=Counter)
    progress: Progress = attrs.field(factory=Progress)
    errors: list[BaseException] = attrs.field(factory=list)
    """What on_error received."""
    raised: list[BaseException] = attrs.field(factory=list)
    """What the backend's claim, heartbeat and settle raised."""
    executions: dict[str, list[tuple[int, int]]] = attrs.field(factory=dict)
    """run id -> (attempt, token) of every handler execution that reached its end."""
    stale: set[tuple[str, int]] = attrs.field(factory=set)
    """(run id, token) of every claim the backend answered stale (settle or heartbeat)."""

    def beat_failed(self, runs: Sequence[ClaimedRun]) -> None:
        """Count failed heartbeats per claim. Beats fall due every third of the lease, so a
        held run's fourth failed beat comes after its lease lapsed."""
        held = set(self.run_ids[: self.held])
        for run in runs:
            claim = (run.run_id, run.token)
            self.failed_beats[claim] += 1
            if run.run_id in held and self.failed_beats[claim] == 4:
                self.progress.bump("held leases lapsed")

    def backend(self) -> ObservedBackend:
        return ObservedBackend(
            self,
            database=self.engine,
            table=runs,
            state_table=state,
            queue_depth_limit=None,
            on_error=self.errors.append,
            clock=None,
            operation_timeout=10.0,
        )

    def job(self) -> JobDefinition[Any]:
        async def work(ctx: Any, payload: Any) -> None:
            if payload["n"] < self.held:
                await self.release.wait()
            await anyio.sleep(self.work_time)  # the handler's work, not a wait for an event
            self.executions.setdefault(ctx.run_id, []).append((ctx.attempt, ctx.token))
            self.progress.bump("handler ends")

        return define_job(
            "faults.work",
            work,
            payload=dict,
            concurrency=Concurrency(max=100, lease=LEASE),
            # Lost claim answers spend attempts: room for several before anything dead-letters.
            retry=RetryPolicy(attempts=10, base_delay=0.05),
        )

    async def unfinished(self) -> int | None:
        """Runs not completed yet, or None when the database could not answer this time."""
        try:
            async with self.admin.connect() as connection:
                return int(
                    (
                        await connection.execute(
                            text("SELECT count(*) FROM ship_job_runs WHERE state <> 'completed'")
                        )
                    ).scalar_one()
                )
        except (DBAPIError, OSError):
            return None

    async def until_all_completed(self) -> None:
        """Check the table after each of the runtime's claim passes until nothing is left."""
        while await self.unfinished() != 0:
            await self.progress.reach("claim calls", self.progress.counts["claim calls"] + 1)

    async def check_nothing_lost(self, total: int) -> None:
        """Every run completed; each handler ran at least once; repeats are explained."""
        async with self.admin.connect() as connection:
            by_state: dict[str, int] = dict(
                (
                    await connection.execute(
                        text("SELECT state, count(*) FROM ship_job_runs GROUP BY state")
                    )
                ).all()
            )
            attempts: dict[str, int] = dict(
                (await connection.execute(text("SELECT id, attempt FROM ship_job_runs"))).all()
            )
        assert by_state == {"completed": total}
        assert len(attempts) == total
        assert set(self.executions) == set(attempts), "a run completed without its handler"
        for run_id, executions in self.executions.items():
            tokens = [token for _, token in executions]
            assert len(set(tokens)) == len(tokens), f"one claim of {run_id} executed twice"
            assert max(attempt for attempt, _ in executions) <= attempts[run_id]
            if len(executions) > 1:
                # Only a claim the backend later called stale may have been superseded.
                refused = [t for t in tokens if (run_id, t) in self.stale]
                assert len(refused) >= len(executions) - 1, (
                    f"run {run_id} ran {len(executions)} times {executions} but only"
                    f" {len(refused)} of those claims were answered stale"
                )

    def check_errors_reported(self) -> None:
        """J11: whatever the backend raised reached on_error; nothing else went wrong."""
        assert self.raised, "the backend never failed: the fault did not reach the runtime"
        reported = {id(error) for error in self.errors}
        missed = [error for error in self.raised if id(error) not in reported]
        assert not missed, f"raised but never reported:\n{describe(missed)}"
        assert self.connection_errors(), "on_error never saw a connection error"
        unexpected = self.unexpected_errors()
        assert not unexpected, f"unexpected errors:\n{describe(unexpected)}"
        # J5: a stale report is never a false alarm: that claim of the run was superseded.
        for error in self.errors:
            if isinstance(error, JobLeaseStaleError):
                found = STALE_REPORT.search(str(error))
                assert found is not None, str(error)
                run_id, token = found["run"], int(found["token"])
                later = [t for _, t in self.executions.get(run_id, []) if t > token]
                assert later, f"stale reported for a claim nobody retook: {error}"

    def connection_errors(self) -> list[BaseException]:
        return [e for e in self.errors if is_connection_error(e)]

    def unexpected_errors(self) -> list[BaseException]:
        return [
            e
            for e in self.errors
            if not is_connection_error(e) and not isinstance(e, JobLeaseStaleError)
        ]


STALE_REPORT = re.compile(r"run '(?P<run>[^']+)' \(attempt \d+, claim token (?P<token>\d+)\)")
"""The run id and token in a JobLeaseStaleError's message (kernel/_runtime_state.stale_error)."""


def is_connection_error(error: BaseException) -> bool:
    """What a dropped connection or a restarting server looks like from the backend: a refused
    or broken socket, a connection the pool invalidated, SQLSTATE class 08 (connection
    exception) or 57P01-57P03 (terminated by the administrator, crash, shutting down or starting
    up)."""
    if isinstance(error, JobBackendTimeoutError | OSError):
        return True
    if not isinstance(error, DBAPIError):
        return False
    code = sqlstate_of(error) or ""
    return (
        error.connection_invalidated
        or isinstance(error.orig, OSError)
        or code.startswith("08")
        or code in {"57P01", "57P02", "57P03"}
    )


def describe(errors: Sequence[BaseException]) -> str:
    return "\n".join(f"{type(e).__name__}: {e}"[:300] for e in errors[:10])


async def run_under_faults(
    harness: Harness, total: int, fault: Callable[[], Coroutine[Any, Any, None]], *, within: float
) -> None:
    """Enqueue ``total`` runs, start a worker runtime, run ``fault`` beside it until it is done
    and every run is completed, then stop the runtime; all ``within`` seconds."""
    async with harness.engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = harness.backend()
    job = harness.job()
    for start in range(0, total, 1000):
        results = await backend.enqueue_many(
            job, [EnqueueRequest({"n": n}) for n in range(start, min(start + 1000, total))]
        )
        harness.run_ids.extend(str(result.run_id) for result in results)
    with anyio.fail_after(within):
        runtime = await start_job_runtime(
            [job], backend=backend, drain_timeout=5, poll_interval=POLL, max_in_flight=50
        )
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(fault)
                await harness.progress.reach("handler ends", total)
                await harness.until_all_completed()
            assert runtime.running  # the same runtime all along: it recovered by itself
        finally:
            with anyio.CancelScope(shield=True), anyio.fail_after(30):
                await runtime.stop()


# --- (a) connections terminated again and again -------------------------------------------------

TERMINATE_EVERY = 300
TERMINATE_RUNS = 3000


async def test_terminated_connections_under_load_lose_no_run(
    ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """J11: every few hundred handler ends, pg_terminate_backend drops every connection of the
    runtime's database (claims, heartbeats and completions in flight). The runtime reports the
    errors to on_error, recovers by itself (same runtime, same process) and loses no run:
    every run is completed, each handler ran at least once, and a handler that ran twice did so
    only after the backend answered one of its claims stale (J5, J6 at-least-once)."""
    admin = create_async_engine(ship_engine_url, poolclass=NullPool)
    harness = Harness(ship_engine, admin)
    waves: list[int] = []

    async def terminator() -> None:
        for threshold in range(TERMINATE_EVERY, TERMINATE_RUNS, TERMINATE_EVERY):
            await harness.progress.reach("handler ends", threshold)
            async with admin.connect() as connection:
                killed = (
                    await connection.execute(
                        text(
                            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))"
                            " FROM pg_stat_activity"
                            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                        )
                    )
                ).scalar_one()
            waves.append(int(killed))

    try:
        await run_under_faults(harness, TERMINATE_RUNS, terminator, within=40)
        assert len(waves) == TERMINATE_RUNS // TERMINATE_EVERY - 1
        assert sum(waves) > 0, "no connection was ever terminated"
        harness.check_errors_reported()
        await harness.check_nothing_lost(TERMINATE_RUNS)
    finally:
        await admin.dispose()


# --- (b) the server restarted mid-load ----------------------------------------------------------


@pytest.fixture
def private_cluster() -> Iterator[Cluster]:
    """A fresh cluster of this test alone (tests/support/pg_cluster.py), stopped and removed
    afterwards; skips when it cannot be had here."""
    with start_private_cluster() as cluster:
        yield cluster


RESTART_RUNS = 2000
RESTART_AFTER = 500


async def test_server_restart_under_load_loses_no_run(private_cluster: Cluster) -> None:
    """J11: PostgreSQL is stopped (pg_ctl stop -m fast) while a runtime works through 2,000
    runs, and started again only once the loop's claims, the completer's completes and the
    heartbeats have each failed against the dead server, and the leases of runs whose handlers
    ended during the outage have lapsed (J6). The runtime reports every failure to
    on_error, backs off, reconnects by itself (same runtime, same process, a plain pool without
    pre-ping) and loses no run: every run is completed, each handler ran at least once, and a
    repeat only follows a claim the backend answered stale (J5, J6 at-least-once)."""
    engine = create_async_engine(private_cluster.url, pool_size=5, max_overflow=10)
    admin = create_async_engine(private_cluster.url, poolclass=NullPool)
    # Runs in flight when the server goes away: the first few are held until it is down, so
    # their completes and heartbeats must meet the outage; the rest take a moment each.
    harness = Harness(engine, admin, work_time=0.005, held=10)
    back_at: list[int] = []

    async def pg_ctl(*argv: str) -> None:
        done = await anyio.run_process(private_cluster.pg_ctl(*argv), check=False)
        assert done.returncode == 0, f"pg_ctl {argv}: {done.stderr.decode(errors='replace')}"

    async def restart() -> None:
        progress = harness.progress
        await progress.reach("handler ends", RESTART_AFTER)
        await pg_ctl("-m", "fast", "-w", "stop")
        harness.release.set()
        before = progress.counts.copy()
        for operation in ("claim", "settle", "heartbeat"):
            await progress.reach(f"{operation} failed", before[f"{operation} failed"] + 1)
        # Down for longer than a lease: the held runs' leases lapse, so after the restart either
        # their pending completes land (a lapsed lease nobody retook is still current) or a
        # claim retakes them first and the handler runs again (its first claim then stale).
        await progress.reach("held leases lapsed", harness.held)
        await pg_ctl("-l", str(private_cluster.log), "-w", "start")
        back_at.append(progress.counts["handler ends"])

    try:
        await run_under_faults(harness, RESTART_RUNS, restart, within=40)
        [handled] = back_at
        assert handled < RESTART_RUNS, "the server came back after the load, not during it"
        harness.check_errors_reported()
        await harness.check_nothing_lost(RESTART_RUNS)
    finally:
        await engine.dispose()
        await admin.dispose()
