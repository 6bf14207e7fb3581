"""Consumers (SPEC §15, C1-C3): an external stream (a broker partition, a vendor's cursor, a
table) read per key, each batch and the cursor past it committed in one fenced transaction.
Start from ``define_consumer``; register ``consumer.jobs``; the errors are in
:mod:`ship_sqla.errors`.
"""

from ship_sqla.kernel._lazy import attach_stub as _attach_stub

__getattr__, __dir__, __all__ = _attach_stub(__name__, __file__)
