"""Partitioned limits in the in-memory model (F8, F9): the rules the PostgreSQL claim
(CLAIM_PARTITIONED) applies with one gate row per (job, partition), here on plain dicts.

A partitioned claim (a job whose ``concurrency.max`` and ``RateLimit`` hold per tenant, or per
partition key: ``ClaimRequest.partition``):

- walks the partitions that have waiting runs (the tenants or keys, sorted, from the one after where
  this job's last partitioned claim stopped, wrapping round: ``max_tenants`` of them, the
  ``Fairness``' or :data:`DEFAULT_PARTITION_WALK`, but at most ``max(limit, 16)``
  (:func:`~ship_sqla.kernel._jobs.partition_walk`), when there are that many; without a
  ``Fairness``, on past them while the partitions visited hold fewer due runs than the
  claim's room, up to ``max(limit, 16)`` (at most 256):
  :func:`~ship_sqla.kernel._jobs.partition_walk_widest`), and the runs of none as one more
  partition when any is due;
- gives each visited partition at most what its own limits leave: ``max - running`` (every
  running run of the partition holds a slot, lapsed or not, F9) and ``limit - starts in the
  window`` (F8), and shares the claim's room among them as a fair claim does (F2, by weight,
  work-conserving): so a partition at its limit takes nothing and the others take its room;
- retakes lapsed runs first (a retake is a start: it spends its partition's rate, and moves its
  slot), then each partition's oldest due runs, within its grant;
- records each partition's starts at its own start time (never before the partition's last).
"""

from __future__ import annotations

import heapq
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from ship_sqla.kernel._jobs import partition_walk, partition_walk_widest
from ship_sqla.kernel._plans.fairness import counted_for_shares, fair_shares

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from ship_sqla.kernel._ports import ClaimRequest

__all__ = ["PartitionChoice", "choose_partitioned"]


