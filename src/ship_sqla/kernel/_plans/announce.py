"""When a store announces new work to other processes (K1, K8; SPEC §11): a pure rule over a
monotonic time, shared by the job backend (key: the job id) and the outbox (key: the outbox id).

An announcement is a ``pg_notify``; PostgreSQL delivers it only when the transaction that sent
it commits, so a rolled-back enqueue wakes nobody (K1). Its cost is the commit: a committing
transaction that notified takes a cluster-wide lock and holds it through its commit, WAL flush
included, so notifying commits queue behind each other. On the 2-core VM of BENCHMARKS.md,
16 clients committed 9.7k one-row INSERTs a second, but 4.3k when each also notified; a
transaction that only notifies, committed without waiting for its flush
(``synchronous_commit = off``: losing it to a crash loses nothing, a listener looks again
when it reconnects), costs what a ``SELECT 1`` costs (28 µs a round trip) and holds the lock for
microseconds.

The rule (:class:`AnnouncePlan`, one per announcing store and process, "a sender"):

- Only due work is announced (:func:`due_now`): a delayed run starts on the poll after it
  falls due, at most one poll interval late.
- Every committed enqueue of due work IS announced, within :func:`bound` of its commit (K8).
  Nothing is silenced for a window any more: what the sender does not announce in the
  enqueue's own transaction it announces after the commit, in a notify-only transaction of
  its own that carries every key committed meanwhile (one notifying commit for many enqueues).
- An enqueue announces in its own transaction (``fold``) only when the sender has announced
  nothing for one gap (and has nothing waiting): an isolated enqueue costs no extra statement
  and no extra round trip, and the writing commits that notify stay as rare as the gap allows.
- A sender's announcements start at least one gap apart, and the gap divides the table's
  budget between its senders in proportion to their enqueues: a sender that makes a share
  ``s`` of the table's enqueues announces at most ``s x budget`` times a second. The budget
  is :data:`NOTIFY_BUDGET` while the table sees at most :data:`BUDGET_KNEE` enqueues a second,
  and shrinks in proportion above it (at R enqueues a second, ``NOTIFY_BUDGET x BUDGET_KNEE /
  R``). The table's enqueue rate is read off its identity sequence, which every enqueue of
  every process advances: now and then (:data:`FLEET_SAMPLE_EVERY`) an enqueue's INSERT
  answers the ``seq`` it took (``fleet_seq``), as a folded one always does; a sender that
  learns nothing of the table counts itself alone. So the notifying commits of one table
  stay at or under NOTIFY_BUDGET a second fleet-wide, whatever the enqueue rate and the
  number of processes, plus at most 1 / :data:`MAX_GAP` a second from each sender whose
  share is too small for a gap of its own. The gap is never under :data:`MIN_GAP` nor over
  :data:`MAX_GAP`.

Every listener wakes on each announcement of a key it listens to and claims at once; lost
notifications and lost listeners still wait for the poll (K1), never longer.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import datetime

__all__ = [
    "ANNOUNCE_WINDOW",
    "BUDGET_KNEE",
    "FLEET_SAMPLE_EVERY",
    "MAX_GAP",
    "MIN_GAP",
    "NOTIFY_BUDGET",
    "RECHECKS",
    "AnnouncePlan",
    "AnnounceThrottle",
    "bound",
    "due_now",
]

NOTIFY_BUDGET: Final = 500.0
"""Notifying commits a second per table (runs table, outbox table), fleet-wide. At 500/s the
notify-only commits cost the server about 1.5 % of one core (28 µs each), each listener a wake
and a claim per announcement, and a writing commit never queues behind more than a few of them;
below 500 enqueues a second every enqueue is announced on its own."""

BUDGET_KNEE: Final = 1000.0
"""Enqueues a second of one table above which its budget shrinks in proportion: at a rate R
over the knee, the table's notifying commits stay under NOTIFY_BUDGET x BUDGET_KNEE / R (each
covering at least R² / (NOTIFY_BUDGET x BUDGET_KNEE) enqueues). Notifications cost the server
(and every listener) per notification, while a worker that keeps up with a fast stream is
rarely idle: the faster the table's enqueues, the less each one needs its own."""

