"""Standard Webhooks signatures (https://www.standardwebhooks.com), as pure functions.

A delivery carries three headers: ``webhook-id`` (the event id, stable across retries),
``webhook-timestamp`` (integer Unix seconds of this attempt) and ``webhook-signature`` (a
space-separated list of ``v1,<base64 HMAC-SHA256>`` entries). The signed content is
``{webhook-id}.{webhook-timestamp}.{raw body}``: the body exactly as received, byte for byte, so
it must be verified before anything parses or re-serialises it.

Secrets are ``whsec_<base64 key>`` (the prefix is optional, as the reference libraries accept).
Several secrets may be in force at once while one is rotated: a signature made with any of them
passes. Signatures are compared with :func:`hmac.compare_digest`, never with ``==``.

The timestamp must be within ``tolerance`` of ``now`` in both directions: the window bounds how
long a captured delivery can be replayed. Deduplication is a different matter (a retry has a new
timestamp and a new signature but the same ``webhook-id``); see the webhook event store.

Nothing here does I/O or reads a clock: ``now`` is an argument.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, ClassVar

import attrs

from ship_sqla.kernel._errors import ConfigurationError, RefusedError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "DEFAULT_TOLERANCE",
    "HEADER_ID",
    "HEADER_SIGNATURE",
    "HEADER_TIMESTAMP",
    "SECRET_PREFIX",
    "VerifiedWebhook",
    "WebhookHeaderError",
    "WebhookSignatureError",
    "WebhookTimestampError",
    "WebhookVerificationError",
    "parse_webhook_secret",
    "sign_webhook",
    "verify_webhook",
    "webhook_headers",
]

HEADER_ID = "webhook-id"
HEADER_TIMESTAMP = "webhook-timestamp"
HEADER_SIGNATURE = "webhook-signature"
SECRET_PREFIX = "whsec_"  # noqa: S105 - the format's prefix, not a secret
SIGNATURE_VERSION = "v1"
DEFAULT_TOLERANCE = timedelta(minutes=5)

# Bounds on attacker-controlled input, so a hostile header costs a bounded amount of work.
MAX_ID_LENGTH = 256
MAX_SIGNATURES = 16
_MAX_TIMESTAMP_DIGITS = 12


class WebhookVerificationError(RefusedError, ValueError):
    """A delivery failed Standard Webhooks verification; ``http_status`` is the answer to give."""

    code: ClassVar[str] = "SHIP_SQLA_WEBHOOK_VERIFICATION_FAILED"
    http_status: ClassVar[int] = 401


class WebhookHeaderError(WebhookVerificationError):
    """A required header is missing or malformed: the request is not a Standard Webhook (400)."""

    code = "SHIP_SQLA_WEBHOOK_HEADER_INVALID"
    http_status = 400


class WebhookTimestampError(WebhookVerificationError):
    """The signed timestamp is outside the tolerance window: stale, replayed or clock-skewed."""

    code = "SHIP_SQLA_WEBHOOK_TIMESTAMP_OUT_OF_TOLERANCE"


class WebhookSignatureError(WebhookVerificationError):
    """No ``v1`` signature in the header matches any configured secret."""

    code = "SHIP_SQLA_WEBHOOK_SIGNATURE_MISMATCH"


@attrs.frozen
class VerifiedWebhook:
    """What verification proved: the event id and the (signed) attempt timestamp."""

    webhook_id: str
    timestamp: datetime


def parse_webhook_secret(secret: str | bytes) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret (raw bytes are taken as the key itself)."""
    if isinstance(secret, bytes):
        key = secret
    else:
        encoded = secret.removeprefix(SECRET_PREFIX)
        try:
            key = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ConfigurationError(
                "a webhook secret is not valid base64 after its 'whsec_' prefix.",
                fix="copy the secret exactly as the sender shows it (whsec_ followed by base64).",
            ) from exc
    if not key:
        raise ConfigurationError(
            "a webhook secret is empty.",
            fix="configure the secret the sender generated (whsec_ followed by base64).",
        )
    return key


def _unix_seconds(timestamp: int | datetime) -> int:
    if isinstance(timestamp, datetime):
        if timestamp.tzinfo is None:
            raise ConfigurationError(
                "webhook timestamps must be timezone-aware.",
                fix="pass datetime(..., tzinfo=UTC) or integer Unix seconds.",
            )
        return int(timestamp.timestamp())
    return int(timestamp)


def _signed_content(webhook_id: str, timestamp: int, body: bytes) -> bytes:
    return f"{webhook_id}.{timestamp}.".encode() + body


def _signature(key: bytes, content: bytes) -> str:
    return base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode("ascii")


def sign_webhook(
    secret: str | bytes, webhook_id: str, timestamp: int | datetime, body: bytes
) -> str:
    """The ``v1,<base64>`` signature of one delivery (for senders and tests)."""
    key = parse_webhook_secret(secret)
    stamp = _unix_seconds(timestamp)
    return f"{SIGNATURE_VERSION},{_signature(key, _signed_content(webhook_id, stamp, body))}"


