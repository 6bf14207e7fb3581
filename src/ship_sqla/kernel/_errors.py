"""Errors with a stable code, a statement of what happened, and the fix.

Every error ship_sqla raises on purpose derives from :class:`ShipError`. The ``code`` is stable
across releases (``SHIP_SQLA_*``) so applications and log pipelines can match on it; the message
says what went wrong and what to do about it.

Each public error belongs to one concern, named by the base it derives from (docs/errors.md
lists them on one page): :class:`ConfigurationError` (fix the setup), :class:`UsageError` (fix
the calling code), :class:`StaleLeaseError` (someone else owns the work now: drop it),
:class:`OutageError` (the database or a dependency failed: retry later), :class:`RefusedError`
(a valid request the current state or a policy turns down) and :class:`JobAttemptError` (how a
job attempt ended, raised by or into its handler). Every error of a concern reports
``ship_sqla.errors``, where the application imports it from, as its module; the errors are
defined beside the code that raises them (the kernel's here, in the kernel).
"""

from __future__ import annotations

from typing import Any, ClassVar

PUBLIC_MODULE = "ship_sqla.errors"


def _restore(cls: type[ShipError], args: tuple[Any, ...]) -> ShipError:
    """Unpickle an error without calling its ``__init__`` (subclasses take other arguments);
    its attributes come back through ``__setstate__``."""
    error = cls.__new__(cls, *args)
    error.args = args
    return error


class ShipError(Exception):
    """Base of every deliberate ship_sqla error: a stable ``code`` and an actionable message
    (``message``, and ``fix`` when there is one)."""

    code: ClassVar[str] = "SHIP_SQLA_ERROR"
    concern: ClassVar[str | None] = None
    """The concern this error belongs to (``"usage"``, ``"outage"``...); None on the bases
    that name no concern."""

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        self.message = message
        self.fix = fix
        text = f"{self.code}: {message}"
        if fix:
            text = f"{text} Fix: {fix}"
        super().__init__(text)

    def __init_subclass__(cls, **kwargs: Any) -> None:  # noqa: ANN401 - passed on unchanged
        super().__init_subclass__(**kwargs)
        # A public error is imported from ship_sqla.errors: tracebacks and pickles name that
        # module, never the private one defining it. An error of no concern keeps its module.
        if cls.concern is not None and cls.__module__.startswith("ship_sqla."):
            cls.__module__ = PUBLIC_MODULE

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), self.args), self.__dict__)


ShipError.__module__ = PUBLIC_MODULE


class ConfigurationError(ShipError, ValueError):
    """A factory, a declaration or the deployment was given something that cannot work: fix the
    setup (raised at startup or declaration, never under load)."""

    code = "SHIP_SQLA_CONFIGURATION"
    concern = "configuration"


class UsageError(ShipError):
    """The calling code used ship_sqla wrongly: a bad value, a closed scope, another tenant's
    row, a cursor of another query. Fix the call; retrying it unchanged fails again."""

    code = "SHIP_SQLA_USAGE"
    concern = "usage"


class StaleLeaseError(ShipError):
    """What this worker held (a run's or a message's lease, a lock's fence, an idempotency
    claim) has moved on to someone else: drop the work, its result is not recorded. Expected
    under contention and after pauses; nothing to fix unless it is frequent."""

    code = "SHIP_SQLA_STALE_LEASE"
    concern = "stale lease"


class OutageError(ShipError):
    """The database or a dependency (a sink, the audit log) failed or did not answer in time.
    Retry later; whether the failed call took effect is said by the subclass."""

    code = "SHIP_SQLA_OUTAGE"
    concern = "outage"


class RefusedError(ShipError):
    """A well-formed request that the current state or a policy turns down: no permission, a
    lock or a record held by someone else, a version that moved on, a signature that does not
    verify."""

    code = "SHIP_SQLA_REFUSED"
    concern = "refused"


