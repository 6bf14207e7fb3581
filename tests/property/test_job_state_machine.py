"""The PostgreSQL job backend against the in-memory model, step by step (J1-J7).

Hypothesis drives both backends with the same calls (enqueue, enqueue_many, claim as worker A or B,
heartbeat, operator cancel of any run and pause / resume of a job (K2, K3), settle batches (complete
/ fail of any kind / release, one kind or mixed) with a current or stale token, a handler's outcome
(an exception, TerminalError, a non-retryable type, RetryAfter, Snooze, a timeout) turned into its
settlement by the runtime's own rule, the frozen clock moving past leases, operator retry / discard
through the admin ports, cleanup through the one operator surface) and after every step checks that
the database equals the model and that the backend's invariants hold.

Hypothesis has no async rules, so the sync rules drive the async backends through one event loop
kept for the whole test (an anyio blocking portal); one engine per test on a database created
for it; the tables are truncated between examples. ``SHIP_SQLA_HYPOTHESIS_PROFILE=large`` runs
many more examples.
"""

from __future__ import annotations

import os
from collections.abc import Coroutine, Iterator
from datetime import timedelta
from typing import Any, ClassVar, TypeVar

import attrs
import pytest
from anyio.from_thread import BlockingPortal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from job_helpers import claim_request
from machine_support import Claim, module_database, normalized, run_machine
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._admin import run_record
from ship_sqla._jobs._backend import PostgresJobBackend
from ship_sqla._jobs._sql import JobStatements
from ship_sqla._jobs._sql.admin import GET_RUN
from ship_sqla._sql import Template
from ship_sqla.errors import JobTimeoutError, RetryAfter, Snooze, TerminalError
from ship_sqla.kernel import Settlement, completed, failed, released
from ship_sqla.kernel._jobs import Concurrency, IdempotencyPolicy, RetryPolicy, define_job
from ship_sqla.kernel._memory.jobs import InMemoryJobBackend
from ship_sqla.kernel._operations import JobOperations, create_job_operations
from ship_sqla.kernel._ports import (
    TERMINAL_STATES,
    ClaimedRun,
    EnqueueRequest,
    EnqueueResult,
    RunRecord,
)
from ship_sqla.kernel._runtime.executor import raised_settlement
from ship_sqla.testing import FrozenClock, ResolvedServer

# Private on purpose: databases made here carry the pytest plugin's own prefix
# (ship_sqla_test_), so any left behind are recognisable as test databases.

T = TypeVar("T")

