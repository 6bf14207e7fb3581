"""Webhooks (SPEC sections 6 and 16): the received events table and store, Standard Webhooks
signatures, and the outbound sender with its endpoints and deliveries."""

from ship_sqla._webhooks._operations import WebhookOperations as WebhookOperations
from ship_sqla._webhooks._operations import (
    create_webhook_operations as create_webhook_operations,
)
from ship_sqla._webhooks._out_store import (
    PostgresWebhookDeliveryStore as PostgresWebhookDeliveryStore,
)
from ship_sqla._webhooks._out_store import (
    create_webhook_delivery_store as create_webhook_delivery_store,
)
from ship_sqla._webhooks._out_tables import (
    ship_webhook_deliveries_table as ship_webhook_deliveries_table,
)
from ship_sqla._webhooks._out_tables import (
    ship_webhook_endpoints_table as ship_webhook_endpoints_table,
)
from ship_sqla._webhooks._sender import DEFAULT_WEBHOOK_RETRY as DEFAULT_WEBHOOK_RETRY
from ship_sqla._webhooks._sender import WebhookDeliveryFailedError as WebhookDeliveryFailedError
from ship_sqla._webhooks._sender import WebhookSender as WebhookSender
from ship_sqla._webhooks._sender import create_webhook_sender as create_webhook_sender
from ship_sqla._webhooks._sender import new_webhook_secret as new_webhook_secret
from ship_sqla._webhooks._sender import system_resolver as system_resolver
from ship_sqla._webhooks._signature import VerifiedWebhook as VerifiedWebhook
from ship_sqla._webhooks._signature import WebhookHeaderError as WebhookHeaderError
from ship_sqla._webhooks._signature import WebhookSignatureError as WebhookSignatureError
from ship_sqla._webhooks._signature import WebhookTimestampError as WebhookTimestampError
from ship_sqla._webhooks._signature import WebhookVerificationError as WebhookVerificationError
from ship_sqla._webhooks._signature import parse_webhook_secret as parse_webhook_secret
from ship_sqla._webhooks._signature import sign_webhook as sign_webhook
from ship_sqla._webhooks._signature import verify_webhook as verify_webhook
from ship_sqla._webhooks._signature import webhook_headers as webhook_headers
from ship_sqla._webhooks._store import WebhookEventStore as WebhookEventStore
from ship_sqla._webhooks._store import create_webhook_event_store as create_webhook_event_store
from ship_sqla._webhooks._store import webhook_idempotency_prefix as webhook_idempotency_prefix
from ship_sqla._webhooks._tables import ship_webhook_events_table as ship_webhook_events_table
from ship_sqla._webhooks._types import WebhookCleanupResult as WebhookCleanupResult
from ship_sqla._webhooks._types import WebhookEvent as WebhookEvent
from ship_sqla._webhooks._types import WebhookEventInProgressError as WebhookEventInProgressError
from ship_sqla._webhooks._types import WebhookEventNotFoundError as WebhookEventNotFoundError
from ship_sqla._webhooks._types import WebhookRecordResult as WebhookRecordResult

__all__ = [
    "DEFAULT_WEBHOOK_RETRY",
    "PostgresWebhookDeliveryStore",
    "VerifiedWebhook",
    "WebhookCleanupResult",
    "WebhookDeliveryFailedError",
    "WebhookEvent",
    "WebhookEventInProgressError",
    "WebhookEventNotFoundError",
    "WebhookEventStore",
    "WebhookHeaderError",
    "WebhookOperations",
    "WebhookRecordResult",
    "WebhookSender",
    "WebhookSignatureError",
    "WebhookTimestampError",
    "WebhookVerificationError",
    "create_webhook_delivery_store",
    "create_webhook_event_store",
    "create_webhook_operations",
    "create_webhook_sender",
    "new_webhook_secret",
    "parse_webhook_secret",
    "ship_webhook_deliveries_table",
    "ship_webhook_endpoints_table",
    "ship_webhook_events_table",
    "sign_webhook",
    "system_resolver",
    "verify_webhook",
    "webhook_headers",
    "webhook_idempotency_prefix",
]
