"""The outbound webhooks' statements (SPEC §16). ``{endpoints}`` and ``{deliveries}`` are the
tables' quoted, qualified names; each is a :class:`~ship_sqla._sql.Template` rendered once per
store by its :class:`~ship_sqla._sql.Statements`. Every endpoint statement reads by
``<endpoints>_pkey`` but SUBSCRIBED_ENDPOINTS (the whole small table, filtered); every delivery
statement by ``<deliveries>_pkey``, but RESUME_PAUSED and LIST_DELIVERIES of an endpoint
(``<deliveries>_endpoint_idx``).
"""

from __future__ import annotations

from typing import Final

from ship_sqla._sql import Template

__all__ = [
    "ADD_ENDPOINT",
    "APPEND_ATTEMPT",
    "ENDPOINT_FOR_UPDATE",
    "END_ATTEMPT",
    "GET_DELIVERY",
    "GET_ENDPOINT",
    "GET_FOR_SEND",
    "INSERT_DELIVERY",
    "LIST_DELIVERIES",
    "LIST_ENDPOINTS",
    "RECORD_OUTCOME",
    "RESUME_PAUSED",
    "SET_DELIVERY_STATE",
    "SET_ENDPOINT_SECRETS",
    "SET_ENDPOINT_STATE",
    "SUBSCRIBED_ENDPOINTS",
]

ADD_ENDPOINT: Final = Template(
    """
INSERT INTO {endpoints} (id, tenant, url, topics, secrets, state, consecutive_failures,
                          created_at, updated_at)
VALUES (:id, CAST(:tenant AS text), :url, CAST(:topics AS text[]), CAST(:secrets AS jsonb),
        'enabled', 0, {now}, {now})
ON CONFLICT (id) DO NOTHING
RETURNING id, tenant, url, topics, secrets, state, disabled_reason, consecutive_failures,
        created_at, updated_at
""",
    compacted=False,
)
"""A new endpoint, enabled (an existing id: nothing, the caller reads it back)."""

GET_ENDPOINT: Final = Template(
    """
SELECT id, tenant, url, topics, secrets, state, disabled_reason, consecutive_failures,
       created_at, updated_at
FROM {endpoints} WHERE id = :id
""",
    compacted=False,
)

ENDPOINT_FOR_UPDATE: Final = Template(
    """
SELECT id, tenant, url, topics, secrets, state, disabled_reason, consecutive_failures,
       created_at, updated_at
FROM {endpoints} WHERE id = :id FOR UPDATE
""",
    compacted=False,
)
"""A rotation's read: the row locked until its secrets are written."""

LIST_ENDPOINTS: Final = Template(
    """
SELECT id, tenant, url, topics, secrets, state, disabled_reason, consecutive_failures,
       created_at, updated_at
FROM {endpoints} ORDER BY id LIMIT :limit
""",
    compacted=False,
)

SUBSCRIBED_ENDPOINTS: Final = Template(
    """
SELECT id, tenant, url, topics, secrets, state, disabled_reason, consecutive_failures,
        created_at, updated_at FROM {endpoints}
WHERE state = 'enabled'
  AND tenant IS NOT DISTINCT FROM CAST(:tenant AS text)
  AND topics && ARRAY[CAST(:topic AS text), '*']
ORDER BY id
""",
    compacted=False,
)
"""W1: the endpoints a topic's event goes to (a small table, read whole)."""

SET_ENDPOINT_STATE: Final = Template(
    """
UPDATE {endpoints}
SET state = :state,
    disabled_reason = CASE WHEN :state = 'enabled' THEN NULL ELSE CAST(:reason AS text) END,
    consecutive_failures = CASE WHEN :state = 'enabled' THEN 0 ELSE consecutive_failures END,
    updated_at = {now}
WHERE id = :id
RETURNING id, tenant, url, topics, secrets, state, disabled_reason, consecutive_failures,
        created_at, updated_at
""",
    compacted=False,
)
"""W4: enable (the streak back to 0) or disable with a reason."""

SET_ENDPOINT_SECRETS: Final = Template(
    """
UPDATE {endpoints} SET secrets = CAST(:secrets AS jsonb), updated_at = {now}
WHERE id = :id
RETURNING id, tenant, url, topics, secrets, state, disabled_reason, consecutive_failures,
        created_at, updated_at
""",
    compacted=False,
)

RECORD_OUTCOME: Final = Template(
    """
UPDATE {endpoints}
SET consecutive_failures = CASE WHEN :delivered THEN 0 ELSE consecutive_failures + 1 END,
    state = CASE WHEN NOT :delivered AND consecutive_failures + 1 >= :disable_after
                 THEN 'disabled' ELSE state END,
    disabled_reason = CASE
        WHEN NOT :delivered AND state = 'enabled' AND consecutive_failures + 1 >= :disable_after
        THEN (consecutive_failures + 1)::text || ' consecutive failed deliveries'
        ELSE disabled_reason END,
    updated_at = {now}
WHERE id = :id
RETURNING id, tenant, url, topics, secrets, state, disabled_reason, consecutive_failures,
        created_at, updated_at
""",
    compacted=False,
)
"""W4: a delivered delivery resets the streak; a failed one extends it, and disables the
endpoint when it reaches ``:disable_after`` (one statement: concurrent deliveries count
exactly)."""

