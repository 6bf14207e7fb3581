"""Inbound webhooks: the Standard Webhooks signature helpers and the webhook event store (from
``ship_sqla.create_webhook_event_store``); the ASGI receiver is in :mod:`ship_sqla.asgi`.
"""

from ship_sqla.kernel._lazy import attach_stub as _attach_stub

__getattr__, __dir__, __all__ = _attach_stub(__name__, __file__)
