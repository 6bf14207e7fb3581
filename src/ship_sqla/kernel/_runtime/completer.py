"""Batched completion: successful runs are settled with one ``backend.complete`` per batch.

A handler that returns appends its run and goes; it never waits for its completion to land. The
completer flushes whatever accumulated as soon as it gets the event loop, which is after every
handler that was ready to finish has finished; while one flush is on the wire the next batch
accumulates. So a noop run costs no round trip of its own: at load, batches grow with the
backend's latency; at idle, a run completes one round trip after its handler returned.

A batch whose ``complete`` call fails (the database went away) stays in memory and is retried
after the error backoff (capped at about a second) until it lands: through an outage shorter
than the lease nothing is dropped and nothing runs twice, since heartbeats keep the leases
meanwhile. While the runtime stops, a failed batch is retried until the drain deadline or the
batch's leases end, whichever comes first, then given up (J6: the leases lapse and the runs are
retaken).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ship_sqla.kernel._runtime.state import InFlight, stale_error
from ship_sqla.kernel._waiting import wait_event

if TYPE_CHECKING:
    from collections.abc import Callable

    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._metrics import JobOutcome
    from ship_sqla.kernel._ports import JobBackend

__all__ = ["Completer"]

MAX_BATCH = 1000
"""Runs per ``complete`` call; bounds one statement's size, not throughput."""


class Completer:
    """Owns runs from ``add`` until their completion was answered (or given up at close).

    Invariants: every added run is passed to ``on_settled`` exactly once; a run is never sent to
    ``complete`` after its lease was reported lost; a failed flush is retried after a bounded
    backoff until it succeeds, or once closing until ``close_deadline()`` or the batch's leases
    end; every failure goes to report_error.
    """

    def __init__(
        self,
        backend: JobBackend,
        clock: Clock,
        *,
        on_settled: Callable[[InFlight], None],
        on_outcome: Callable[[InFlight, JobOutcome], None],
        on_flushed: Callable[[], None],
        error_backoff: Callable[[int], float],
        close_deadline: Callable[[], float | None] = lambda: None,
    ) -> None:
        self._backend = backend
        self._clock = clock
        self._on_settled = on_settled
        self._on_outcome = on_outcome
        self._on_flushed = on_flushed
        self._error_backoff = error_backoff
        self._close_deadline = close_deadline
        self._pending: list[InFlight] = []
        self._in_flush = 0
        # Per job: the backend still counts these runs against concurrency.max (J4) until their
        # completion lands, so the runtime must not ask for their slots back before then.
        self._unflushed_by_job: dict[str, int] = {}
        self._ready = asyncio.Event()
        self._closing = asyncio.Event()

    @property
    def unflushed(self) -> int:
        """Runs whose handler returned but whose completion has not been answered yet."""
        return len(self._pending) + self._in_flush

    def unflushed_of(self, job_id: str) -> int:
        """Unflushed runs of one job (see :attr:`unflushed`)."""
        return self._unflushed_by_job.get(job_id, 0)

    def add(self, entry: InFlight) -> None:
        job_id = entry.job.id
        self._unflushed_by_job[job_id] = self._unflushed_by_job.get(job_id, 0) + 1
        self._pending.append(entry)
        if len(self._pending) == 1:
            self._ready.set()

    def close(self) -> None:
        """Flush what is pending (one try per batch), then let :meth:`run` return."""
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
                else:
                    failures += 1
                    delay = self._error_backoff(failures)
                    if not self._closing.is_set():
                        self._pending[:0] = batch
                        await wait_event(self._closing, self._clock, delay)
                        continue
                    if self._clock.monotonic() + delay < self._give_up_at(batch):
                        self._pending[:0] = batch
                        await self._clock.sleep(delay)
                        continue
                    # Giving up is safe: those runs are still running with a lease, which lapses
                    # and lets any worker retake them (J6, at-least-once).
                    self._settle(batch)
                self._on_flushed()
            if self._closing.is_set():
                return

    def _give_up_at(self, batch: list[InFlight]) -> float:
        """While closing: retrying is worth it until the drain deadline, and only while some
        run of the batch may still hold its lease."""
        leases = max(entry.lease_deadline for entry in batch)
        deadline = self._close_deadline()
        return leases if deadline is None else min(leases, deadline)

    async def _flush(self, batch: list[InFlight]) -> bool:
        live = [entry for entry in batch if not entry.lost]
        if live:
            try:
                outcomes = await self._backend.complete([entry.run for entry in live])
                if len(outcomes) != len(live):
                    msg = (
                        f"backend.complete answered {len(outcomes)} outcomes for {len(live)}"
                        " runs; a JobBackend must answer one outcome per run, in order."
                    )
                    raise RuntimeError(msg)  # noqa: TRY301 - reported with the other failures
            except Exception as exc:  # noqa: BLE001 - J11: absorbed, reported, retried
                self._backend.report_error(exc)
                return False
            for entry, outcome in zip(live, outcomes, strict=True):
                if outcome == "stale" and not entry.lost:
                    entry.mark_lost()
                    self._backend.report_error(stale_error(entry.run, "complete"))
                self._on_outcome(entry, "stale" if outcome == "stale" else "completed")
        self._settle(batch)
        return True

    def _settle(self, batch: list[InFlight]) -> None:
        counts = self._unflushed_by_job
        for entry in batch:
            job_id = entry.job.id
            left = counts[job_id] - 1
            if left:
                counts[job_id] = left
            else:
                del counts[job_id]
            self._on_settled(entry)
