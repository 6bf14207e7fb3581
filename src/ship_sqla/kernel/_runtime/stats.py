"""#36: a worker's history recorder: the fold of its attempts and its flush loop.

:meth:`StatsRecorder.record` runs in the runtime's one outcome hook (``_Events.outcome``), on
the event loop, with no I/O: a dict lookup and a few additions. :meth:`StatsRecorder.run`
flushes the fold every ``interval`` seconds in one statement (``JobStatsStore.add_stats``), and
once more when the runtime stops (after its drain, so every settled attempt is in it). A failed
flush is reported (J11) and its rows folded back for the next one; so only a crash loses rows:
what was folded since the last flush, at most one interval of this process's attempts.

What is measured (``kernel/_stats.py``): the run time is the attempt's, from its claim to its
settle's answer on the runtime's monotonic clock (J10's duration); the queue wait is the
database's, from the run's due time to its claim (the claim's ``lease_expires_at`` minus its
lease), so two machines' clocks never mix. A retaken run (its previous holder's lease lapsed)
records no wait: its due time predates the lapsed attempt. The minute is the process clock's.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import TYPE_CHECKING

from ship_sqla.kernel._stats import StatsFold, stats_outcome
from ship_sqla.kernel._waiting import wait_event

if TYPE_CHECKING:
    from ship_sqla.kernel._metrics import JobOutcome
    from ship_sqla.kernel._ports import ClaimedRun
    from ship_sqla.kernel._runtime.state import InFlight
    from ship_sqla.kernel._runtime.wiring import Plumbing
    from ship_sqla.kernel._stats import JobStatsStore

__all__ = ["StatsRecorder", "queue_wait"]


def queue_wait(run: ClaimedRun) -> float | None:
    """Seconds from the run's due time to its claim, on the database's clock; None when not
    known (no due time, or a retaken run)."""
    if run.run_at is None or run.retaken:
        return None
    claimed = run.lease_expires_at - timedelta(seconds=run.lease)
    return max(0.0, (claimed - run.run_at).total_seconds())


class StatsRecorder:
    """Folds this runtime's finishes and flushes them to ``store`` every
    ``store.flush_interval`` seconds."""

    def __init__(self, store: JobStatsStore, shared: Plumbing) -> None:
        self.store = store
        self.interval = store.flush_interval
        self._clock = shared.clock
        self._report_error = shared.report_error
        self._fold = StatsFold()
        self._stop = asyncio.Event()

    def record(self, entry: InFlight, outcome: JobOutcome, run_seconds: float) -> None:
        counted = stats_outcome(outcome)
        if counted is None:
            return
        run = entry.run
        self._fold.record(run.job_id, self._clock.now(), counted, run_seconds, queue_wait(run))

    def record_dead(self, job_id: str) -> None:
        """A run a claim dead-lettered (its lease lapsed on its last attempt, J6): counted
        dead, with no run time or wait (its holder never settled it)."""
        self._fold.record(job_id, self._clock.now(), "dead")

    async def flush(self) -> None:
        """One flush of the fold (nothing when empty); a failure is reported and its rows
        kept for the next."""
        rows = self._fold.take()
        if not rows:
            return
        try:
            await self.store.add_stats(rows)
        except Exception as exc:  # noqa: BLE001 - J11: reported; the rows wait for the next
            self._fold.add_rows(rows)
            self._report_error(exc)

    async def run(self) -> None:
        """Flush every interval until :meth:`close`; then the runtime's final :meth:`flush`."""
        while not await wait_event(self._stop, self._clock, self.interval):
            await self.flush()

    def close(self) -> None:
        self._stop.set()
