"""The enqueue statements (J1, J2): what ``insert`` runs for prepared runs. Rules: see
:mod:`ship_sqla._jobs._sql`. Each statement takes one job's runs as parallel arrays in request
order (``:ids``, ``:payloads``, ``:keys``, ``:run_ats``, ``:max_attempts``, ``:priorities``
(K6), ``:trace_contexts`` (K7, JSON text or NULL), ``:tenant`` (F2: one for the whole batch,
the enqueue's ambient tenant, or NULL), ``:handler_version`` (D9: the job's, one for the whole
batch, or NULL), and ``:dedupe_keys`` where a run may carry
one), exactly as :func:`~ship_sqla.kernel._plans.prepare.prepare_runs` made them: the
statements compute nothing a run carries.
"""

from __future__ import annotations

from typing import Final

from ship_sqla._sql import Template
from ship_sqla._sql import notify as announcements

__all__ = [
    "ANNOUNCE",
    "ANNOUNCE_AFTER_COMMIT",
    "ENQUEUE_COPY_ALLOWED",
    "ENQUEUE_COPY_COLUMNS",
    "ENQUEUE_COPY_MIN_RUNS",
    "ENQUEUE_GATE",
    "ENQUEUE_MANY",
    "ENQUEUE_ONE",
    "ENQUEUE_ONE_ANNOUNCED",
    "ENQUEUE_ONE_SAMPLED",
    "ENQUEUE_PLAIN",
    "ENQUEUE_PLAIN_ANNOUNCED",
    "ENQUEUE_PLAIN_CAPPED",
    "ENQUEUE_PLAIN_SAMPLED",
    "SET_PARTITION_KEYS",
]

_INSERT_PLAIN_COLUMNS: Final = """INSERT INTO {runs} (
    id, job_id, state, payload, key, dedupe_key, attempt, max_attempts,
    run_at, created_at, updated_at, history, priority, trace_context, tenant_id,
    handler_version
)
SELECT t.id, :job_id, 'waiting', t.payload, t.key, NULL, 0,
    t.max_attempts, coalesce(t.run_at, {now}), {now}, {now}, CAST('[]' AS jsonb),
    t.priority, CAST(t.trace_context AS jsonb), CAST(:tenant AS text),
    CAST(:handler_version AS integer)
FROM ROWS FROM (
    unnest(CAST(:ids AS text[])), jsonb_array_elements(CAST(:payloads AS jsonb)),
    unnest(CAST(:keys AS text[])), unnest(CAST(:run_ats AS timestamptz[])),
    unnest(CAST(:max_attempts AS integer[])), unnest(CAST(:priorities AS smallint[])),
    unnest(CAST(:trace_contexts AS text[]))
)"""
"""The INSERT ... SELECT FROM the prepared arrays that ENQUEUE_PLAIN and ENQUEUE_PLAIN_CAPPED
share (each adds its own alias list: the capped one numbers the requests)."""

ENQUEUE_PLAIN: Final = Template(
    "\n"
    + _INSERT_PLAIN_COLUMNS
    + " AS t(id, payload, key, run_at, max_attempts, priority, trace_context)\n"
)
"""Insert many runs that need no check: generated ids, no dedupe key, no depth limit.
``:payloads`` is ONE JSON array (element i is run i's payload), cheaper to encode and to parse
than an array of JSON texts; the other arrays run in step with it.

The common enqueue, kept to a plain INSERT ... SELECT FROM unnest: nothing to probe, so nothing
to plan beyond the insert itself (the full ENQUEUE_MANY re-plans six CTEs at every call)."""

ENQUEUE_ONE: Final = Template("""
INSERT INTO {runs} (
    id, job_id, state, payload, key, dedupe_key, attempt, max_attempts,
    run_at, created_at, updated_at, history, priority, trace_context, tenant_id,
    handler_version
)
VALUES (
    CAST(:id AS text), :job_id, 'waiting', CAST(:payload_json AS jsonb), CAST(:key AS text),
    NULL, 0, CAST(:max_attempts AS integer), coalesce(CAST(:run_at AS timestamptz), {now}),
    {now}, {now},
    CAST('[]' AS jsonb), CAST(:priority AS smallint), CAST(:trace_context AS jsonb),
    CAST(:tenant AS text), CAST(:handler_version AS integer)
)
""")
"""ENQUEUE_PLAIN for ONE run, as a VALUES row of scalars: the single enqueue, the commonest
call, skips the arrays' encoding and the function scan over them (about 90 µs of the server's
time per enqueue, BENCHMARKS.md "Session 7"). Index: the insert's own."""