MIN_GAP: Final = 1.0 / NOTIFY_BUDGET
"""Seconds: a sender's announcements start at least this far apart (2 ms: what a lone sender
may use of the budget)."""

MAX_GAP: Final = 0.1
"""Seconds: and at most this far apart while it has something to announce, however small its
share of the table's enqueues and however fast the table: K8's bound never exceeds it (plus
two round trips)."""

RATE_SPAN: Final = 1.0
"""Seconds of history the own and the table's enqueue rates are measured over."""

FLEET_SAMPLE_EVERY: Final = 0.1
"""Seconds: a sender asks an enqueue to read the table's sequence (its INSERT answers the
``seq`` it took) at most this often; a folded enqueue's INSERT reads it anyway."""

ANNOUNCE_WINDOW: Final = 0.25
"""Seconds. The per-key throttle window of :class:`AnnounceThrottle` (what freed fleet slots are
announced by: at most 4 a second per job per process)."""

RECHECKS: Final = (0.05, ANNOUNCE_WINDOW)
"""Seconds after the last announcement it got at which a listener looks again: for senders of
library versions that silenced enqueues for a window (a rolling upgrade), and for a post-commit
announcement that failed."""

_PRUNE_ABOVE: Final = 1024
"""Keys :class:`AnnounceThrottle` remembers before stale ones are forgotten."""


def due_now(run_ats: Iterable[datetime | None], now: datetime) -> bool:
    """Whether any of ``run_ats`` is due at ``now`` (None: due as soon as it is stored)."""
    return any(run_at is None or run_at <= now for run_at in run_ats)


def bound(round_trip: float) -> float:
    """K8: the longest a committed enqueue of due work waits for its announcement to be sent
    and delivered, when no statement takes longer than ``round_trip`` seconds: the sender may be
    waiting for one announcement in flight, then for the gap, then for its own. (Below the
    knee and for a sender alone or with a fair share, the gap is MIN_GAP: a few ms.)"""
    return MAX_GAP + 2 * round_trip


