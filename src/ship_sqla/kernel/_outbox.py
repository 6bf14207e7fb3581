"""The outbox store port: what a relay needs of an outbox, shaped like the runs' ``RunStore``.

A claim takes messages under a lease with a fencing token (O2); ``heartbeat`` extends the leases
of held messages; ``settle`` applies a batch of :class:`OutboxSettlement` records (delivered,
retrying, dead, released), each fenced on its token, in one call (O3, O4), as a run store's
``settle`` does. The records are built by the kernel's constructors
(:mod:`ship_sqla.kernel._outbox_records`), which decide retry or dead; a store decides nothing.

Producing (``enqueue``) is the storage's own: the PostgreSQL outbox joins the unit of work (O1).
Implementations: :class:`~ship_sqla._outbox._store.Outbox` (PostgreSQL) and
:class:`~ship_sqla.kernel._memory.outbox.InMemoryOutbox`, run through one conformance suite
(``tests/conformance/test_outbox_store_conformance.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._on_error import ErrorHandler
    from ship_sqla.kernel._outbox_records import OutboxMessage, OutboxOutcome, OutboxSettlement
    from ship_sqla.kernel._plans.backoff import Backoff

__all__ = ["OutboxStore"]


@runtime_checkable
class OutboxStore(Protocol):
    """Claim, heartbeat and settle an outbox's messages (O2, O3, O4)."""

    @property
    def clock(self) -> Clock: ...

    @property
    def backoff(self) -> Backoff:
        """The message backoff :func:`message_failed` plans a retry with (O4)."""
        ...

    async def claim(
        self,
        outbox_id: str,
        batch_size: int,
        lease: float,
        *,
        worker: str | None = None,
        ordered: bool = False,
        on_error: ErrorHandler | None = None,
    ) -> list[OutboxMessage]:
        """Up to ``batch_size`` messages for ``lease`` seconds, lapsed leases before due pending
        ones, in ``(created_at, id)`` order; each gets a new token and one more attempt. A lapsed
        message on its final attempt is dead instead, reported to ``on_error`` (O2, O4)."""
        ...

    async def heartbeat(self, messages: Sequence[OutboxMessage], lease: float) -> list[bool]:
        """Extend each lease to now + ``lease`` while its token is current; per message,
        whether it is still held (O3)."""
        ...

    async def settle(self, settlements: Sequence[OutboxSettlement]) -> list[OutboxOutcome]:
        """Apply every settlement whose token is current, in one call; per settlement its
        ``settled_as``, or ``"stale"`` (nothing changed). A delivered settlement that already
        landed under the same token answers ``"delivered"`` again (a retried completion)."""
        ...