ENQUEUE_COPY_COLUMNS: Final = (
    "id",
    "job_id",
    "payload",
    "key",
    "max_attempts",
    "priority",
    "trace_context",
    "tenant_id",
    "handler_version",
)
"""ENQUEUE_PLAIN's rows by ``COPY <runs> (<these>[, run_at][, created_at, updated_at]) FROM STDIN
(FORMAT text)``, for a batch of at least ENQUEUE_COPY_MIN_RUNS runs on an asyncpg connection
nobody watches (:mod:`ship_sqla._direct`). The same rows as ENQUEUE_PLAIN's: the columns it
leaves out take the table's defaults (state 'waiting', attempt 0, history '[]', and ``now()``
for ``run_at`` when no run of the batch has one, and for ``created_at``/``updated_at`` unless
the backend's clock is frozen). COPY skips the statement's parse of one JSON array of the whole
batch and its per-row executor work: about 1.2-1.5x the INSERT's rows per second on the same
table (BENCHMARKS.md, "Session 7"). Index: the insert's own entries (``<runs>_pkey``,
``<runs>_due_idx``, and ``<runs>_tenant_idx`` on a table declared with ``fair_claims``); nothing
is read."""

ENQUEUE_COPY_ALLOWED: Final = Template("""
-- pg_class, one row: COPY FROM refuses a table with row-level security on (0A000), so such a
-- runs table (tenant_policy_ddl applied to it) takes the INSERT. Run once per backend.
SELECT NOT coalesce(
    (SELECT c.relrowsecurity FROM pg_class c WHERE c.oid = to_regclass(CAST(:runs AS text))),
    false)
""")
"""Whether the bulk enqueue may COPY into the runs table (``:runs``: its quoted name)."""

ENQUEUE_COPY_MIN_RUNS: Final = 128
"""Below this many runs the INSERT (one round trip) beats COPY (its query, then the data)."""

ENQUEUE_GATE: Final = Template("""
INSERT INTO {state} AS g (job_id, updated_at)
VALUES (CAST(:gate AS text), {now})
ON CONFLICT (job_id) DO UPDATE SET updated_at = EXCLUDED.updated_at
""")
"""Take the job's enqueue gate (J2, hard cap): the first statement of every insert of a job
with a ``queue_depth_limit``, in the inserting transaction (the application's unit of work, the
backend's own READ COMMITTED one, or a schedule's tick). ``:gate`` is ``<job_id>#enqueue-gate``:
a row of the state table of its own, which no job id can name (``#`` is not allowed in one),
so schedule rows are never locked with it. Index: ``<state>_pkey`` (the ON CONFLICT arbiter).

The row lock it takes lasts until that transaction ends, so enqueuers of one capped job take
turns from the gate to their commit: ENQUEUE_MANY, a later statement with a later snapshot,
counts every run a previous holder committed, and none can be added while it decides. It
WRITES the row (a lock alone would not do): a REPEATABLE READ or SERIALIZABLE transaction whose
snapshot predates another holder's commit fails here with 40001 (its snapshot could not count
that holder's runs), which the unit of work re-runs (U3); under READ COMMITTED it just waits."""

