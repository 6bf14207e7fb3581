"""The database schema of ship tables: the check against a live database, the DDL, and the
row-level security policy of a tenant-scoped table.
"""

from ship_sqla.kernel._lazy import attach_stub as _attach_stub

__getattr__, __dir__, __all__ = _attach_stub(__name__, __file__)
