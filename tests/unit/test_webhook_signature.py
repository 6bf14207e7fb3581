"""Standard Webhooks signing and verification: pure functions, no database."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

import pytest

from ship_sqla._webhooks import (
    WebhookHeaderError,
    WebhookSignatureError,
    WebhookTimestampError,
    WebhookVerificationError,
    parse_webhook_secret,
    sign_webhook,
    verify_webhook,
    webhook_headers,
)
from ship_sqla.errors import ConfigurationError

# The reference example published with the Standard Webhooks specification.
REF_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # noqa: S105 - published test vector
REF_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
REF_TIMESTAMP = 1614265330
REF_BODY = b'{"test": 2432232314}'
REF_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
OTHER = "whsec_" + base64.b64encode(b"o" * 32).decode()
NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
BODY = b'{"type":"invoice.paid","amount":42}'


def _headers(secret=SECRET, *, webhook_id="msg_1", at=NOW, body=BODY):
    return webhook_headers(secret, webhook_id, at, body)


def test_sign_matches_the_reference_example() -> None:
    assert sign_webhook(REF_SECRET, REF_ID, REF_TIMESTAMP, REF_BODY) == REF_SIGNATURE


def test_reference_example_verifies() -> None:
    headers = {
        "webhook-id": REF_ID,
        "webhook-timestamp": str(REF_TIMESTAMP),
        "webhook-signature": REF_SIGNATURE,
    }
    now = datetime.fromtimestamp(REF_TIMESTAMP, UTC)
    verified = verify_webhook(headers, REF_BODY, secrets=[REF_SECRET], now=now)
    assert verified.webhook_id == REF_ID
    assert verified.timestamp == now


def test_secret_prefix_is_optional_and_raw_bytes_are_the_key() -> None:
    key = parse_webhook_secret(SECRET)
    assert key == b"k" * 32
    assert parse_webhook_secret(SECRET.removeprefix("whsec_")) == key
    assert sign_webhook(key, "m", 1, b"x") == sign_webhook(SECRET, "m", 1, b"x")


@pytest.mark.parametrize("secret", ["whsec_not base64!", "whsec_", ""])
def test_bad_secrets_are_configuration_errors(secret: str) -> None:
    with pytest.raises(ConfigurationError, match="SHIP_SQLA_CONFIGURATION"):
        parse_webhook_secret(secret)


def test_no_secrets_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="no secrets"):
        verify_webhook(_headers(), BODY, secrets=[], now=NOW)


def test_naive_now_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="timezone-aware"):
        verify_webhook(_headers(), BODY, secrets=[SECRET], now=NOW.replace(tzinfo=None))


def test_valid_delivery_passes() -> None:
    verified = verify_webhook(_headers(), BODY, secrets=[SECRET], now=NOW)
    assert verified.webhook_id == "msg_1"


def test_header_names_are_case_insensitive() -> None:
    headers = {k.title(): v for k, v in _headers().items()}
    verify_webhook(headers, BODY, secrets=[SECRET], now=NOW)


def test_any_rotated_secret_verifies() -> None:
    signed_with_old = _headers(OTHER)
    verify_webhook(signed_with_old, BODY, secrets=[SECRET, OTHER], now=NOW)
    both = webhook_headers([SECRET, OTHER], "msg_1", NOW, BODY)
    assert len(both["webhook-signature"].split()) == 2
    verify_webhook(both, BODY, secrets=[OTHER], now=NOW)


def test_wrong_secret_is_a_signature_error_401() -> None:
    with pytest.raises(WebhookSignatureError) as caught:
        verify_webhook(_headers(OTHER), BODY, secrets=[SECRET], now=NOW)
    assert caught.value.code == "SHIP_SQLA_WEBHOOK_SIGNATURE_MISMATCH"
    assert caught.value.http_status == 401
    assert "Fix:" in str(caught.value)


def test_reserialised_body_fails() -> None:
    """The signature covers the raw bytes: equal JSON with other whitespace does not verify."""
    with pytest.raises(WebhookSignatureError):
        verify_webhook(
            _headers(), b'{"type": "invoice.paid", "amount": 42}', secrets=[SECRET], now=NOW
        )


def test_other_signature_versions_are_ignored() -> None:
    headers = _headers()
    headers["webhook-signature"] = "v1a,AAAA " + headers["webhook-signature"]
    verify_webhook(headers, BODY, secrets=[SECRET], now=NOW)
    headers["webhook-signature"] = "v1a,AAAA"
    with pytest.raises(WebhookSignatureError):
        verify_webhook(headers, BODY, secrets=[SECRET], now=NOW)


@pytest.mark.parametrize("skew", [timedelta(minutes=5), -timedelta(minutes=5)])
def test_timestamp_at_the_tolerance_edge_passes(skew: timedelta) -> None:
    verify_webhook(_headers(at=NOW + skew), BODY, secrets=[SECRET], now=NOW)


@pytest.mark.parametrize(
    "skew", [timedelta(minutes=5, seconds=1), -timedelta(minutes=5, seconds=1)]
)
def test_timestamp_beyond_tolerance_fails_both_ways(skew: timedelta) -> None:
    with pytest.raises(WebhookTimestampError) as caught:
        verify_webhook(_headers(at=NOW + skew), BODY, secrets=[SECRET], now=NOW)
    assert caught.value.http_status == 401
    assert caught.value.code == "SHIP_SQLA_WEBHOOK_TIMESTAMP_OUT_OF_TOLERANCE"


def test_tolerance_is_configurable() -> None:
    headers = _headers(at=NOW - timedelta(hours=1))
    verify_webhook(headers, BODY, secrets=[SECRET], now=NOW, tolerance=timedelta(hours=2))


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_missing_header_is_malformed_400(missing: str) -> None:
    headers = _headers()
    del headers[missing]
    with pytest.raises(WebhookHeaderError, match=missing) as caught:
        verify_webhook(headers, BODY, secrets=[SECRET], now=NOW)
    assert caught.value.http_status == 400
    assert isinstance(caught.value, WebhookVerificationError)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("webhook-timestamp", "yesterday"),
        ("webhook-timestamp", "-17"),
        ("webhook-timestamp", "1" * 20),
        ("webhook-signature", "v1"),
        ("webhook-signature", " ".join(["v1,AAAA"] * 17)),
        ("webhook-id", "m" * 300),
    ],
)
def test_malformed_header_is_malformed_400(name: str, value: str) -> None:
    headers = _headers()
    headers[name] = value
    with pytest.raises(WebhookHeaderError) as caught:
        verify_webhook(headers, BODY, secrets=[SECRET], now=NOW)
    assert caught.value.code == "SHIP_SQLA_WEBHOOK_HEADER_INVALID"
