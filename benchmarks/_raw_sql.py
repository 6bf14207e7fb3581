"""The baselines' statements (plain asyncpg, ``$n`` parameters) and the bulk loaders.

Baselines run on tables built by the same ship table factories, so they pay for the same columns
and indexes; they only skip what ship_sqla adds on top (dedupe and depth checks, per-job claim
locks, fencing tokens drawn at random, SQLAlchemy, the runtime). Each claim below walks the same
partial index as ship's (named beside it) with ``FOR UPDATE SKIP LOCKED``.

Table names are the benchmarks' own constants, never input.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["JobSQL", "OutboxSQL", "job_sql", "outbox_sql"]

JOB_COPY_COLUMNS = (
    "id",
    "job_id",
    "state",
    "payload",
    "max_attempts",
    "run_at",
    "created_at",
    "updated_at",
)
"""What the COPY baseline writes; the rest are server defaults, as ship's enqueue leaves them."""


@dataclass(frozen=True, slots=True)
class JobSQL:
    claim: str
    """$1 job_id, $2 worker, $3 limit -> (id, lease_token, payload) of the claimed runs."""
    complete: str
    """$1 ids text[], $2 tokens bigint[]."""
    insert_one: str
    """$1 id, $2 job_id, $3 payload (JSON text)."""
    load_waiting: str
    """$1 job_id, $2 count: waiting runs due over the past hour, in run_at order."""
    refill_waiting: str
    """$1 job_id, $2 count: waiting runs due now (they queue behind the backlog)."""


def job_sql(table: str) -> JobSQL:
    return JobSQL(
        # <table>_due_idx, ordered, SKIP LOCKED; then primary-key probes.
        claim=f"""
            UPDATE {table} r
            SET state = 'running', attempt = r.attempt + 1,
                lease_token = coalesce(r.lease_token, 0) + 1,
                lease_expires_at = now() + interval '30 seconds', claimed_by = $2,
                updated_at = now()
            WHERE r.id = ANY(ARRAY(
                SELECT id FROM {table}
                WHERE job_id = $1 AND state = 'waiting' AND run_at <= now()
                -- The due index's order (job_id, priority, run_at, seq). Every benchmark run has
                -- priority 0, so this is the one-level floor; ship's claim walks the levels (K6).
                ORDER BY priority, run_at, id
                LIMIT $3
                FOR UPDATE SKIP LOCKED))
            RETURNING r.id, r.lease_token, r.payload
        """,
        # <table>_pkey probes, fenced on the token like ship's.
        complete=f"""
            UPDATE {table} r
            SET state = 'completed', finished_at = now(), updated_at = now(),
                lease_expires_at = NULL, claimed_by = NULL
            FROM unnest($1::text[], $2::bigint[]) AS s(id, token)
            WHERE r.id = s.id AND r.lease_token = s.token AND r.state = 'running'
        """,
        insert_one=f"""
            INSERT INTO {table} (id, job_id, state, payload, max_attempts, run_at, created_at,
                                 updated_at)
            VALUES ($1, $2, 'waiting', $3::jsonb, 5, now(), now(), now())
        """,
        load_waiting=f"""
            INSERT INTO {table} (id, job_id, state, payload, max_attempts, run_at, created_at,
                                 updated_at)
            SELECT 'L' || lpad(g::text, 10, '0'), $1, 'waiting', '{{}}'::jsonb, 5,
                   now() - interval '1 hour' + g * interval '1 microsecond', now(), now()
            FROM generate_series(1, $2::integer) AS g
        """,
        refill_waiting=f"""
            INSERT INTO {table} (id, job_id, state, payload, max_attempts, run_at, created_at,
                                 updated_at)
            SELECT gen_random_uuid()::text, $1, 'waiting', '{{}}'::jsonb, 5, now(), now(), now()
            FROM generate_series(1, $2::integer) AS g
        """,
    )


@dataclass(frozen=True, slots=True)
class OutboxSQL:
    claim: str
    """$1 outbox_id, $2 worker, $3 batch size -> (id, lease_token, topic, payload)."""
    complete: str
    """$1 ids uuid[], $2 tokens uuid[]."""
    load_pending: str
    """$1 outbox_id, $2 count: pending messages available over the past hour."""
    refill_pending: str
    """$1 outbox_id, $2 count: pending messages available now."""


def outbox_sql(table: str) -> OutboxSQL:
    return OutboxSQL(
        # <table>_pending_idx, ordered, SKIP LOCKED; then primary-key probes.
        claim=f"""
            UPDATE {table} o
            SET state = 'claimed', attempts = o.attempts + 1, lease_token = gen_random_uuid(),
                claimed_by = $2, lease_expires_at = now() + interval '30 seconds'
            WHERE o.id = ANY(ARRAY(
                SELECT id FROM {table}
                WHERE outbox_id = $1 AND state = 'pending' AND available_at <= now()
                ORDER BY available_at, created_at
                LIMIT $3
                FOR UPDATE SKIP LOCKED))
            RETURNING o.id, o.lease_token, o.topic, o.payload
        """,
        complete=f"""
            UPDATE {table} o
            SET state = 'delivered', delivered_at = now(), lease_expires_at = NULL,
                lease_token = NULL
            FROM unnest($1::uuid[], $2::uuid[]) AS h(id, token)
            WHERE o.id = h.id AND o.lease_token = h.token AND o.state = 'claimed'
        """,
        load_pending=f"""
            INSERT INTO {table} (outbox_id, topic, payload, state, attempts, max_attempts,
                                 available_at, created_at)
            SELECT $1, 'bench', '{{}}'::jsonb, 'pending', 0, 10,
                   now() - interval '1 hour' + g * interval '1 microsecond',
                   now() - interval '1 hour' + g * interval '1 microsecond'
            FROM generate_series(1, $2::integer) AS g
        """,
        refill_pending=f"""
            INSERT INTO {table} (outbox_id, topic, payload, state, attempts, max_attempts,
                                 available_at, created_at)
            SELECT $1, 'bench', '{{}}'::jsonb, 'pending', 0, 10, now(), now()
            FROM generate_series(1, $2::integer) AS g
        """,
    )
