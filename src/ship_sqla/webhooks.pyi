from ship_sqla._webhooks import DEFAULT_WEBHOOK_RETRY as DEFAULT_WEBHOOK_RETRY
from ship_sqla._webhooks import PostgresWebhookDeliveryStore as PostgresWebhookDeliveryStore
from ship_sqla._webhooks import VerifiedWebhook as VerifiedWebhook
from ship_sqla._webhooks import WebhookCleanupResult as WebhookCleanupResult
from ship_sqla._webhooks import WebhookEvent as WebhookEvent
from ship_sqla._webhooks import WebhookEventStore as WebhookEventStore
from ship_sqla._webhooks import WebhookOperations as WebhookOperations
from ship_sqla._webhooks import WebhookRecordResult as WebhookRecordResult
from ship_sqla._webhooks import WebhookSender as WebhookSender
from ship_sqla._webhooks import create_webhook_delivery_store as create_webhook_delivery_store
from ship_sqla._webhooks import create_webhook_operations as create_webhook_operations
from ship_sqla._webhooks import create_webhook_sender as create_webhook_sender
from ship_sqla._webhooks import new_webhook_secret as new_webhook_secret
from ship_sqla._webhooks import parse_webhook_secret as parse_webhook_secret
from ship_sqla._webhooks import ship_webhook_deliveries_table as ship_webhook_deliveries_table
from ship_sqla._webhooks import ship_webhook_endpoints_table as ship_webhook_endpoints_table
from ship_sqla._webhooks import sign_webhook as sign_webhook
from ship_sqla._webhooks import system_resolver as system_resolver
from ship_sqla._webhooks import verify_webhook as verify_webhook
from ship_sqla._webhooks import webhook_headers as webhook_headers
from ship_sqla._webhooks import webhook_idempotency_prefix as webhook_idempotency_prefix

__all__ = (
    "DEFAULT_WEBHOOK_RETRY",
    "PostgresWebhookDeliveryStore",
    "VerifiedWebhook",
    "WebhookCleanupResult",
    "WebhookEvent",
    "WebhookEventStore",
    "WebhookOperations",
    "WebhookRecordResult",
    "WebhookSender",
    "create_webhook_delivery_store",
    "create_webhook_operations",
    "create_webhook_sender",
    "new_webhook_secret",
    "parse_webhook_secret",
    "ship_webhook_deliveries_table",
    "ship_webhook_endpoints_table",
    "sign_webhook",
    "system_resolver",
    "verify_webhook",
    "webhook_headers",
    "webhook_idempotency_prefix",
)
