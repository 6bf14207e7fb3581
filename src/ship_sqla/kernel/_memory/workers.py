"""The in-memory worker registry (F6) and queue-sampler lease (F5): the reference the PostgreSQL
store is tested against (``tests/conformance/test_job_workers_conformance.py``). Time comes only
from the injected clock."""

from __future__ import annotations

import heapq
from datetime import timedelta
from typing import TYPE_CHECKING

from ship_sqla.kernel._workers import WorkerRecord

if TYPE_CHECKING:
    from datetime import datetime

    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._workers import WorkerEntry

__all__ = ["InMemoryWorkerRegistry"]


class _Stored:
    __slots__ = ("entry", "last_seen_at", "sampler_until")

    def __init__(
        self, entry: WorkerEntry, last_seen_at: datetime, sampler_until: datetime | None
    ) -> None:
        self.entry = entry
        self.last_seen_at = last_seen_at
        self.sampler_until = sampler_until


class InMemoryWorkerRegistry:
    """:class:`~ship_sqla.kernel.WorkerRegistry` in one process's memory: what
    :class:`~ship_sqla.kernel.InMemoryJobBackend` carries as ``backend.workers``. Every method
    runs without awaiting in between, so no two tasks ever both hold the sampler lease."""

    __slots__ = ("_clock", "_entries")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._entries: dict[str, _Stored] = {}

    async def probe(self) -> str | None:
        return None

    async def heartbeat(self, entry: WorkerEntry) -> None:
        stored = self._entries.get(entry.worker_id)
        sampler_until = stored.sampler_until if stored is not None else None
        self._entries[entry.worker_id] = _Stored(entry, self._clock.now(), sampler_until)

    async def deregister(self, worker_id: str) -> bool:
        return self._entries.pop(worker_id, None) is not None

    async def prune(self, *, stale_after: float, limit: int) -> int:
        cutoff = self._clock.now() - timedelta(seconds=stale_after)
        doomed = heapq.nsmallest(
            limit,
            (stored for stored in self._entries.values() if stored.last_seen_at <= cutoff),
            key=lambda stored: stored.last_seen_at,
        )
        for stored in doomed:
            del self._entries[stored.entry.worker_id]
        return len(doomed)

    async def hold_sampler(self, worker_id: str, *, lease: float) -> bool:
        mine = self._entries.get(worker_id)
        if mine is None:
            return False
        now = self._clock.now()
        if any(
            stored is not mine and stored.sampler_until is not None and stored.sampler_until > now
            for stored in self._entries.values()
        ):
            return False
        mine.sampler_until = now + timedelta(seconds=lease)
        return True

    async def release_sampler(self, worker_id: str) -> None:
        mine = self._entries.get(worker_id)
        if mine is not None:
            mine.sampler_until = None

    async def list_workers(self, *, limit: int) -> list[WorkerRecord]:
        now = self._clock.now()
        return [
            _record(self._entries[worker_id], now) for worker_id in sorted(self._entries)[:limit]
        ]


def _record(stored: _Stored, now: datetime) -> WorkerRecord:
    entry = stored.entry
    return WorkerRecord(
        worker_id=entry.worker_id,
        host=entry.host,
        pid=entry.pid,
        started_at=entry.started_at,
        last_seen_at=stored.last_seen_at,
        job_ids=entry.job_ids,
        in_flight=entry.in_flight,
        draining=entry.draining,
        sampler=stored.sampler_until is not None and stored.sampler_until > now,
        job_versions=entry.job_versions,
    )
