"""ORM-free contracts of ship_sqla: errors, the clock, job definitions, backend Protocols, the
job runtime and in-memory reference backends.

This package imports neither SQLAlchemy nor asyncpg (a test proves it), so applications can
depend on the contracts alone and unit-test against the in-memory backends.
"""

from ship_sqla.kernel._clock import Clock as Clock
from ship_sqla.kernel._clock import FrozenClock as FrozenClock
from ship_sqla.kernel._clock import SystemClock as SystemClock
from ship_sqla.kernel._errors import BoundExceededError as BoundExceededError
from ship_sqla.kernel._errors import ConfigurationError as ConfigurationError
from ship_sqla.kernel._errors import InvalidCursorError as InvalidCursorError
from ship_sqla.kernel._errors import NotYetImplementedError as NotYetImplementedError
from ship_sqla.kernel._errors import PermissionDeniedError as PermissionDeniedError
from ship_sqla.kernel._errors import ScopeClosedError as ScopeClosedError
from ship_sqla.kernel._errors import ScopeConcurrencyError as ScopeConcurrencyError
from ship_sqla.kernel._errors import ShipError as ShipError
from ship_sqla.kernel._errors import TenantRequiredError as TenantRequiredError
from ship_sqla.kernel._errors import TenantViolationError as TenantViolationError
from ship_sqla.kernel._errors import UnknownProjectionError as UnknownProjectionError
from ship_sqla.kernel._errors import VersionConflictError as VersionConflictError

__all__ = (
    "BoundExceededError",
    "Clock",
    "ConfigurationError",
    "FrozenClock",
    "InvalidCursorError",
    "NotYetImplementedError",
    "PermissionDeniedError",
    "ScopeClosedError",
    "ScopeConcurrencyError",
    "ShipError",
    "SystemClock",
    "TenantRequiredError",
    "TenantViolationError",
    "UnknownProjectionError",
    "VersionConflictError",
)
