"""F6: a worker runtime's entry in its backend's worker registry; F5: whether this runtime is the
fleet's queue sampler. The port and the bounds are :mod:`ship_sqla.kernel._workers`'s.

The runtime registers when it starts (its first heartbeat), heartbeats every
``WORKER_HEARTBEAT_INTERVAL`` seconds of its clock with what it runs, holds and whether it is
draining, prunes the entries not seen for ``WORKER_STALE_AFTER`` seconds in the same beat, and
deregisters once it has stopped. A runtime that samples the queue gauges (metrics on, a reader
collecting them, ``queue_sample_interval`` set) also asks for the fleet's sampler lease at every
beat; while it holds it, it samples the queues of every job its fleet runs (the union of the
registry's entries), and the other runtimes sample nothing.

Without a registry (a backend that keeps none, or whose store says why not: the PostgreSQL
backend's table is absent) the runtime logs that once and runs unregistered, and each runtime
samples its own jobs' queues, as before the registry existed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Literal

from ship_sqla.kernel._versions import served_by_entries
from ship_sqla.kernel._waiting import wait_event
from ship_sqla.kernel._workers import (
    MAX_WORKERS_LISTED,
    PRUNE_BATCH,
    SAMPLER_LEASE,
    WORKER_HEARTBEAT_INTERVAL,
    WORKER_STALE_AFTER,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from ship_sqla.kernel._runtime.wiring import Plumbing
    from ship_sqla.kernel._workers import WorkerEntry, WorkerRegistry

__all__ = ["Registration"]

logger = logging.getLogger("ship_sqla.jobs")


class Registration:
    """One runtime's registry entry and sampler lease (:meth:`run` until :meth:`close`).
    ``entry()`` is what each heartbeat reports; ``wants_sampler()`` whether the runtime would
    sample now; ``on_sampler()`` is called when it starts sampling (a fresh lease, or no
    registry: its own jobs), so the sampler samples at once.

    Invariants:

    - The entry is written at start, every ``WORKER_HEARTBEAT_INTERVAL`` seconds after, at once
      when draining begins (:meth:`drain`), and deleted once the runtime has stopped; one task
      does all of it in order, so no heartbeat ever lands after the deregistration.
    - Every heartbeat prunes at most ``PRUNE_BATCH`` entries not seen for
      ``WORKER_STALE_AFTER`` seconds.
    - The runtime samples the fleet's queues only while its last granted lease runs on its own
      monotonic clock (from when the renewal was sent: never past the store's end of it). A
      draining runtime asks for no lease, hands back the one it holds, and samples nothing.
    - A registry failure is reported (J11) and retried after the error backoff; it never stops
      the runtime, and never stops it from claiming.
    """

    def __init__(
        self,
        registry: WorkerRegistry,
        shared: Plumbing,
        *,
        worker_id: str,
        entry: Callable[[], WorkerEntry],
        wants_sampler: Callable[[], bool],
        on_sampler: Callable[[], None] | None,
    ) -> None:
        self._registry = registry
        self._clock = shared.clock
        self._worker_id = worker_id
        self._entry = entry
        self._wants_sampler = wants_sampler
        self._on_sampler = on_sampler
        self._report_error = shared.report_error
        self._error_backoff = shared.error_backoff
        self._state: Literal["probing", "on", "off"] = "probing"
        # The local end of the sampler lease (runtime's monotonic clock); None: not held.
        self._sampler_until: float | None = None
        # True from a grant until the lease was handed back (a fresh grant samples at once).
        self._granted = False
        # True from asking for the lease until a release or a refusal is answered: what a
        # drain must release (a hold whose answer was lost may hold it).
        self._may_hold = False
        self._fleet_jobs: tuple[str, ...] = ()
        # D9: the handler versions the fleet serves, per job (the registry's entries).
        self._fleet_versions: dict[str, frozenset[int]] = {}
        self._draining = False
        self._closing = False
        self._kick = asyncio.Event()

    def sampled_jobs(self, own: Sequence[str]) -> tuple[str, ...]:
        """F5: the jobs whose queue gauges this runtime samples now: ``own`` without a
        registry; with one, every job the fleet runs while this runtime holds the sampler
        lease, else none."""
        if self._state == "off":
            return tuple(own)
        until = self._sampler_until
        if self._draining or until is None or self._clock.monotonic() >= until:
            return ()
        return self._fleet_jobs

    def served_versions(self, own: Mapping[str, frozenset[int]]) -> Mapping[str, frozenset[int]]:
        """D9: the handler versions served, per job: ``own`` without a registry; with one, the
        union of every registered worker's as of this runtime's last sampler beat."""
        if self._state == "off":
            return own
        return self._fleet_versions

    def drain(self) -> None:
        """``stop()`` was called: report draining at once and hand the sampler lease back."""
        self._draining = True
        self._sampler_until = None
        self._kick.set()

    def close(self) -> None:
        """The runtime has stopped: :meth:`run` deregisters and returns."""
        self._closing = True
        self._kick.set()

    async def run(self) -> None:
        failures = 0
        while not self._closing:
            self._kick.clear()
            try:
                if self._state == "probing" and not await self._probe():
                    return
                await self._beat()
                failures = 0
                delay = WORKER_HEARTBEAT_INTERVAL
            except Exception as exc:  # noqa: BLE001 - J11: reported; the next beat retries
                self._report_error(exc)
                failures += 1
                delay = self._error_backoff(failures)
            await wait_event(self._kick, self._clock, delay)
        if self._state == "on":
            try:
                await self._registry.deregister(self._worker_id)
            except Exception as exc:  # noqa: BLE001 - J11: the entry is pruned once stale
                self._report_error(exc)

    async def _probe(self) -> bool:
        reason = await self._registry.probe()
        if reason is None:
            self._state = "on"
            return True
        self._state = "off"
        if self._on_sampler is not None:  # it samples its own jobs from now on: at once
            self._on_sampler()
        logger.warning(
            "job runtime %s runs unregistered, and samples its own jobs' queue gauges: %s",
            self._worker_id,
            reason,
        )
        return False

    async def _beat(self) -> None:
        registry = self._registry
        entry = self._entry()
        await registry.heartbeat(entry)
        await registry.prune(stale_after=WORKER_STALE_AFTER, limit=PRUNE_BATCH)
        if self._draining or not self._wants_sampler():
            self._sampler_until = None
            if self._may_hold:
                # Cleared only once the release is answered: a failed one is retried next beat.
                await registry.release_sampler(self._worker_id)
                self._may_hold = False
                self._granted = False
            return
        sent = self._clock.monotonic()
        # Set before asking: a hold whose answer is lost (an error after the commit) may hold
        # the lease, so a drain releases it rather than leave it to lapse.
        self._may_hold = True
        if not await registry.hold_sampler(self._worker_id, lease=SAMPLER_LEASE):
            self._sampler_until = None
            self._granted = self._may_hold = False
            return
        # A new holder samples at once; a renewing one keeps its sampler's period.
        fresh = not self._granted
        self._granted = True
        workers = await registry.list_workers(limit=MAX_WORKERS_LISTED)
        fleet = {*entry.job_ids, *(job for worker in workers for job in worker.job_ids)}
        self._fleet_jobs = tuple(sorted(fleet))
        self._fleet_versions = served_by_entries(
            (*entry.job_versions, *(text for worker in workers for text in worker.job_versions))
        )
        self._sampler_until = sent + SAMPLER_LEASE
        if fresh and self._on_sampler is not None:
            self._on_sampler()