_CAPPED_DEPTH: Final = """
WITH depth AS (
    -- <runs>_due_idx (index-only), as ENQUEUE_MANY's depth: at most :depth_limit entries.
    SELECT count(*) AS n FROM (
        SELECT 1 FROM {runs}
        WHERE job_id = :job_id AND state = 'waiting'
        ORDER BY priority, run_at, seq
        LIMIT CAST(:depth_limit AS integer)
    ) d
), inserted AS (
"""
_CAPPED_ROOM: Final = """ WITH ORDINALITY
    AS t(id, payload, key, run_at, max_attempts, priority, trace_context, ord), depth
    WHERE t.ord <= CAST(:depth_limit AS integer) - depth.n
)
SELECT greatest(CAST(:depth_limit AS integer) - depth.n, 0) AS room FROM depth
"""
ENQUEUE_PLAIN_CAPPED: Final = Template(_CAPPED_DEPTH + _INSERT_PLAIN_COLUMNS + _CAPPED_ROOM)
"""ENQUEUE_PLAIN for a job with a ``queue_depth_limit`` (after ENQUEUE_GATE): generated ids and
no dedupe key, so nothing can conflict and the only question is room. The first ``room``
requests (in request order) are inserted, the rest are queue-full; it answers ``room``. Same
one-JSON-array payloads as ENQUEUE_PLAIN, and none of ENQUEUE_MANY's probes."""

ENQUEUE_MANY: Final = Template("""
WITH input AS (
    SELECT t.id, t.payload, t.dedupe_key, t.key, t.run_at, t.max_attempts, t.priority,
        t.trace_context, t.ord
    FROM unnest(
        CAST(:ids AS text[]), CAST(:payloads AS text[]), CAST(:dedupe_keys AS text[]),
        CAST(:keys AS text[]), CAST(:run_ats AS timestamptz[]),
        CAST(:max_attempts AS integer[]), CAST(:priorities AS smallint[]),
        CAST(:trace_contexts AS text[])
    ) WITH ORDINALITY
        AS t(id, payload, dedupe_key, key, run_at, max_attempts, priority, trace_context, ord)
), probed AS (
    SELECT i.*,
        coalesce(
            -- <runs>_pkey: a durable id that exists already is that run, terminal or not.
            (SELECT r.id FROM {runs} r WHERE r.id = i.id),
            -- <runs>_dedupe_idx: the live run holding this dedupe key (J1).
            (SELECT r.id FROM {runs} r
             WHERE r.job_id = :job_id AND r.dedupe_key = i.dedupe_key
               AND r.dedupe_key IS NOT NULL AND r.state IN ('waiting', 'running'))
        ) AS existing_id
    FROM input i
), fresh AS (
    SELECT p.*, row_number() OVER (ORDER BY p.ord) AS rn
    FROM probed p
    WHERE p.existing_id IS NULL
), depth AS (
    -- The caller holds the job's gate (ENQUEUE_GATE) whenever a limit is set, so this count,
    -- in a snapshot taken after the gate was granted, is exact (J2 is a hard cap).
    -- <runs>_due_idx (index-only): the bounded depth check (J2) stops after the limit's
    -- number of entries, whatever the backlog. The ORDER BY is the index's own order: it keeps
    -- the planner off a LIMITed sequential scan, which would read the whole table whenever
    -- this job's rows sit behind other rows. No limit configured: it reads nothing.
    SELECT count(*) AS n FROM (
        SELECT 1 FROM {runs}
        WHERE job_id = :job_id AND state = 'waiting'
        ORDER BY priority, run_at, seq
        LIMIT coalesce(CAST(:depth_limit AS integer), 0)
    ) d
), room AS (
    SELECT CASE WHEN CAST(:depth_limit AS integer) IS NULL THEN NULL
                ELSE CAST(:depth_limit AS integer) - depth.n END AS n
    FROM depth
), inserted AS (
    INSERT INTO {runs} (
        id, job_id, state, payload, key, dedupe_key, attempt, max_attempts,
        run_at, created_at, updated_at, history, priority, trace_context, tenant_id,
    handler_version
    )
    SELECT f.id, :job_id, 'waiting', CAST(f.payload AS jsonb), f.key, f.dedupe_key, 0,
        f.max_attempts, coalesce(f.run_at, {now}), {now}, {now}, CAST('[]' AS jsonb),
        f.priority, CAST(f.trace_context AS jsonb), CAST(:tenant AS text),
        CAST(:handler_version AS integer)
    FROM fresh f, room
    WHERE room.n IS NULL OR f.rn <= room.n
    ORDER BY f.ord
    -- Any unique violation here (the pkey or <runs>_dedupe_idx) is a concurrent duplicate; the
    -- caller re-runs this statement for the losers, whose new snapshot sees the winner.
    ON CONFLICT DO NOTHING
    RETURNING id
)
SELECT p.ord, p.id, p.existing_id,
    EXISTS (SELECT 1 FROM inserted x WHERE x.id = p.id) AND p.existing_id IS NULL AS inserted,
    f.rn, (SELECT room.n FROM room) AS room
FROM probed p
LEFT JOIN fresh f ON f.ord = p.ord
ORDER BY p.ord
""")
"""Insert many runs of one job in one statement (J1 dedupe, J2 queue-full, after ENQUEUE_GATE
when the backend has a ``queue_depth_limit``): runs with a durable id or a dedupe key, and a
schedule's fired occurrence.

The requests must not repeat a run id or a dedupe key among themselves (the backend splits a
batch that does into consecutive statements, which keeps a batch equal to enqueueing its requests
one by one). Per request it reports: inserted; or ``existing_id`` (deduplicated against a stored
run, by id first, then by dedupe key); or, not inserted, queue-full (``rn > room``) or a lost race
with a concurrent insert."""

