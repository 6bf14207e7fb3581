from ship_sqla._webhooks import VerifiedWebhook as VerifiedWebhook
from ship_sqla._webhooks import WebhookCleanupResult as WebhookCleanupResult
from ship_sqla._webhooks import WebhookEvent as WebhookEvent
from ship_sqla._webhooks import WebhookEventStore as WebhookEventStore
from ship_sqla._webhooks import WebhookRecordResult as WebhookRecordResult
from ship_sqla._webhooks import parse_webhook_secret as parse_webhook_secret
from ship_sqla._webhooks import sign_webhook as sign_webhook
from ship_sqla._webhooks import verify_webhook as verify_webhook
from ship_sqla._webhooks import webhook_headers as webhook_headers
from ship_sqla._webhooks import webhook_idempotency_prefix as webhook_idempotency_prefix

__all__ = (
    "VerifiedWebhook",
    "WebhookCleanupResult",
    "WebhookEvent",
    "WebhookEventStore",
    "WebhookRecordResult",
    "parse_webhook_secret",
    "sign_webhook",
    "verify_webhook",
    "webhook_headers",
    "webhook_idempotency_prefix",
)
