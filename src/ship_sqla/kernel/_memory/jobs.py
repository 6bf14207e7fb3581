"""The in-memory reference :class:`~ship_sqla.kernel.JobBackend`.

It is the executable statement of the backend contract: the conformance suite runs against it
and against the PostgreSQL backend, and property tests use it as the model. Every rule below is
one the PostgreSQL backend must also keep. Time comes only from the injected clock.

- J1 ``enqueue`` with a ``dedupe_key`` (given, or from the job's idempotency policy) that a
  non-terminal run of the same job holds returns that run, ``deduplicated=True``. A ``run_id``
  that already exists (any state) is also returned deduplicated: a durable id is inserted once.
- J2 ``enqueue`` is rejected ``"queue-full"`` once the job holds ``queue_depth_limit`` waiting
  runs (due or delayed). Deduplication is checked first: a duplicate is never "full". It is a
  hard cap: a call counts and inserts without awaiting in between, so no concurrent task can
  take the same place (the PostgreSQL backend gets the same from its per-job gate).
- Every request goes through :func:`~ship_sqla.kernel._plans.prepare.prepare_run` (the checks both
  backends share) before anything is stored: one bad request of a batch stores nothing.
- J3 ``claim`` never lets the job's running runs exceed ``concurrency.max`` (whoever claimed
  them, live or lapsed leases alike: a lapsed run holds its slot until a claim retakes it, which
  moves the slot, or buries it), takes due runs by ``run_at`` then creation order, and skips
  ``exclude_keys``.
- J5 Every claim draws a new fencing token (per run, increasing). ``complete``, ``fail`` and
  ``release`` act only while the run is running under that token; otherwise they change nothing
  and answer "stale". A lease that lapsed but that no claim has retaken is still current for
  them (nobody else holds the run), but ``heartbeat`` refuses it (False): a lapsed lease is
  never revived, its holder stops.
- J6 A running run whose lease lapsed is retaken by the next claim (a new attempt), the lapsed
  attempt recorded in its history (``LEASE_LAPSED_MESSAGE``). One that lapsed on its final
  attempt is dead-lettered with ``LEASE_LAPSED_FINAL_MESSAGE`` instead and reported in the
  claim's ``buried``.
- J7 ``release`` returns a run to waiting without consuming its attempt; ``fail`` appends to the
  history and retries at ``retry_at`` or dead-letters (``retry_at`` None or attempts spent).
- Terminal runs (completed, dead, discarded) never change state again except through
  :meth:`InMemoryJobBackend.retry` (an operator's one more attempt for a dead run).
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ship_sqla.kernel._backend_options import BackendOptions
from ship_sqla.kernel._clock import require_aware
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._plans.prepare import PreparedRun, prepare_run, prepare_runs
from ship_sqla.kernel._plans.schedule import due_occurrence, next_occurrence, occurrence_id
from ship_sqla.kernel._plans.scheduled_runs import scheduled_only, scheduled_payload
from ship_sqla.kernel._ports import (
    LEASE_LAPSED_FINAL_MESSAGE,
    LEASE_LAPSED_MESSAGE,
    TERMINAL_STATES,
    BuriedRun,
    ClaimBatch,
    ClaimedRun,
    EnqueueRequest,
    EnqueueResult,
    LockProvider,
    QueueDepth,
    RunRecord,
    RunState,
    SettleOutcome,
)
from ship_sqla.kernel._waiting import LocalWake

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._on_error import ErrorHandler

__all__ = ["InMemoryJobBackend"]

logger = logging.getLogger("ship_sqla.jobs")


class _Run:
    """The stored form of a run. ``payload_json`` is JSON text, as PostgreSQL would store it."""

    __slots__ = (
        "attempt",
        "created_at",
        "dedupe_key",
        "finished_at",
        "history",
        "job_id",
        "key",
        "last_error",
        "lease",
        "lease_expires_at",
        "max_attempts",
        "payload_json",
        "run_at",
        "run_id",
        "seq",
        "state",
        "token",
        "updated_at",
        "worker",
    )

    def __init__(
        self,
        *,
        run_id: str,
        job_id: str,
        payload_json: str,
        key: str | None,
        dedupe_key: str | None,
        max_attempts: int,
        run_at: datetime,
        now: datetime,
        seq: int,
    ) -> None:
        self.run_id = run_id
        self.job_id = job_id
        self.payload_json = payload_json
        self.key = key
        self.dedupe_key = dedupe_key
        self.max_attempts = max_attempts
        self.run_at = run_at
        self.created_at = now
        self.updated_at = now
        self.seq = seq
        self.state: RunState = "waiting"
        self.attempt = 0
        self.token = 0
        self.lease = 0.0
        self.lease_expires_at: datetime | None = None
        self.finished_at: datetime | None = None
        self.last_error: str | None = None
        self.history: list[dict[str, Any]] = []
        self.worker: str | None = None

    def record(self) -> RunRecord:
        return RunRecord(
            run_id=self.run_id,
            job_id=self.job_id,
            state=self.state,
            payload=json.loads(self.payload_json),
            attempt=self.attempt,
            max_attempts=self.max_attempts,
            key=self.key,
            dedupe_key=self.dedupe_key,
            run_at=self.run_at,
            created_at=self.created_at,
            updated_at=self.updated_at,
            finished_at=self.finished_at,
            lease_expires_at=self.lease_expires_at,
            last_error=self.last_error,
            history=tuple(dict(entry) for entry in self.history),
        )


def _claim_order(run: _Run) -> tuple[datetime, int]:
    return run.run_at, run.seq


def _scan(
    live: Iterable[_Run], now: datetime, excluded: frozenset[str]
) -> tuple[int, list[_Run], list[_Run]]:
    """(running runs holding a slot: live or retakable leases, claimable runs, lapsed runs on
    their final attempt)."""
    held = 0
    candidates: list[_Run] = []
    lapsed_on_final: list[_Run] = []
    for run in live:
        if run.state == "running":
            assert run.lease_expires_at is not None  # noqa: S101 - running implies a lease
            if run.lease_expires_at > now:
                held += 1
            elif run.attempt >= run.max_attempts:
                lapsed_on_final.append(run)
            else:
                held += 1
                if run.key not in excluded:
                    candidates.append(run)
        elif run.run_at <= now and run.key not in excluded:
            candidates.append(run)
    return held, candidates, lapsed_on_final


class InMemoryJobBackend(BackendOptions):
    """Runs kept in this process: the reference backend and the model for property tests.

    ``enqueue`` accepts ``scope=`` for signature compatibility and ignores it (there are no
    transactions in memory), so the local wake happens at once. Safe for any number of runtimes
    and callers in one event loop; not thread-safe.
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        lock_provider: LockProvider | None = None,
        poll_interval: float = 1.0,
        queue_depth_limit: int | None = None,
        max_in_flight: int = 100,
        on_error: ErrorHandler | None = None,
        meter_provider: Any = None,  # noqa: ANN401 - an OpenTelemetry MeterProvider
    ) -> None:
        self._set_options(
            clock=clock,
            lock_provider=lock_provider,
            poll_interval=poll_interval,
            queue_depth_limit=queue_depth_limit,
            max_in_flight=max_in_flight,
            on_error=on_error,
            meter_provider=meter_provider,
        )
        self._runs: dict[str, _Run] = {}
        # Non-terminal runs per job, in creation order: what claim and the J2 count look at.
        self._live: dict[str, dict[str, _Run]] = {}
        self._waiting: dict[str, int] = {}
        self._dedupe: dict[tuple[str, str], str] = {}
        self._seq = itertools.count()
        self._wakeup = LocalWake()
        # job id -> (trigger text, next_at): the state table of the PostgreSQL backend (J9).
        self._schedules: dict[str, tuple[str, datetime]] = {}

    # --- enqueue --------------------------------------------------------------------------------

    async def enqueue(
        self,
        job: JobDefinition[Any],
        payload: Any,  # noqa: ANN401 - the job's typed payload
        *,
        dedupe_key: str | None = None,
        run_at: datetime | None = None,
        run_id: str | None = None,
        scope: Any = None,  # noqa: ANN401, ARG002 - no transactions in memory
    ) -> EnqueueResult:
        request = EnqueueRequest(payload, dedupe_key=dedupe_key, run_at=run_at, run_id=run_id)
        prepared = prepare_run(job, request)
        now = self._clock.now()
        result, created = self._insert(job, prepared, now)
        if created is not None and created.run_at <= now:
            self._wake()
        return result

    async def enqueue_many(
        self,
        job: JobDefinition[Any],
        requests: Sequence[EnqueueRequest],
        *,
        scope: Any = None,  # noqa: ANN401, ARG002 - no transactions in memory
    ) -> list[EnqueueResult]:
        # Every request first: like one INSERT statement, a bad request writes nothing.
        prepared = prepare_runs(job, requests)
        now = self._clock.now()
        results: list[EnqueueResult] = []
        due = False
        for run in prepared:
            result, created = self._insert(job, run, now)
            results.append(result)
            due = due or (created is not None and created.run_at <= now)
        if due:
            self._wake()
        return results

    def _insert(
        self, job: JobDefinition[Any], prepared: PreparedRun, now: datetime
    ) -> tuple[EnqueueResult, _Run | None]:
        """Store one prepared run (J1 dedupe, then J2), with no await: atomic in the loop."""
        run_id, dedupe_key = prepared.run_id, prepared.dedupe_key
        if run_id is not None and run_id in self._runs:
            return EnqueueResult(run_id=run_id, deduplicated=True), None
        if dedupe_key is not None:
            existing = self._dedupe.get((job.id, dedupe_key))
            if existing is not None:
                return EnqueueResult(run_id=existing, deduplicated=True), None
        limit = self._queue_depth_limit
        if limit is not None and self._waiting.get(job.id, 0) >= limit:
            return EnqueueResult(run_id=None, rejected="queue-full"), None
        run = _Run(
            run_id=run_id if run_id is not None else str(uuid.uuid4()),
            job_id=job.id,
            payload_json=prepared.payload_json,
            key=prepared.key,
            dedupe_key=dedupe_key,
            max_attempts=job.retry.attempts,
            run_at=prepared.run_at if prepared.run_at is not None else now,
            now=now,
            seq=next(self._seq),
        )
        self._runs[run.run_id] = run
        self._live.setdefault(job.id, {})[run.run_id] = run
        self._waiting[job.id] = self._waiting.get(job.id, 0) + 1
        if dedupe_key is not None:
            self._dedupe[(job.id, dedupe_key)] = run.run_id
        return EnqueueResult(run_id=run.run_id), run

    # --- claim and settle -----------------------------------------------------------------------

    async def claim(
        self,
        job: JobDefinition[Any],
        *,
        worker: str,
        limit: int,
        exclude_keys: Sequence[str] = (),
    ) -> ClaimBatch:
        now = self._clock.now()
        live = self._live.get(job.id)
        if not live:
            return ClaimBatch()
        held, candidates, lapsed_on_final = _scan(live.values(), now, frozenset(exclude_keys))
        buried: list[BuriedRun] = []
        for run in lapsed_on_final:
            self._append_history(run, LEASE_LAPSED_FINAL_MESSAGE, now)
            self._finish(run, "dead", now)
            buried.append(BuriedRun(run.run_id, run.job_id, run.attempt, run.key))
        # J3: concurrency.max counts every running run, whichever worker holds it, live lease
        # or lapsed (a lapsed one keeps its slot until a claim retakes it): so the bound never
        # depends on when a lapsed holder's heartbeat is refused. Due runs take only free slots;
        # retaking a lapsed run moves its slot.
        room = max(min(limit, job.concurrency.max - held), 0)
        retakable = [run for run in candidates if run.state == "running"]
        due = heapq.nsmallest(
            room, (run for run in candidates if run.state == "waiting"), key=_claim_order
        )
        chosen = heapq.nsmallest(limit, retakable + due, key=_claim_order)
        lease = job.concurrency.lease
        expires_at = now + timedelta(seconds=lease)
        claimed: list[ClaimedRun] = []
        for run in chosen:
            if run.state == "waiting":
                self._waiting[job.id] -= 1
            else:
                # J6: the attempt that lapsed is history too (its holder never settled it).
                self._append_history(run, LEASE_LAPSED_MESSAGE, now)
            run.state = "running"
            run.attempt += 1
            run.token += 1
            run.lease = lease
            run.lease_expires_at = expires_at
            run.worker = worker
            run.updated_at = now
            claimed.append(
                ClaimedRun(
                    run_id=run.run_id,
                    job_id=run.job_id,
                    payload=json.loads(run.payload_json),
                    attempt=run.attempt,
                    max_attempts=run.max_attempts,
                    token=run.token,
                    key=run.key,
                    lease_expires_at=expires_at,
                    created_at=run.created_at,
                )
            )
        return ClaimBatch(claimed, buried)

    def _current(self, claimed: ClaimedRun) -> _Run | None:
        """The stored run while ``claimed``'s token is current (J5), else None."""
        run = self._runs.get(claimed.run_id)
        if run is None or run.state != "running" or run.token != claimed.token:
            return None
        return run

    async def heartbeat(self, runs: Sequence[ClaimedRun]) -> list[bool]:
        now = self._clock.now()
        alive: list[bool] = []
        for claimed in runs:
            run = self._current(claimed)
            # A lapsed lease is never revived: a claim may retake the run at any moment.
            if run is None or run.lease_expires_at is None or run.lease_expires_at <= now:
                alive.append(False)
                continue
            run.lease_expires_at = now + timedelta(seconds=run.lease)
            run.updated_at = now
            alive.append(True)
        return alive

    async def complete(self, runs: Sequence[ClaimedRun]) -> list[SettleOutcome]:
        now = self._clock.now()
        outcomes: list[SettleOutcome] = []
        for claimed in runs:
            run = self._current(claimed)
            if run is None:
                outcomes.append("stale")
                continue
            self._finish(run, "completed", now)
            outcomes.append("completed")
        return outcomes

    async def fail(
        self, run: ClaimedRun, error: str, *, retry_at: datetime | None
    ) -> SettleOutcome:
        now = self._clock.now()
        stored = self._current(run)
        if stored is None:
            return "stale"
        self._append_history(stored, error, now)
        if retry_at is None or stored.attempt >= stored.max_attempts:
            self._finish(stored, "dead", now)
            return "dead"
        self._to_waiting(stored, require_aware(retry_at, "retry_at"), now)
        return "retrying"

    async def release(
        self, run: ClaimedRun, *, run_at: datetime, error: str | None = None
    ) -> SettleOutcome:
        now = self._clock.now()
        stored = self._current(run)
        if stored is None:
            return "stale"
        if error is not None:
            self._append_history(stored, error, now)
        # J7: the attempt was never really spent; the next claim takes the same number again.
        stored.attempt -= 1
        self._to_waiting(stored, require_aware(run_at, "run_at"), now)
        return "released"

    def _append_history(self, run: _Run, error: str, now: datetime) -> None:
        run.history.append({"attempt": run.attempt, "at": now.isoformat(), "error": error})
        run.last_error = error

    def _to_waiting(self, run: _Run, run_at: datetime, now: datetime) -> None:
        run.state = "waiting"
        run.run_at = run_at
        run.lease_expires_at = None
        run.worker = None
        run.updated_at = now
        self._waiting[run.job_id] = self._waiting.get(run.job_id, 0) + 1
        if run_at <= now:
            self._wake()

    def _finish(self, run: _Run, state: RunState, now: datetime) -> None:
        """Move ``run`` to terminal ``state``; terminal runs leave the live set for good."""
        if run.state == "waiting":
            self._waiting[run.job_id] -= 1
        run.state = state
        run.finished_at = now
        run.updated_at = now
        run.lease_expires_at = None
        run.worker = None
        self._live[run.job_id].pop(run.run_id, None)
        if run.dedupe_key is not None and self._dedupe.get((run.job_id, run.dedupe_key)) == (
            run.run_id
        ):
            del self._dedupe[(run.job_id, run.dedupe_key)]

    # --- schedules (J9) -------------------------------------------------------------------------

    async def schedule(self, definitions: Iterable[JobDefinition[Any]]) -> None:
        """One state per scheduled job; an unchanged trigger keeps its ``next_at`` (J9)."""
        scheduled = scheduled_only(definitions)
        for job, _ in scheduled:
            scheduled_payload(job)
        now = self._clock.now()
        for job, schedule in scheduled:
            stored = self._schedules.get(job.id)
            if stored is None or stored[0] != schedule.trigger:
                self._schedules[job.id] = (schedule.trigger, next_occurrence(schedule, now))

    async def tick(self, definitions: Iterable[JobDefinition[Any]]) -> int:
        """Fire ONE run per due schedule (the latest missed occurrence, id
        ``<job_id>/<occurrence>``) and advance to the first occurrence after now (J9)."""
        now = self._clock.now()
        created = 0
        for job, schedule in scheduled_only(definitions):
            stored = self._schedules.get(job.id)
            if stored is None or stored[0] != schedule.trigger:
                continue
            fire, next_at = due_occurrence(schedule, stored[1], now)
            if fire is None:
                continue
            self._schedules[job.id] = (stored[0], next_at)
            payload = scheduled_payload(job)
            request = EnqueueRequest(payload, run_at=fire, run_id=occurrence_id(job.id, fire))
            _, run = self._insert(job, prepare_run(job, request), now)
            created += run is not None
        if created:
            self._wake()
        return created

    def next_at(self, job_id: str) -> datetime | None:
        """The stored next occurrence of ``job_id``'s schedule (None: not scheduled)."""
        stored = self._schedules.get(job_id)
        return stored[1] if stored is not None else None

    # --- waking ---------------------------------------------------------------------------------

    async def wait_for_work(self, timeout: float) -> None:  # noqa: ASYNC109 - the Protocol's name
        await self._wakeup.wait(self._clock, timeout)

    def _wake(self) -> None:
        self._wakeup.wake()

    # --- inspection and operator operations (the model for property tests) ---------------------

    def get_run(self, run_id: str) -> RunRecord | None:
        run = self._runs.get(run_id)
        return run.record() if run is not None else None

    def runs(self, job_id: str | None = None) -> list[RunRecord]:
        """A snapshot of every stored run (of ``job_id`` when given), in creation order."""
        return [
            run.record() for run in self._runs.values() if job_id is None or run.job_id == job_id
        ]

    def waiting_count(self, job_id: str) -> int:
        """Runs of ``job_id`` in state waiting, due or delayed: what J2 compares to the limit."""
        return self._waiting.get(job_id, 0)

    async def queue_depths(self, job_ids: Sequence[str]) -> dict[str, QueueDepth]:
        """J10's queue gauges: waiting runs per job and the age of the oldest due one."""
        now = self._clock.now()
        depths = dict.fromkeys(job_ids, 0)
        oldest: dict[str, datetime] = {}
        for run in self._runs.values():
            if run.state != "waiting" or run.job_id not in depths:
                continue
            depths[run.job_id] += 1
            if run.run_at <= now and (run.job_id not in oldest or run.run_at < oldest[run.job_id]):
                oldest[run.job_id] = run.run_at
        return {
            job_id: QueueDepth(
                depth, (now - oldest[job_id]).total_seconds() if job_id in oldest else 0.0
            )
            for job_id, depth in depths.items()
        }

    def retry(self, run_id: str) -> bool:
        """Operator retry (J8): a dead run gets one more attempt and waits, due now.

        False when the run is not dead, or when its dedupe key is now held by another
        non-terminal run (reviving it would break J1).
        """
        run = self._runs.get(run_id)
        if run is None or run.state != "dead":
            return False
        if run.dedupe_key is not None and (run.job_id, run.dedupe_key) in self._dedupe:
            return False
        now = self._clock.now()
        run.max_attempts = run.attempt + 1
        run.finished_at = None
        self._live.setdefault(run.job_id, {})[run.run_id] = run
        if run.dedupe_key is not None:
            self._dedupe[(run.job_id, run.dedupe_key)] = run.run_id
        self._to_waiting(run, now, now)
        return True

    def discard(self, run_id: str) -> bool:
        """Operator discard (J8): a waiting or dead run becomes discarded. False otherwise."""
        run = self._runs.get(run_id)
        if run is None or run.state not in ("waiting", "dead"):
            return False
        now = self._clock.now()
        if run.state == "dead":
            run.state = "discarded"
            run.finished_at = now
            run.updated_at = now
        else:
            self._finish(run, "discarded", now)
        return True

    def cleanup(self, job: JobDefinition[Any], *, limit: int = 1000) -> int:
        """Delete at most ``limit`` terminal runs of ``job`` past their retention; the count."""
        if limit < 1:
            raise ConfigurationError(f"cleanup limit must be at least 1, got {limit!r}.")
        now = self._clock.now()
        retention = {
            "completed": job.retention.completed,
            "dead": job.retention.dead,
            "discarded": job.retention.discarded,
        }
        doomed = [
            run.run_id
            for run in self._runs.values()
            if run.job_id == job.id
            and run.state in TERMINAL_STATES
            and run.finished_at is not None
            and run.finished_at + retention[run.state] <= now
        ][:limit]
        for run_id in doomed:
            del self._runs[run_id]
        return len(doomed)
