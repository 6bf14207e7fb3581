"""When a store announces new work to other processes (K1, SPEC §10): a pure rule over a
monotonic time, shared by the job backend (key: the job id) and the outbox (key: the outbox id).

An announcement is a NOTIFY sent in the enqueueing transaction: PostgreSQL delivers it only
when that transaction commits, so a rolled-back enqueue wakes nobody. It is not free: a
committing transaction that notified takes a database-wide lock held through its commit's WAL
flush, so notifying commits queue behind each other. Hence the throttle:

- an enqueue announces only when a run (or message) it stores is due now
  (:func:`due_now`): a delayed one would wake listeners that find nothing, and starts on the
  poll after it falls due, at most one poll interval late;
- a store skips the announcement of a key it announced (and committed) less than
  :data:`ANNOUNCE_WINDOW` seconds ago (:class:`AnnounceThrottle`).

What a skipped enqueue relies on, the listening side does: after every announcement it gets, a
listener looks again :data:`RECHECKS` seconds after the last one (soon, for a burst that
follows the announcement closely, and once the window has passed), so an enqueue the throttle
silenced is seen within at most the window when it commits within it (one statement outside a
unit of work always does). Anything else (a long unit of work, a lost notification, a lost
listener) waits for the poll: never more than one poll interval.

The window is counted from the COMMIT of the announcing transaction (``announced`` is called
after commit), never from its statement: a rolled-back announcement silences nobody.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import datetime

__all__ = ["ANNOUNCE_WINDOW", "RECHECKS", "AnnounceThrottle", "due_now"]

ANNOUNCE_WINDOW: Final = 0.25
"""Seconds. A store announces each key at most once per window (counted from the commit of the
announcement): at most 4 notifying commits per second per job (or outbox) per process, however
fast it enqueues."""

RECHECKS: Final = (0.05, ANNOUNCE_WINDOW)
"""Seconds after the last announcement it got at which a listener looks again, for the
enqueues of the same window that the throttle silenced: a burst right behind an announcement
waits at most 50 ms, the rest of the window at most the window."""

_PRUNE_ABOVE: Final = 1024
"""Keys remembered before stale ones (older than the window) are forgotten: the memory is
bounded by the keys announced within one window, not by every key ever announced."""


def due_now(run_ats: Iterable[datetime | None], now: datetime) -> bool:
    """Whether any of ``run_ats`` is due at ``now`` (None: due as soon as it is stored)."""
    return any(run_at is None or run_at <= now for run_at in run_ats)


class AnnounceThrottle:
    """One store's memory of when it last announced each key (see the module docstring).

    Not shared between processes or stores: each announcing store throttles only itself, so a
    listener hears from every store within one window of its first enqueue.
    """

    __slots__ = ("_last", "window")

    def __init__(self, window: float = ANNOUNCE_WINDOW) -> None:
        self.window = window
        self._last: dict[str, float] = {}

    def wanted(self, key: str, now: float) -> bool:
        """Whether an enqueue of ``key`` at monotonic time ``now`` should announce: the key's
        last committed announcement is at least :attr:`window` old (or there was none)."""
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
