"""The idempotency store (from ``ship_sqla.create_idempotency_store``) and its outcomes; the
ASGI middleware is :class:`ship_sqla.asgi.IdempotencyKeyMiddleware`.
"""

from ship_sqla.kernel._lazy import attach_stub as _attach_stub

__getattr__, __dir__, __all__ = _attach_stub(__name__, __file__)
