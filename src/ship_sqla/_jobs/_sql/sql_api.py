"""The SQL enqueue API's text (SPEC §18, E1-E8): the job definitions' upsert and the DDL of the
versioned functions ``<runs>_enqueue_v1``, ``<runs>_enqueue_many_v1`` and
``<runs>_enqueue_versions`` that callers in any language (and triggers) call.

The functions store exactly the run ``enqueue`` stores (:mod:`ship_sqla._jobs._sql.enqueue`:
the same columns, the same J1 probes by ``<runs>_pkey`` then ``<runs>_dedupe_idx``, the same J2
gate row ``<job_id>#enqueue-gate`` of the state table and bounded depth count on
``<runs>_due_idx``), with the defaults of the job's row in the definitions table (E8). Their
text is rendered per table set by :func:`ship_sqla._jobs._sql_api.sql_enqueue_ddl`; the
placeholders are ``{fn}_<suffix>`` (a function's quoted, qualified name), ``{fn_plain}``
(the runs table's bare name, inside a literal), ``{runs}``, ``{state}``, ``{defs}``,
``{result}`` (the result type), ``{channel}`` (the wake channel, a literal), ``{security}``
and the K8 rule's constants.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ANNOUNCE",
    "ENQUEUE_MANY_V1",
    "ENQUEUE_V1",
    "ENQUEUE_VERSIONS",
    "ERROR",
    "HISTORY_PROBE",
    "JSON_SIZE",
    "NEW_RUN_ID",
    "RESULT_TYPE",
    "UPSERT_DEFINITIONS",
]

UPSERT_DEFINITIONS: Final = """
-- <defs>_pkey (the ON CONFLICT arbiter): one row per job, rewritten only when it changed.
INSERT INTO {defs} AS d (
    job_id, max_attempts, priority, max_payload_bytes, queue_depth_limit, dedupe_required,
    key_required, partition_by_key, partition_key_derived, handler_version,
    completed_retention, dead_retention, cancelled_retention, updated_at
)
SELECT t.job_id, t.max_attempts, t.priority, t.max_payload_bytes, t.queue_depth_limit,
    t.dedupe_required, t.key_required, t.partition_by_key, t.partition_key_derived,
    t.handler_version, t.completed_s * interval '1 second', t.dead_s * interval '1 second',
    t.cancelled_s * interval '1 second', now()
FROM unnest(
    CAST(:job_ids AS text[]), CAST(:max_attempts AS integer[]), CAST(:priorities AS integer[]),
    CAST(:max_payload_bytes AS integer[]), CAST(:queue_depth_limits AS integer[]),
    CAST(:dedupe_required AS boolean[]), CAST(:key_required AS boolean[]),
    CAST(:partition_by_key AS boolean[]), CAST(:partition_key_derived AS boolean[]),
    CAST(:handler_versions AS integer[]), CAST(:completed_s AS float8[]),
    CAST(:dead_s AS float8[]), CAST(:cancelled_s AS float8[])
) AS t(job_id, max_attempts, priority, max_payload_bytes, queue_depth_limit, dedupe_required,
    key_required, partition_by_key, partition_key_derived, handler_version, completed_s, dead_s,
    cancelled_s)
ON CONFLICT (job_id) DO UPDATE SET
    max_attempts = EXCLUDED.max_attempts, priority = EXCLUDED.priority,
    max_payload_bytes = EXCLUDED.max_payload_bytes,
    queue_depth_limit = EXCLUDED.queue_depth_limit,
    dedupe_required = EXCLUDED.dedupe_required, key_required = EXCLUDED.key_required,
    partition_by_key = EXCLUDED.partition_by_key,
    partition_key_derived = EXCLUDED.partition_key_derived,
    handler_version = EXCLUDED.handler_version,
    completed_retention = EXCLUDED.completed_retention,
    dead_retention = EXCLUDED.dead_retention, cancelled_retention = EXCLUDED.cancelled_retention,
    updated_at = EXCLUDED.updated_at
