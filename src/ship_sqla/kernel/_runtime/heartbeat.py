"""Automatic heartbeats: one ``RunStore.heartbeat`` call per round for every due run (J5).

Each run is due every third of its job's ``concurrency.lease`` after its claim (so two beats may
fail before the lease lapses). Runs claimed together fall due together and share one call.
A single-runner lock is extended in the same round, so exclusion lasts as long as the run.

A heartbeat answers, per run, whether its lease is still the holder's (§10: a heartbeat that
answers nothing could carry neither a lost lease nor a cancel). One the backend refuses (stale
token, or a lease that lapsed: a lapsed lease is never revived) hands the run to ``on_lost``
(``"lease-lost"``), which cancels its handler; a held one whose cancel an operator requested
(``HeartbeatBatch.cancel_requested``, K2) is handed over as ``"cancelled"``: the fallback for a
runtime that missed the notification, at most one beat (a third of the lease) late. A run is
not heartbeated while its settle is on its way, so no heartbeat races its settle (§10), unless
that settle is still unanswered in the lease's last third, or a settle call of it failed (an
outage): then the lease is kept while the completer retries (``InFlight.next_beat``). A
heartbeat call that fails is
tried again after the error backoff (about a second at most), not a whole interval later, so a
short outage does not eat the lease's margin. Each answered heartbeat moves the run's
``lease_deadline`` (the runtime's own bound on the lease) to when it was sent plus the lease the
claim was granted (``ClaimedRun.lease``: the store extends the lease by as much).
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING

from ship_sqla.kernel._ports import RenewableLock
from ship_sqla.kernel._waiting import wait_event

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from ship_sqla.kernel._job_context import CancelReason
    from ship_sqla.kernel._ports import RunStore
    from ship_sqla.kernel._runtime.state import InFlight
    from ship_sqla.kernel._runtime.wiring import Plumbing

__all__ = ["Heartbeater"]


class Heartbeater:
    """Invariants: a run whose heartbeat answered False is never heartbeated again and is
    handed to ``on_lost`` once; a held run answered cancel-requested is handed to ``on_lost``
    with ``"cancelled"`` while its handler runs, and still heartbeated until it settles; a run
    is heartbeated at its ``next_beat`` only (never while its settle is on its way, unless
    that settle is slow or failed); a heartbeat
    call that raises cancels nothing (the lease may still be good) and goes to report_error; it
    is retried after ``error_backoff``, never later than the run's next regular beat."""

    def __init__(
        self,
        store: RunStore,
        shared: Plumbing,
        entries: Mapping[str, InFlight],
        *,
        tick: float,
        on_lost: Callable[[InFlight, CancelReason], None],
    ) -> None:
        self._store = store
        self._report_error = shared.report_error
        self._clock = shared.clock
        self._entries = entries
        # The longest this loop sleeps: a run claimed while it sleeps falls due no earlier than
        # one tick later, because no job heartbeats more often than every ``tick`` seconds.
        self._tick = tick
        self._on_lost = on_lost
        self._error_backoff = shared.error_backoff
        self._failures = 0
        self._closing = asyncio.Event()

    def close(self) -> None:
        self._closing.set()

    async def run(self) -> None:
        while not self._closing.is_set():
            now = self._clock.monotonic()
            due = [entry for entry in self._entries.values() if entry.next_beat <= now]
            if due:
                await self._beat(due, now)
            await self._extend_fenced_locks(now)
            next_due = min(
                (min(e.next_beat, e.next_lock_extension) for e in self._entries.values()),
                default=math.inf,
            )
            delay = min(next_due - self._clock.monotonic(), self._tick)
            await wait_event(self._closing, self._clock, max(delay, 0.0))

    async def _beat(self, due: list[InFlight], now: float) -> None:
        # J13: a transactional handler about to fence one of these runs waits for this call
        # first (InFlight.beat_pending): a heartbeat that reached the row after the fence's lock
        # would wait for that whole transaction, holding up every other run of the batch.
        answered = asyncio.Event()
        for entry in due:
            entry.beat_due = now + entry.job.concurrency.heartbeat_interval
            entry.beat_pending = answered
        try:
            await self._beat_now(due)
        finally:
            answered.set()
            for entry in due:
                if entry.beat_pending is answered:
                    entry.beat_pending = None

    async def _beat_now(self, due: list[InFlight]) -> None:
        sent = self._clock.monotonic()
        try:
            alive = await self._store.heartbeat([entry.run for entry in due])
            if len(alive) != len(due):
                msg = (
                    f"backend.heartbeat answered {len(alive)} results for {len(due)} runs; a"
                    " RunStore must answer one result per run, in order."
                )
                raise RuntimeError(msg)  # noqa: TRY301 - reported with the other failures
        except Exception as exc:  # noqa: BLE001 - J11: absorbed and reported; retried soon
            self._report_error(exc)
            self._retry_soon(due)
            return
        self._failures = 0
        cancel_requested = alive.cancel_requested
        for entry, ok in zip(due, alive, strict=True):
            if self._entries.get(entry.run.run_id) is not entry:
                continue  # settled while the heartbeat was in flight: nothing left to keep alive
            if ok and entry.run.run_id in cancel_requested and not entry.handler_done:
                # K2's fallback: the notification was missed (or the backend sends none).
                self._on_lost(entry, "cancelled")
            if not ok:
                # Once the handler returned, a refusal may only mean its completion landed
                # first; the completion's own answer tells (and reports a truly stale lease).
                # J13: a fenced run's transaction answers for it (a heartbeat sent just before
                # the fence waited for its commit, and finds the run completed).
                if not entry.lost and not entry.handler_done and not entry.fenced:
                    self._on_lost(entry, "lease-lost")
            else:
                entry.lease_deadline = sent + entry.run.lease
                if entry.lock is not None:
                    await self._extend_lock(entry)

    async def _extend_fenced_locks(self, now: float) -> None:
        """J4, J13: extend the single-runner locks of fenced runs (not heartbeated while their
        transaction may hold the row), on their heartbeat schedule, so the exclusion lasts as
        long as the handler; a lock that cannot be extended cancels the handler, as always."""
        due = [e for e in self._entries.values() if e.next_lock_extension <= now]
        for entry in due:
            entry.beat_due = now + entry.job.concurrency.heartbeat_interval
            await self._extend_lock(entry)

    def _retry_soon(self, due: list[InFlight]) -> None:
        """After a failed call: beat these runs again after the error backoff (their lease may
        be running out), or at their regular time if that comes first."""
        self._failures += 1
        retry = self._clock.monotonic() + self._error_backoff(self._failures)
        for entry in due:
            if not entry.lost:
                entry.beat_due = min(entry.beat_due, retry)

    async def _extend_lock(self, entry: InFlight) -> None:
        lock = entry.lock
        assert lock is not None  # noqa: S101 - checked by the caller
        try:
            if isinstance(lock, RenewableLock):
                held = await lock.extend(entry.job.concurrency.lease)
            else:
                held = not lock.lost
        except Exception as exc:  # noqa: BLE001 - J11: absorbed and reported; next round retries
            self._report_error(exc)
            return
        if not held:
            self._on_lost(entry, "lock-lost")
