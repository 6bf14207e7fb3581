"""The in-memory inbox (J13): the reference :class:`~ship_sqla.kernel.InboxStore`, with the
idempotency store's rules (I1, I2) over a dict.

A mark joins the active :class:`~ship_sqla.kernel.InMemoryUnitOfWork` transaction and is undone
when it rolls back (I1). While the transaction that marked a key is open, any other transaction
is answered ``"held"`` (PostgreSQL answers so after its bounded lock wait); once committed, the
key answers ``"duplicate"`` (same fingerprint) or ``"mismatch"`` until its ttl passes.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from ship_sqla.kernel._clock import Clock, SystemClock
from ship_sqla.kernel._memory.transactions import required_transaction

if TYPE_CHECKING:
    from datetime import datetime

    from ship_sqla.kernel._memory.transactions import InMemoryTransaction
    from ship_sqla.kernel._transactional import InboxAnswer

__all__ = ["InMemoryInbox"]

_DEFAULT_TTL = timedelta(hours=24).total_seconds()


class _Mark:
    __slots__ = ("expires_at", "fingerprint", "holder")

    def __init__(
        self, fingerprint: str, expires_at: datetime, holder: InMemoryTransaction | None
    ) -> None:
        self.fingerprint = fingerprint
        self.expires_at = expires_at
        self.holder = holder


class InMemoryInbox:
    """Inbox marks in memory (see the module docstring); ``ttl`` (seconds) unless a job's
    :class:`~ship_sqla.jobs.Inbox` names one."""

    def __init__(self, *, clock: Clock | None = None, ttl: float = _DEFAULT_TTL) -> None:
        self._clock = clock if clock is not None else SystemClock()
        self._ttl = ttl
        self._marks: dict[tuple[str, str, str], _Mark] = {}

    def marked(self, key: str, *, prefix: str, tenant: str | None = None) -> bool:
        """Whether ``key`` is marked and committed (for tests and the state machine)."""
        mark = self._marks.get((prefix, tenant or "", key))
        return mark is not None and mark.holder is None

    async def mark_inbox(
        self, key: str, fingerprint: str, *, prefix: str, ttl: float | None
    ) -> InboxAnswer:
        tx = required_transaction("an inbox mark")
        where = (prefix, tx.tenant or "", key)
        now = self._clock.now()
        existing = self._marks.get(where)
        if existing is not None and existing.expires_at > now:
            if existing.holder is not None and existing.holder is not tx:
                return "held"
            return "duplicate" if existing.fingerprint == fingerprint else "mismatch"
        mark = _Mark(fingerprint, now + timedelta(seconds=ttl or self._ttl), tx)
        self._marks[where] = mark

        def undo() -> None:
            if self._marks.get(where) is mark:
                if existing is None:
                    del self._marks[where]
                else:
                    self._marks[where] = existing

        def release() -> None:
            mark.holder = None

        tx.on_rollback(undo)
        tx.on_end(release)
        return "new"