WHERE (d.max_attempts, d.priority, d.max_payload_bytes, d.queue_depth_limit, d.dedupe_required,
       d.key_required, d.partition_by_key, d.partition_key_derived, d.handler_version,
       d.completed_retention, d.dead_retention, d.cancelled_retention)
    IS DISTINCT FROM
      (EXCLUDED.max_attempts, EXCLUDED.priority, EXCLUDED.max_payload_bytes,
       EXCLUDED.queue_depth_limit, EXCLUDED.dedupe_required, EXCLUDED.key_required,
       EXCLUDED.partition_by_key, EXCLUDED.partition_key_derived, EXCLUDED.handler_version,
       EXCLUDED.completed_retention, EXCLUDED.dead_retention, EXCLUDED.cancelled_retention)
"""
"""E8 (DDL-like text rendered per table set, not a registry Template: its table is not one of
:class:`~ship_sqla._jobs._sql.JobStatements`'): upsert the definitions of the jobs a worker
runs (at its start) or that ``ship-sqla jobs
sync-definitions`` names: parallel arrays, one entry per job."""

RESULT_TYPE: Final = """
DO $ship$ BEGIN
    IF to_regtype('{result_literal}') IS NULL THEN
        CREATE TYPE {result} AS (run_id text, outcome text);
    END IF;
END $ship$
"""
"""E1/E5: the result row of every ``_v1`` function, ``(run_id, outcome)``: created once, never
altered within a major release (a ``_v2`` with other columns gets a type of its own)."""

ERROR: Final = "RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = "
"""E4: every refusal is SQLSTATE 22023 (invalid_parameter_value), its message starting with the
SHIP_SQLA_* code the Python front raises for the same input, its HINT the fix."""

ANNOUNCE: Final = """
CREATE OR REPLACE FUNCTION {fn}_announce(a_job text, a_seq bigint) RETURNS void
LANGUAGE plpgsql VOLATILE {security}
AS $ship$
-- E3/K1: announce due runs in the caller's transaction, by K8's budget for the table's SQL
-- enqueuers (one sender): at most one announcement per gap; the gap widens with the table's
-- enqueue rate (read off its seq, as AnnouncePlan does). The announce row is locked only by
-- the announcer (SKIP LOCKED: nobody waits on it).
DECLARE
    ann record;
    elapsed float8;
    rate float8;
    gap float8;
BEGIN
    SELECT s.updated_at, s.claim_granted INTO ann FROM {state} s
    WHERE s.job_id = '{announce_row}';
    elapsed := CASE WHEN ann.updated_at IS NULL THEN 'infinity'::float8
                    ELSE extract(epoch FROM clock_timestamp() - ann.updated_at) END;
    rate := CASE WHEN ann.claim_granted IS NULL OR elapsed <= 0 OR elapsed = 'infinity'
                 THEN 0 ELSE (a_seq - ann.claim_granted) / elapsed END;
    -- AnnouncePlan.gap for one sender: 1 / (NOTIFY_BUDGET x min(1, BUDGET_KNEE / rate)).
    gap := least(greatest(greatest(rate, {knee}) / ({budget} * {knee}), {min_gap}), {max_gap});
    IF elapsed >= gap THEN
        PERFORM 1 FROM {state} s WHERE s.job_id = '{announce_row}'
            AND s.updated_at IS NOT DISTINCT FROM ann.updated_at FOR UPDATE SKIP LOCKED;
        IF FOUND OR ann.updated_at IS NULL THEN
            INSERT INTO {state} AS s (job_id, updated_at, claim_granted)
            VALUES ('{announce_row}', clock_timestamp(), a_seq)
            ON CONFLICT (job_id) DO UPDATE
            SET updated_at = EXCLUDED.updated_at, claim_granted = EXCLUDED.claim_granted;
            PERFORM pg_notify('{channel}', 'sql/' || a_job);
        END IF;
    END IF;
END
$ship$
"""
"""E3, K1, K8: the SQL enqueuers' announce rule, written once (the single call and the bulk's
set path call it)."""

ENQUEUE_V1: Final = """
CREATE OR REPLACE FUNCTION {fn}_enqueue_v1(
    job_id text,
    payload jsonb,
    run_at timestamptz DEFAULT NULL,
    priority integer DEFAULT NULL,
    dedupe_key text DEFAULT NULL,
    run_id text DEFAULT NULL,
    tenant text DEFAULT NULL,
    key text DEFAULT NULL,
    trace_context jsonb DEFAULT NULL,
    options jsonb DEFAULT NULL
) RETURNS {result}
LANGUAGE plpgsql VOLATILE {security}
AS $ship$
#variable_conflict use_column
DECLARE
    d record;
    a_job text := job_id;
    a_id text := run_id;
    a_dedupe text := dedupe_key;
    a_key text := key;
    a_tenant text := tenant;
    a_trace jsonb := trace_context;
    a_part text;
    a_priority integer := priority;
    a_run_at timestamptz := coalesce(run_at, now());
    a_payload jsonb := payload;
    durable boolean := run_id IS NOT NULL;
    found_id text;
    depth integer;
    new_seq bigint;
    size bigint;
    pass integer;
    result {result};