ENQUEUE_PLAIN_ANNOUNCED: Final = Template(
    announcements.announcing(ENQUEUE_PLAIN.sql, sequence="seq")
)
"""ENQUEUE_PLAIN and the enqueue's announcement (K1) in ONE statement: ``WITH ship_enqueued AS
(<ENQUEUE_PLAIN> RETURNING seq) SELECT pg_notify(:channel, :payload), max(seq)``, so an
announced plain enqueue costs no round trip more (and stays one autocommitted statement outside
a unit of work). The NOTIFY is part of the inserting transaction: delivered when it commits,
never after a rollback. ``fleet_seq``: the largest ``seq`` it took, how many runs every process
has enqueued so far (the announce rule's share of the budget). Index: as ENQUEUE_PLAIN (the
insert's own)."""

ENQUEUE_ONE_ANNOUNCED: Final = Template(announcements.announcing(ENQUEUE_ONE.sql, sequence="seq"))
"""ENQUEUE_ONE and the enqueue's announcement (K1) in ONE statement, as
ENQUEUE_PLAIN_ANNOUNCED."""

ANNOUNCE: Final = Template(announcements.NOTIFY.sql)
"""The announcement (K1) of the other inserts (capped, checked), sent in their transaction once
they inserted a due run: ``:channel`` is the backend's wake channel, ``:payload`` the job id."""

ANNOUNCE_AFTER_COMMIT: Final = Template(announcements.ANNOUNCE_AFTER_COMMIT.sql)
"""The announcer's post-commit announcement (:data:`~ship_sqla._sql.notify.ANNOUNCE_AFTER_COMMIT`:
one notify-only transaction for every job committed since the last one, committed without
waiting for its WAL flush). Reads no table."""

ENQUEUE_PLAIN_SAMPLED: Final = Template(ENQUEUE_PLAIN.sql.rstrip() + "\nRETURNING seq\n")
"""ENQUEUE_PLAIN answering the ``seq`` of each run it took: how many runs every process has
enqueued so far, the sample of the table's enqueue rate the announce rule asks for now and
then (at most every FLEET_SAMPLE_EVERY; :mod:`ship_sqla.kernel._plans.announce`). Index: as
ENQUEUE_PLAIN."""

ENQUEUE_ONE_SAMPLED: Final = Template(ENQUEUE_ONE.sql.rstrip() + "\nRETURNING seq\n")
"""ENQUEUE_ONE answering its run's ``seq``, as ENQUEUE_PLAIN_SAMPLED."""

SET_PARTITION_KEYS: Final = Template("""
-- <runs>_pkey, one probe per run: F8/F9, the partition keys of the runs this enqueue inserted
-- (a job whose limits are per partition key), in the enqueue's own transaction, right after
-- its INSERT: no claim ever sees these runs without their keys.
UPDATE {runs} r SET partition_key = u.partition_key
FROM unnest(CAST(:ids AS text[]), CAST(:partition_keys AS text[])) AS u(id, partition_key)
WHERE r.id = u.id AND r.state = 'waiting' AND r.partition_key IS NULL
""")
"""Store the partition keys of newly inserted runs (``:ids`` and ``:partition_keys`` in step).
Only runs that have none yet: a deduplicated run keeps the key it was inserted with."""
