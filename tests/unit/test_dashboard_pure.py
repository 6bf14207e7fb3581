"""The dashboard's pure parts: CSRF tokens (S2) and the throughput chart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ship_sqla._dashboard._csrf import form_token, new_session_id, token_matches
from ship_sqla._dashboard._svg import throughput_chart
from ship_sqla.kernel import ThroughputBucket

SECRET = b"s" * 32


def test_s2_a_csrf_token_is_valid_only_for_its_session_and_secret():
    """S2: a token matches its own session id under the dashboard's secret, never another
    session's, another secret's, a truncated one, or a missing one."""
    session, other = new_session_id(), new_session_id()
    token = form_token(SECRET, session)
    assert token_matches(SECRET, session, token)
    assert not token_matches(SECRET, other, token)
    assert not token_matches(b"t" * 32, session, token)
    assert not token_matches(SECRET, session, token[:-1])
    assert not token_matches(SECRET, session, None)
    assert not token_matches(SECRET, None, token)
    assert not token_matches(SECRET, "x" * 500, form_token(SECRET, "x" * 500))


def test_throughput_chart_draws_one_bar_pair_per_bucket_and_escapes_its_titles():
    start = datetime(2026, 1, 1, tzinfo=UTC)
    buckets = [
        ThroughputBucket(start + timedelta(minutes=5 * i), i, i % 2, capped=i == 3)
        for i in range(4)
    ]
    svg = throughput_chart(buckets, bucket_seconds=300)
    assert svg.startswith("<svg")
    assert svg.endswith("</svg>")
    assert svg.count('class="completed"') == 4
    assert svg.count('class="dead"') == 4
    assert "capped: at least" in svg
    assert "3 completed, 1 dead" in svg
    assert throughput_chart([], bucket_seconds=300).endswith("</svg>")
