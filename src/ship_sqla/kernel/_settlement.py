"""How a claimed run's attempt settles: ONE frozen record, built here and nowhere else.

The executor decides how an attempt ended and calls one of the named constructors below
(:func:`completed`, :func:`failed`, :func:`released`, :func:`snoozed`, :func:`cancelled`); each
works out, once, everything a store and the runtime need to know:

- ``state``: where the run goes (``completed``, ``waiting``, ``dead``, ``cancelled``), and
  ``run_at`` when it goes back to waiting. Retry or dead is decided here (J7: a failure with a
  retry time goes back to waiting unless its attempts are spent), never again by a store;
- ``spends_attempt``: False for a release or a snooze (J7, K4): the next claim takes the same
  attempt number again; ``snoozes_added``: 1 for a snooze (K4), else 0;
- ``entry``: the history entry to append (its text and :data:`HistoryKind`), or None;
- ``answer``: what the store answers when the settlement lands as built (:data:`SettleOutcome`);
  ``recorded``: the ``ship.job.runs`` outcome of the attempt (J10; None when no attempt ran);
  ``label``: how a stale report names it.

A store only *applies* a record (PostgreSQL's ``SETTLE_IF_TOKEN_CURRENT``, the in-memory model's
``_settle_one``), fenced on the claim's token (J5), with one rule of its own, because it depends
on the row at that instant: once an operator asked to cancel the run, any settlement but a
completion ends it ``cancelled`` (K2; :meth:`Settlement.landed`). The completer, the run log,
tracing and metrics read the record's fields; none of them looks at how it was built.

A workflow's :class:`~ship_sqla.kernel._ports.Suspend` (D3) stays the store's own case: where the
run waits is decided by the store from its steps and events.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final, Literal, TypeAlias, assert_never, get_args

import attrs

from ship_sqla.kernel._clock import require_aware
from ship_sqla.kernel._errors import ConfigurationError, UsageError
from ship_sqla.kernel._json_text import storable_text
from ship_sqla.kernel._plans.retry import attempts_spent
from ship_sqla.kernel._ports import FAILURE_KINDS, Suspend

if TYPE_CHECKING:
    from ship_sqla.kernel._metrics import JobOutcome
    from ship_sqla.kernel._ports import ClaimedRun, FailureKind, HistoryKind, SettleOutcome

__all__ = [
    "RELEASE_REASONS",
    "SETTLED_STATES",
    "HistoryEntry",
    "JobSettleRefusedError",
    "ReleaseReason",
    "SettleRequest",
    "SettledState",
    "Settlement",
    "cancelled",
    "completed",
    "duplicate",
    "failed",
    "refused",
    "released",
    "settle_refusal",
    "snoozed",
]

SettledState = Literal["completed", "waiting", "dead", "cancelled"]
"""Where a settlement sends its run (a cancel request may turn any but ``completed`` into
``cancelled``, K2)."""
SETTLED_STATES: Final = frozenset(get_args(SettledState))

ReleaseReason = Literal["lock-held", "cancelled", "unstarted", "lapsed", "refused", "version"]
"""Why the runtime hands a claimed run back unfinished, its attempt unspent (:func:`released`):
its single-runner lock was held elsewhere (J7); its handler was cancelled (drain deadline or lost
lock, J12), or cancelled before it started; its lease had lapsed before its handler could start
(J6); or the loop must not execute it (claimed while stopping, or beyond the limit asked); or
this process has no handler for the version the run was enqueued under (D9)."""
RELEASE_REASONS: Final = frozenset(get_args(ReleaseReason))


@attrs.frozen
class HistoryEntry:
    """The entry a settlement appends to its run's history (and keeps as ``last_error``); the
    store adds the attempt number and the time. Its text is always storable (J23): a NUL or a
    lone surrogate an exception's message carried is escaped, never sent to fail the batch."""

    error: str = attrs.field(converter=storable_text)
    kind: HistoryKind


