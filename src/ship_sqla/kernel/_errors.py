"""Errors with a stable code, a statement of what happened, and the fix.

Every error ship_sqla raises on purpose derives from :class:`ShipError`. The ``code`` is stable
across releases (``SHIP_SQLA_*``) so applications and log pipelines can match on it; the message
says what went wrong and what to do about it.
"""

from __future__ import annotations

from typing import ClassVar


class ShipError(Exception):
    """Base of every deliberate ship_sqla error: a stable ``code`` and an actionable message."""

    code: ClassVar[str] = "SHIP_SQLA_ERROR"

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        self.message = message
        self.fix = fix
        text = f"{self.code}: {message}"
        if fix:
            text = f"{text} Fix: {fix}"
        super().__init__(text)


class ConfigurationError(ShipError, ValueError):
    """A factory or declaration was given options that cannot work together."""

    code = "SHIP_SQLA_CONFIGURATION"


class ScopeClosedError(ShipError, RuntimeError):
    """A transaction scope was used after the ``uow.run`` that opened it had ended (U2)."""

    code = "SHIP_SQLA_SCOPE_CLOSED"


class ScopeConcurrencyError(ShipError, RuntimeError):
    """A transaction scope was used from a task other than the one running its ``uow.run``."""

    code = "SHIP_SQLA_SCOPE_CONCURRENT_USE"


class TenantRequiredError(ShipError, ValueError):
    """A tenant-scoped repository was built for a scope that names no tenant (R2)."""

    code = "SHIP_SQLA_TENANT_REQUIRED"


class TenantViolationError(ShipError, ValueError):
    """A write named a tenant other than the repository's own, or tried to move a row (R2); or
    a tenant that is no tenant at all (empty, blank, too long, control characters), which could
    alias "no tenant"."""

    code = "SHIP_SQLA_TENANT_VIOLATION"


class BoundExceededError(ShipError, ValueError):
    """A repository call asked for more rows than the repository's declared bound (R1)."""

    code = "SHIP_SQLA_BOUND_EXCEEDED"


class InvalidCursorError(ShipError, ValueError):
    """A page cursor was tampered with, malformed, or reused on a different query."""

    code = "SHIP_SQLA_INVALID_CURSOR"


class VersionConflictError(ShipError, RuntimeError):
    """An optimistic update named a version the row no longer has."""

    code = "SHIP_SQLA_VERSION_CONFLICT"


class UnknownProjectionError(ShipError, KeyError):
    """A projection was selected by a name the repository does not declare (R4)."""

    code = "SHIP_SQLA_UNKNOWN_PROJECTION"

    def __str__(self) -> str:  # KeyError would repr() the message; keep it readable.
        return Exception.__str__(self)


class RollbackOnlyError(ShipError, RuntimeError):
    """A nested ``uow.run`` that joined this run raised; its partial writes cannot be separated
    from the outer run's, so the whole transaction was rolled back (U5)."""

    code = "SHIP_SQLA_UOW_ROLLBACK_ONLY"


class PermissionDeniedError(ShipError, PermissionError):
    """An operator operation was refused by the application's authorizer."""

    code = "SHIP_SQLA_PERMISSION_DENIED"


class DatabaseUnavailableError(ShipError, ConnectionError):
    """The database could not be reached or its connection was lost: a refused or failed
    connect, a connection closed under the work, or a server shutting down or starting up.

    The driver's error is chained as ``__cause__``. Work that failed with it did not commit,
    unless the message says the COMMIT itself was cut off (then it may or may not have). It is a
    ``ConnectionError`` too, so ``except OSError`` handlers keep catching outages.
    """

    code = "SHIP_SQLA_DATABASE_UNAVAILABLE"


class DatabaseTimeoutError(ShipError, TimeoutError):
    """A store's own database call did not finish within its ``operation_timeout``: the database
    is unreachable, overloaded, or a lock is held for long. Nothing is known about whether the
    call took effect (every settle is fenced, so retrying one is safe)."""

    code = "SHIP_SQLA_DATABASE_TIMEOUT"


class InvalidPayloadError(ShipError, ValueError):
    """A payload did not match its job's declared type, or is not storable JSON (not JSON, or
    holding a NUL character); nothing was enqueued."""

    code = "SHIP_SQLA_JOB_PAYLOAD_INVALID"


class PayloadTooLargeError(InvalidPayloadError):
    """A payload's encoded JSON is longer than its job's ``max_payload_bytes``; nothing was
    enqueued."""

    code = "SHIP_SQLA_JOB_PAYLOAD_TOO_LARGE"
