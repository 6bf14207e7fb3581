"""What a handler knows about the run it executes: ``async def handler(ctx, payload)``."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from datetime import datetime

    from ship_sqla.kernel._ports import ClaimedRun

__all__ = ["CancelReason", "Cancellation", "JobContext"]

CancelReason = Literal["lease-lost", "lock-lost", "drain", "cancelled", "timeout"]
"""Why a run was cancelled: its lease was retaken or could not be extended (J5); its single-runner
lock ended before the run did (L2); the runtime's drain deadline passed (J12); an operator
cancelled the run (``"cancelled"``, K2: it ends cancelled, it is not retried); the job's
``timeout`` passed (``"timeout"``, K5: the attempt is a failure, the retry policy decides)."""


class Cancellation:
    """The cancellation signal of one run. Set at most once; the first reason wins.

    The runtime cancels the handler's task as well, so a handler need not poll this; it is for
    handlers that shield work from cancellation or hand the signal to code that is not async.
    """

    __slots__ = ("_event", "reason")

    def __init__(self) -> None:
        self.reason: CancelReason | None = None
        # Created on first wait only: most runs are never waited on, and an Event per run would
        # be pure overhead on the hot path.
        self._event: asyncio.Event | None = None

    def cancel(self, reason: CancelReason) -> bool:
        """Record ``reason``; False when the run was already cancelled (the first reason stays)."""
        if self.reason is not None:
            return False
        self.reason = reason
        if self._event is not None:
            self._event.set()
        return True

    @property
    def cancelled(self) -> bool:
        return self.reason is not None

    async def wait(self) -> None:
        """Return once the run is cancelled."""
        if self.reason is not None:
            return
        if self._event is None:
            self._event = asyncio.Event()
        await self._event.wait()


class JobContext:
    """The run a handler executes, and its cancellation signal.

    ``token`` is the claim's fencing token (J5): any external write the handler fences (a version
    column, a conditional PUT) can carry it so a zombie holder's late write is refused.
    ``cancelled`` becomes true, and the handler's task is cancelled, when the lease is lost
    (another worker may now run it), the single-runner lock ended, the drain deadline passed, or
    an operator cancelled the run (``cancel_reason == "cancelled"``, K2), or the job's
    ``timeout`` passed (``"timeout"``, K5). ``snoozes`` counts the run's earlier snoozes (K4).
    ``tenant`` is the tenant the run was enqueued for (F2).
    """

    __slots__ = ("_cancellation", "_run", "worker_id")

    def __init__(self, run: ClaimedRun, cancellation: Cancellation, *, worker_id: str) -> None:
        self._run = run
        self._cancellation = cancellation
        self.worker_id = worker_id

    @classmethod
    def standalone(cls, run: ClaimedRun, *, worker_id: str = "test") -> JobContext:
        """A context outside any runtime, to unit-test a handler; cancel via ``cancellation``."""
        return cls(run, Cancellation(), worker_id=worker_id)

    @property
    def run(self) -> ClaimedRun:
        return self._run

    @property
    def run_id(self) -> str:
        return self._run.run_id

    @property
    def job_id(self) -> str:
        return self._run.job_id

    @property
    def tenant(self) -> str | None:
        """The tenant the run was enqueued for (F2), None for none. The handler runs in it: a
        ``uow.run`` it opens without a tenant, and every run it enqueues, default to it."""
        return self._run.tenant

    @property
    def attempt(self) -> int:
        """1 on the first run; a JOB_LOCK_HELD release or a drain cancellation does not count."""
        return self._run.attempt

    @property
    def max_attempts(self) -> int:
        return self._run.max_attempts

    @property
    def snoozes(self) -> int:
        """How many times the run snoozed before this attempt (:class:`~ship_sqla.kernel.Snooze`,
        at most ``retry.max_snoozes``; K4)."""
        return self._run.snoozes

    @property
    def is_final_attempt(self) -> bool:
        return self._run.attempt >= self._run.max_attempts

    @property
    def token(self) -> int:
        return self._run.token

    @property
    def key(self) -> str | None:
        return self._run.key

    @property
    def created_at(self) -> datetime:
        return self._run.created_at

    @property
    def cancellation(self) -> Cancellation:
        return self._cancellation

    @property
    def cancelled(self) -> bool:
        return self._cancellation.reason is not None

    @property
    def cancel_reason(self) -> CancelReason | None:
        return self._cancellation.reason

    async def wait_cancelled(self) -> None:
        """Return once the run is cancelled (see :class:`Cancellation`)."""
        await self._cancellation.wait()

    def __repr__(self) -> str:
        return (
            f"JobContext(job_id={self.job_id!r}, run_id={self.run_id!r},"
            f" attempt={self.attempt}/{self.max_attempts}, token={self.token})"
        )
