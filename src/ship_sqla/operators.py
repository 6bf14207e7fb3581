"""The operator surface (SPEC §14): who may operate (``Authorizer``, ``DashboardAuthorizer``)
and the audit log of what they did (S1).
"""

from ship_sqla.kernel._lazy import attach_stub as _attach_stub

__getattr__, __dir__, __all__ = _attach_stub(__name__, __file__)
