"""The completer: every settle of a claimed run (a
:class:`~ship_sqla.kernel._settlement.Settlement`, or a workflow's suspend) is batched into
``RunStore.settle`` calls, and every answer is read in one place.

An executor whose handler ended hands its run's settlement over and goes; it never waits for the
settle to land. The completer flushes whatever accumulated as soon as it gets the event loop,
which is after every handler that was ready to finish has finished; while one flush is on the
wire the next batch accumulates. So a noop run costs no round trip of its own: at load, batches
grow with the backend's latency; at idle, a run settles one round trip after its handler ended.

A batch whose ``settle`` call fails (the database went away) stays in memory and is retried
after the error backoff (capped at about a second), each settlement by its own rule:

- a completion until it lands: through an outage shorter than the lease nothing is dropped and
  nothing runs twice, since heartbeats keep the leases meanwhile;
- a failure or release while the run's lease may still be held (its ``lease_deadline``, which
  answered heartbeats move on), and for at most one lease after its first failed try, so a
  settle that can never land while heartbeats still do does not keep its run here forever;
- once the runtime stops, none past the drain deadline, and a completion only while its lease
  may still be held.

A settlement given up is safe to drop: its run is still running with a lease, which lapses and
lets any worker retake it (J6, at-least-once). Retrying is safe because every settlement is
fenced on its claim's token (J5): once another worker retook the run it answers ``"stale"`` and
changes nothing. A try that raised may still have landed (its answer lost with the connection,
after the commit): a retry answered ``"stale"`` is checked against the run's row
(``claim_state``), and one that landed on the earlier try is answered as landed, never reported
stale (a stale report is never a false alarm).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

from ship_sqla.kernel._runtime.state import InFlight, stale_error
from ship_sqla.kernel._settlement import Settlement
from ship_sqla.kernel._waiting import wait_event

if TYPE_CHECKING:
    from ship_sqla.kernel._metrics import JobOutcome
    from ship_sqla.kernel._ports import JobBackend, SettleOutcome
    from ship_sqla.kernel._runtime.wiring import Plumbing, RuntimeEvents
    from ship_sqla.kernel._settlement import SettleRequest

__all__ = ["MAX_BATCH", "Completer"]

MAX_BATCH = 1000
"""Settlements per ``settle`` call; bounds one statement's size, not throughput."""

_UNPLANNED: Final[dict[SettleOutcome, JobOutcome]] = {
    "stale": "stale",
    "cancelled": "cancelled",
    "refused": "dead",
}
"""The ``ship.job.runs`` outcome of an answer that is not the settlement's own (J5, K2; J23: a
settlement the database refused was replaced by a dead letter)."""


