"""Webhooks (SPEC section 6): the events table and store, Standard Webhooks signatures."""

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
    "VerifiedWebhook",
    "WebhookCleanupResult",
    "WebhookEvent",
    "WebhookEventInProgressError",
    "WebhookEventNotFoundError",
    "WebhookEventStore",
    "WebhookHeaderError",
    "WebhookRecordResult",
    "WebhookSignatureError",
    "WebhookTimestampError",
    "WebhookVerificationError",
    "create_webhook_event_store",
    "parse_webhook_secret",
    "ship_webhook_events_table",
    "sign_webhook",
    "verify_webhook",
    "webhook_headers",
    "webhook_idempotency_prefix",
]
