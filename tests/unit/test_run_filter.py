"""Issue 36 items 4-5, pure: a RunFilter reads back from its own fields, matches payload paths
(lists by index) and the state's own time, and a bulk action's confirmation token is bound to
its action, filter and count and lapses after 15 minutes (S1: an old confirmation changes
nothing). The clock is passed in, never slept on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ship_sqla.kernel._ports import RunRecord
from ship_sqla.kernel._search import (
    TOKEN_TTL,
    BulkTokenError,
    RunFilter,
    bulk_token,
    check_bulk_token,
)

T0 = datetime(2026, 12, 6, 12, tzinfo=UTC)
SECRET = b"k" * 32


def _record(**changes: object) -> RunRecord:
    fields: dict[str, object] = {
        "run_id": "r1",
        "job_id": "mail",
        "state": "waiting",
        "payload": {"order": {"lines": [{"sku": "A-1"}]}, "n": 7},
        "attempt": 0,
        "max_attempts": 3,
        "key": None,
        "dedupe_key": None,
        "run_at": T0,
        "created_at": T0 - timedelta(hours=1),
        "updated_at": T0,
        "finished_at": None,
        "lease_expires_at": None,
        "last_error": None,
    }
    return RunRecord(**{**fields, **changes})  # type: ignore[arg-type]


def test_a_filter_reads_back_from_its_fields() -> None:
    """``as_fields`` is what ``parse`` reads: a link or an audit entry keeps the filter."""
    flt = RunFilter.parse(
        ["job=mail", "state=dead", f"from={T0.isoformat()}", "error=Time Out", "payload=n=7"]
    )
    assert RunFilter.parse([f"{n}={v}" for n, v in flt.as_fields()]) == flt
    assert flt.describe().startswith("job=mail state=dead from=2026-12-06T12:00:00+00:00")
    assert RunFilter().describe() == "every run"


def test_matching_reads_payload_paths_and_the_state_s_own_time() -> None:
    """Payload paths walk objects and lists (by index), values compare as JSON; a waiting run's
    time is its due time, a finished run's its creation time."""
    run = _record()
    assert RunFilter.parse(["payload=order.lines.0.sku=A-1"]).matches(run)
    assert RunFilter.parse(['payload=order.lines.0.sku="A-1"']).matches(run)
    assert not RunFilter.parse(["payload=order.lines.1.sku=A-1"]).matches(run)
    assert not RunFilter.parse(['payload=n="7"']).matches(run)
    due = RunFilter.parse([f"from={T0.isoformat()}", f"to={(T0 + timedelta(1)).isoformat()}"])
    assert due.matches(run)
    assert not due.matches(_record(state="dead", finished_at=T0))  # created an hour before


def test_a_confirmation_token_is_bound_to_action_filter_count_and_time() -> None:
    """S1: the token confirms its count for its action and filter only, and for 15 minutes."""
    flt = RunFilter.parse(["state=dead"])
    now = T0.timestamp()
    token = bulk_token(SECRET, "retry", flt, 12, now)
    assert check_bulk_token(SECRET, "retry", flt, token, now + TOKEN_TTL) == 12
    with pytest.raises(BulkTokenError, match="s old"):
        check_bulk_token(SECRET, "retry", flt, token, now + TOKEN_TTL + 1)
    for action, other, forged in (
        ("discard", flt, token),
        ("retry", RunFilter.parse(["state=dead", "job=mail"]), token),
        ("retry", flt, token.replace("12.", "13.", 1)),
        ("retry", flt, None),
    ):
        with pytest.raises(BulkTokenError):
            check_bulk_token(SECRET, action, other, forged, now)
