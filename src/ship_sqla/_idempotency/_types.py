"""Values and errors of the idempotency store: the stored response and the outcomes of begin."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias

import attrs

from ship_sqla.kernel._errors import (
    ConfigurationError,
    RefusedError,
    StaleLeaseError,
    UsageError,
)
from ship_sqla.kernel._json_text import unstorable_text

if TYPE_CHECKING:
    import uuid
    from datetime import datetime

    from ship_sqla._scope import TransactionScope

__all__ = [
    "IdempotencyClaim",
    "IdempotencyClaimLostError",
    "IdempotencyFingerprintMismatch",
    "IdempotencyInProgress",
    "IdempotencyKeyError",
    "IdempotencyOutcome",
    "IdempotencyRecord",
    "IdempotencyRecordCorruptError",
    "IdempotencyReplay",
    "IdempotencyStarted",
    "IdempotencyStatus",
    "StoredResponse",
]

IdempotencyStatus: TypeAlias = Literal["in_progress", "completed"]


def _headers(value: Any) -> tuple[tuple[str, str], ...]:  # noqa: ANN401 - attrs converter
    if isinstance(value, Mapping):
        value = value.items()
    return tuple((str(k), str(v)) for k, v in value)


def _storable_headers(
    _instance: object, _attribute: object, headers: tuple[tuple[str, str], ...]
) -> None:
    """Refuse a header ``jsonb`` cannot store (a NUL character, a surrogate code point) when the
    response is made, not as the driver's error when it is stored (issue 25 D6)."""
    for index, pair in enumerate(headers):
        for part, text in zip(("name", "value"), pair, strict=True):
            problem = unstorable_text(text)
            if problem is not None:
                raise ConfigurationError(
                    f"stored response header {index}'s {part} {text[:60]!r} holds {problem}:"
                    " PostgreSQL's jsonb cannot store it.",
                    fix="send header names and values as valid Unicode text without NUL"
                    " characters.",
                )


