"""The worker registry (F6) and the fleet's one queue-gauge sampler (F5): the port, its values and
its bounds, once for every backend.

Each worker runtime keeps one entry in its backend's registry (:class:`WorkerRegistry`, carried
as ``backend.workers``): who it is (id, host, pid, start), which jobs it runs, how many runs it
holds and whether it is draining, refreshed by a heartbeat every
:data:`WORKER_HEARTBEAT_INTERVAL` seconds and removed when it stops. An entry not seen for
:data:`WORKER_STALE_AFTER` seconds belongs to a process that died (or cannot reach the database)
and is pruned by the heartbeat of any live worker; a live worker that was pruned registers again
at its next beat.

The same registry elects the fleet's queue sampler (F5): at most one entry holds the sampler
lease at any instant of the store's clock, for :data:`SAMPLER_LEASE` seconds from its last
renewal. The runtime holding it samples the queue gauges of every job its fleet runs; the others
sample nothing. A holder that dies is replaced once its lease lapses; one that stops or starts
draining hands the lease back at once.

The runtime's side of the rules is :mod:`ship_sqla.kernel._runtime.registration`; the stores
only store (:class:`~ship_sqla.kernel.InMemoryWorkerRegistry`, and the PostgreSQL one of
``create_job_backend``, ``ship_job_workers_table``). Both pass one conformance suite
(``tests/conformance/test_job_workers_conformance.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

import attrs

if TYPE_CHECKING:
    from datetime import datetime

__all__ = [
    "MAX_WORKERS_LISTED",
    "PRUNE_BATCH",
    "SAMPLER_LEASE",
    "WORKER_HEARTBEAT_INTERVAL",
    "WORKER_STALE_AFTER",
    "WorkerEntry",
    "WorkerRecord",
    "WorkerRegistry",
]

WORKER_HEARTBEAT_INTERVAL: Final = 10.0
"""Seconds between two heartbeats of a worker runtime's registry entry (F6): one upsert of a
small row, one bounded prune and, for a runtime that samples, one lease renewal."""
WORKER_STALE_AFTER: Final = 3 * WORKER_HEARTBEAT_INTERVAL
"""An entry not seen for this many seconds (three missed heartbeats) is pruned (F6)."""
SAMPLER_LEASE: Final = 3 * WORKER_HEARTBEAT_INTERVAL
"""How long one renewal of the queue-sampler lease lasts (F5): three heartbeats, so a holder
that died is replaced within ``SAMPLER_LEASE + WORKER_HEARTBEAT_INTERVAL`` seconds."""
PRUNE_BATCH: Final = 100
"""Stale entries one heartbeat deletes at most (one bounded statement); the next beat goes on."""
MAX_WORKERS_LISTED: Final = 1000
"""Entries one listing reads at most: ``JobOperations.workers``, ``ship-sqla workers`` and the
sampler's view of which jobs its fleet runs."""


@attrs.frozen
class WorkerEntry:
    """What a worker runtime reports of itself at every heartbeat (F6). The store keeps it as
    given and stamps ``last_seen_at`` with its own clock."""

    worker_id: str
    host: str
    pid: int
    started_at: datetime
    job_ids: tuple[str, ...]
    """The ids of the jobs the runtime executes, in its registry's order."""
    in_flight: int
    """Runs the runtime has claimed and not settled yet."""
    draining: bool
    """True from the moment ``stop()`` was called: the runtime claims nothing any more."""
    job_versions: tuple[str, ...] = ()
    """D9: the handler versions it serves, ``"<job_id>:<version>"`` for each versioned job
    (:func:`~ship_sqla.kernel._versions.served_entries`)."""


@attrs.frozen
class WorkerRecord:
    """One registry entry as operators see it (``JobOperations.workers``, ``ship-sqla
    workers``): the :class:`WorkerEntry` its runtime last reported, when that was
    (``last_seen_at``, the store's clock), and whether it holds the fleet's queue-sampler lease
    now (``sampler``, F5)."""

    worker_id: str
    host: str
    pid: int
    started_at: datetime
    last_seen_at: datetime
    job_ids: tuple[str, ...]
    in_flight: int
    draining: bool
    sampler: bool = False
    job_versions: tuple[str, ...] = ()
    """D9: the handler versions it serves (as :attr:`WorkerEntry.job_versions`)."""


@runtime_checkable
class WorkerRegistry(Protocol):
    """Storage of the worker registry (F6) and of the queue-sampler lease (F5). It receives what
    the runtime decided (its entry, the bounds) and stores it; every time is the store's clock
    (``coalesce(:now, now())`` on PostgreSQL). Safe to call from many processes."""

    async def probe(self) -> str | None:
        """None when the registry can be kept here; else why not and the fix, which the runtime
        logs once before running unregistered (the PostgreSQL store: its table is missing)."""
        ...

    async def heartbeat(self, entry: WorkerEntry) -> None:
        """Insert or replace ``entry``'s row (the first call registers the worker, and so does
        one after a prune), with ``last_seen_at`` now. The sampler lease it holds is kept."""
        ...

    async def deregister(self, worker_id: str) -> bool:
        """Remove ``worker_id``'s entry (and so the sampler lease it held); False when it had
        none."""
        ...

    async def prune(self, *, stale_after: float, limit: int) -> int:
        """Delete at most ``limit`` entries last seen ``stale_after`` seconds ago or longer,
        oldest first (one bounded statement); the number deleted. An entry refreshed while the
        prune runs is kept."""
        ...

    async def hold_sampler(self, worker_id: str, *, lease: float) -> bool:
        """Take or renew the fleet's queue-sampler lease for ``worker_id`` until ``lease``
        seconds from now: True when it holds it now, False when another entry holds a lease
        that has not lapsed, or ``worker_id`` has no entry. Never two holders at once."""
        ...

    async def release_sampler(self, worker_id: str) -> None:
        """Give the sampler lease back, if ``worker_id`` holds it (the next asker gets it)."""
        ...

    async def list_workers(self, *, limit: int) -> list[WorkerRecord]:
        """At most ``limit`` entries, stale ones not pruned yet included, ordered by worker id
        (code point order)."""
        ...
