"""ASGI building blocks: the Standard Webhooks receiver, the Idempotency-Key middleware and the
job demand endpoint (F5, for autoscalers).

Both are plain ASGI (no web framework is a dependency of ship_sqla) and mount in Starlette,
FastAPI or any ASGI server::

    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Route
    from ship_sqla.asgi import IdempotencyKeyMiddleware, WebhookEndpoint, WebhookReceiver

    receiver = WebhookReceiver(
        endpoints=[WebhookEndpoint("stripe", secrets=["whsec_..."])],
        events=webhook_events, idempotency=idempotency, outbox=outbox,
    )
    app = Starlette(
        routes=[Route("/webhooks/{name}", receiver, methods=["POST"]), ...],
        middleware=[Middleware(IdempotencyKeyMiddleware, store=idempotency)],
    )

See ``examples/orders_app.py`` for a complete application.
"""

from ship_sqla.kernel._lazy import attach_stub as _attach_stub

__getattr__, __dir__, __all__ = _attach_stub(__name__, __file__)
