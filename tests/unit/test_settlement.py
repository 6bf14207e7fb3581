"""J5, J7, K2, K4: one settlement record, built once by the kernel's named constructors; stores
only apply it."""

from __future__ import annotations

import typing
from datetime import UTC, datetime, timedelta

import pytest

from ship_sqla._jobs._sql.settle import SETTLE_IF_TOKEN_CURRENT
from ship_sqla.errors import ConfigurationError
from ship_sqla.kernel._json_text import unstorable_text
from ship_sqla.kernel._metrics import JobOutcome
from ship_sqla.kernel._ports import FAILURE_KINDS, ClaimedRun, SettleOutcome
from ship_sqla.kernel._settlement import (
    RELEASE_REASONS,
    SETTLED_STATES,
    HistoryEntry,
    JobSettleRefusedError,
    ReleaseReason,
    Settlement,
    cancelled,
    completed,
    failed,
    refused,
    released,
    settle_refusal,
    snoozed,
)

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
LATER = NOW + timedelta(seconds=30)


def _run(attempt: int = 1, max_attempts: int = 3, snoozes: int = 0) -> ClaimedRun:
    return ClaimedRun(
        run_id="r1",
        job_id="j",
        payload={},
        attempt=attempt,
        max_attempts=max_attempts,
        token=7,
        key=None,
        lease_expires_at=NOW,
        created_at=NOW,
        lease=30.0,
        snoozes=snoozes,
    )


def _every_settlement() -> list[Settlement]:
    run = _run()
    made = [
        completed(run),
        cancelled(run),
        cancelled(run, "stop"),
        snoozed(run, LATER, "not yet"),
        failed(run, "boom", LATER),
        failed(run, "boom", None, "terminal"),
        failed(_run(attempt=3), "boom", LATER, "timeout"),
    ]
    for reason in typing.get_args(ReleaseReason):
        made.append(released(run, LATER, reason=reason))
        made.append(released(run, LATER, reason=reason, error="drained"))
    return made


def test_j7_a_failure_with_attempts_left_goes_back_to_waiting_at_its_retry_time() -> None:
    """J7: retry or dead is decided once, when the settlement is built."""
    settlement = failed(_run(attempt=1, max_attempts=3), "boom", LATER, "retry-after")
    assert (settlement.state, settlement.run_at, settlement.answer) == (
        "waiting",
        LATER,
        "retrying",
    )
    assert settlement.spends_attempt
    assert settlement.entry == HistoryEntry("boom", "retry-after")
    assert (settlement.failure_kind, settlement.recorded) == ("retry-after", "retrying")


@pytest.mark.parametrize(("attempt", "retry_at"), [(3, LATER), (1, None), (4, None)])
def test_j7_a_failure_is_dead_when_its_attempts_are_spent_or_it_has_no_retry_time(
    attempt: int, retry_at: datetime | None
) -> None:
    """J7: the last attempt's failure (or one the plan gave no time) dead-letters the run."""
    settlement = failed(_run(attempt=attempt, max_attempts=3), "boom", retry_at)
    assert (settlement.state, settlement.run_at, settlement.answer) == ("dead", None, "dead")
    assert settlement.recorded == "dead"


def test_j7_k4_a_release_or_a_snooze_refunds_its_attempt_and_only_a_snooze_is_counted() -> None:
    """J7, K4: releases and snoozes go back to waiting without spending the attempt."""
    run = _run(snoozes=2)
    release = released(run, LATER, reason="lock-held")
    assert (release.state, release.spends_attempt, release.snoozes_added) == ("waiting", False, 0)
    assert release.entry is None
    snooze = snoozed(run, LATER, "not ready")
    assert (snooze.state, snooze.spends_attempt, snooze.snoozes_added) == ("waiting", False, 1)
    assert snooze.entry == HistoryEntry("not ready", "snooze")


def test_j10_each_release_reason_records_its_own_outcome() -> None:
    """J10: a release records lock_held / cancelled, or nothing when no attempt ran."""
    recorded = {
        reason: released(_run(), LATER, reason=reason).recorded
        for reason in typing.get_args(ReleaseReason)
    }
    assert recorded == {
        "lock-held": "lock_held",
        "cancelled": "cancelled",
        "unstarted": None,
        "lapsed": None,
        "refused": None,
        "version": None,
    }
    assert frozenset(recorded) == RELEASE_REASONS


def test_k2_a_cancel_request_turns_any_landed_settlement_into_cancelled() -> None:
    """K2: the store answers "cancelled" where a cancel request ended the run instead."""
    for settlement in _every_settlement():
        assert settlement.landed("cancelled") == "cancelled"
        assert settlement.landed(settlement.state) == settlement.answer


def test_every_field_comes_from_one_closed_vocabulary() -> None:
    """One outcome literal per concept: every settlement's state, answer, recorded outcome and
    history kind belongs to its literal (typing.get_args), on every constructor."""
    for settlement in _every_settlement():
        assert settlement.state in SETTLED_STATES
        assert settlement.answer in typing.get_args(SettleOutcome)
        assert settlement.recorded is None or settlement.recorded in typing.get_args(JobOutcome)
        assert (settlement.run_at is not None) == (settlement.state == "waiting")
        assert settlement.failure_kind is None or settlement.failure_kind in FAILURE_KINDS


def test_a_settlement_is_built_only_by_its_constructors() -> None:
    """The record has no public ``__init__``: a hand-made one cannot skip the rules."""
    with pytest.raises(TypeError):
        Settlement(_run(), "completed")  # type: ignore[call-arg]


def test_bad_settlements_are_refused_with_the_fix() -> None:
    """An unknown failure kind or a naive time is refused before any store sees it."""
    with pytest.raises(ConfigurationError, match="failure's kind 'oops' is unknown"):
        failed(_run(), "x", None, "oops")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="must be timezone-aware"):
        released(_run(), datetime(2026, 1, 1), reason="lapsed")  # noqa: DTZ001 - the point


def test_j7_the_settle_statement_decides_no_retry_or_dead_of_its_own() -> None:
    """J7: the PostgreSQL statement applies the settlement's state; it never compares attempts
    (the kernel's ``failed`` is the one place that does)."""
    assert "max_attempts" not in SETTLE_IF_TOKEN_CURRENT.sql
    assert "'fail'" not in SETTLE_IF_TOKEN_CURRENT.sql


def test_j23_a_history_entry_is_always_storable_text() -> None:
    """J23: an exception's message holding a NUL or a lone surrogate is escaped in the entry,
    so it can never make the batch it rides in unstorable."""
    entry = failed(_run(), "bad \x00 byte and \ud800 half", None).entry
    assert entry is not None
    assert entry.error == "bad \\x00 byte and \\ud800 half"
    assert unstorable_text(entry.error) is None


def test_j23_a_refused_settlement_becomes_a_dead_letter_answering_refused() -> None:
    """J23: what replaces a settlement the database refused: the run dead for good (a refused
    value is refused again), the typed refusal in its history, the store's answer "refused"."""
    original = snoozed(_run(), LATER, "later")
    refusal = settle_refusal(original, OverflowError("date value out of range"))
    settlement = refused(original, refusal)
    assert (settlement.state, settlement.answer, settlement.recorded) == ("dead", "refused", "dead")
    assert settlement.entry is not None
    assert settlement.entry.kind == "terminal"
    assert settlement.entry.error.startswith(JobSettleRefusedError.code)
    assert "OverflowError: date value out of range" in settlement.entry.error
    assert refusal.__cause__ is not None
