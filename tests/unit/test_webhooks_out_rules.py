"""The outbound webhooks' pure rules (SPEC §16): W3's classification and Retry-After, W5's
destination check. No database, no network."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ship_sqla._webhooks._sender import _retry_after
from ship_sqla.errors import ConfigurationError, RetryAfter
from ship_sqla.jobs import RetryPolicy
from ship_sqla.kernel._plans.retry import plan_raised
from ship_sqla.kernel._webhooks_out import check_allow, classify_status, excerpt, refused_address

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@given(st.integers(100, 599))
def test_w3_every_status_has_one_class(status: int) -> None:
    """W3: 2xx delivered; 408, 409, 425, 429 and 5xx retried; every other answer (1xx, 3xx:
    redirects are not followed, other 4xx) terminal."""
    expected = (
        "delivered"
        if 200 <= status < 300
        else "retry"
        if status in (408, 409, 425, 429) or status >= 500
        else "terminal"
    )
    assert classify_status(status) == expected


def test_w3_retry_after_reads_seconds_and_http_dates_and_is_clamped_by_max_delay() -> None:
    """W3: Retry-After as delta-seconds or an HTTP date (a past date: now); nonsense is
    ignored (the backoff decides); the kernel's RetryAfter plan clamps it by the policy's
    max_delay."""
    assert _retry_after("120", NOW) == 120
    assert _retry_after("Thu, 01 Jan 2026 00:01:30 GMT", NOW) == 90
    assert _retry_after("Wed, 31 Dec 2025 23:00:00 GMT", NOW) == 0
    assert _retry_after("soon", NOW) is None
    assert _retry_after(None, NOW) is None
    policy = RetryPolicy(attempts=5, max_delay=60.0)
    plan = plan_raised(policy, RetryAfter(7200), attempt=1, max_attempts=5, snoozes=0, now=NOW)
    assert plan.at == NOW + timedelta(seconds=60)


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.1", "private"),
        ("10.255.255.255", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.1", "private"),
        ("192.168.1.1", "private"),
        ("fc00::1", "private"),
        ("fd12:3456::1", "private"),
        ("169.254.169.254", "link-local"),
        ("169.254.0.1", "link-local"),
        ("fe80::1", "link-local"),
        ("fe80::1%eth0", "link-local"),
        ("0.0.0.0", "unspecified"),  # noqa: S104 - an address under test
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "link-local"),
        ("100.64.0.1", "not a public"),
    ],
)
def test_w5_non_public_addresses_are_refused_unless_allowed(address: str, kind: str) -> None:
    """W5: loopback, private (10/8, 172.16/12, 192.168/16, fc00::/7), link-local (169.254/16
    with the metadata address, fe80::/10), unspecified, multicast and the rest that is not
    public are refused, naming why; an IPv4-mapped IPv6 address is judged as the IPv4 one; the
    allowlist (a network holding it, or the host's name) lets it through."""
    why = refused_address("hooks.test", address, [])
    assert why is not None
    assert kind in why
    bare = ipaddress.ip_address(address.split("%", maxsplit=1)[0])
    network = f"{bare}/{bare.max_prefixlen}"
    if isinstance(bare, ipaddress.IPv6Address) and bare.ipv4_mapped is not None:
        network = f"{bare.ipv4_mapped}/32"
    assert refused_address("hooks.test", address, [network]) is None
    assert refused_address("hooks.test", address, ["HOOKS.test"]) is None
    assert refused_address("other.test", address, ["hooks.test", "8.8.8.0/24"]) is not None


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111"])
def test_w5_public_addresses_pass(address: str) -> None:
    """W5: a public address needs no allowlist."""
    assert refused_address("hooks.test", address, []) is None


def test_w5_the_allowlist_is_a_list_and_the_excerpt_says_when_cut() -> None:
    """W5: one string given as the allowlist is refused (it would be read letter by letter);
    W3: an excerpt longer than its bound says how much was cut."""
    with pytest.raises(ConfigurationError, match="list"):
        check_allow("127.0.0.1/32")  # type: ignore[arg-type]
    assert check_allow([" 127.0.0.1/32 ", ""]) == ("127.0.0.1/32",)
    assert excerpt("abc", 5) == "abc"
    assert excerpt("abcdefgh", 5) == "abcde... [3 more characters]"