BEGIN
    -- E4: unknown option keys are refused (new optional inputs arrive here, E5).
    IF options IS NOT NULL AND (jsonb_typeof(options) <> 'object' OR EXISTS (
        SELECT 1 FROM jsonb_object_keys(options) k WHERE k NOT IN ('partition_key'))) THEN
        {error}'SHIP_SQLA_CONFIGURATION: options '
            || options::text || ' holds an unknown option (known: partition_key)',
            HINT = 'Fix: pass options as a JSON object with only known keys, or NULL.';
    END IF;
    -- E8: the job's definitions row (<defs>_pkey).
    SELECT * INTO d FROM {defs} x WHERE x.job_id = a_job;
    IF NOT FOUND THEN
        {error}'SHIP_SQLA_JOB_UNKNOWN: no job '
            || coalesce(quote_literal(a_job), 'NULL') || ' in {defs_literal}',
            HINT = 'Fix: start a worker that runs the job, or run '
                || '"ship-sqla jobs sync-definitions", then call again.';
    END IF;
    IF a_id IS NOT NULL AND (a_id = '' OR length(a_id) > 255) THEN
        {error}'SHIP_SQLA_KEY_INVALID: run_id must be non-empty '
            || 'text of at most 255 characters',
            HINT = 'Fix: pass a shorter run_id, or NULL for a generated one.';
    END IF;
    -- The checks run in prepare_runs' order, so the first error is Python's.
    IF payload IS NULL THEN
        {error}'SHIP_SQLA_JOB_PAYLOAD_INVALID: job '
            || quote_literal(a_job) || ': the payload is NULL',
            HINT = 'Fix: pass a JSON payload (''{}''::jsonb for none).';
    END IF;
    -- K6 payload bound: the compact ASCII JSON size, as Python measures it.
    size := octet_length(payload::text);
    IF size * 12 > d.max_payload_bytes THEN
        size := {fn}_json_size(payload);
    END IF;
    IF size > d.max_payload_bytes THEN
        {error}'SHIP_SQLA_JOB_PAYLOAD_TOO_LARGE: job '
            || quote_literal(a_job) || ': the payload is ' || size
            || ' bytes of encoded JSON, more than the job''s max_payload_bytes ('
            || d.max_payload_bytes || ')',
            HINT = 'Fix: store large data elsewhere and enqueue a reference to it, or raise '
                || 'define_job(..., max_payload_bytes=...).';
    END IF;
    IF a_dedupe IS NOT NULL AND (a_dedupe = '' OR length(a_dedupe) > 255) THEN
        {error}'SHIP_SQLA_KEY_INVALID: dedupe_key must be '
            || 'non-empty text of at most 255 characters',
            HINT = 'Fix: pass a shorter dedupe_key (a hash of a long one), or NULL.';
    END IF;
    IF a_dedupe IS NULL AND d.dedupe_required THEN
        {error}'SHIP_SQLA_CONFIGURATION: job ' || quote_literal(a_job)
            || ' derives its dedupe key in Python (an idempotency policy)',
            HINT = 'Fix: pass dedupe_key => the key the job''s policy would derive.';
    END IF;
    IF d.key_required THEN
        IF a_key IS NULL THEN
            {error}'SHIP_SQLA_CONFIGURATION: job ' || quote_literal(a_job)
                || ' is single-runner and derives its key in Python (Concurrency.key)',
                HINT = 'Fix: pass key => the single-runner key of this payload.';
        END IF;
    ELSE
        a_key := NULL;  -- as Python: a job that is not single-runner stores no key
    END IF;
    IF a_priority IS NULL THEN
        a_priority := d.priority;
    ELSIF a_priority NOT BETWEEN -10 AND 10 THEN
        {error}'SHIP_SQLA_JOB_PRIORITY_INVALID: priority must be '
            || 'an int from -10 to 10, got ' || a_priority,
            HINT = 'Fix: pass a priority from -10 (last) to 10 (first), or NULL.';
    END IF;
    a_part := options ->> 'partition_key';
    IF a_part IS NOT NULL AND NOT d.partition_by_key THEN
        {error}'SHIP_SQLA_CONFIGURATION: job ' || quote_literal(a_job)
            || ' has no limit with partition=''key'' but partition_key was given',
            HINT = 'Fix: drop options.partition_key, or declare the job''s limit with '
                || 'partition=''key''.';
    END IF;
    IF a_part IS NULL AND d.partition_key_derived THEN
        {error}'SHIP_SQLA_CONFIGURATION: job ' || quote_literal(a_job)
            || ' derives its partition key in Python (define_job(partition_key=fn))',
            HINT = 'Fix: pass options => jsonb_build_object(''partition_key'', <key>).';
    END IF;
    IF a_part IS NOT NULL AND (a_part = '' OR length(a_part) > 255) THEN
        {error}'SHIP_SQLA_KEY_INVALID: partition_key must be '
            || 'non-empty text of at most 255 characters',
            HINT = 'Fix: pass a shorter partition key.';
    END IF;
    -- K7: a W3C trace context, as Python stores it ({"traceparent": ..., "tracestate": ...}).
    IF a_trace IS NOT NULL AND (jsonb_typeof(a_trace) <> 'object'
        OR jsonb_typeof(a_trace -> 'traceparent') IS DISTINCT FROM 'string'
        OR (a_trace ->> 'traceparent') !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
        OR EXISTS (SELECT 1 FROM jsonb_each(a_trace) e
                   WHERE e.key NOT IN ('traceparent', 'tracestate')
                      OR jsonb_typeof(e.value) <> 'string')
        OR octet_length(a_trace::text) > 1024) THEN
        {error}'SHIP_SQLA_USAGE: trace_context must be a W3C '
            || 'trace context {"traceparent": "00-<32 hex>-<16 hex>-<2 hex>"[, "tracestate"]}',
            HINT = 'Fix: pass your tracer''s injected carrier, or NULL.';
    END IF;
    -- F2: the argument, else the session's tenant (a trigger in a tenanted unit of work).
    a_tenant := coalesce(a_tenant, nullif(current_setting('ship.tenant_id', true), ''));
    IF a_id IS NULL THEN
        a_id := {fn}_new_run_id();
    END IF;
    IF d.queue_depth_limit IS NOT NULL THEN
        -- J2: the job's enqueue gate, the one Python's enqueuers take (ENQUEUE_GATE).
        INSERT INTO {state} AS g (job_id, updated_at) VALUES (a_job || '#enqueue-gate', now())
        ON CONFLICT (job_id) DO UPDATE SET updated_at = EXCLUDED.updated_at;
    END IF;
    FOR pass IN 1..3 LOOP
        -- J1, as ENQUEUE_MANY: <runs>_pkey for a caller's id, then <runs>_dedupe_idx.
        found_id := NULL;
        IF durable THEN
            SELECT r.id INTO found_id FROM {runs} r WHERE r.id = a_id;
            {history_probe}
        END IF;
        IF found_id IS NULL AND a_dedupe IS NOT NULL THEN
            SELECT r.id INTO found_id FROM {runs} r
            WHERE r.job_id = a_job AND r.dedupe_key = a_dedupe
              AND r.dedupe_key IS NOT NULL AND r.state IN ('waiting', 'running');
        END IF;
        IF found_id IS NOT NULL THEN
            result := (found_id, 'deduplicated');
            RETURN result;
        END IF;
        IF d.queue_depth_limit IS NOT NULL THEN
            -- J2: <runs>_due_idx (index-only), at most the limit's number of entries.
            SELECT count(*) INTO depth FROM (
                SELECT 1 FROM {runs} r WHERE r.job_id = a_job AND r.state = 'waiting'
                ORDER BY r.priority, r.run_at, r.seq LIMIT d.queue_depth_limit) c;
            IF depth >= d.queue_depth_limit THEN
                result := (NULL, 'queue-full');
                RETURN result;
            END IF;
        END IF;
        INSERT INTO {runs} AS r (
            id, job_id, state, payload, key, dedupe_key, attempt, max_attempts, run_at,
            created_at, updated_at, history, priority, trace_context, tenant_id, partition_key,
            handler_version
        ) VALUES (
            a_id, a_job, 'waiting', a_payload, a_key, a_dedupe, 0, d.max_attempts, a_run_at,
            now(), now(), '[]'::jsonb, a_priority, a_trace, a_tenant, a_part, d.handler_version
        )
        ON CONFLICT DO NOTHING
        RETURNING r.seq INTO new_seq;
        EXIT WHEN new_seq IS NOT NULL;
    END LOOP;
    IF new_seq IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = 'SHIP_SQLA_REFUSED: enqueue of job '
            || quote_literal(a_job) || ' kept conflicting with concurrent inserts',
            HINT = 'Fix: retry the transaction.';
    END IF;
    IF a_run_at <= now() THEN
        PERFORM {fn}_announce(a_job, new_seq);  -- E3/K1, K8's rule
    END IF;
    result := (a_id, 'inserted');
    RETURN result;
