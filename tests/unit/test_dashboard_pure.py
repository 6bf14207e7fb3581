"""The dashboard's pure parts: CSRF tokens (S2), the one reader of a page's parameters (S2,
issue 25), the throughput chart, and the templates and static files (issue 36)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import pytest

from ship_sqla._dashboard._csrf import form_token, new_session_id, token_matches
from ship_sqla._dashboard._filters import BadParameter, Filters, read_filters
from ship_sqla._dashboard._html import ENV, at, link, table, text
from ship_sqla._dashboard._static import ASSETS, STATIC_DIR
from ship_sqla._dashboard._svg import throughput_chart
from ship_sqla.errors import (
    ConfigurationError,
    InvalidCursorError,
    InvalidKeyError,
    TenantViolationError,
)
from ship_sqla.jobs import ThroughputBucket

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


RUNS = ("state", "job", "tenant", "since", "until", "cursor")


@pytest.mark.parametrize(
    ("query", "parameter", "error"),
    [
        ({"tenant": "\x00"}, "tenant", TenantViolationError),
        ({"tenant": "a\x1bb"}, "tenant", TenantViolationError),
        ({"tenant": "\x85"}, "tenant", TenantViolationError),
        ({"tenant": "\ud800"}, "tenant", TenantViolationError),
        ({"tenant": " "}, "tenant", TenantViolationError),
        ({"tenant": "t" * 256}, "tenant", TenantViolationError),
        ({"job": "a b"}, "job", ConfigurationError),
        ({"job": "\x00"}, "job", ConfigurationError),
        ({"state": "bogus"}, "state", ConfigurationError),
        ({"since": "yesterday"}, "since", ConfigurationError),
        ({"until": "2026-01-01T00:00\x00"}, "until", ConfigurationError),
        ({"state": "waiting", "since": "2026-01-01T00:00"}, "since", ConfigurationError),
        ({"state": "running", "until": "2026-01-01T00:00"}, "until", ConfigurationError),
        ({"cursor": "\x00"}, "cursor", InvalidCursorError),
        ({"cursor": "é"}, "cursor", InvalidCursorError),
        ({"cursor": "c" * 4097}, "cursor", InvalidCursorError),
    ],
)
def test_s2_a_bad_parameter_is_refused_naming_it_with_the_librarys_typed_error(
    query, parameter, error
):
    """S2, issue 25 (D5): each parameter of the runs page goes through the library's own check
    for its kind of value; the first refused one raises BadParameter naming it and carrying the
    typed error (its stable code and its fix)."""
    with pytest.raises(BadParameter) as refused:
        read_filters(query, {}, RUNS)
    assert refused.value.parameter == parameter
    assert isinstance(refused.value.error, error)
    assert str(refused.value.error).startswith("SHIP_SQLA_")
    assert refused.value.error.fix


def test_s2_good_parameters_are_read_and_unread_ones_ignored():
    """S2, issue 25: absent or empty parameters are no filter; a date without an offset is UTC;
    a page ignores what it does not read; the audit position and the run id are checked the same
    way."""
    query = {
        "state": "dead",
        "job": "dash.mail",
        "tenant": "acme",
        "since": "2026-01-02T03:04",
        "until": "",
        "cursor": "abc",
        "before": "\x00",  # not read by the runs page
    }
    read = read_filters(query, {}, RUNS)
    assert (read.state, read.job, read.tenant, read.cursor, read.until) == (
        "dead",
        "dash.mail",
        "acme",
        "abc",
        None,
    )
    assert read.since == datetime(2026, 1, 2, 3, 4, tzinfo=UTC)
    assert read_filters({}, {}, RUNS) == Filters()
    assert read_filters({"before": "42"}, {}, ("before",)).before == 42
    for before in ("abc", "\u00b2", "0", "-1", str(2**63)):
        with pytest.raises(BadParameter) as refused:
            read_filters({"before": before}, {}, ("before",))
        assert refused.value.parameter == "before"
    assert read_filters({}, {"run_id": "r/1"}, ("run_id",)).run_id == "r/1"
    for run_id in ("\x00", "", "r" * 256):
        with pytest.raises(BadParameter) as refused:
            read_filters({}, {"run_id": run_id}, ("run_id",))
        assert (refused.value.parameter, type(refused.value.error)) == ("run_id", InvalidKeyError)


def test_s2_a_csrf_token_of_any_text_is_refused_not_an_error_issue_32() -> None:
    """S2, issue 32: a forged token with non-ASCII characters (or a lone surrogate) is simply
    not the session's token: False, never the TypeError of ``hmac.compare_digest`` on a str."""
    secret = b"s" * 32
    for token in ("\u202eevil", "é" * 64, "\ud800", "\x00"):
        assert token_matches(secret, "session", token) is False
    assert token_matches(secret, "session", form_token(secret, "session")) is True


def test_every_template_compiles_and_escapes_what_it_is_given_issue_36():
    """Issue 36: every template of the dashboard compiles; a value reaching a macro is escaped
    (autoescape), and a time is a ``<time>`` reading in UTC for the page script to localise."""
    names = ENV.list_templates()
    assert {"layout.html", "macros.html", "parts.html", "pages/overview.html"} <= set(names)
    for name in names:
        ENV.get_template(name)
    hostile = "<script>alert(1)</script>"
    cell = table(["h"], [[text(hostile)]], empty="")
    assert hostile not in cell
    assert "&lt;script&gt;" in cell
    assert hostile not in link("/ops", "/runs", hostile, {"job": hostile})
    assert at(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == (
        '<time datetime="2026-01-02T03:04:05Z">2026-01-02 03:04:05 UTC</time>'
    )


def test_the_static_files_are_served_under_their_content_hash_with_a_licence_issue_36():
    """Issue 36: each static file's served name holds the first 10 hex digits of its content's
    SHA-256 (a changed file is a new name, so ``immutable`` is safe), and each vendored file is
    listed in the vendor README beside its licence file."""
    readme = (STATIC_DIR / "vendor" / "README.md").read_text()
    for relative, (hashed, _) in ASSETS.items():
        digest = hashlib.sha256((STATIC_DIR / relative).read_bytes()).hexdigest()[:10]
        stem, _, ext = relative.rpartition(".")
        assert hashed == f"{stem}.{digest}.{ext}"
        if relative.startswith("vendor/"):
            assert f"`{relative.removeprefix('vendor/')}`" in readme, relative
    for licence in ("htmx", "idiomorph", "htmx-ext-sse", "uplot"):
        assert (STATIC_DIR / "vendor" / f"LICENSE.{licence}").is_file()