INSERT_DELIVERY: Final = Template(
    """
INSERT INTO {deliveries} (id, endpoint_id, tenant, topic, payload, state, attempts,
                          created_at, updated_at)
VALUES (:id, :endpoint_id, CAST(:tenant AS text), :topic, CAST(:payload AS jsonb), 'pending',
        '[]'::jsonb, {now}, {now})
""",
    compacted=False,
)
"""W1: one delivery, in the caller's unit of work."""

GET_DELIVERY: Final = Template(
    """
SELECT id, endpoint_id, tenant, topic, payload, state, attempts, created_at, updated_at
FROM {deliveries} WHERE id = :id
""",
    compacted=False,
)

LIST_DELIVERIES: Final = Template(
    """
SELECT id, endpoint_id, tenant, topic, payload, state, attempts, created_at, updated_at
FROM {deliveries}
WHERE (CAST(:endpoint_id AS text) IS NULL OR endpoint_id = :endpoint_id)
  AND (CAST(:state AS text) IS NULL OR state = :state)
ORDER BY id DESC
LIMIT :limit
""",
    compacted=False,
)
"""Newest first (delivery ids are UUIDv7: time ordered)."""

APPEND_ATTEMPT: Final = Template(
    """
UPDATE {deliveries}
SET attempts = attempts || jsonb_build_array(CAST(:attempt AS jsonb)),
    state = :state,
    updated_at = {now}
WHERE id = :id
RETURNING id, endpoint_id, tenant, topic, payload, state, attempts, created_at, updated_at
""",
    compacted=False,
)
"""W3: one attempt recorded, and what it made of the delivery, before the next is planned."""

SET_DELIVERY_STATE: Final = Template(
    """
UPDATE {deliveries} SET state = :state, updated_at = {now}
WHERE id = :id
RETURNING id, endpoint_id, tenant, topic, payload, state, attempts, created_at, updated_at
""",
    compacted=False,
)

RESUME_PAUSED: Final = Template(
    """
UPDATE {deliveries} SET state = 'pending', updated_at = {now}
WHERE endpoint_id = :endpoint_id AND state = 'paused'
RETURNING id
""",
    compacted=False,
)
"""W4: an enabled endpoint's waiting deliveries, pending again (served by
``<deliveries>_endpoint_idx``)."""

GET_FOR_SEND: Final = Template(
    """
SELECT d.id, d.endpoint_id, d.tenant, d.topic, d.payload, d.state, d.attempts, d.created_at,
       d.updated_at,
       e.id AS e_id, e.tenant AS e_tenant, e.url AS e_url, e.topics AS e_topics,
       e.secrets AS e_secrets, e.state AS e_state, e.disabled_reason AS e_disabled_reason,
       e.consecutive_failures AS e_consecutive_failures, e.created_at AS e_created_at,
       e.updated_at AS e_updated_at
FROM {deliveries} AS d
LEFT JOIN {endpoints} AS e ON e.id = d.endpoint_id
WHERE d.id = :id
""",
    compacted=False,
)
"""An attempt's one read: the delivery and its endpoint (both by primary key)."""

END_ATTEMPT: Final = Template(
    """
WITH d AS (
    UPDATE {deliveries}
    SET attempts = attempts || jsonb_build_array(CAST(:attempt AS jsonb)),
        state = :state,
        updated_at = {now}
    WHERE id = :id
    RETURNING endpoint_id
), e AS (
    UPDATE {endpoints} AS e
    SET consecutive_failures = CASE WHEN CAST(:delivered AS boolean) THEN 0
                                    ELSE e.consecutive_failures + 1 END,
        state = CASE WHEN NOT CAST(:delivered AS boolean)
                          AND e.consecutive_failures + 1 >= :disable_after
                     THEN 'disabled' ELSE e.state END,
        disabled_reason = CASE
            WHEN NOT CAST(:delivered AS boolean) AND e.state = 'enabled'
                 AND e.consecutive_failures + 1 >= :disable_after
            THEN (e.consecutive_failures + 1)::text || ' consecutive failed deliveries'
            ELSE e.disabled_reason END,
        updated_at = {now}
    FROM d
    WHERE CAST(:ended AS boolean) AND e.id = d.endpoint_id
    RETURNING e.id
)
SELECT (SELECT count(*) FROM d) AS deliveries, (SELECT count(*) FROM e) AS endpoints
""",
    compacted=False,
)
"""An attempt's one write (W3, W4): the attempt appended with the delivery's new state and,
when that ends the delivery (``:ended``), the endpoint's streak moved as RECORD_OUTCOME does
(both by primary key)."""
