"""Error groups (issue 36, item 6): what makes two dead runs' errors one group, and the filter
"retry all dead in this group" acts on. Pure: no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ship_sqla.kernel._error_groups import group_errors, group_key, normalise_message
from ship_sqla.kernel._ports import RunRecord

T0 = datetime(2026, 12, 7, tzinfo=UTC)


@pytest.mark.parametrize(
    ("message", "normalised"),
    [
        ("order 123 failed after 4.5 s", "order <n> failed after <n> s"),
        (
            "run 01a24e02-321e-727c-8c07-8fac09346124 lost",
            "run <uuid> lost",
        ),
        ("object at 0x7f3a2b1c and sha deadbeef12", "object at <hex> and sha <hex>"),
        ("'customer 7'  not\n found", "'customer <n>' not found"),
        ("utf8 codec can't decode", "utf8 codec can't decode"),  # a digit inside a word stays
    ],
)
def test_normalise_message_strips_what_varies(message: str, normalised: str) -> None:
    """Numbers, UUIDs and hex are replaced, whitespace collapsed; words with digits kept."""
    assert normalise_message(message) == normalised


def test_group_key_splits_the_exception_type_from_the_first_line() -> None:
    """The type is the first line's ``Type:`` prefix; the traceback after it is ignored."""
    assert group_key("ValueError: bad 3\n\nTraceback (most recent call last):\n x") == (
        "ValueError",
        "bad <n>",
    )
    assert group_key("builtins.KeyError: 'k 9'") == ("builtins.KeyError", "'k <n>'")
    assert group_key("TimeoutError") == ("TimeoutError", "")
    assert group_key("boom 12 happened") == ("", "boom <n> happened")
    assert group_key(None) == ("", "")


def _dead(run_id: str, job_id: str, error: str, minutes: int) -> RunRecord:
    at = T0 + timedelta(minutes=minutes)
    return RunRecord(
        run_id=run_id,
        job_id=job_id,
        state="dead",
        payload={},
        attempt=1,
        max_attempts=1,
        key=None,
        dedupe_key=None,
        run_at=at,
        created_at=at,
        updated_at=at,
        finished_at=at,
        lease_expires_at=None,
        last_error=error,
    )


def test_group_errors_counts_first_last_seen_and_example_and_the_retry_filter() -> None:
    """Groups by (job, type, normalised message), most runs first; the example is the newest
    (records come newest first); the filter is the job, dead, and the longest literal piece
    of the summary."""
    records = [
        _dead("r4", "mail", "ValueError: order 4 has no address", 4),
        _dead("r3", "mail", "ValueError: order 3 has no address", 3),
        _dead("r2", "sms", "ValueError: order 2 has no address", 2),
        _dead("r1", "mail", "KeyError: 'x'", 1),
        _dead("r0", "mail", "ValueError: order 0 has no address", 0),
    ]
    first, *rest = group_errors(records)
    assert (first.job_id, first.exception, first.message, first.count) == (
        "mail",
        "ValueError",
        "order <n> has no address",
        3,
    )
    assert first.example_run_id == "r4"
    assert first.first_seen == T0
    assert first.last_seen == T0 + timedelta(minutes=4)
    assert first.run_filter.as_fields() == [
        ("job", "mail"),
        ("state", "dead"),
        ("error", "ValueError: order"),
    ]
    assert sorted((g.job_id, g.count) for g in rest) == [("mail", 1), ("sms", 1)]
