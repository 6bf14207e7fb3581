"""ORM-free contracts for backend authors: the ports a job, lock, worker-registry or workflow
backend implements (``RunStore``, ``ScheduleStore``, ``RunAdmin``, ``LockProvider``...), the
values they exchange (``ClaimRequest``, ``ClaimedRun``, the settlements ``Complete``,
``Fail``...), the clock, and the in-memory reference backends.

This package imports neither SQLAlchemy nor asyncpg (a test proves it). Applications import
from :mod:`ship_sqla` and its concern modules; the names are listed once, in
``__init__.pyi`` (see ``_lazy.py``).
"""

from ship_sqla.kernel._lazy import attach_stub as _attach_stub

__getattr__, __dir__, __all__ = _attach_stub(__name__, __file__)
