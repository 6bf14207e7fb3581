"""Issue 36 item 6: an outbox's trend in the job history table, written by its relays.

A relay given ``stats=`` (a :class:`~ship_sqla.kernel._stats.JobStatsStore`, the table the job
workers flush into) runs :class:`OutboxStatsRecorder` beside its loop. Every
``stats.flush_interval`` seconds (15 s) it writes, under the row id :func:`outbox_stats_id`
(``outbox/<outbox_id>``: a ``/`` no job id has, so it never mixes with a job's rows):

- the messages this relay delivered since its last flush, as the minute's ``completed`` (one
  ``add_stats`` statement; every relay of the outbox adds its own, so the minute's count is the
  outbox's);
- the pending backlog, a sampled gauge: the outbox's pending messages counted through
  ``<outbox>_pending_idx`` (capped at :data:`PENDING_CAP`), as the minute's ``waiting`` (one
  count and one ``record_backlog`` statement; the last sample of a minute wins).

Nothing runs per message: the relay's claim, publish and settle are unchanged (the delivered
count is the relay's own counter). A failed write is reported through the relay's
``on_error`` and its count kept for the next flush; a crashed relay loses at most one interval
of its delivered count. The job history's retention prunes these rows with the rest.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

from ship_sqla.kernel._stats import Backlog, StatsRow, minute_of
from ship_sqla.kernel._waiting import wait_event

if TYPE_CHECKING:
    from collections.abc import Callable

    from ship_sqla._outbox._admin import OutboxAdmin
    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._stats import JobStatsStore

__all__ = ["PENDING_CAP", "OutboxStatsRecorder", "outbox_stats_id"]

PENDING_CAP: Final = 100_000
"""The most pending messages one sample counts (index entries read): more reads as this."""


def outbox_stats_id(outbox_id: str) -> str:
    """The history table's row id of ``outbox_id``'s trend (never a job id: it has a ``/``)."""
    return f"outbox/{outbox_id}"


class OutboxStatsRecorder:
    """Flushes a relay's delivered count and samples its outbox's pending backlog into
    ``store`` every ``store.flush_interval`` seconds, until :meth:`close`."""

    def __init__(
        self,
        store: JobStatsStore,
        admin: OutboxAdmin,
        outbox_id: str,
        *,
        delivered: Callable[[], int],
        clock: Clock,
        report: Callable[[BaseException], None],
    ) -> None:
        self.store = store
        self._admin = admin
        self._outbox_id = outbox_id
        self._row_id = outbox_stats_id(outbox_id)
        self._delivered = delivered
        self._clock = clock
        self._report = report
        self._flushed = delivered()
        self._stop = asyncio.Event()

    async def flush(self) -> None:
        """One flush: the delivered messages since the last one (none: no statement), then the
        pending gauge. A failure is reported; an unwritten count waits for the next flush."""
        minute = minute_of(self._clock.now())
        delivered = self._delivered()
        try:
            if delivered > self._flushed:
                row = StatsRow(self._row_id, minute, completed=delivered - self._flushed)
                await self.store.add_stats([row])
                self._flushed = delivered
            pending, _claimed = await self._admin.counts(self._outbox_id, cap=PENDING_CAP)
            await self.store.record_backlog(minute, {self._row_id: Backlog(pending, None)})
        except Exception as exc:  # noqa: BLE001 - J11: reported; the next flush retries
            self._report(exc)

    async def run(self) -> None:
        """Flush every interval until :meth:`close`, then once more."""
        while not await wait_event(self._stop, self._clock, self.store.flush_interval):
            await self.flush()
        await self.flush()

    def close(self) -> None:
        self._stop.set()
