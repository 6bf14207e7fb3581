"""Partitioned limits (F8, F9) with fair claims (F2): the PostgreSQL backend against the
in-memory model, step by step.

Hypothesis drives both backends with the same calls: enqueues for many partitions (tenants and
untenanted runs; partition keys from the payload and runs without one), claims by several
workers, completions, failures that retry, releases, the
clock moving past leases (lapsed runs are retaken or buried) and past rate windows, operator
cancels. After every step the database equals the model, and from the history of every start
the machine recorded:

- F8: no window of ``period`` holds more than ``limit`` starts of one partition;
- F9: no partition has more than ``max`` running runs (live or lapsed leases alike);
- F2: a claim that visits every partition with due runs, and meets no lapsed lease, takes
  ``min(limit, what the partitions' due runs and limits allow)`` (work-conserving), and gives
  each partition at least its weighted share of the room or all it may take.

The machine's plumbing (one event loop through a portal, a database of its own, the tables
truncated between examples) is the job state machine's (``machine_support``).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Coroutine, Iterator
from datetime import datetime, timedelta
from typing import Any, ClassVar, TypeVar

import pytest
from anyio.from_thread import BlockingPortal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
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
from ship_sqla.kernel import completed, failed, released
from ship_sqla.kernel._jobs import (
    Concurrency,
    Fairness,
    RateLimit,
    RetryPolicy,
    define_job,
    partition_walk,
)
from ship_sqla.kernel._memory.jobs import InMemoryJobBackend
from ship_sqla.kernel._operations import JobOperations, create_job_operations
from ship_sqla.kernel._ports import ClaimedRun, EnqueueRequest, RunRecord
from ship_sqla.kernel._tenancy import tenant_ambient
from ship_sqla.testing import FrozenClock, ResolvedServer

T = TypeVar("T")

LARGE = os.environ.get("SHIP_SQLA_HYPOTHESIS_PROFILE") == "large"
SETTINGS = settings(
    max_examples=200 if LARGE else 20,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

metadata = MetaData()
runs_table = ship_job_runs_table(metadata, partitioned_claims=True, partition_keys=True)
state_table = ship_job_state_table(metadata)
ALL_RUNS = JobStatements(runs="ship_job_runs", state="ship_job_state")[
    Template(GET_RUN.sql.replace("WHERE r.id = :id", "ORDER BY r.id"))
]


async def noop(ctx: Any, payload: Any) -> None:
    return None


def allow(permission: str, operation: str) -> bool:
    return True


RETRY = RetryPolicy(attempts=3, jitter="none")
RATED = define_job(
    "p.rated",
    noop,
    payload=dict,
    concurrency=Concurrency(lease=5),
    rate_limit=RateLimit(2, 10.0, partition="tenant"),
    fairness=Fairness(max_tenants=3),
    retry=RETRY,
)
CAPPED = define_job(
    "p.capped",
    noop,
    payload=dict,
    concurrency=Concurrency(max=2, lease=5, partition="tenant"),
    retry=RETRY,
)
BOTH = define_job(
    "p.both",
    noop,
    payload=dict,
    concurrency=Concurrency(max=1, lease=5, partition="tenant"),
    rate_limit=RateLimit(3, 10.0, partition="tenant"),
    fairness=Fairness(max_tenants=4, weights={"t0": 2}),
    retry=RETRY,
)
BY_KEY = define_job(
    "p.by_key",
    noop,
    payload=dict,
    concurrency=Concurrency(max=1, lease=5, partition="key"),
    rate_limit=RateLimit(2, 10.0, partition="key"),
    partition_key=lambda payload: payload["k"],
    retry=RETRY,
)
JOBS_BY_ID = {job.id: job for job in (RATED, CAPPED, BOTH, BY_KEY)}
JOBS = st.sampled_from([RATED, CAPPED, BOTH, BY_KEY])
KEYS = st.sampled_from([None, "k0", "k1", "k2", "k3", "k4", "k5"])


def partition_of(job: Any, tenant: str | None, payload: Any) -> str | None:
    """A run's partition under ``job``'s limits: its tenant, or its partition key."""
    return payload["k"] if job.partition == "key" else tenant


TENANTS = st.sampled_from([None, "t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"])
WORKERS = st.sampled_from(["A", "B", "C"])
PICKS = st.integers(min_value=0, max_value=10_000)


def _claimed_view(run: ClaimedRun) -> tuple[Any, ...]:
    return (run.run_id, run.attempt, run.tenant, run.lease_expires_at, run.retaken)


class PartitionMachine(RuleBasedStateMachine):
    portal: ClassVar[BlockingPortal]
    engine: ClassVar[AsyncEngine]

    def __init__(self) -> None:
        super().__init__()
        self.run(self._truncate())
        self.clock = FrozenClock()
        self.pg: PostgresJobBackend = create_job_backend(
            database=self.engine, table=runs_table, state_table=state_table, clock=self.clock
        )
        self.model = InMemoryJobBackend(clock=self.clock, live_only=False)
        self.pg_ops: JobOperations = create_job_operations(self.pg, authorizer=allow)
        self.model_ops: JobOperations = create_job_operations(self.model, authorizer=allow)
        self.claims: list[Claim] = []
        self.tokens: dict[str, int] = {}
        self.counter = 0
        # (job id, partition) -> the start times of its runs (every claim of a run, retakes too).
        self.starts: dict[tuple[str, str | None], list[datetime]] = {}

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

    def current(self, index: int) -> Claim | None:
        """A recorded claim whose token is still its running run's."""
        model = {record.run_id: record for record in self.model.runs()}
        held = [
            claim
            for claim in self.claims
            if (record := model.get(claim.pg.run_id)) is not None
            and record.state == "running"
            and self.tokens[claim.pg.run_id] == claim.pg.token
        ]
        return held[index % len(held)] if held else None

    # --- rules -----------------------------------------------------------------------------------

    @rule(
        job=JOBS,
        tenant=TENANTS,
        key=KEYS,
        count=st.integers(min_value=1, max_value=3),
        delay=st.sampled_from([0, 0, 0, 4]),
    )
    def enqueue(
        self, job: Any, tenant: str | None, key: str | None, count: int, delay: int
    ) -> None:
        requests = []
        for _ in range(count):
            self.counter += 1
            run_at = self.clock.now() + timedelta(seconds=delay) if delay else None
            payload = {"n": self.counter, "k": key}
            requests.append(EnqueueRequest(payload, run_at=run_at, run_id=f"r{self.counter:05d}"))
        with tenant_ambient(tenant):
            expected = self.run(self.model.enqueue_many(job, requests))
            assert self.run(self.pg.enqueue_many(job, requests)) == expected

    @rule(job=JOBS, worker=WORKERS, limit=st.integers(min_value=1, max_value=5))
    def claim(self, job: Any, worker: str, limit: int) -> None:
        before = self.pg_records()
        request = claim_request(job, worker=worker, limit=limit)
        expected = self.run(self.model.claim(request))
        actual = self.run(self.pg.claim(request))
        assert [_claimed_view(r) for r in actual] == [_claimed_view(r) for r in expected]
        assert sorted(actual.buried, key=str) == sorted(expected.buried, key=str)
        if expected.rate_wait is None:
            assert actual.rate_wait is None
        else:
            assert actual.rate_wait == pytest.approx(expected.rate_wait, abs=1e-3)
        self.check_fair_share(job, limit, before, list(actual))
        now = self.clock.now()
        for pg_run, model_run in zip(actual, expected, strict=True):
            assert pg_run.token > self.tokens.get(pg_run.run_id, 0)  # J5
            self.tokens[pg_run.run_id] = pg_run.token
            self.claims.append(Claim(pg_run, model_run, worker))
            part = partition_of(job, pg_run.tenant, pg_run.payload)
            self.starts.setdefault((job.id, part), []).append(now)

    @precondition(lambda self: self.claims)
    @rule(
        pick=PICKS,
        kind=st.sampled_from(["complete", "complete", "fail", "release"]),
        retry_in=st.sampled_from([0, 3]),
    )
    def settle(self, pick: int, kind: str, retry_in: int) -> None:
        claim = self.current(pick)
        if claim is None:
            return
        when = self.clock.now() + timedelta(seconds=retry_in)

        def settlement(run: ClaimedRun) -> Any:
            if kind == "complete":
                return completed(run)
            if kind == "fail":
                return failed(run, "e", retry_at=when, kind="failure")
            return released(run, when, reason="lock-held", error=None)

        expected = self.run(self.model.settle([settlement(claim.model)]))
        assert self.run(self.pg.settle([settlement(claim.pg)])) == expected

    @rule(pick=PICKS, of_running=st.booleans())
    def cancel(self, pick: int, of_running: bool) -> None:
        """K2 beside the limits: a cancelled waiting run leaves its partition's queue; a
        cancel-requested running run holds its slot until it settles or its lapse buries it."""
        ids = sorted(r.run_id for r in self.model.runs())
        if of_running:
            ids = [r.run_id for r in self.model.runs() if r.state == "running"] or ids
        if not ids:
            return
        run_id = ids[pick % len(ids)]
        expected = self.run(self.model_ops.cancel(run_id))
        actual = self.run(self.pg_ops.cancel(run_id))
        assert actual.outcome == expected.outcome

    @rule(seconds=st.sampled_from([1, 3, 6, 11]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    # --- the F2 bound at each claim --------------------------------------------------------------

    def check_fair_share(
        self, job: Any, limit: int, before: dict[str, RunRecord], taken: list[ClaimedRun]
    ) -> None:
        """F2 with F8/F9: when the claim's walk covers every partition with waiting runs and no
        lease had lapsed, it takes min(limit, what the partitions allow) (work-conserving) and
        each partition at least min(what it may take, its weighted share of the limit)."""
        now = self.clock.now()
        mine = [r for r in before.values() if r.job_id == job.id]
        if any(r.state == "running" and r.lease_expires_at <= now for r in mine):
            return  # lapsed leases: retakes share the room first

        def part(record: Any) -> str | None:
            return partition_of(job, record.tenant, record.payload)

        waiting = {part(r) for r in mine if r.state == "waiting"} - {None}
        if len(waiting) > partition_walk(job.fairness, limit):
            return  # the walk takes turns: not every partition is visited by one claim
        due_of = Counter(part(r) for r in mine if r.state == "waiting" and r.run_at <= now)
        may = {p: max(min(due, self.allowance(job, p, mine, now)), 0) for p, due in due_of.items()}
        got = Counter(part(run) for run in taken)
        assert len(taken) == min(limit, sum(may.values())), (may, got)
        weights = {t: job.fairness.weight_of(t) if job.fairness else 1 for t in may if may[t]}
        total = sum(weights.values())
        for tenant, weight in weights.items():
            assert got[tenant] >= min(may[tenant], limit * weight // total), (tenant, may, got)

    def allowance(self, job: Any, part: str | None, mine: list[RunRecord], now: datetime) -> int:
        room = 10**6
        if job.concurrency.max is not None:
            running = sum(
                1
                for r in mine
                if partition_of(job, r.tenant, r.payload) == part and r.state == "running"
            )
            room = min(room, job.concurrency.max - running)
        rate = job.rate_limit
        if rate is not None:
            since = now - timedelta(seconds=rate.period)
            recent = [at for at in self.starts.get((job.id, part), []) if at > since]
            room = min(room, rate.limit - len(recent))
        return room

    # --- invariants ------------------------------------------------------------------------------

    @invariant()
    def database_equals_model_and_limits_hold(self) -> None:
        records = self.pg_records()
        model = {r.run_id: r for r in self.model.runs()}
        assert sorted(records) == sorted(model)
        for run_id, record in records.items():
            assert normalized(record) == normalized(model[run_id]), run_id
        # F9: at most max running runs per partition, live or lapsed leases alike.
        running = Counter(
            (r.job_id, partition_of(JOBS_BY_ID[r.job_id], r.tenant, r.payload))
            for r in records.values()
            if r.state == "running"
        )
        for (job_id, tenant), n in running.items():
            cap = JOBS_BY_ID[job_id].concurrency.max
            assert cap is None or n <= cap, (job_id, tenant, n)
        # F8: no window of period holds more than limit starts of one partition.
        for (job_id, tenant), times in self.starts.items():
            rate = JOBS_BY_ID[job_id].rate_limit
            if rate is None:
                continue
            period = timedelta(seconds=rate.period)
            for end in times:
                inside = sum(1 for at in times if end - period < at <= end)
                assert inside <= rate.limit, (job_id, tenant, end, inside)


@pytest.fixture(scope="module")
def partition_database(ship_server: ResolvedServer) -> Iterator[str]:
    """A database of this module's own (created and dropped synchronously)."""
    yield from module_database(ship_server, "partsm")


@pytest.mark.timeout(900 if LARGE else 300)
def test_partitioned_limits_match_the_model(partition_database: str) -> None:
    """F8, F9, F2 against the model, with many partitions (eight tenants and the untenanted
    runs), three claimers, clock steps, completions, retries, releases, lapsed leases and
    cancels: after every step the database equals the model; no window of ``period`` holds more
    than ``limit`` starts of one partition (F8: retakes of lapsed runs count); no partition has
    more than ``max`` running runs (F9); and a claim whose walk visits every partition, with no
    lapsed lease, is work-conserving and gives each partition at least min(what its limits
    allow, its weighted share of the limit) (F2)."""
    run_machine(PartitionMachine, partition_database, metadata, SETTINGS)