LARGE = os.environ.get("SHIP_SQLA_HYPOTHESIS_PROFILE") == "large"
SETTINGS = settings(
    max_examples=300 if LARGE else 25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
DEPTH_LIMIT = 4

metadata = MetaData()
runs_table = ship_job_runs_table(metadata)
state_table = ship_job_state_table(metadata)
ALL_RUNS = JobStatements(runs="ship_job_runs", state="ship_job_state")[
    Template(GET_RUN.sql.replace("WHERE r.id = :id", "ORDER BY r.id"))
]


async def noop(ctx: Any, payload: Any) -> None:
    return None


def allow(permission: str, operation: str) -> bool:
    return True


PLAIN = define_job(
    "plain",
    noop,
    payload=dict,
    concurrency=Concurrency(max=2, lease=10),
    # No jitter: the handler-outcome rule computes each retry time twice (model, database).
    retry=RetryPolicy(attempts=3, max_snoozes=2, jitter="none"),
)
KEYED = define_job(
    "keyed",
    noop,
    payload=dict,
    concurrency=Concurrency(max=3, lease=6, single_runner=True, key=lambda p: p["key"]),
    retry=RetryPolicy(attempts=2, max_snoozes=1, non_retryable=(KeyError,), jitter="none"),
    idempotency=IdempotencyPolicy(key=lambda p: f"n{p['n'] % 3}"),
)
JOBS_BY_ID = {PLAIN.id: PLAIN, KEYED.id: KEYED}
RAISED = st.sampled_from(["error", "terminal", "non-retryable", "retry-after", "snooze", "timeout"])
FAIL_KINDS = st.sampled_from(["failure", "terminal", "retry-after", "timeout"])


def _raised(name: str) -> BaseException:
    """One exception a handler may end an attempt with (K4, K5)."""
    if name == "terminal":
        return TerminalError("bad input")
    if name == "non-retryable":
        return KeyError("gone")  # KEYED names it non-retryable; PLAIN retries it
    if name == "retry-after":
        return RetryAfter(4, "rate limited")
    if name == "snooze":
        return Snooze(2, "not ready")
    if name == "timeout":
        return JobTimeoutError("ran past its timeout")
    return ValueError("boom")


JOBS = st.sampled_from([PLAIN, KEYED])
WORKERS = st.sampled_from(["A", "B"])
PICKS = st.integers(min_value=0, max_value=10_000)


def _claimed_view(run: ClaimedRun) -> tuple[Any, ...]:
    return (
        run.run_id,
        run.job_id,
        run.payload,
        run.attempt,
        run.max_attempts,
        run.key,
        run.lease_expires_at,
        run.created_at,
        run.snoozes,
        run.priority,
    )


class JobBackendMachine(RuleBasedStateMachine):
    portal: ClassVar[BlockingPortal]
    engine: ClassVar[AsyncEngine]

    def __init__(self) -> None:
        super().__init__()
        self.run(self._truncate())
        self.clock = FrozenClock()
        self.pg: PostgresJobBackend = create_job_backend(
            database=self.engine,
            table=runs_table,
            state_table=state_table,
            clock=self.clock,
            queue_depth_limit=DEPTH_LIMIT,
        )
        self.model = InMemoryJobBackend(
            clock=self.clock, queue_depth_limit=DEPTH_LIMIT, live_only=False
        )
        self.pg_ops: JobOperations = create_job_operations(self.pg, authorizer=allow)
        self.model_ops: JobOperations = create_job_operations(self.model, authorizer=allow)
        self.claims: list[Claim] = []
        self.tokens: dict[str, int] = {}
        self.counter = 0
        self.seen: dict[str, str] = {}
        self.retried: set[str] = set()
        # K2: runs an operator cancelled while they ran: never waiting or dead again.
        self.cancel_requested: set[str] = set()

    # --- plumbing --------------------------------------------------------------------------------

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        async def awaited() -> T:
            return await coroutine

        return self.portal.call(awaited)

    async def _truncate(self) -> None:
        async with self.engine.begin() as connection:
            await connection.execute(text("TRUNCATE ship_job_runs, ship_job_state"))

    async def _pg_records(self) -> list[RunRecord]:
        async with self.engine.connect() as connection:
            return [run_record(row) for row in await connection.execute(ALL_RUNS)]

    def pg_records(self) -> dict[str, RunRecord]:
        return {r.run_id: r for r in self.run(self._pg_records())}

    def next_id(self) -> str:
        self.counter += 1
        return f"run-{self.counter:05d}"

    def pick(self, index: int, stale: bool = False) -> Claim:
        """A recorded claim: one whose token is current, or with ``stale`` preferably one whose
        run is running under a newer token (the zombie J5 fences out), else any stale one."""
        current: list[Claim] = []
        superseded: list[Claim] = []
        model = {record.run_id: record for record in self.model.runs()}
        for claim in self.claims:
            record = model.get(claim.pg.run_id)
            if record is None or record.state != "running":
                continue
            if self.tokens[claim.pg.run_id] == claim.pg.token:
                current.append(claim)
            else:
                superseded.append(claim)
        pool = (superseded or [c for c in self.claims if c not in current]) if stale else current
        pool = pool or self.claims
        return pool[index % len(pool)]

    def known_ids(self) -> list[str]:
        return sorted(self.pg_records())

    # --- enqueue -------------------------------------------------------------------------------

    def _request(
        self, dedupe: str | None, delay: int, key: str, priority: int | None = None
    ) -> EnqueueRequest:
        payload = {"n": self.counter, "key": key}
        run_at = self.clock.now() + timedelta(seconds=delay) if delay else None
        return EnqueueRequest(
            payload=payload,
            dedupe_key=dedupe,
            run_at=run_at,
            run_id=self.next_id(),
            priority=priority,
        )

    @initialize()
    def some_runs(self) -> None:
        for job in (PLAIN, KEYED):
            self.enqueue(job, [(None, 0, "x"), (None, 0, "y")], repeat_id=False)

    @rule(
        job=JOBS,
        specs=st.lists(
            st.tuples(
                st.none() | st.sampled_from(["d1", "d2"]),
                st.sampled_from([0, 0, 5]),
                st.sampled_from(["x", "y"]),
                # K6: claims must agree on the order priority, run_at, creation.
                st.sampled_from([None, None, 0, 2, -1]),
            ),
            min_size=1,
            max_size=4,
        ),
        repeat_id=st.booleans(),
    )
    def enqueue(
        self, job: Any, specs: list[tuple[Any, int, str, int | None]], repeat_id: bool
    ) -> None:
        """One request through ``enqueue``, several through ``enqueue_many``."""
        requests = [self._request(*spec) for spec in specs]
        if len(requests) == 1:
            [request] = requests
            waiting_before = self.model.waiting_count(job.id)
            kwargs = {
                "dedupe_key": request.dedupe_key,
                "run_at": request.run_at,
                "run_id": request.run_id,
                "priority": request.priority,
            }
            expected = self.run(self.model.enqueue(job, request.payload, **kwargs))
            actual = self.run(self.pg.enqueue(job, request.payload, **kwargs))
            assert actual == expected
            if waiting_before >= DEPTH_LIMIT and not actual.deduplicated:
                assert actual.rejected == "queue-full"  # J2
            return
        if repeat_id:
            requests[-1] = attrs.evolve(requests[-1], run_id=requests[0].run_id)
        many: list[EnqueueResult] = self.run(self.model.enqueue_many(job, requests))
        assert self.run(self.pg.enqueue_many(job, requests)) == many

    # --- claim and settle ----------------------------------------------------------------------

    @rule(
        job=JOBS,
        worker=WORKERS,
        limit=st.integers(min_value=1, max_value=3),
        exclude=st.sampled_from([(), ("x",)]),
    )
    def claim(self, job: Any, worker: str, limit: int, exclude: tuple[str, ...]) -> None:
        request = claim_request(job, worker=worker, limit=limit, exclude_keys=exclude)
        expected = self.run(self.model.claim(request))
        actual = self.run(self.pg.claim(request))
        assert [_claimed_view(r) for r in actual] == [_claimed_view(r) for r in expected]
        # J6, J10: both answer the same dead-lettered runs, for the runtime to report and count.
        assert sorted(actual.buried, key=str) == sorted(expected.buried, key=str)
        for pg_run, model_run in zip(actual, expected, strict=True):
            # J5: every claim draws a token above any earlier holder's of the same run.
            assert pg_run.token > self.tokens.get(pg_run.run_id, 0)
            self.tokens[pg_run.run_id] = pg_run.token
            self.claims.append(Claim(pg_run, model_run, worker))

    @precondition(lambda self: self.claims)
    @rule(
        op=st.sampled_from(["heartbeat", "complete", "fail", "release", "mixed"]),
        picks=st.lists(st.tuples(PICKS, st.booleans()), min_size=1, max_size=3),
        retry_in=st.none() | st.sampled_from([0, 3]),
        error=st.none() | st.sampled_from(["e1", "e2"]),
        kinds=st.lists(st.sampled_from(["complete", "fail", "release"]), min_size=3, max_size=3),
        fail_kind=FAIL_KINDS,
    )
    def settle(  # noqa: PLR0917 - Hypothesis draws each argument
        self,
        op: str,
        picks: list[tuple[int, bool]],
        retry_in: int | None,
        error: str | None,
        kinds: list[str],
        fail_kind: Any,
    ) -> None:
        """heartbeat / complete take a batch; fail / release the first pick; mixed settles a
        batch of every kind in one call (one statement on PostgreSQL). A pick is a current claim
        or (flag) a stale one; whatever the backends answer must agree, and a stale answer must
        leave the row as it was (J5)."""
        chosen = [self.pick(i, stale) for i, stale in picks]
        before = self.pg_records()
        if op == "heartbeat":
            expected: list[Any] = self.run(self.model.heartbeat([c.model for c in chosen]))
            actual: list[Any] = self.run(self.pg.heartbeat([c.pg for c in chosen]))
            assert actual == expected
            # K2: both answer the same held runs as cancel-requested.
            assert actual.cancel_requested == expected.cancel_requested  # type: ignore[attr-defined]
            stale_flags = [not ok for ok in actual]
            now = self.clock.now()
            for claim, ok in zip(chosen, actual, strict=True):
                record = before.get(claim.pg.run_id)
                lapsed = record is not None and (
                    record.lease_expires_at is None or record.lease_expires_at <= now
                )
                assert not (ok and lapsed), claim  # J5: a lapsed lease is never revived
        else:
            if op in ("fail", "release"):
                chosen = chosen[:1]
            when = None if retry_in is None else self.clock.now() + timedelta(seconds=retry_in)

            def settlements(side: str) -> list[Settlement]:
                made: list[Settlement] = []
                for claim, kind in zip(chosen, kinds, strict=False):
                    run = claim.pg if side == "pg" else claim.model
                    kind = op if op != "mixed" else kind  # noqa: PLW2901 - one kind, or each its own
                    if kind == "complete":
                        made.append(completed(run))
                    elif kind == "fail":
                        made.append(failed(run, error or "e", retry_at=when, kind=fail_kind))
                    else:
                        made.append(
                            released(run, when or self.clock.now(), reason="lock-held", error=error)
                        )
                return made

            expected = self.run(self.model.settle(settlements("model")))
            actual = self.run(self.pg.settle(settlements("pg")))
            assert actual == expected
            stale_flags = [o == "stale" for o in actual]
        after = self.pg_records()
        settled = {c.pg.run_id for c, stale in zip(chosen, stale_flags, strict=True) if not stale}
        for claim, stale in zip(chosen, stale_flags, strict=True):
            if stale and claim.pg.run_id not in settled:
                assert after.get(claim.pg.run_id) == before.get(claim.pg.run_id)  # J5

    @precondition(lambda self: self.claims)
    @rule(pick=PICKS, stale=st.booleans(), raised=RAISED)
    def handler_outcome(self, pick: int, stale: bool, raised: str) -> None:
        """K4, K5: a handler's attempt ends by raising; the runtime's own rule
        (``raised_settlement``: the retry plan over the claim's attempt and snoozes) makes the
        settlement, the same on both sides; both backends must answer alike, a stale one
        changing nothing (J5)."""
        claim = self.pick(pick, stale)
        job = JOBS_BY_ID[claim.pg.job_id]
        now = self.clock.now()
        expected = self.run(
            self.model.settle([raised_settlement(job, claim.model, _raised(raised), now)])
        )
        before = self.pg_records().get(claim.pg.run_id)
        actual = self.run(self.pg.settle([raised_settlement(job, claim.pg, _raised(raised), now)]))
        assert actual == expected
        if actual == ["stale"]:
            assert self.pg_records().get(claim.pg.run_id) == before  # J5

    @rule(
        op=st.sampled_from(["cancel", "cancel", "pause", "resume"]),
        pick=PICKS,
        job=JOBS,
        of_running=st.booleans(),
    )
    def control(self, op: str, pick: int, job: Any, of_running: bool) -> None:
        """K2, K3: cancel a known run (waiting, running or finished; ``of_running`` prefers a
        running one) or pause / resume a job through the operator surface on both; both answer
        alike, and the other rules then run against cancel-requested runs and paused jobs. A
        run cancelled while running is remembered (invariants)."""
        if op != "cancel":
            expected = self.run(getattr(self.model_ops, op)(job.id))
            assert self.run(getattr(self.pg_ops, op)(job.id)) == expected
            return
        ids = self.known_ids()
        if of_running:
            ids = [r.run_id for r in self.model.runs() if r.state == "running"] or ids
        if not ids:
            return
        run_id = ids[pick % len(ids)]
        expected = self.run(self.model_ops.cancel(run_id))
        actual = self.run(self.pg_ops.cancel(run_id))
        assert actual.outcome == expected.outcome
        assert normalized(actual.record) == normalized(expected.record)
        if actual.outcome == "requested":
            self.cancel_requested.add(run_id)

    @rule(seconds=st.sampled_from([1, 3, 7, 11, 2 * 86400]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    # --- operator operations -------------------------------------------------------------------

    @rule(op=st.sampled_from(["retry", "discard", "cleanup"]), pick=PICKS, job=JOBS)
    def operate(self, op: str, pick: int, job: Any) -> None:
        if op == "cleanup":
            assert self.run(self.pg_ops.cleanup([job])) == self.run(self.model_ops.cleanup([job]))
            return
        ids = self.known_ids()
        if not ids:
            return
        run_id = ids[pick % len(ids)]
        if op == "retry":
            expected = self.run(self.model.admin.retry_dead(run_id)) is not None
            assert (self.run(self.pg.admin.retry_dead(run_id)) is not None) == expected
            if expected:
                self.retried.add(run_id)
        else:
            expected = self.run(self.model.admin.discard(run_id)) is not None
            assert (self.run(self.pg.admin.discard(run_id)) is not None) == expected

    # --- invariants ----------------------------------------------------------------------------

    @invariant()
    def database_equals_model_and_invariants_hold(self) -> None:
        records = self.pg_records()
        self.database_equals_model(records)
        self.backend_invariants_hold(records)

    def database_equals_model(self, records: dict[str, RunRecord]) -> None:
        model = {r.run_id: r for r in self.model.runs()}
        assert sorted(records) == sorted(model)
        for run_id, record in records.items():
            assert normalized(record) == normalized(model[run_id]), run_id

    def backend_invariants_hold(self, records: dict[str, RunRecord]) -> None:
        # J3 (F1): concurrency.max bounds each job's running runs, live or lapsed leases alike
        # (a lapsed run keeps its slot until a claim retakes or buries it).
        for job in (PLAIN, KEYED):
            running = sum(
                1 for r in records.values() if r.job_id == job.id and r.state == "running"
            )
            assert running <= job.concurrency.max, (job.id, running)
        live_keys: set[tuple[str, str]] = set()
        for run_id, record in records.items():
            # Attempts never exceed the bound; nor do snoozes (K4: the kernel bounds them).
            assert 0 <= record.attempt <= record.max_attempts, record
            assert 0 <= record.snoozes <= JOBS_BY_ID[record.job_id].retry.max_snoozes, record
            # K4: every history entry records its kind.
            assert all("kind" in entry for entry in record.history), record
            # J1: one non-terminal run per (job, dedupe key).
            if record.dedupe_key is not None and record.state not in TERMINAL_STATES:
                assert (record.job_id, record.dedupe_key) not in live_keys, record
                live_keys.add((record.job_id, record.dedupe_key))
            # K2: a run cancelled while running ends cancelled (or completed), never waiting
            # or dead.
            if run_id in self.cancel_requested:
                assert record.state in ("running", "cancelled", "completed"), record
            # Terminal runs never come back (a dead run only through an operator retry).
            previous = self.seen.get(run_id)
            if previous in ("completed", "discarded", "cancelled"):
                assert record.state == previous, (run_id, previous, record.state)
            if previous == "dead" and record.state != "dead":
                assert record.state == "discarded" or run_id in self.retried, record
        # Cleanup may delete terminal runs; it never deletes a live one.
        for run_id, previous in self.seen.items():
            if run_id not in records:
                assert previous in TERMINAL_STATES, (run_id, previous)
        self.seen = {run_id: record.state for run_id, record in records.items()}
        self.retried.clear()
        # No run has two live holders: at most one recorded claim per run holds its current
        # token, and only a running run has one.
        holders: dict[str, int] = {}
        for claim in self.claims:
            record = records.get(claim.pg.run_id)
            if record is not None and record.state == "running":
                current = self.tokens[claim.pg.run_id] == claim.pg.token
                holders[claim.pg.run_id] = holders.get(claim.pg.run_id, 0) + int(current)
        assert all(count <= 1 for count in holders.values()), holders


@pytest.fixture(scope="module")
def job_database(ship_server: ResolvedServer) -> Iterator[str]:
    """A database of this module's own (created and dropped synchronously)."""
    yield from module_database(ship_server, "jobsm")


@pytest.mark.timeout(900 if LARGE else 300)
def test_postgres_backend_matches_the_model(job_database: str) -> None:
    """J1-J7, K4, K5 against the model: after every step the database equals the in-memory
    model; no run has two live holders; a stale token never changes a row (J5) and a heartbeat
    never revives a lapsed lease (J5); terminal runs never come back; attempts never exceed the
    bound; a job never has more than concurrency.max running runs (J3); dedupe (J1) and
    queue-full (J2) hold; lapsed leases are retaken (the lapsed attempt in the history) or
    dead-lettered and returned as buried as the model says (J6, J10); a handler's terminal,
    non-retryable, retry-after, snooze and timeout outcomes settle alike on both (K4, K5), every
    history entry records its kind, and no run snoozes more than retry.max_snoozes (K4); runs
    of mixed priorities are claimed in the same order, priority, run_at, creation (K6); cancels
    of waiting, running and finished runs answer alike, a finished run never changes, a run
    cancelled while running ends cancelled (its settlements, or the claim after its lease
    lapsed), never waiting or dead, and heartbeats answer the same cancel requests (K2); a
    paused job's claims take nothing until it is resumed (K3)."""
    run_machine(JobBackendMachine, job_database, metadata, SETTINGS)