class AnnouncePlan:
    """One sender's announcements (see the module docstring). Pure: every time is the caller's
    monotonic clock, every decision a return value; the store sends.

    The protocol: before an enqueue's statement, :meth:`fold` (announce in it, or not); after its
    commit, :meth:`committed`. When :meth:`next_send_at` is due, :meth:`take` the keys, send
    them in one notify-only transaction, then :meth:`sent`.
    """

    __slots__ = ("_commits", "_fleet", "_in_flight", "_last_at", "_pending", "budget")

    def __init__(self, budget: float = NOTIFY_BUDGET) -> None:
        self.budget = budget
        self._last_at: float | None = None
        """When the last announcement (a fold's decision, or a send) started."""
        self._pending: dict[str, None] = {}
        """Keys committed, not yet announced (an ordered set)."""
        self._in_flight = False
        self._commits: deque[float] = deque()
        """This sender's commits of due work within RATE_SPAN."""
        self._fleet: deque[tuple[float, int]] = deque()
        """(time, the table's sequence) samples within RATE_SPAN."""

    @property
    def pending(self) -> tuple[str, ...]:
        return tuple(self._pending)

    def gap(self, now: float) -> float:
        """Seconds between this sender's announcements now: its share of the budget."""
        self._forget(now)
        own = len(self._commits)
        if own == 0:
            return MIN_GAP
        fleet = float(own)
        if len(self._fleet) >= 2:  # noqa: PLR2004 - a rate needs two samples (within the span)
            (first_at, first_seq), (last_at, last_seq) = self._fleet[0], self._fleet[-1]
            if last_at > first_at:
                # The table's enqueues over the same span as our own count (runs per second,
                # scaled to the span): never fewer than our own.
                fleet = max(fleet, (last_seq - first_seq) / (last_at - first_at) * RATE_SPAN)
        # The table's budget at its enqueue rate (enqueues a second), then this sender's share.
        budget = self.budget * min(1.0, BUDGET_KNEE * RATE_SPAN / fleet)
        return min(max(fleet / (budget * own), MIN_GAP), MAX_GAP)

    def wants_fleet_sample(self, now: float) -> bool:
        """Whether an enqueue starting at ``now`` should read the table's sequence: the last
        sample is FLEET_SAMPLE_EVERY old (or there is none)."""
        fleet = self._fleet
        return not fleet or now - fleet[-1][0] >= FLEET_SAMPLE_EVERY

    def fold(self, now: float) -> bool:
        """Whether an enqueue whose statement starts at ``now`` announces in its own transaction:
        only when nothing is waiting or in flight and the last announcement is a gap old. A
        fold counts as an announcement from now on (so concurrent enqueues do not all fold)."""
        if self._pending or self._in_flight:
            return False
        if self._last_at is not None and now - self._last_at < self.gap(now):
            return False
        self._last_at = now
        return True

    def committed(
        self, key: str, now: float, *, folded: bool, fleet_seq: int | None = None
    ) -> None:
        """An enqueue of due work under ``key`` committed at ``now``; ``folded``: its own
        transaction announced it, else it waits for :meth:`take`. ``fleet_seq``: the table's
        sequence as the enqueue's statement read it (a folded enqueue's INSERT does), or None."""
        self._commits.append(now)
        if fleet_seq is not None:
            self._fleet.append((now, fleet_seq))
        if not folded:
            self._pending[key] = None

    def next_send_at(self, now: float) -> float | None:
        """When the waiting keys are to be sent (at most ``now``: at once), or None: nothing
        waits, or a send is in flight (its :meth:`sent` comes first)."""
        if not self._pending or self._in_flight:
            return None
        if self._last_at is None:
            return now
        return max(self._last_at + self.gap(now), now)

    def take(self, now: float) -> tuple[str, ...]:
        """The keys to send now, in one announcement; nothing more is sent until :meth:`sent`."""
        keys = tuple(self._pending)
        self._pending.clear()
        self._in_flight = True
        self._last_at = now
        return keys

    def sent(self, keys: Iterable[str], *, ok: bool) -> None:
        """The send of :meth:`take`'s ``keys`` ended: ``ok``, or failed (the keys wait
        again, sent after the next gap)."""
        self._in_flight = False
        if not ok:
            self._pending = dict.fromkeys(keys) | self._pending

    def _forget(self, now: float) -> None:
        """Drop what is older than RATE_SPAN: an old burst (of this sender or of the table)
        never widens today's gap."""
        horizon = now - RATE_SPAN
        commits, fleet = self._commits, self._fleet
        while commits and commits[0] < horizon:
            commits.popleft()
        while fleet and fleet[0][0] < horizon:
            fleet.popleft()


class AnnounceThrottle:
    """A store's memory of when it last announced each key, for announcements that stand for a
    state rather than for new runs (a capped job's freed fleet slots, F1): at most one per key
    per :attr:`window`.

    Not shared between processes or stores: each announcing store throttles only itself.
    """

    __slots__ = ("_last", "window")

    def __init__(self, window: float = ANNOUNCE_WINDOW) -> None:
        self.window = window
        self._last: dict[str, float] = {}

    def wanted(self, key: str, now: float) -> bool:
        """Whether ``key`` should be announced at monotonic time ``now``: its last committed
        announcement is at least :attr:`window` old (or there was none)."""
        last = self._last.get(key)
        return last is None or now - last >= self.window

    def announced(self, key: str, now: float) -> None:
        """An announcement of ``key`` committed at monotonic time ``now``."""
        last = self._last
        if len(last) >= _PRUNE_ABOVE and key not in last:
            for stale in [k for k, at in last.items() if now - at >= self.window]:
                del last[stale]
        previous = last.get(key)
        if previous is None or now > previous:
            last[key] = now