class Completer:
    """Owns runs from :meth:`add` until their settle was answered (or given up).

    Invariants: every added run is passed to ``events.settled`` exactly once; a completion or a
    failure is never sent once the claim's loss was reported (its answer could only be stale),
    while a release always is (it hands back a run this process will not run; fenced, it changes
    nothing if the run was retaken); a "stale" answer is reported once per claim, here and
    nowhere else (J5); every failed call goes to report_error (J11) and is retried as the module
    docstring says.
    """

    def __init__(self, store: JobBackend, shared: Plumbing, events: RuntimeEvents) -> None:
        self._store = store
        self._clock = shared.clock
        self._report_error = shared.report_error
        self._error_backoff = shared.error_backoff
        self._events = events
        self._pending: list[InFlight] = []
        self._in_flush = 0
        # Per job: the backend still counts these runs against concurrency.max (J3) until their
        # settle lands, so the runtime must not ask for their slots back before then.
        self._unflushed_by_job: dict[str, int] = {}
        self._ready = asyncio.Event()
        self._closing = asyncio.Event()

    @property
    def unflushed(self) -> int:
        """Runs handed over whose settle has not been answered yet."""
        return len(self._pending) + self._in_flush

    def unflushed_of(self, job_id: str) -> int:
        """Unflushed runs of one job (see :attr:`unflushed`)."""
        return self._unflushed_by_job.get(job_id, 0)

    def add(self, entry: InFlight, settlement: SettleRequest) -> None:
        """Settle ``entry``'s run with ``settlement``."""
        entry.settlement = settlement
        job_id = entry.job.id
        self._unflushed_by_job[job_id] = self._unflushed_by_job.get(job_id, 0) + 1
        self._pending.append(entry)
        if len(self._pending) == 1:
            self._ready.set()

    def landed(self, entry: InFlight, settlement: Settlement, outcome: SettleOutcome) -> None:
        """``entry``'s run was settled with ``settlement`` inside its handler's own transaction,
        which committed (J13): its answer is read here, as a flushed one is, and nothing is
        sent."""
        entry.settlement = settlement
        self._answered(entry, outcome)
        if entry.job.concurrency.max is not None:
            self._store.room_freed((entry.job.id,))
        self._events.settled(entry)
        self._events.flushed()

    def close(self) -> None:
        """Flush what is pending (retried only as the stop rules allow), then let :meth:`run`
        return."""
        self._closing.set()
        self._ready.set()

    async def run(self) -> None:
        failures = 0
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._pending:
                batch = self._pending[:MAX_BATCH]
                del self._pending[:MAX_BATCH]
                self._in_flush = len(batch)
                try:
                    flushed = await self._flush(batch)
                finally:
                    self._in_flush = 0
                if flushed:
                    failures = 0
                    self._events.flushed()
                    continue
                failures += 1
                delay = self._error_backoff(failures)
                retry = self._keep_retrying(batch, delay)
                if not retry:
                    continue
                self._pending[:0] = retry
                if self._closing.is_set():
                    await self._clock.sleep(delay)
                else:
                    await wait_event(self._closing, self._clock, delay)
            if self._closing.is_set():
                return

    def _keep_retrying(self, batch: list[InFlight], delay: float) -> list[InFlight]:
        """After a failed flush: the runs worth another try ``delay`` seconds from now; the
        others are given up (settled without an answer; their leases bring them back, J6)."""
        now = self._clock.monotonic()
        closing = self._closing.is_set()
        drain_deadline = self._events.drain_deadline
        retry: list[InFlight] = []
        given_up: list[InFlight] = []
        for entry in batch:
            # Also what resumes the run's heartbeats (InFlight.next_beat): the lease must hold
            # while the settle is retried.
            if entry.settle_failed_at is None:
                entry.settle_failed_at = now
            settlement = entry.settlement
            if settlement is not None and settlement.answer == "completed":
                if not closing:
                    retry.append(entry)
                    continue
                limit = entry.lease_deadline
            else:
                limit = min(entry.lease_deadline, entry.settle_failed_at + entry.run.lease)
            if drain_deadline is not None:
                limit = min(limit, drain_deadline)
            (retry if now + delay < limit else given_up).append(entry)
        if given_up:
            self._done(given_up)
            # Their runs stay running in the backend until their leases lapse: only this
            # process's own room grew (on_flushed is for answered settles, which free the
            # backend's).
            self._events.given_up()
        return retry

    async def _flush(self, batch: list[InFlight]) -> bool:
        live: list[InFlight] = []
        settlements: list[SettleRequest] = []
        for entry in batch:
            settlement = entry.settlement
            assert settlement is not None  # noqa: S101 - add() sets it
            if entry.lost and settlement.answer != "released":
                continue
            live.append(entry)
            settlements.append(settlement)
        if live:
            try:
                outcomes = await self._store.settle(settlements)
                if len(outcomes) != len(live):
                    msg = (
                        f"backend.settle answered {len(outcomes)} outcomes for {len(live)}"
                        " settlements; a RunStore must answer one outcome per settlement, in"
                        " order."
                    )
                    raise RuntimeError(msg)  # noqa: TRY301 - reported with the other failures
                outcomes = await self._landed_before(live, outcomes)
            except Exception as exc:  # noqa: BLE001 - J11: absorbed, reported, retried
                self._report_error(exc)
                return False
            for entry, outcome in zip(live, outcomes, strict=True):
                self._answered(entry, outcome)
            # F1: the fleet cap of these jobs has room again; other processes may take it.
            capped = {entry.job.id for entry in live if entry.job.concurrency.max is not None}
            if capped:
                self._store.room_freed(capped)
        self._done(batch)
        return True

    async def _landed_before(
        self, live: list[InFlight], outcomes: list[SettleOutcome]
    ) -> list[SettleOutcome]:
        """J5: a settlement retried after a try that raised (its answer lost: the connection
        dropped after the commit) may have landed on that try; its retry then answers "stale"
        though no other claim took the run. The run's row says which (``claim_state``): still
        this claim's, in the state the settlement leaves (or cancelled, K2, which a completion
        never becomes), it landed, and is answered so; else it is stale indeed."""
        resolved = list(outcomes)
        for index, (entry, outcome) in enumerate(zip(live, outcomes, strict=True)):
            settlement = entry.settlement
            if (
                outcome != "stale"
                or entry.settle_failed_at is None
                or not isinstance(settlement, Settlement)
            ):
                continue
            state = await self._store.claim_state(entry.run)
            if state is None:
                continue
            cancelled = state == "cancelled" and settlement.state != "completed"
            if state == settlement.state or cancelled:
                resolved[index] = settlement.landed(state)
        return resolved

    def _answered(self, entry: InFlight, outcome: SettleOutcome) -> None:
        """The one place a settle's answer is read: a stale one is reported once per claim (J5),
        and the attempt's outcome recorded (J10): the settlement's own, or "cancelled" where a
        cancel request turned it into one (K2), or "stale"; nothing for a release of an
        attempt that never ran."""
        settlement = entry.settlement
        assert settlement is not None  # noqa: S101 - add() sets it
        if outcome == "stale" and not entry.lost:
            entry.mark_lost()
            self._report_error(stale_error(entry.run, settlement.label))
        if settlement.recorded is not None:
            recorded = _UNPLANNED.get(outcome, settlement.recorded)
            self._events.outcome(entry, recorded)

    def _done(self, entries: list[InFlight]) -> None:
        counts = self._unflushed_by_job
        for entry in entries:
            job_id = entry.job.id
            left = counts[job_id] - 1
            if left:
                counts[job_id] = left
            else:
                del counts[job_id]
            self._events.settled(entry)