END
$ship$
"""
HISTORY_PROBE: Final = """IF found_id IS NULL THEN
                -- J16: a durable id that ended is in history (its id index), as
                -- ENQUEUE_MANY_EITHER.
                SELECT h.id INTO found_id FROM {history} h WHERE h.id = a_id;
            END IF;"""
"""ENQUEUE_V1's durable-id probe of the history table, for tables with one (J16)."""

"""E1, E2, E3, E4: enqueue one run (see the module docstring). Returns ``(run_id, outcome)``:
``inserted`` (its new or given id), ``deduplicated`` (the existing run's id, J1) or
``queue-full`` (NULL, J2)."""

ENQUEUE_MANY_V1: Final = """
CREATE OR REPLACE FUNCTION {fn}_enqueue_many_v1(requests jsonb)
RETURNS SETOF {result}
LANGUAGE plpgsql VOLATILE {security}
AS $ship$
DECLARE
    r jsonb;
    n integer;
BEGIN
    IF jsonb_typeof(requests) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'SHIP_SQLA_USAGE: requests must be a JSON array of request objects',
            HINT = 'Fix: pass jsonb_build_array(jsonb_build_object(''job_id'', ...), ...).';
    END IF;
    n := jsonb_array_length(requests);
    IF n > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'SHIP_SQLA_BOUND_EXCEEDED: ' || n || ' requests, more than 10000 a call',
            HINT = 'Fix: split the requests into calls of at most 10000.';
    END IF;
    -- The set path: every request plain (no run_id, dedupe_key, key, trace_context or
    -- options), of a known job with no cap and nothing derived in Python, and every check of
    -- _enqueue_v1 passed: one INSERT for all (the rows _enqueue_v1 would store, in order).
    IF NOT EXISTS (
        SELECT 1 FROM jsonb_array_elements(requests) AS q(v)
        LEFT JOIN {defs} d ON d.job_id = q.v ->> 'job_id'
        WHERE d.job_id IS NULL OR jsonb_typeof(q.v) <> 'object'
           OR d.queue_depth_limit IS NOT NULL OR d.dedupe_required OR d.key_required
           OR d.partition_key_derived
           OR EXISTS (SELECT 1 FROM jsonb_each(CASE WHEN jsonb_typeof(q.v) = 'object'
                                                     THEN q.v END) e WHERE e.value <> 'null'::jsonb
                      AND e.key NOT IN ('job_id', 'payload', 'run_at', 'priority', 'tenant'))
           OR jsonb_typeof(q.v -> 'payload') IS NULL OR q.v -> 'payload' = 'null'::jsonb
           OR octet_length((q.v -> 'payload')::text) * 12 > d.max_payload_bytes
           OR jsonb_typeof(q.v -> 'priority') NOT IN ('number', 'null')
           OR CAST(q.v ->> 'priority' AS numeric) NOT BETWEEN -10 AND 10
           OR jsonb_typeof(q.v -> 'run_at') NOT IN ('string', 'null')
           OR jsonb_typeof(q.v -> 'tenant') NOT IN ('string', 'null')
    ) THEN
        RETURN QUERY
        WITH src AS (
            SELECT q.ord, {fn}_new_run_id() AS id, q.v ->> 'job_id' AS job_id,
                q.v -> 'payload' AS payload, d.max_attempts, d.handler_version,
                coalesce(CAST(q.v ->> 'run_at' AS timestamptz), now()) AS run_at,
                coalesce(CAST(q.v ->> 'priority' AS integer), d.priority) AS priority,
                coalesce(q.v ->> 'tenant',
                         nullif(current_setting('ship.tenant_id', true), '')) AS tenant
            FROM jsonb_array_elements(requests) WITH ORDINALITY AS q(v, ord)
            JOIN {defs} d ON d.job_id = q.v ->> 'job_id'
        ), ins AS (
            INSERT INTO {runs} (
                id, job_id, state, payload, key, dedupe_key, attempt, max_attempts, run_at,
                created_at, updated_at, history, priority, trace_context, tenant_id,
                partition_key, handler_version
            )
            SELECT s.id, s.job_id, 'waiting', s.payload, NULL, NULL, 0, s.max_attempts, s.run_at,
                now(), now(), '[]'::jsonb, s.priority, NULL, s.tenant, NULL, s.handler_version
            FROM src s ORDER BY s.ord
            RETURNING seq, job_id, run_at
        ), announced AS (
            SELECT {fn}_announce(i.job_id, max(i.seq)) FROM ins i
            WHERE i.run_at <= now() GROUP BY i.job_id
        )
        SELECT s.id, 'inserted'::text FROM src s
        WHERE (SELECT count(*) FROM announced) >= 0
        ORDER BY s.ord;
        RETURN;
    END IF;
    FOR r IN SELECT value FROM jsonb_array_elements(requests) LOOP
        IF jsonb_typeof(r) <> 'object' OR EXISTS (SELECT 1 FROM jsonb_object_keys(r) k
            WHERE k NOT IN ('job_id', 'payload', 'run_at', 'priority', 'dedupe_key', 'run_id',
                            'tenant', 'key', 'trace_context', 'options')) THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = 'SHIP_SQLA_CONFIGURATION: request ' || r::text
                    || ' is not an object of known keys',
                HINT = 'Fix: use only the keys of {fn_plain}_enqueue_v1''s parameters.';
        END IF;
        RETURN NEXT {fn}_enqueue_v1(
            r ->> 'job_id', r -> 'payload', CAST(r ->> 'run_at' AS timestamptz),
            CAST(r ->> 'priority' AS integer), r ->> 'dedupe_key', r ->> 'run_id',
            r ->> 'tenant', r ->> 'key', nullif(r -> 'trace_context', 'null'::jsonb),
            nullif(r -> 'options', 'null'::jsonb));
    END LOOP;
END
$ship$
"""
"""E1: up to 10,000 requests (a JSON array of objects keyed like ``_enqueue_v1``'s parameters)
in one statement, each decided as if enqueued one by one, rows in request order."""

