"""Every public ship_sqla exception, importable from here and reporting this module.

One base, :class:`ShipError` (a stable ``code``, ``message`` and ``fix``), and one concern base
per kind of failure: :class:`ConfigurationError`, :class:`UsageError`,
:class:`StaleLeaseError`, :class:`OutageError`, :class:`RefusedError` and
:class:`JobAttemptError`. docs/errors.md lists the hierarchy with each code. Names load on
first use: importing an error of the kernel loads neither SQLAlchemy nor asyncpg.
"""

from ship_sqla.kernel._lazy import attach_stub as _attach_stub

__getattr__, __dir__, __all__ = _attach_stub(__name__, __file__)
