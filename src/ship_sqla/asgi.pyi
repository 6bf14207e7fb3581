from ship_sqla._idempotency._middleware import IdempotencyKeyMiddleware as IdempotencyKeyMiddleware
from ship_sqla._idempotency._middleware import request_fingerprint as request_fingerprint
from ship_sqla._jobs._demand_app import DemandEndpoint as DemandEndpoint
from ship_sqla._webhooks._receiver import OutboxWriter as OutboxWriter
from ship_sqla._webhooks._receiver import WebhookEndpoint as WebhookEndpoint
from ship_sqla._webhooks._receiver import WebhookReceiver as WebhookReceiver

__all__ = (
    "DemandEndpoint",
    "IdempotencyKeyMiddleware",
    "OutboxWriter",
    "WebhookEndpoint",
    "WebhookReceiver",
    "request_fingerprint",
)