@attrs.frozen(init=False)
class Settlement:
    """What a worker asks a store to do with a claimed run: see the module docstring. Built only
    by the constructors of this module (it has no public ``__init__``)."""

    run: ClaimedRun
    state: SettledState
    run_at: datetime | None
    """When the run is due again (``state == "waiting"``); None otherwise."""
    spends_attempt: bool
    snoozes_added: int
    entry: HistoryEntry | None
    answer: SettleOutcome
    recorded: JobOutcome | None
    label: str
    failure_kind: FailureKind | None = None
    """How a failed attempt failed (K4, K5); None for any other settlement."""
    wait_for: str | None = None
    """What the run waits for once back to waiting (D10: :data:`DIVERGED` for a parked run);
    None for any other settlement."""

    def landed(self, state: str) -> SettleOutcome:
        """The store's answer once the settlement landed leaving its run in ``state``: its own
        ``answer``, or ``"cancelled"`` when a cancel request turned it into one (K2)."""
        return "cancelled" if state == "cancelled" else self.answer

    @property
    def keeps_lapses(self) -> bool:
        """J15: whether landing leaves the run's ``consecutive_lapses`` as it was: a release (a
        drain, a hand-back, a held lock) is neither a lapse nor an end its handler reached;
        every other settlement ends the streak (back to 0)."""
        return self.answer == "released"

    def makes_due(self, outcome: SettleOutcome, now: datetime) -> bool:
        """Whether landing with ``outcome`` left the run waiting and due at ``now``."""
        return outcome == self.answer and self.run_at is not None and self.run_at <= now


SettleRequest: TypeAlias = Settlement | Suspend
"""What ``RunStore.settle`` takes: a :class:`Settlement`, or a workflow's suspend (D3)."""


def _build(
    run: ClaimedRun,
    state: SettledState,
    *,
    answer: SettleOutcome,
    recorded: JobOutcome | None,
    label: str,
    run_at: datetime | None = None,
    spends_attempt: bool = True,
    snoozes_added: int = 0,
    entry: HistoryEntry | None = None,
    failure_kind: FailureKind | None = None,
    wait_for: str | None = None,
) -> Settlement:
    if run_at is not None:
        require_aware(run_at, f"the run_at of run {run.run_id!r}'s settlement")
    settlement = Settlement.__new__(Settlement)
    settlement.__attrs_init__(
        run,
        state,
        run_at,
        spends_attempt,
        snoozes_added,
        entry,
        answer,
        recorded,
        label,
        failure_kind,
        wait_for,
    )
    return settlement


def completed(run: ClaimedRun) -> Settlement:
    """The handler returned: the run is completed."""
    return _build(run, "completed", answer="completed", recorded="completed", label="complete")


def duplicate(run: ClaimedRun, key: str) -> Settlement:
    """J13: the run's inbox key was completed before (within its ttl): the run is completed as
    a duplicate without calling its handler, the key named in its history."""
    return _build(
        run,
        "completed",
        answer="duplicate",
        recorded="duplicate",
        label="complete as a duplicate",
        entry=HistoryEntry(
            f"inbox key {key!r} was completed before: completed as a duplicate, the handler"
            " not called",
            "duplicate",
        ),
    )


def failed(
    run: ClaimedRun, error: str, retry_at: datetime | None, kind: FailureKind = "failure"
) -> Settlement:
    """The attempt failed (K4, K5) with ``error`` (its history entry, of ``kind``): waiting again
    at ``retry_at``, or dead when ``retry_at`` is None or the attempts are spent (J7, the one
    place this is decided). The retry plan (:func:`~ship_sqla.kernel._plans.retry.plan_raised`)
    chose ``kind`` and ``retry_at``."""
    if kind not in FAILURE_KINDS:
        raise ConfigurationError(
            f"a failure's kind {kind!r} is unknown.", fix=f"use one of {sorted(FAILURE_KINDS)}."
        )
    entry = HistoryEntry(error, kind)
    if retry_at is None or attempts_spent(run.attempt, run.max_attempts):
        return _build(
            run,
            "dead",
            answer="dead",
            recorded="dead",
            label="fail",
            entry=entry,
            failure_kind=kind,
        )
    return _build(
        run,
        "waiting",
        answer="retrying",
        recorded="retrying",
        label="fail",
        run_at=retry_at,
        entry=entry,
        failure_kind=kind,
    )


def _released_as(reason: ReleaseReason) -> tuple[str, JobOutcome | None]:
    """Per reason: how a stale report names the release, and the ``ship.job.runs`` outcome it
    records (None: no attempt ran, nothing is recorded; J10)."""
    match reason:
        case "lock-held":
            return "release (lock held)", "lock_held"
        case "cancelled":
            return "release (cancelled)", "cancelled"
        case "unstarted":
            return "release (cancelled)", None
        case "lapsed":
            return "release (lapsed)", None
        case "refused":
            return "release after claim", None
        case "version":
            return "release (version unavailable)", None
        case _:  # pragma: no cover - mypy proves every reason is matched
            assert_never(reason)


