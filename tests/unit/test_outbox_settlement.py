"""The outbox's settlement records (kernel/_outbox_records.py): the kernel decides how a claimed
message settles, once; stores only apply the record (O3, O4)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from ship_sqla.errors import ConfigurationError
from ship_sqla.kernel import message_delivered, message_failed, message_released
from ship_sqla.kernel._plans.backoff import Backoff
from ship_sqla.outbox import OutboxMessage

NOW = datetime(2026, 1, 1, tzinfo=UTC)
BACKOFF = Backoff(kind="fixed", base=7.0, jitter="none")


def message(attempt: int, max_attempts: int = 3) -> OutboxMessage:
    return OutboxMessage(
        uuid.uuid4(),
        "main",
        "t",
        {},
        {},
        None,
        None,
        attempt,
        max_attempts,
        uuid.uuid4(),
        "w",
        NOW,
        NOW,
        NOW,
        None,
    )


def test_a_failure_before_the_last_attempt_retries_after_the_backoff() -> None:
    """O4: pending again after the outbox backoff's delay for this attempt, or ``retry_in``."""
    m = message(attempt=1)
    failed = message_failed(m, ValueError("no"), BACKOFF)
    assert (failed.settled_as, failed.delay, failed.error) == ("retrying", 7.0, "ValueError: no")
    assert (failed.message_id, failed.token, failed.outbox_id) == (m.id, m.token, "main")
    assert message_failed(m, "soon", BACKOFF, retry_in=0).delay == 0.0
    assert message_failed(m, "soon", BACKOFF, retry_in=0).wakes


def test_a_failure_on_the_last_attempt_or_permanent_is_dead() -> None:
    """O4: the kernel's one rule (attempts_spent, the runs' rule) makes the last attempt's
    failure dead whatever the backoff; ``permanent`` makes any attempt's failure dead."""
    assert message_failed(message(attempt=3), "x", BACKOFF).settled_as == "dead"
    assert message_failed(message(attempt=1), "x", BACKOFF, permanent=True).settled_as == "dead"
    assert not message_failed(message(attempt=3), "x", BACKOFF).wakes


def test_a_bad_retry_in_is_refused_before_any_store_sees_it() -> None:
    """O4: a negative or unbounded delay is a ConfigurationError naming ``retry_in``."""
    with pytest.raises(ConfigurationError, match="retry_in"):
        message_failed(message(attempt=1), "x", BACKOFF, retry_in=-1)


def test_a_release_is_due_now_or_at_an_aware_time() -> None:
    """O3: a release for now wakes local relays; one for later does not; a naive time is
    refused."""
    m = message(attempt=1)
    assert message_released(m).settled_as == "released"
    assert message_released(m).wakes
    later = message_released(m, NOW + timedelta(seconds=5))
    assert later.release_at == NOW + timedelta(seconds=5)
    assert not later.wakes
    with pytest.raises(ConfigurationError):
        message_released(m, datetime(2026, 1, 1))  # noqa: DTZ001 - the naive time refused
    assert message_delivered(m).settled_as == "delivered"
    assert not message_delivered(m).wakes
