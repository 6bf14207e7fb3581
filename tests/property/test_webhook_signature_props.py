"""Properties of Standard Webhooks verification (pure, no database)."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ship_sqla._webhooks import WebhookVerificationError, verify_webhook, webhook_headers

NOW = datetime(2030, 1, 1, tzinfo=UTC)
NOW_TS = int(NOW.timestamp())

secrets_ = st.binary(min_size=16, max_size=64).map(
    lambda key: "whsec_" + base64.b64encode(key).decode()
)
webhook_ids = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=64
)
bodies = st.binary(max_size=512)
timestamps = st.integers(min_value=NOW_TS - 300, max_value=NOW_TS + 300)


def _verify(headers: dict[str, str], body: bytes, secrets: list[str]) -> None:
    verify_webhook(headers, body, secrets=secrets, now=NOW)


@settings(max_examples=200, deadline=None)
@given(
    secrets=st.lists(secrets_, min_size=1, max_size=4, unique=True),
    signer=st.integers(min_value=0),
    webhook_id=webhook_ids,
    timestamp=timestamps,
    body=bodies,
)
def test_any_rotated_secret_verifies(
    secrets: list[str], signer: int, webhook_id: str, timestamp: int, body: bytes
) -> None:
    """A delivery signed with any one of the secrets in force passes verification."""
    secret = secrets[signer % len(secrets)]
    headers = webhook_headers(secret, webhook_id, timestamp, body)
    verified = verify_webhook(headers, body, secrets=secrets, now=NOW)
    assert verified.webhook_id == webhook_id


@settings(max_examples=200, deadline=None)
@given(
    secret=secrets_,
    webhook_id=webhook_ids,
    timestamp=timestamps,
    body=bodies.filter(bool),
    position=st.integers(min_value=0),
    mask=st.integers(min_value=1, max_value=255),
)
def test_any_body_byte_flip_fails(
    *, secret: str, webhook_id: str, timestamp: int, body: bytes, position: int, mask: int
) -> None:
    """Changing any bit of any byte of the body makes verification fail."""
    headers = webhook_headers(secret, webhook_id, timestamp, body)
    index = position % len(body)
    tampered = body[:index] + bytes([body[index] ^ mask]) + body[index + 1 :]
    with pytest.raises(WebhookVerificationError):
        _verify(headers, tampered, [secret])


def _flip_printable(text: str, position: int, shift: int) -> str:
    """Replace one character by another printable, non-space ASCII character."""
    index = position % len(text)
    replacement = chr(0x21 + (ord(text[index]) - 0x21 + shift) % 94)
    return text[:index] + replacement + text[index + 1 :]


@settings(max_examples=200, deadline=None)
@given(
    secret=secrets_,
    webhook_id=webhook_ids,
    timestamp=timestamps,
    body=bodies,
    position=st.integers(min_value=0),
    shift=st.integers(min_value=1, max_value=93),
)
def test_any_id_flip_fails(
    *, secret: str, webhook_id: str, timestamp: int, body: bytes, position: int, shift: int
) -> None:
    """Changing any character of the webhook-id makes verification fail."""
    headers = webhook_headers(secret, webhook_id, timestamp, body)
    headers["webhook-id"] = _flip_printable(webhook_id, position, shift)
    with pytest.raises(WebhookVerificationError):
        _verify(headers, body, [secret])


@settings(max_examples=200, deadline=None)
@given(
    secret=secrets_,
    webhook_id=webhook_ids,
    timestamp=timestamps,
    body=bodies,
    position=st.integers(min_value=0),
    shift=st.integers(min_value=1, max_value=93),
)
def test_any_timestamp_flip_fails(
    *, secret: str, webhook_id: str, timestamp: int, body: bytes, position: int, shift: int
) -> None:
    """Changing any character of the timestamp makes verification fail (by signature,
    tolerance or format, whichever it breaks)."""
    headers = webhook_headers(secret, webhook_id, timestamp, body)
    headers["webhook-timestamp"] = _flip_printable(headers["webhook-timestamp"], position, shift)
    with pytest.raises(WebhookVerificationError):
        _verify(headers, body, [secret])


@settings(max_examples=100, deadline=None)
@given(
    secret=secrets_,
    others=st.lists(secrets_, min_size=1, max_size=3),
    webhook_id=webhook_ids,
    timestamp=timestamps,
    body=bodies,
)
def test_signature_from_an_unconfigured_secret_fails(
    secret: str, others: list[str], webhook_id: str, timestamp: int, body: bytes
) -> None:
    """A signature made with a secret that is not in force never verifies."""
    others = [o for o in others if o != secret]
    if not others:
        return
    headers = webhook_headers(secret, webhook_id, timestamp, body)
    with pytest.raises(WebhookVerificationError):
        _verify(headers, body, others)
