"""One attempt of a transactional handler (J13, J14): the fence, the inbox mark, the handler and
the completion in the job's unit of work, committed together or not at all.

``uow.run(in_transaction)`` where ``in_transaction`` is, in order:

1. :meth:`~ship_sqla.kernel.FencedRuns.fence`: the run row locked to the transaction's end,
   the claim's token current, still running, no cancel requested. Stale: raise
   :class:`~ship_sqla.errors.JobLeaseStaleError` (the transaction rolls back; nothing was
   written). A cancel committed before it: the run ends cancelled (K2), apart.
2. The inbox mark (when the job declares an :class:`~ship_sqla.jobs.Inbox`): a key completed
   before completes the run as a duplicate, the handler not called; a key another open
   transaction holds snoozes the run (attempt unspent), apart; a fingerprint mismatch is
   terminal, apart.
3. ``handler(ctx, payload, repositories)``.
4. The completion, through the store's one settle statement joined to the transaction
   (:meth:`~ship_sqla.kernel.FencedRuns.settle_within`). Not landed: stale, rolled back.

"Apart" is :class:`SettlesApart`: the transaction rolls back and the runtime's completer settles
the run as usual. A raising handler rolls everything back and its K4 outcome settles apart too.
A serialization failure re-runs the whole function (U3), fence first.

When the COMMIT's answer is lost after the completion was sent, the run is read by id and token
(:meth:`~ship_sqla.kernel.FencedRuns.claim_state`): completed means it committed. Correctness
does not hang on that read: every settle is fenced (J5), so a K4 settle sent for a run that did
commit answers stale and changes nothing.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._ports import CANCELLED_MESSAGE, JobLeaseStaleError
from ship_sqla.kernel._runtime.state import describe_failure, stale_error
from ship_sqla.kernel._settlement import cancelled, completed, duplicate, failed, snoozed
from ship_sqla.kernel._transactional import InboxFingerprintMismatchError, payload_fingerprint

if TYPE_CHECKING:
    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._job_context import JobContext
    from ship_sqla.kernel._jobs import TransactionalHandler
    from ship_sqla.kernel._ports import ClaimedRun, JobBackend, SettleOutcome
    from ship_sqla.kernel._runtime.state import InFlight
    from ship_sqla.kernel._settlement import Settlement
    from ship_sqla.kernel._transactional import FencedRuns, Inbox

__all__ = ["FusedAttempt", "SettlesApart", "fenced_completion"]


class SettlesApart(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Internal: roll the transaction back, then settle the run with ``settlement`` through the
    completer (a cancel before the fence, an inbox key held or mismatched)."""

    def __init__(self, settlement: Settlement) -> None:
        super().__init__(settlement.label)
        self.settlement = settlement


async def fenced_completion(
    backend: FencedRuns, run: ClaimedRun, settlement: Settlement
) -> SettleOutcome:
    """Settle ``settlement`` inside the active transaction; raise JobLeaseStaleError (rolling it
    back) unless it landed as built (J14)."""
    outcome = await backend.settle_within(settlement)
    if outcome != settlement.answer:
        raise stale_error(run, f"the {settlement.label} in the handler's transaction")
    return outcome


class FusedAttempt:
    """One attempt of a transactional job's handler (see the module docstring). ``landed`` is
    the settlement committed with the handler's writes once :meth:`run` returned (when
    :meth:`run` raises, the completion sent in the transaction whose COMMIT failed); ``stale``:
    the fence or the completion found the claim gone (J14)."""

    __slots__ = ("_backend", "_clock", "_ctx", "_entry", "_payload", "landed", "stale")

    def __init__(
        self,
        entry: InFlight,
        ctx: JobContext[Any],
        payload: Any,  # noqa: ANN401 - the job's typed payload
        backend: JobBackend,
        clock: Clock,
    ) -> None:
        self._entry = entry
        self._ctx = ctx
        self._payload = payload
        self._backend = backend
        self._clock = clock
        self.stale = False
        self.landed: tuple[Settlement, SettleOutcome] | None = None

    async def run(self) -> None:
        entry = self._entry
        job = entry.job
        assert job.transaction is not None  # noqa: S101 - only transactional jobs come here
        await entry.fencing()
        await job.transaction.run(self._in_transaction)

    async def _in_transaction(self, repositories: Any) -> None:  # noqa: ANN401
        entry = self._entry
        run = entry.run
        job = entry.job
        self.landed = None
        answer = await self._backend.fence(run)
        if answer == "stale":
            self.stale = True
            raise stale_error(run, "the fence of the handler's transaction")
        if answer == "cancel-requested":
            raise SettlesApart(cancelled(run, CANCELLED_MESSAGE))
        settlement = completed(run)
        if job.inbox is not None:
            settlement = await self._mark_inbox(job.inbox, run)
        if settlement.answer == "completed":
            handler = cast("TransactionalHandler[Any]", job.handler)
            await handler(self._ctx, self._payload, repositories)
        try:
            outcome = await fenced_completion(self._backend, run, settlement)
        except JobLeaseStaleError:
            self.stale = True
            raise
        self.landed = (settlement, outcome)

    async def _mark_inbox(self, inbox: Inbox, run: ClaimedRun) -> Settlement:
        """The inbox mark (J13): the completion to commit (plain, or as a duplicate); a held or
        mismatched key settles apart."""
        job_id = run.job_id
        key: object = inbox.key(self._payload)
        if not isinstance(key, str) or not key:
            raise ConfigurationError(
                f"job {job_id!r}: its inbox key function returned {key!r}, not a non-empty str.",
                fix="make Inbox(key=...) return a str that identifies the input (an order id).",
            )
        fingerprint = (
            payload_fingerprint(run.payload)
            if inbox.fingerprint is None
            else inbox.fingerprint(self._payload)
        )
        marked = await inbox.store.mark_inbox(
            key, fingerprint, prefix=inbox.prefix_for(job_id), ttl=inbox.ttl
        )
        if marked == "duplicate":
            return duplicate(run, key)
        if marked == "held":
            raise SettlesApart(
                snoozed(
                    run,
                    self._clock.now() + timedelta(seconds=inbox.held_delay),
                    f"inbox key {key!r} is held by another open transaction; tried again in"
                    f" {inbox.held_delay:g} s (attempt unspent)",
                )
            )
        if marked == "mismatch":
            error = InboxFingerprintMismatchError(
                f"job {job_id!r} run {run.run_id!r}: inbox key {key!r} was marked before for a"
                " different payload (its fingerprint differs); the run is dead-lettered, the"
                " handler not called.",
                fix="give each distinct input its own inbox key (the key function), or retry the"
                " dead run once the first key's ttl has passed.",
            )
            raise SettlesApart(failed(run, describe_failure(error), None, "terminal"))
        return completed(run)