def released(
    run: ClaimedRun, run_at: datetime, *, reason: ReleaseReason, error: str | None = None
) -> Settlement:
    """Hand the run back to waiting at ``run_at`` without spending its attempt (J7 lock held,
    J12 drain or lost lock, J6 lapsed before start); ``error``, when given, is appended to the
    history (kind ``"released"``)."""
    label, recorded = _released_as(reason)
    entry = None if error is None else HistoryEntry(error, "released")
    return _build(
        run,
        "waiting",
        answer="released",
        recorded=recorded,
        label=label,
        run_at=run_at,
        spends_attempt=False,
        entry=entry,
    )


DIVERGED: Final = "#diverged"
"""D10: the ``wait_for`` of a parked run (its handler diverged from its history)."""
PARKED_UNTIL: Final = datetime(9999, 12, 31, tzinfo=UTC)
"""D10: a parked run's ``run_at``: due never, until an operator or a new build unparks it."""


def parked(run: ClaimedRun, error: str) -> Settlement:
    """D10: the run's handler diverged from its history (D7) before the diverging step ran: back
    to waiting, its attempt unspent, due never (:data:`PARKED_UNTIL`), waiting for
    :data:`DIVERGED`, the divergence (``error``) its history entry (kind ``"diverged"``)."""
    return _build(
        run,
        "waiting",
        answer="parked",
        recorded="parked",
        label="park",
        run_at=PARKED_UNTIL,
        spends_attempt=False,
        entry=HistoryEntry(error, "diverged"),
        wait_for=DIVERGED,
    )


def snoozed(run: ClaimedRun, run_at: datetime, error: str) -> Settlement:
    """The handler raised ``Snooze`` (K4): back to waiting at ``run_at``, attempt unspent, one
    more snooze counted, the snooze's text in the history. The executor sends it only while the
    run has snoozed fewer than ``retry.max_snoozes`` times."""
    return _build(
        run,
        "waiting",
        answer="snoozed",
        recorded="snoozed",
        label="snooze",
        run_at=run_at,
        spends_attempt=False,
        snoozes_added=1,
        entry=HistoryEntry(error, "snooze"),
    )


def cancelled(run: ClaimedRun, error: str | None = None) -> Settlement:
    """An operator cancelled the run and its handler stopped (K2): it ends cancelled. Not a
    failure: no retry, no dead letter, the attempt counted; ``error``, when given, is appended."""
    entry = None if error is None else HistoryEntry(error, "cancelled")
    return _build(
        run, "cancelled", answer="cancelled", recorded="cancelled", label="cancel", entry=entry
    )


class JobSettleRefusedError(UsageError, ValueError):
    """The database refused to store one run's settlement or suspension (a value it cannot hold:
    text it cannot encode, a time out of its range, a constraint): that run alone was failed for
    good with this error in its history; every other run of the batch settled as ever (J23)."""

    code = "SHIP_SQLA_JOB_SETTLE_REFUSED"


def settle_refusal(
    settlement: SettleRequest,
    error: BaseException,
    *,
    quoting: bool = True,
    stored: bool = True,
) -> JobSettleRefusedError:
    """The typed error of a settlement the database refused to store, ``error`` its cause.
    ``quoting=False``: the database refused the refusal too (its text quotes the refused
    value, which a constraint may refuse again): name only the cause's type. ``stored=False``:
    not even that could be stored (a constraint on the run's state): the run stays claimed."""
    run = settlement.run
    cause = f"{type(error).__name__}: {error}" if quoting else type(error).__name__
    then = (
        "The run was failed for good instead"
        if stored
        else "Not even its failure could be stored: the run stays as it was until its lease"
        " lapses, and then runs again"
    )
    refusal = JobSettleRefusedError(
        f"the database refused to store the {settlement.label} of job {run.job_id!r} run"
        f" {run.run_id!r} (attempt {run.attempt}): {cause}. {then}; the other runs settled"
        " beside it were not affected.",
        fix="find the value the database cannot hold (a lone surrogate or NUL in a step name,"
        " an event key or a result; a time out of range; a value a constraint refuses) and fix"
        " the handler, then retry the dead run.",
    )
    refusal.__cause__ = error
    return refusal


def refused(settlement: SettleRequest, refusal: JobSettleRefusedError) -> Settlement:
    """What replaces a settlement the database refused to store (J23): the run fails for good
    (dead, kind ``"terminal"``; a refused value is refused again at every retry), its history
    holding ``refusal`` (:func:`settle_refusal`); the store answers ``"refused"``."""
    return _build(
        settlement.run,
        "dead",
        answer="refused",
        recorded="dead",
        label="fail",
        entry=HistoryEntry(str(refusal), "terminal"),
        failure_kind="terminal",
    )