JSON_SIZE: Final = """
CREATE OR REPLACE FUNCTION {fn}_json_size(value jsonb) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $ship$
DECLARE
    kind text := jsonb_typeof(value);
    total bigint;
BEGIN
    IF kind = 'object' THEN
        SELECT 2 + count(*) + greatest(count(*) - 1, 0)
            + coalesce(sum({fn}_json_size(to_jsonb(o.k)) + {fn}_json_size(o.v)), 0)
        INTO total FROM jsonb_each(value) AS o(k, v);
    ELSIF kind = 'array' THEN
        SELECT 2 + greatest(count(*) - 1, 0) + coalesce(sum({fn}_json_size(a.v)), 0)
        INTO total FROM jsonb_array_elements(value) AS a(v);
    ELSIF kind = 'string' THEN
        -- the JSON text's ASCII characters count once, a BMP character as an escape of 6, one
        -- beyond it as two escapes (12)
        SELECT length(value::text)
            + 5 * count(*) FILTER (WHERE ascii(c) BETWEEN 128 AND 65535)
            + 11 * count(*) FILTER (WHERE ascii(c) > 65535)
        INTO total FROM regexp_split_to_table(value #>> '{}', '') AS c;
    ELSE
        total := octet_length(value::text);
    END IF;
    RETURN total;
END
$ship$
"""
"""K6's payload bound: the size of ``value`` as compact ASCII JSON (Python's encoding: no
spaces, non-ASCII characters as ``\\uXXXX`` escapes, two for a character beyond the BMP)."""