class JobAttemptError(ShipError):
    """How a job attempt ended other than by returning: raised by a handler
    (:class:`TerminalError`, :class:`RetryAfter`, :class:`Snooze`) or into it (a timeout, a
    cancel). The runtime turns each into the run's settlement (K4, K5)."""

    code = "SHIP_SQLA_JOB_ATTEMPT"
    concern = "job attempt"


class ScopeClosedError(UsageError, RuntimeError):
    """A transaction scope was used after the ``uow.run`` that opened it had ended (U2)."""

    code = "SHIP_SQLA_SCOPE_CLOSED"


class ScopeConcurrencyError(UsageError, RuntimeError):
    """A transaction scope was used from a task other than the one running its ``uow.run``."""

    code = "SHIP_SQLA_SCOPE_CONCURRENT_USE"


class TenantRequiredError(UsageError, ValueError):
    """A tenant-scoped repository was built for a scope that names no tenant (R2)."""

    code = "SHIP_SQLA_TENANT_REQUIRED"


class TenantViolationError(UsageError, ValueError):
    """A write named a tenant other than the repository's own, or tried to move a row (R2); or
    a tenant that is no tenant at all (empty, blank, too long, control characters), which could
    alias "no tenant"."""

    code = "SHIP_SQLA_TENANT_VIOLATION"


class BoundExceededError(UsageError, ValueError):
    """A repository call asked for more rows than the repository's declared bound (R1)."""

    code = "SHIP_SQLA_BOUND_EXCEEDED"


class InvalidCursorError(UsageError, ValueError):
    """A page cursor was tampered with, malformed, or reused on a different query."""

    code = "SHIP_SQLA_INVALID_CURSOR"


class VersionConflictError(RefusedError, RuntimeError):
    """An optimistic update named a version the row no longer has."""

    code = "SHIP_SQLA_VERSION_CONFLICT"


class UnknownProjectionError(UsageError, KeyError):
    """A projection was selected by a name the repository does not declare (R4)."""

    code = "SHIP_SQLA_UNKNOWN_PROJECTION"

    def __str__(self) -> str:  # KeyError would repr() the message; keep it readable.
        return Exception.__str__(self)


class RollbackOnlyError(UsageError, RuntimeError):
    """A nested ``uow.run`` that joined this run raised; its partial writes cannot be separated
    from the outer run's, so the whole transaction was rolled back (U5)."""

    code = "SHIP_SQLA_UOW_ROLLBACK_ONLY"


class PermissionDeniedError(RefusedError, PermissionError):
    """An operator operation was refused by the application's authorizer."""

    code = "SHIP_SQLA_PERMISSION_DENIED"


class DatabaseUnavailableError(OutageError, ConnectionError):
    """The database could not be reached or its connection was lost: a refused or failed
    connect, a connection closed under the work, or a server shutting down or starting up.

    The driver's error is chained as ``__cause__``. Work that failed with it did not commit,
    unless the message says the COMMIT itself was cut off (then it may or may not have). It is a
    ``ConnectionError`` too, so ``except OSError`` handlers keep catching outages.
    """

    code = "SHIP_SQLA_DATABASE_UNAVAILABLE"


class DatabaseTimeoutError(OutageError, TimeoutError):
    """A store's own database call did not finish within its ``operation_timeout``: the database
    is unreachable, overloaded, or a lock is held for long. Nothing is known about whether the
    call took effect (every settle is fenced, so retrying one is safe)."""

    code = "SHIP_SQLA_DATABASE_TIMEOUT"


class InvalidPayloadError(UsageError, ValueError):
    """A payload did not match its job's declared type, or is not storable JSON (not JSON, or
    holding a NUL character); nothing was enqueued."""

    code = "SHIP_SQLA_JOB_PAYLOAD_INVALID"


class PayloadTooLargeError(InvalidPayloadError):
    """A payload's encoded JSON is longer than its job's ``max_payload_bytes``; nothing was
    enqueued."""

    code = "SHIP_SQLA_JOB_PAYLOAD_TOO_LARGE"
