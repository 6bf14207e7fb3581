"""Transactional handlers (SPEC §8 J13-J14): what a job declares so that its handler's writes,
its inbox mark and the run's completion commit as one fenced transaction, and the port a
storage implements for it.

A job declared with ``transaction=uow`` runs ``handler(ctx, payload, repositories)`` inside
``uow.run``. The runtime (:mod:`ship_sqla.kernel._runtime.fused`) opens the transaction with
the claim's fence (:meth:`FencedRuns.fence`: the run row locked to the end, its token current,
still running, no cancel requested), marks the inbox key when the job declares an
:class:`Inbox`, awaits the handler, and ends with the completion settled through the same
settle statement the completer uses, joined to the transaction
(:meth:`FencedRuns.settle_within`). All of it commits together or not at all.

The inbox reuses the idempotency store (I1, I2): a key completed within its ttl completes the
run as a duplicate without calling the handler; a key an open transaction holds snoozes the run
without spending its attempt; a key stored with another fingerprint (another payload under the
same key) is terminal.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, runtime_checkable

import attrs

from ship_sqla.kernel._errors import ConfigurationError, RefusedError, UsageError
from ship_sqla.kernel._ports import CANCELLED_MESSAGE, JobLeaseStaleError
from ship_sqla.kernel._settlement import cancelled

if TYPE_CHECKING:
    from collections.abc import Callable

    from ship_sqla.kernel._job_context import Cancellation
    from ship_sqla.kernel._ports import ClaimedRun, FencedRuns, SettleOutcome
    from ship_sqla.kernel._settlement import Settlement

__all__ = [
    "DEFAULT_INBOX_HELD_DELAY",
    "Inbox",
    "InboxAnswer",
    "InboxFingerprintMismatchError",
    "InboxStore",
    "SettlesApart",
    "TransactionalHandlerMisuseError",
    "fenced_completion",
    "payload_fingerprint",
    "take_fence",
]

InboxAnswer = Literal["new", "duplicate", "held", "mismatch"]
"""What marking an inbox key answered (J13): ``"new"`` (marked in this transaction: it commits
with it), ``"duplicate"`` (completed before, within its ttl), ``"held"`` (an open transaction
holds it), ``"mismatch"`` (stored with another fingerprint)."""

DEFAULT_INBOX_HELD_DELAY: Final = 1.0
"""Seconds a run whose inbox key another open transaction holds waits before it is tried again
(its attempt unspent)."""


class TransactionalHandlerMisuseError(UsageError, RuntimeError):
    """A transactional handler (J13) made a workflow call, or a workflow made one after the
    transaction that completed its run."""

    code = "SHIP_SQLA_JOB_TRANSACTIONAL_MISUSE"


class InboxFingerprintMismatchError(RefusedError, ValueError):
    """A transactional job's inbox key was stored for another payload: the run is dead-lettered
    (retrying cannot make the two agree)."""

    code = "SHIP_SQLA_JOB_INBOX_MISMATCH"


@runtime_checkable
class InboxStore(Protocol):
    """Where a transactional job's inbox keys live (the idempotency store on PostgreSQL,
    :class:`~ship_sqla.kernel.InMemoryInbox` in memory)."""

    async def mark_inbox(
        self, key: str, fingerprint: str, *, prefix: str, ttl: float | None
    ) -> InboxAnswer:
        """Mark ``key`` (under ``prefix``, in the active transaction's tenant) as done by the
        active transaction, or say why not (:data:`InboxAnswer`). Joins the active unit of work:
        the mark commits or rolls back with it. A key another open transaction holds is answered
        ``"held"`` after a bounded wait, never by blocking until that transaction ends.
        ``ttl``: seconds the mark is remembered (None: the store's default)."""
        ...


def _non_empty(name: str) -> Callable[[Inbox, attrs.Attribute[Any], object], None]:
    def check(_instance: Inbox, _attribute: attrs.Attribute[Any], value: object) -> None:
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ConfigurationError(
                f"Inbox {name} must be a non-blank string, got {value!r}.",
                fix=f"omit {name} for the default, or pass a short name.",
            )

    return check


def _callable(
    name: str, *, optional: bool
) -> Callable[[Inbox, attrs.Attribute[Any], object], None]:
    def check(_instance: Inbox, _attribute: attrs.Attribute[Any], value: object) -> None:
        if (value is None and not optional) or (value is not None and not callable(value)):
            raise ConfigurationError(
                f"Inbox {name} must be a function of the payload, got {value!r}.",
                fix=f"pass {name}=lambda payload: payload.order_id (a str), or similar.",
            )

    return check


def _ttl_seconds(value: object) -> float | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds <= 0:
        raise ConfigurationError(
            f"Inbox ttl must be a positive number of seconds or a timedelta, got {value!r}.",
            fix="omit ttl for the store's default, or pass e.g. timedelta(days=7).",
        )
    return float(seconds)


def _check_store(_instance: Inbox, _attribute: attrs.Attribute[Any], value: object) -> None:
    if not callable(getattr(value, "mark_inbox", None)):
        raise ConfigurationError(
            f"Inbox store must be an inbox store (an IdempotencyStore on PostgreSQL, an"
            f" InMemoryInbox in memory), got {type(value).__name__}.",
            fix="pass Inbox(create_idempotency_store(engine, table=...), key=...).",
        )


@attrs.frozen
class Inbox:
    """A transactional job's inbox (J13): one mark per ``key(payload)``, in the idempotency
    store, committed with the handler's writes. A run whose key was completed before (within
    ``ttl``) completes as a duplicate without calling the handler.

    ``fingerprint(payload)`` tells two payloads sent under one key apart (default: a hash of the
    stored payload); a mismatch dead-letters the run. ``prefix`` is the store's namespace
    (default ``"job:<job id>"``); ``held_delay`` is how long a run waits when an open
    transaction holds its key (its attempt unspent)."""

    store: InboxStore = attrs.field(validator=_check_store)
    key: Callable[[Any], str] = attrs.field(validator=_callable("key", optional=False))
    fingerprint: Callable[[Any], str] | None = attrs.field(
        default=None, validator=_callable("fingerprint", optional=True)
    )
    prefix: str | None = attrs.field(default=None, validator=_non_empty("prefix"))
    ttl: float | None = attrs.field(default=None, converter=_ttl_seconds)
    held_delay: float = DEFAULT_INBOX_HELD_DELAY

    def prefix_for(self, job_id: str) -> str:
        return self.prefix if self.prefix is not None else f"job:{job_id}"


def payload_fingerprint(stored_payload: object) -> str:
    """The default inbox fingerprint: the sha256 of the run's stored payload as canonical JSON
    (keys sorted), so one payload fingerprints alike however it was built."""
    text = json.dumps(stored_payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


class SettlesApart(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Internal: roll the handler's transaction back, then settle the run with ``settlement``
    through the completer (a cancel committed before the fence, an inbox key held or
    mismatched)."""

    def __init__(self, settlement: Settlement) -> None:
        super().__init__(settlement.label)
        self.settlement = settlement


async def take_fence(
    backend: FencedRuns, run: ClaimedRun, cancellation: Cancellation | None
) -> None:
    """J13's fence, the first statement of a handler's transaction (a transactional job's, a
    workflow's completing ``ctx.transaction``, a consumer's batch): from here no heartbeat is
    sent for the run (``cancellation.fenced``; one already on its way, ``beat_pending``, is let
    through first so it never waits on the fence's row lock); then ``run``'s row is locked to the
    transaction's end. A claim no longer current raises JobLeaseStaleError and a committed
    cancel raises :class:`SettlesApart` (the run ends cancelled, K2), both rolling the
    transaction back (J14). The caller clears ``fenced`` when the transaction ended."""
    if cancellation is not None:
        cancellation.fenced = True
        pending = getattr(cancellation, "beat_pending", None)
        if pending is not None:
            await pending.wait()
    answer = await backend.fence(run)
    if answer == "held":
        return
    if answer == "cancel-requested":
        raise SettlesApart(cancelled(run, CANCELLED_MESSAGE))
    raise JobLeaseStaleError(
        f"job {run.job_id!r} run {run.run_id!r} (attempt {run.attempt}, claim token"
        f" {run.token}): the fence of the handler's transaction found the claim no longer"
        " current (another worker may hold the run); the whole transaction was rolled back.",
        fix="nothing to undo: nothing of this transaction was committed, and the run's current"
        " holder goes on with it.",
    )


async def fenced_completion(
    backend: FencedRuns, run: ClaimedRun, settlement: Settlement
) -> SettleOutcome:
    """Settle ``settlement`` inside the active transaction; raise JobLeaseStaleError (rolling it
    back) unless it landed as built (J14)."""
    outcome = await backend.settle_within(settlement)
    if outcome != settlement.answer:
        raise JobLeaseStaleError(
            f"job {run.job_id!r} run {run.run_id!r} (attempt {run.attempt}, claim token"
            f" {run.token}): the {settlement.label} in the handler's transaction was refused"
            " because the claim is no longer current; the whole transaction was rolled back.",
            fix="nothing to undo: nothing of this attempt was committed, and the run's current"
            " holder settles it.",
        )
    return outcome