NEW_RUN_ID: Final = """
CREATE OR REPLACE FUNCTION {fn}_new_run_id() RETURNS text
LANGUAGE plpgsql VOLATILE
AS $ship$
DECLARE
    u text := gen_random_uuid()::text;
BEGIN
    -- gen_random_uuid()'s random bits (its variant kept) under the millisecond time and
    -- version 7. PL/pgSQL: a plain-SQL function with a FROM clause is planned at every call
    -- (about 140 us a call measured, against 5 us).
    RETURN (lpad(to_hex(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')
        || '7' || substr(u, 16, 3) || substr(u, 20, 4) || substr(u, 25, 12))::uuid::text;
END
$ship$
"""
"""A version 7 UUID as text (what Python's ``new_run_ids`` makes; PostgreSQL 18's ``uuidv7()``
is not available on every supported server)."""

ENQUEUE_VERSIONS: Final = """
CREATE OR REPLACE FUNCTION {fn}_enqueue_versions()
RETURNS TABLE (version text, function_name text, build text)
LANGUAGE sql STABLE
AS $ship$
SELECT 'v1', '{fn_plain}_enqueue_v1', '{build}'
UNION ALL SELECT 'v1', '{fn_plain}_enqueue_many_v1', '{build}'
$ship$
"""
"""E5: the installed versions of the SQL enqueue API, with their build hash."""
