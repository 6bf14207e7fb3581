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

from ship_sqla._idempotency._middleware import IdempotencyKeyMiddleware, request_fingerprint
from ship_sqla._jobs._demand_app import DemandEndpoint
from ship_sqla._webhooks._receiver import OutboxWriter, WebhookEndpoint, WebhookReceiver

__all__ = [
    "DemandEndpoint",
    "IdempotencyKeyMiddleware",
    "OutboxWriter",
    "WebhookEndpoint",
    "WebhookReceiver",
    "request_fingerprint",
]