class _RunLike(Protocol):
    @property
    def run_id(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def tenant(self) -> str | None: ...
    @property
    def partition(self) -> str | None: ...
    @property
    def run_at(self) -> datetime: ...
    @property
    def seq(self) -> int: ...
    @property
    def priority(self) -> int: ...


_Run = TypeVar("_Run", bound=_RunLike)

Starts = dict[tuple[str, str | None], list[tuple[datetime, int]]]
"""(job id, partition) -> its recent starts, (time, count) pairs: the gate rows' rate arrays."""


class PartitionChoice(Generic[_Run]):
    """What a partitioned claim takes: the runs in claim order, each one's start time, and the
    seconds until the soonest full window frees (the claim's ``rate_wait``), or None."""

    __slots__ = ("chosen", "rate_wait", "started")

    def __init__(
        self, chosen: list[_Run], started: dict[str, datetime], rate_wait: float | None
    ) -> None:
        self.chosen = chosen
        self.started = started
        self.rate_wait = rate_wait


def _walk(
    request: ClaimRequest,
    waiting: Sequence[_RunLike],
    cursors: dict[str, str],
    due: tuple[dict[str | None, int], int],
) -> list[str | None]:
    """The partitions this claim visits, as CLAIM_PARTITIONED's walk finds them: at least
    ``partition_walk`` of them, then on while those visited hold fewer due runs (``due``: each
    partition's count, and the claim's room) than the room, up to ``partition_walk_widest``.
    The next claim starts after the last one when the walk stopped there, not for want of
    partitions."""
    least = partition_walk(request.fairness, request.limit)
    widest = partition_walk_widest(request.fairness, request.limit)
    due_of, room = due
    part = _part_of(request)
    named = sorted({p for run in waiting if (p := part(run)) is not None})
    after = cursors.pop(request.job_id, None)
    onward = [part for part in named if after is None or part > after]
    wrapped = [part for part in named if after is not None and part <= after]
    walked: list[str] = []
    found = 0

    def stops() -> bool:
        return len(walked) >= least and (len(walked) >= widest or found >= room)

    for visit in onward + wrapped:
        if stops():
            break
        walked.append(visit)
        found += due_of.get(visit, 0)
    if walked and stops():
        cursors[request.job_id] = walked[-1]
    return [*walked]


class _Gate:
    """One partition's gate as this claim sees it: its start time, what it allows."""

    __slots__ = ("at", "cap_room", "rate_room")

    def __init__(self, at: datetime, cap_room: int | None, rate_room: int | None) -> None:
        self.at = at
        self.cap_room = cap_room
        self.rate_room = rate_room

    def allows(self, limit: int) -> int:
        rooms = [room for room in (self.cap_room, self.rate_room) if room is not None]
        return max(min([limit, *rooms]), 0)


def _gate(
    request: ClaimRequest, part: str | None, held: int, starts: Starts, now: datetime
) -> _Gate:
    """``part``'s gate: its start time and rooms, its window trimmed (F8, F9)."""
    window = starts.setdefault((request.job_id, part), [])
    at = max(now, window[-1][0]) if window else now
    cap = request.max_running
    rate = request.rate_limit
    rate_room: int | None = None
    if rate is not None:
        since = at - timedelta(seconds=rate.period)
        window[:] = [(start, n) for start, n in window if start > since]
        rate_room = rate.limit - sum(n for _, n in window)
    return _Gate(at, None if cap is None else cap - held, rate_room)


def choose_partitioned(
    request: ClaimRequest,
    live: Iterable[_Run],
    candidates: list[_Run],
    *,
    buried: set[str],
    starts: Starts,
    cursors: dict[str, str],
    now: datetime,
) -> PartitionChoice[_Run]:
    """F8/F9: the runs a partitioned claim takes (see the module docstring). ``candidates``
    are the claimable runs (due waiting ones and retakable lapsed ones, J4's keys left out);
    ``buried`` the lapsed runs this claim ends (they give their slots up)."""
    lives = list(live)
    part = _part_of(request)
    held: dict[str | None, int] = {}
    for run in lives:
        if run.state == "running" and run.run_id not in buried:
            held[part(run)] = held.get(part(run), 0) + 1
    retakable = sorted((run for run in candidates if run.state == "running"), key=_claim_order)
    room = max(request.limit - len(retakable), 0)
    waiting = [run for run in lives if run.state == "waiting"]
    # Counted as the claim counts them: every due run of the partition, J4's keys or not.
    due_of: dict[str | None, int] = {}
    for run in waiting:
        if run.run_at <= now:
            due_of[part(run)] = due_of.get(part(run), 0) + 1
    visited = _walk(request, waiting, cursors, (due_of, room))
    if due_of.get(None):
        visited.insert(0, None)
    gates = {part: _gate(request, part, held.get(part, 0), starts, now) for part in visited}
    due = [run for run in candidates if run.state == "waiting"]
    ranked = _due_shares(request, visited, gates, (due_of, due), room)
    for run in retakable:
        if part(run) not in gates:
            gates[part(run)] = _gate(request, part(run), held.get(part(run), 0), starts, now)
    return _grant(request, gates, retakable, ranked, starts)


def _due_shares(
    request: ClaimRequest,
    visited: list[str | None],
    gates: dict[str | None, _Gate],
    due: tuple[dict[str | None, int], list[_Run]],
    room: int,
) -> dict[str | None, list[_Run]]:
    """Each visited partition's oldest due runs, at most its share of ``room`` (F2's
    water-filling over the partitions, each counted as :func:`counted_for_shares` says, up to
    what its gate allows). ``due``:
    each partition's count of due runs, and the due runs this claim may take."""
    due_of, takeable = due
    part = _part_of(request)
    by_part: dict[str | None, list[_Run]] = {}
    for run in takeable:
        by_part.setdefault(part(run), []).append(run)
    fairness = request.fairness
    allowed = [gates[part].allows(request.limit) for part in visited]
    weights = [1 if fairness is None else fairness.weight_of(part) for part in visited]
    counts = counted_for_shares(
        [
            (min(due_of.get(part, 0), allows), allows, weight)
            for part, allows, weight in zip(visited, allowed, weights, strict=True)
        ],
        room,
    )
    shares = fair_shares(list(zip(counts, weights, strict=True)), room)
    ranked: dict[str | None, list[_Run]] = {}
    for visit, share in zip(visited, shares, strict=True):
        if share > 0:
            runs = by_part.get(visit, [])
            ranked[visit] = heapq.nsmallest(share, runs, key=lambda run: (run.run_at, run.seq))
    return ranked


def _grant(
    request: ClaimRequest,
    gates: dict[str | None, _Gate],
    retakable: list[_Run],
    ranked: dict[str | None, list[_Run]],
    starts: Starts,
) -> PartitionChoice[_Run]:
    """Each partition's gate grants (lapsed runs first, then due ones within the cap's room,
    all within the rate's), records its starts, and says how long a full window stays full."""
    partition_of = _part_of(request)
    lapsed: dict[str | None, list[_Run]] = {}
    for run in retakable:
        lapsed.setdefault(partition_of(run), []).append(run)
    order: list[tuple[int, int, datetime, int, _Run]] = []
    started: dict[str, datetime] = {}
    waits: list[float] = []
    rate = request.rate_limit
    for part, gate in gates.items():
        mine, fresh = lapsed.get(part, []), ranked.get(part, [])
        if not mine and not fresh:
            continue
        rooms = [room for room in (gate.cap_room, gate.rate_room) if room is not None]
        due_grant = max(min([len(fresh), *rooms]), 0)
        total = len(mine) + due_grant
        if gate.rate_room is not None:
            total = min(total, gate.rate_room)
        total = max(min(total, request.limit), 0)
        taken = [*mine, *fresh[:due_grant]][:total]
        for rank, run in enumerate(taken):
            place = 0 if run.state == "running" else rank - len(mine) + 1
            order.append((place, -run.priority, run.run_at, run.seq, run))
            started[run.run_id] = gate.at
        if rate is not None:
            window = starts[(request.job_id, part)]
            window.append((gate.at, total))
            if sum(n for _, n in window) >= rate.limit:
                oldest = min(at for at, n in window if n > 0)
                waits.append((oldest + timedelta(seconds=rate.period) - gate.at).total_seconds())
    # The claim takes at most its limit (what a gate granted past it is recorded all the
    # same: a start the claim did not make only narrows the window), in claim order (K6).
    order.sort(key=lambda entry: entry[:4])
    chosen = sorted((entry[4] for entry in order[: request.limit]), key=_claim_order)
    return PartitionChoice(chosen, started, min(waits, default=None))


def _part_of(request: ClaimRequest) -> Callable[[_RunLike], str | None]:
    """A run's partition under the claim's limits: its tenant, or its partition key."""
    if request.partition == "key":
        return lambda run: run.partition
    return lambda run: run.tenant


def _claim_order(run: _RunLike) -> tuple[int, datetime, int]:
    return -run.priority, run.run_at, run.seq
