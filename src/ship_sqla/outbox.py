"""The transactional outbox: ``Outbox`` (from ``ship_sqla.create_outbox``), the relay and its
sinks, the operator gate, and the values they take and return.
"""

from ship_sqla.kernel._lazy import attach_stub as _attach_stub

__getattr__, __dir__, __all__ = _attach_stub(__name__, __file__)
