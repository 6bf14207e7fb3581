"""J17, J22: when the fleet's sampler rebuilds the runs table's indexes before the next
maintenance pass (issue 39: after a held snapshot the heap comes back, its indexes do not).

J17's maintenance pass rebuilds every runs-table index that :func:`index_needs_rebuild` calls
bloated, once per ``MAINTENANCE_INTERVAL`` (10 minutes). A held snapshot makes them bloat in
minutes (every run settled while it is held leaves its index entries behind: 10 → ~96 MiB of
indexes in the steady bench's 10-minute hold), and no rebuild can run while it is held (the
pass skips: ``REINDEX CONCURRENTLY`` would wait for it). So the sampler, which reads the storage
health every sample anyway (J22), asks :class:`EarlyRebuild` after each read whether to run the
rebuild check now. It answers a reason when an index of the runs table needs a rebuild
(:func:`index_needs_rebuild` of the largest one against the table's live tuples) and no
snapshot older than the rebuild's lock timeout is held (one would make it wait and give up),
and:

- ``"released"``: a snapshot held for at least ``hold_age`` seconds (default 30, the default
  lease: from then on a held snapshot bloats every claim's probes; a warned-about one,
  ``HealthBounds.horizon_alarm``, counts whatever its age) was seen since the last complete
  check, and is gone: the first sample without it rebuilds, seconds after the release instead
  of up to 10 minutes;
- ``"bloated"``: the largest index is past ``factor`` (default 4) times what the rule allows,
  whatever caused it (a burst, a hold shorter than ``hold_age``), at most once per ``gap``
  seconds (default 60) so an ordinary load, whose indexes hover around the rule between passes,
  is left to the pass.

A check that was deferred (a lock not granted within 1 s) or skipped (a snapshot the health
read did not see, an interrupted rebuild's leftover dropped first) is tried again at the next
sample, ``RETRIES`` times in a row at most before ``gap`` applies again. A maintenance pass is a
check too (:meth:`EarlyRebuild.checked`). The rebuild itself is J17's, unchanged: one index at
a time, ``REINDEX INDEX CONCURRENTLY`` under the 1 s ``lock_timeout``, skipped while a snapshot
older than 1 s is held. Pure: no SQLAlchemy; time is the injected clock's ``monotonic``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal, Protocol, runtime_checkable

from ship_sqla.kernel._history_partitions import (
    INDEX_REBUILD_ENTRY_BYTES,
    INDEX_REBUILD_FLOOR,
    LOCK_TIMEOUT,
    HistoryMaintenance,
)

if TYPE_CHECKING:
    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._health import StorageHealth

__all__ = [
    "EARLY_REBUILD_FACTOR",
    "EARLY_REBUILD_GAP",
    "RELEASE_HOLD_AGE",
    "RETRIES",
    "EarlyRebuild",
    "RebuildReason",
    "RunsIndexRebuilder",
    "rebuild_allowance",
]

RebuildReason = Literal["released", "bloated"]

RELEASE_HOLD_AGE: Final = 30.0
"""Seconds a snapshot must have been held for its release to call for a rebuild (the default
lease: past it every finished run's lease entry is in the claims' lapsed range)."""

EARLY_REBUILD_FACTOR: Final = 4
"""How far past the rule's allowance the largest index must be for a rebuild before the pass
without a hold having been released."""

EARLY_REBUILD_GAP: Final = 60.0
"""Seconds between two early checks for bloat alone (a release is acted on at once)."""

RETRIES: Final = 3
"""Early checks in a row retried at the next sample after a deferred or skipped one."""


def rebuild_allowance(live_entries: int) -> int:
    """The bytes :func:`~ship_sqla.kernel._history_partitions.index_needs_rebuild` allows one
    runs-table index holding ``live_entries`` live runs."""
    return max(INDEX_REBUILD_FLOOR, INDEX_REBUILD_ENTRY_BYTES * max(live_entries, 0))


@runtime_checkable
class RunsIndexRebuilder(Protocol):
    """A store that can run J17's runs-table index rebuild step on its own (no partition DDL)."""

    async def rebuild_runs_indexes(self) -> HistoryMaintenance:
        """The rebuild step of a maintenance pass alone: only its ``rebuilt``,
        ``leftovers_dropped``, ``invalid``, ``rebuild_skipped`` and ``deferred`` are set."""
        ...


class EarlyRebuild:
    """The rule (see the module docstring): :meth:`due` after each health read, then
    :meth:`checked` with what the check (or a maintenance pass) did."""

    __slots__ = ("_checked_at", "_clock", "_factor", "_gap", "_hold_age", "_hold_seen", "_retries")

    def __init__(
        self,
        clock: Clock,
        *,
        hold_age: float = RELEASE_HOLD_AGE,
        factor: float = EARLY_REBUILD_FACTOR,
        gap: float = EARLY_REBUILD_GAP,
    ) -> None:
        self._clock = clock
        self._hold_age = hold_age
        self._factor = factor
        self._gap = gap
        self._hold_seen = False
        self._checked_at: float | None = None
        self._retries = 0

    @property
    def hold_seen(self) -> bool:
        """A long hold was seen since the last complete check (its release is awaited)."""
        return self._hold_seen

    def due(self, health: StorageHealth) -> RebuildReason | None:
        """Why the rebuild check should run now, or None (see the module docstring)."""
        reason = self._reason(health)
        last = self._checked_at
        if reason is None or last is None or 0 < self._retries <= RETRIES:
            return reason
        if reason == "released" and not self._retries:
            return reason
        return reason if self._clock.monotonic() - last >= self._gap else None

    def _reason(self, health: StorageHealth) -> RebuildReason | None:
        """The reason an index of the runs table needs a rebuild now, leaving timing aside."""
        if not health.known:
            return None
        holder = health.horizon
        if holder is not None:
            if holder.age >= min(self._hold_age, health.bounds.horizon_alarm):
                self._hold_seen = True
            if holder.age > LOCK_TIMEOUT:  # the rebuild would wait for it: not now
                return None
        runs = health.table("runs")
        largest = None if runs is None else runs.largest_index_bytes
        if runs is None or largest is None:
            return None
        allowance = rebuild_allowance(runs.live_tuples)
        if largest <= allowance:
            self._hold_seen = False  # released with nothing to rebuild: nothing awaited
            return None
        if self._hold_seen:
            return "released"
        return "bloated" if largest > self._factor * allowance else None

    def checked(self, done: HistoryMaintenance) -> None:
        """A rebuild check ran (early, or within a maintenance pass) and did ``done``: complete
        (nothing deferred or skipped) ends the awaited release; otherwise the next sample
        tries again (:data:`RETRIES` times in a row at most)."""
        self._checked_at = self._clock.monotonic()
        if done.deferred or done.rebuild_skipped is not None:
            self._retries += 1
            return
        self._retries = 0
        self._hold_seen = False