def webhook_headers(
    secrets: str | bytes | Sequence[str | bytes],
    webhook_id: str,
    timestamp: int | datetime,
    body: bytes,
) -> dict[str, str]:
    """The three Standard Webhooks headers for one delivery, signed with every given secret."""
    if isinstance(secrets, str | bytes):
        secrets = [secrets]
    stamp = _unix_seconds(timestamp)
    signatures = " ".join(sign_webhook(s, webhook_id, stamp, body) for s in secrets)
    return {HEADER_ID: webhook_id, HEADER_TIMESTAMP: str(stamp), HEADER_SIGNATURE: signatures}


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if value is None:
        # Mappings built from ASGI scopes are lower-case already; tolerate hand-built ones.
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    if value is None or not value.strip():
        raise WebhookHeaderError(
            f"the {name!r} header is missing or empty; this is not a Standard Webhooks delivery.",
            fix=f"send {HEADER_ID}, {HEADER_TIMESTAMP} and {HEADER_SIGNATURE} with every delivery.",
        )
    return value.strip()


def _parse_timestamp(raw: str) -> int:
    if not raw.isascii() or not raw.isdigit() or len(raw) > _MAX_TIMESTAMP_DIGITS:
        raise WebhookHeaderError(
            f"the {HEADER_TIMESTAMP!r} header {raw[:40]!r} is not integer Unix seconds.",
            fix="send the attempt time as whole seconds since the Unix epoch, e.g. 1700000000.",
        )
    return int(raw)


def _provided_v1_signatures(raw: str) -> list[bytes]:
    entries = raw.split()
    if len(entries) > MAX_SIGNATURES:
        raise WebhookHeaderError(
            f"the {HEADER_SIGNATURE!r} header lists {len(entries)} signatures, more than"
            f" {MAX_SIGNATURES}.",
            fix="sign with the secrets currently in force only (one, or two while rotating).",
        )
    provided: list[bytes] = []
    for entry in entries:
        version, sep, signature = entry.partition(",")
        if not sep:
            raise WebhookHeaderError(
                f"the {HEADER_SIGNATURE!r} header entry {entry[:40]!r} is not '<version>,<sig>'.",
                fix="send space-separated entries such as 'v1,<base64 signature>'.",
            )
        if version == SIGNATURE_VERSION:  # other schemes (v1a: ed25519) are not ours to check
            provided.append(signature.encode("ascii", errors="replace"))
    return provided


def verify_webhook(
    headers: Mapping[str, str],
    body: bytes,
    *,
    secrets: Iterable[str | bytes],
    now: datetime,
    tolerance: timedelta = DEFAULT_TOLERANCE,
) -> VerifiedWebhook:
    """Verify one delivery over its RAW body; raise a :class:`WebhookVerificationError` if not.

    Passes when the timestamp is within ``tolerance`` of ``now`` (either direction) and one of
    the header's ``v1`` signatures matches one of ``secrets`` (rotation: several may be in force).
    Raises :class:`WebhookHeaderError` (malformed, 400), :class:`WebhookTimestampError` or
    :class:`WebhookSignatureError` (401).
    """
    keys = [parse_webhook_secret(s) for s in secrets]
    if not keys:
        raise ConfigurationError(
            "verify_webhook was given no secrets, so no delivery could ever pass.",
            fix="configure at least one whsec_ secret for this webhook.",
        )
    if now.tzinfo is None:
        raise ConfigurationError(
            "verify_webhook needs a timezone-aware now.", fix="pass clock.now() (aware UTC)."
        )
    webhook_id = _header(headers, HEADER_ID)
    if len(webhook_id) > MAX_ID_LENGTH:
        raise WebhookHeaderError(
            f"the {HEADER_ID!r} header is {len(webhook_id)} characters, over {MAX_ID_LENGTH}.",
            fix="use short unique event ids (e.g. msg_<ulid>).",
        )
    stamp = _parse_timestamp(_header(headers, HEADER_TIMESTAMP))
    provided = _provided_v1_signatures(_header(headers, HEADER_SIGNATURE))
    signed_at = datetime.fromtimestamp(stamp, UTC)
    if abs(now - signed_at) > tolerance:
        raise WebhookTimestampError(
            f"the delivery's timestamp {signed_at.isoformat()} is more than"
            f" {tolerance.total_seconds():g} s from now ({now.isoformat()}).",
            fix="check both clocks (NTP); a replayed old delivery is refused on purpose.",
        )
    content = _signed_content(webhook_id, stamp, body)
    matched = False
    for key in keys:
        expected = _signature(key, content).encode("ascii")
        for signature in provided:
            # Every pair is compared (no early exit) so timing reveals nothing about which key.
            matched |= hmac.compare_digest(expected, signature)
    if not matched:
        raise WebhookSignatureError(
            "no v1 signature in the webhook-signature header matches a configured secret"
            " (or the body was altered: it must be verified exactly as received).",
            fix="check the secret (and, while rotating, that the new one is configured too);"
            " verify the raw body, never re-serialised JSON.",
        )
    return VerifiedWebhook(webhook_id=webhook_id, timestamp=signed_at)
