"""J19: where a claim's priority walk starts (the claim floor), and when it walks from the start.

Under a held MVCC horizon (an open ``REPEATABLE READ`` transaction anywhere in the database) the
index entries of runs already claimed stay in ``<runs>_due_idx`` until the horizon moves, and a
walk that starts at the index's start reads all of them: its cost grows with throughput x hold
time. So each backend keeps, per job and per priority level, the lowest ``(run_at, seq)`` its
previous claim took there (never later than ``now - lag``), and its next claim of that level
starts there. Every ``sweep`` seconds (and at a backend's first claim of a job) a claim walks
from the index's start instead: that is the one claim that pays for the dead prefix.

That full walk's cost grows with the hold too (it reads every entry the hold kept: 0.4 s of
server time at 10 minutes of 1,000 runs a second). So the full walks are spaced by what the
last one took (:func:`sweep_spacing`): never sooner than ``sweep`` seconds, and later while a
full walk takes more than ``share`` of that spacing (``took / share`` seconds), up to
``ceiling`` seconds. Their cost is then at most ``share`` of one connection's time (0.1 %: at
1,000 runs a second, about a microsecond a claimed run for each of the two sweeps) until a full
walk takes more than ``share x ceiling`` (60 ms), and one full walk a ``ceiling`` after that; a
quick full walk (no hold: a few milliseconds) keeps the ``sweep`` spacing.

The rule holds exactly for every run the floor can see coming: a run committed after the floor
was recorded with ``run_at >= its commit - lag`` (every plain enqueue, retry, release, snooze and
operator retry) is above it, and a run this backend itself enqueues below a floor lowers that
floor at once. What it relaxes (K6, stated in docs/jobs.md): a run enqueued by ANOTHER process
with a ``run_at`` more than ``lag`` in the past, or whose enqueuing transaction stayed open
longer than ``lag``, or that a concurrent statement held locked when the floor's claim passed it
(``SKIP LOCKED``) and then released, may be claimed after lower-priority or later runs, for at
most ``sweep`` seconds (plus one claim interval): the next full walk takes it in its turn. While
full walks are slow (each takes more than ``sweep x share``, 5 ms by default: a held horizon's
dead entries, which J22 reports), that bound is the spacing, at most ``ceiling`` (60 s).

Pure and clock-injected: the PostgreSQL backend passes the floors to CLAIM_UNCAPPED /
CLAIM_GATED (and their keyed forms) as arrays; the in-memory backend filters its candidates by
the same floors. Aged (F10), fair (F2) and partitioned (F8/F9) claims walk from the start.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

import attrs

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "DEFAULT_FLOOR_LAG",
    "DEFAULT_FLOOR_SWEEP",
    "ClaimFloors",
    "Floor",
    "LapsedFloors",
    "below_floor",
    "lapsed_probe_complete",
    "sweep_spacing",
]

DEFAULT_FLOOR_SWEEP: Final = 5.0
"""J19: seconds between two full walks of a job by one backend (the bound of K6's relaxation)."""
DEFAULT_SWEEP_SHARE: Final = 0.001
"""J19: the most a backend's full walks (and full lapsed probes) of a job take of its time: a
full walk that took ``t`` seconds is followed by the next one no sooner than ``t / share``.
At 0.5 % the two sweeps of a 1,000 runs/s job cost its claims two thirds more under a held
snapshot (BENCHMARKS.md, "Issue 39: the sweeps' share"); 0.1 % keeps them within a few %."""
DEFAULT_SWEEP_CEILING: Final = 60.0
"""J19: the longest spacing of two full walks of a job by one backend, however slow they are
(the bound of K6's relaxation while full walks are slow)."""
DEFAULT_FLOOR_LAG: Final = 1.0
"""J19: a floor is never later than ``now - lag`` (seconds): runs back-dated by less than this,
or whose enqueuing transaction lasted less than this, are always above every floor."""

_LOWEST_SEQ: Final = 0
"""Below every stored ``seq`` (a sequence starting at 1)."""


@attrs.frozen
class Floor:
    """Where one priority level's walk starts: runs at ``(run_at, seq) >= (run_at, seq)``."""

    priority: int
    run_at: datetime
    seq: int


def sweep_spacing(
    took: float | None,
    *,
    sweep: float = DEFAULT_FLOOR_SWEEP,
    share: float = DEFAULT_SWEEP_SHARE,
    ceiling: float = DEFAULT_SWEEP_CEILING,
) -> float:
    """J19: seconds from a full walk (or full lapsed probe) that took ``took`` seconds (None:
    not measured) to the next one: ``sweep``, or ``took / share`` when that is longer, never
    more than ``ceiling`` (nor less than ``sweep``)."""
    if took is None or not took > 0:
        return sweep
    return max(sweep, min(took / share, ceiling))


def below_floor(floors: Iterable[Floor], priority: int, run_at: datetime, seq: int) -> bool:
    """Whether a waiting run at ``(priority, run_at, seq)`` is below its level's floor (the
    floored walk does not see it). A level without a floor is walked from its start."""
    for floor in floors:
        if floor.priority == priority:
            return (run_at, seq) < (floor.run_at, floor.seq)
    return False


@attrs.define
class _Sweeps:
    """When one backend's claims of each job read from the start (J19): its first, then each
    ``sweep`` seconds after the last one, longer after a slow one (:func:`sweep_spacing`), or
    when the clock went back. Shared by the claim walk's floors and the lapsed probe's."""

    sweep: float = DEFAULT_FLOOR_SWEEP
    lag: float = DEFAULT_FLOOR_LAG
    share: float = DEFAULT_SWEEP_SHARE
    ceiling: float = DEFAULT_SWEEP_CEILING
    _swept: dict[str, datetime] = attrs.field(factory=dict, init=False)
    _spacing: dict[str, float] = attrs.field(factory=dict, init=False)

    def _sweeping(self, job_id: str, now: datetime) -> bool:
        """Whether the next claim of ``job_id`` at ``now`` reads from the start."""
        swept = self._swept.get(job_id)
        if swept is None or now < swept:
            return True
        return (now - swept).total_seconds() >= self._spacing.get(job_id, self.sweep)

    def _swept_at(self, job_id: str, now: datetime, took: float | None) -> None:
        """A read from the start at ``now`` that took ``took`` seconds: the next one is
        :func:`sweep_spacing` later."""
        self._swept[job_id] = now
        self._spacing[job_id] = sweep_spacing(
            took, sweep=self.sweep, share=self.share, ceiling=self.ceiling
        )


@attrs.define
class ClaimFloors(_Sweeps):
    """One backend's claim floors, per job (J19). Not thread-safe; one per backend."""

    _levels: dict[str, dict[int, tuple[datetime, int]]] = attrs.field(factory=dict, init=False)

    def floors(self, job_id: str, now: datetime) -> tuple[Floor, ...]:
        """The floors the next claim of ``job_id`` starts at, by priority; ``()``: a full walk
        (the backend's first claim of the job, or the spacing since its last full walk passed:
        ``sweep`` seconds, longer after a slow one, :func:`sweep_spacing`; or the clock went
        back)."""
        if self._sweeping(job_id, now):
            return ()
        levels = self._levels.get(job_id, {})
        return tuple(Floor(p, at, seq) for p, (at, seq) in sorted(levels.items(), reverse=True))

    def record(
        self,
        job_id: str,
        now: datetime,
        floors: tuple[Floor, ...],
        taken: Iterable[tuple[int, datetime, int]],
        *,
        took: float | None = None,
    ) -> None:
        """After a claim that walked from ``floors`` (``()``: a full walk) and took the waiting
        runs ``taken`` as (priority, run_at, seq) (retaken lapsed runs excluded): each level it
        took from starts next time at the lowest position taken there, never later than
        ``now - lag``; the other levels keep their floors (none after a full walk). ``took``:
        the claim's seconds, which space a full walk from the next (:func:`sweep_spacing`)."""
        if not floors:
            self._swept_at(job_id, now, took)
            self._levels[job_id] = {}
        levels = self._levels.setdefault(job_id, {})
        lowest: dict[int, tuple[datetime, int]] = {}
        for priority, run_at, seq in taken:
            here = lowest.get(priority)
            if here is None or (run_at, seq) < here:
                lowest[priority] = (run_at, seq)
        cap = (now - timedelta(seconds=self.lag), _LOWEST_SEQ)
        for priority, position in lowest.items():
            levels[priority] = min(position, cap)

    def lower(self, job_id: str, priority: int, run_at: datetime) -> None:
        """A run this backend enqueued at ``run_at``: a floor of its level above it moves down
        to it (so this backend's own back-dated enqueues are never skipped)."""
        levels = self._levels.get(job_id)
        if levels is None:
            return
        floor = levels.get(priority)
        if floor is not None and run_at <= floor[0]:
            levels[priority] = (run_at, _LOWEST_SEQ)


def lapsed_probe_complete(*, found: int, handled: int, limit: int, paused: bool) -> bool:
    """J6/J19: whether a claim's lapsed-lease probe met every lapsed run it could see: it found
    fewer than its limit (``lapsed_limit``), the claim retook or buried each one it found, and
    the job was not paused (a paused claim probes nothing). Only then may the next probe start
    above it (:class:`LapsedFloors`)."""
    return not paused and found < limit and handled >= found


@attrs.define
class LapsedFloors(_Sweeps):
    """One backend's lapsed-lease floors, per job (J6 under J19). Not thread-safe.

    The claim's lapsed probe (J6) reads ``<runs>_lease_idx`` for running runs whose lease has
    expired. Under a held MVCC horizon every run that ran since keeps a dead entry there, and
    once the hold is older than the lease each of those is in the probe's range: a probe from
    the index's start reads all of them. So after a *complete* probe (:func:`
    lapsed_probe_complete`) at time ``t``, this backend's next probes of the job read only leases
    that expired after ``t - lag`` (every run lapsed before that was met by that probe); an
    incomplete probe keeps the previous floor. Every ``sweep`` seconds (and at a backend's first
    claim of a job) a probe reads from the start.

    The floor is passed as a window in seconds before the claim's ``now`` (``lease_expires_at >
    now - window``), so the database's clock may sit at any constant offset from the backend's.
    The bounded relaxation of J6's timing: a lapsed run a concurrent statement held locked
    (``SKIP LOCKED``: a heartbeat or settle) when a complete probe passed it, then released
    without renewing or ending it (a rollback), or whose lease was written by a transaction open
    longer than ``lag``, is retaken up to ``sweep`` seconds (plus one claim interval) later; while
    full probes are slow, up to their spacing (:func:`sweep_spacing`, at most ``ceiling``)."""

    _since: dict[str, datetime] = attrs.field(factory=dict, init=False)

    def window(self, job_id: str, now: datetime) -> float | None:
        """Seconds before ``now`` the next probe of ``job_id`` starts at (it reads leases
        expired after ``now - window``); None: a probe from the start (the first, its spacing
        since the last one, :func:`sweep_spacing`; no complete probe since, or the clock went
        back)."""
        since = self._since.get(job_id)
        if self._sweeping(job_id, now) or since is None or now < since:
            return None
        return (now - since).total_seconds() + self.lag

    def record(
        self,
        job_id: str,
        now: datetime,
        window: float | None,
        *,
        complete: bool,
        took: float | None = None,
    ) -> None:
        """After a probe from ``window`` (None: from the start) at ``now``, a time no later than
        the probe's own (the PostgreSQL backend reads it before sending the statement): a
        complete one moves the floor up to ``now - lag``; an incomplete one keeps it (from the
        start: none). ``took``: the claim's seconds, which space a probe from the start from the
        next (:func:`sweep_spacing`)."""
        if window is None:
            self._swept_at(job_id, now, took)
            if not complete:
                self._since.pop(job_id, None)
        if complete:
            self._since[job_id] = now
