"""Advisory locks (from ``ship_sqla.advisory_lock_provider``) and fenced locks (F4) over any
lock provider.
"""

from ship_sqla.kernel._lazy import attach_stub as _attach_stub

__getattr__, __dir__, __all__ = _attach_stub(__name__, __file__)