@attrs.frozen
class StoredResponse:
    """The response a key's first request produced, replayed to its duplicates.

    ``headers`` keep their order and repeats (several ``set-cookie``, say). The body is stored as
    UTF-8 text when it is text PostgreSQL's jsonb can hold, else as base64.
    """

    status: int
    headers: tuple[tuple[str, str], ...] = attrs.field(
        default=(), converter=_headers, validator=_storable_headers
    )
    body: bytes = b""

    def to_json(self) -> dict[str, Any]:
        try:
            text = self.body.decode("utf-8")
            if "\x00" in text:  # jsonb rejects \u0000 in strings
                raise ValueError(text)  # noqa: TRY301 - same fallback as undecodable bytes
            body, encoding = text, "utf-8"
        except ValueError:
            body, encoding = base64.b64encode(self.body).decode("ascii"), "base64"
        return {
            "status": self.status,
            "headers": [[k, v] for k, v in self.headers],
            "body": body,
            "body_encoding": encoding,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StoredResponse:
        try:
            encoding = data.get("body_encoding", "utf-8")
            raw = str(data.get("body", ""))
            body = base64.b64decode(raw, validate=True) if encoding == "base64" else raw.encode()
            return cls(
                status=int(data["status"]),
                headers=[(str(k), str(v)) for k, v in data.get("headers", [])],
                body=body,
            )
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise IdempotencyRecordCorruptError(
                f"a stored idempotency response cannot be read back ({exc!r}).",
                fix="the row was written by something other than this store; delete the key.",
            ) from exc


class IdempotencyKeyError(UsageError, ValueError):
    """An idempotency key or prefix is empty, too long, or not printable text."""

    code = "SHIP_SQLA_IDEMPOTENCY_KEY_INVALID"


class IdempotencyClaimLostError(StaleLeaseError, RuntimeError):
    """``complete`` or ``release`` carried a claim token that is no longer current.

    The claim was released, or left in progress past ``locked_until`` and taken over by a retry;
    nothing was changed.
    """

    code = "SHIP_SQLA_IDEMPOTENCY_CLAIM_LOST"


class IdempotencyRecordCorruptError(RefusedError, RuntimeError):
    """A stored response does not have the shape this store writes."""

    code = "SHIP_SQLA_IDEMPOTENCY_RECORD_CORRUPT"


class _ClaimOwner:
    """What a claim calls back into (the store); a Protocol would leak the store's internals."""

    async def _complete(
        self,
        claim: IdempotencyClaim,
        response: StoredResponse,
        scope: TransactionScope | None,
    ) -> datetime:
        raise NotImplementedError

    async def _release(self, claim: IdempotencyClaim, scope: TransactionScope | None) -> None:
        raise NotImplementedError


@attrs.frozen
class IdempotencyClaim:
    """A key this caller holds: run the effect, then :meth:`complete` (or :meth:`release`).

    Inside a unit of work the claim is invisible to others until the run commits, and a rollback
    removes it. Outside one, ``begin`` committed it at once: other requests see it in progress
    until ``locked_until``, after which a retry with the same fingerprint may take it over (and
    this claim's ``complete`` then raises :class:`IdempotencyClaimLostError`).
    """

    prefix: str
    tenant: str
    key: str
    fingerprint: str
    token: uuid.UUID
    locked_until: datetime
    expires_at: datetime
    _owner: _ClaimOwner = attrs.field(repr=False, alias="owner")

    async def complete(
        self, response: StoredResponse, *, scope: TransactionScope | None = None
    ) -> datetime:
        """Store ``response`` for replay, in the caller's unit of work (I1); its time is returned.

        Raises :class:`IdempotencyClaimLostError` when this claim is no longer current.
        """
        return await self._owner._complete(self, response, scope)  # noqa: SLF001

    async def release(self, *, scope: TransactionScope | None = None) -> None:
        """Give the key up (the effect failed) so a retry can run at once.

        Inside a unit of work a rollback does this already. Raises
        :class:`IdempotencyClaimLostError` when this claim is no longer current.
        """
        await self._owner._release(self, scope)  # noqa: SLF001


@attrs.frozen
class IdempotencyStarted:
    """The key is now this caller's: run the effect, then ``claim.complete(response)``."""

    claim: IdempotencyClaim
    outcome: ClassVar[str] = "started"


@attrs.frozen
class IdempotencyReplay:
    """The key's first request completed: answer with its stored response, run nothing."""

    response: StoredResponse
    completed_at: datetime | None
    outcome: ClassVar[str] = "replay"


@attrs.frozen
class IdempotencyInProgress:
    """Another request holds the key and has not finished (answer 409 Conflict; retry later).

    ``locked_until`` is when a committed but abandoned claim becomes retakeable; None when the
    holder's claim is not committed yet (its unit of work is still running).
    """

    locked_until: datetime | None
    outcome: ClassVar[str] = "in_progress"
    http_status: ClassVar[int] = 409


@attrs.frozen
class IdempotencyFingerprintMismatch:
    """The key was used before for a different request (answer 422 Unprocessable Content)."""

    key: str
    outcome: ClassVar[str] = "fingerprint_mismatch"
    http_status: ClassVar[int] = 422


IdempotencyOutcome: TypeAlias = (
    IdempotencyStarted | IdempotencyReplay | IdempotencyInProgress | IdempotencyFingerprintMismatch
)
"""What ``begin`` answers; match on the class (I2: every outcome is explicit)."""


@attrs.frozen
class IdempotencyRecord:
    """A key's row as operators and tests see it."""

    prefix: str
    tenant: str | None
    key: str
    fingerprint: str
    status: IdempotencyStatus
    response: StoredResponse | None
    locked_until: datetime | None
    expires_at: datetime
    created_at: datetime
    completed_at: datetime | None
