"""Every statement the PostgreSQL job backend runs: named, in one place, each hot one beside the
index that serves it.

The runs table's name and schema are the application's choice, so each statement is a template
rendered once per backend (:func:`render`) with the quoted table names; after that it is one
stable SQL text, so SQLAlchemy caches its compiled form and asyncpg its prepared statement.
Rules every statement follows:

- Time is ``coalesce(CAST(:now AS timestamptz), now())`` (``NOW`` below): ``:now`` is the
  injected clock's time when it is frozen, else NULL and the database's clock rules.
- Partial-index predicates are written as the index declares them (``_tables.py``), as SQL
  literals, never bound parameters: PostgreSQL uses a partial index only when the query's
  predicate implies the index's, and a generic prepared plan cannot prove that about ``$1``.
- Arrays, never expanding IN lists: ``unnest(CAST(:ids AS text[]), ...)`` and
  ``= ANY(...)`` keep one SQL text whatever the batch size.
- Every settle (complete, fail, release, heartbeat) matches ``id`` AND ``lease_token`` AND
  ``state = 'running'`` (J5): a holder whose claim was retaken changes nothing. A heartbeat also
  needs a live lease: a lapsed one is never revived.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy import TextClause, text

__all__ = [
    "CLAIM_DUE_AND_LAPSED_SKIP_LOCKED",
    "CLAIM_LOCK",
    "CLAIM_LOCK_TUNED",
    "COMPLETE_IF_TOKEN_CURRENT",
    "ENQUEUE_GATE",
    "ENQUEUE_MANY",
    "ENQUEUE_PLAIN",
    "ENQUEUE_PLAIN_CAPPED",
    "FAIL_IF_TOKEN_CURRENT",
    "HEARTBEAT_IF_TOKEN_CURRENT",
    "QUEUE_DEPTHS",
    "RELEASE_IF_TOKEN_CURRENT",
    "render",
    "render_gate",
]

NOW: Final = "coalesce(CAST(:now AS timestamptz), now())"
AT: Final = "to_char(" + NOW + """ AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')"""
"""A history entry's ``at``: ISO-8601 UTC text whatever the session's TimeZone."""

_RUN_COLUMNS = (
    "r.id, r.job_id, r.state, r.payload, r.key, r.dedupe_key, r.attempt, r.max_attempts,"
    " r.run_at, r.created_at, r.updated_at, r.finished_at, r.lease_expires_at, r.lease_token,"
    " r.claimed_by, r.last_error, r.history"
)


def render(template: str, *, runs: str) -> TextClause:
    """The statement for one runs table (``runs``: the quoted, schema-qualified name)."""
    return text(
        template.replace("{runs}", runs)
        .replace("{at}", AT)
        .replace("{now}", NOW)
        .replace("{cols}", _RUN_COLUMNS)
    )


ENQUEUE_PLAIN: Final = """
INSERT INTO {runs} (
    id, job_id, state, payload, key, dedupe_key, attempt, max_attempts,
    run_at, created_at, updated_at, history
)
SELECT t.id, :job_id, 'waiting', t.payload, t.key, NULL, 0,
    CAST(:max_attempts AS integer), coalesce(t.run_at, {now}), {now}, {now}, CAST('[]' AS jsonb)
FROM ROWS FROM (
    unnest(CAST(:ids AS text[])), jsonb_array_elements(CAST(:payloads AS jsonb)),
    unnest(CAST(:keys AS text[])), unnest(CAST(:run_ats AS timestamptz[]))
) AS t(id, payload, key, run_at)
"""
"""Insert many runs that need no check: fresh generated ids, no dedupe key, no depth limit.
``:payloads`` is ONE JSON array (element i is run i's payload), cheaper to encode and to parse
than an array of JSON texts; the other arrays run in step with it.

The common enqueue, kept to a plain INSERT ... SELECT FROM unnest: nothing to probe, so nothing
to plan beyond the insert itself (the full ENQUEUE_MANY re-plans six CTEs at every call)."""


def render_gate(template: str, *, state: str) -> TextClause:
    """The gate statement for one state table (``state``: the quoted, schema-qualified name)."""
    return text(template.replace("{state}", state).replace("{now}", NOW))


ENQUEUE_GATE: Final = """
INSERT INTO {state} AS g (job_id, updated_at)
VALUES (CAST(:gate AS text), {now})
ON CONFLICT (job_id) DO UPDATE SET updated_at = EXCLUDED.updated_at
"""
"""Take the job's enqueue gate (J2, hard cap): the first statement of every enqueue of a job
with a ``queue_depth_limit``, in the enqueuing transaction (the application's unit of work, or
the backend's own READ COMMITTED one). ``:gate`` is ``<job_id>#enqueue-gate``: a row of the
state table of its own, which no job id can name (``#`` is not allowed in one), so schedules
never lock or wait for it. Index: ``<state>_pkey`` (the ON CONFLICT arbiter).

The row lock it takes lasts until that transaction ends, so enqueuers of one capped job take
turns from the gate to their commit: ENQUEUE_MANY, a later statement with a later snapshot,
counts every run a previous holder committed, and none can be added while it decides. It
WRITES the row (a lock alone would not do): a REPEATABLE READ or SERIALIZABLE transaction whose
snapshot predates another holder's commit fails here with 40001 (its snapshot could not count
that holder's runs), which the unit of work re-runs (U3); under READ COMMITTED it just waits."""

ENQUEUE_PLAIN_CAPPED: Final = """
WITH depth AS (
    -- <runs>_due_idx (index-only), as ENQUEUE_MANY's depth: at most :depth_limit entries.
    SELECT count(*) AS n FROM (
        SELECT 1 FROM {runs}
        WHERE job_id = :job_id AND state = 'waiting'
        ORDER BY run_at, seq
        LIMIT CAST(:depth_limit AS integer)
    ) d
), inserted AS (
    INSERT INTO {runs} (
        id, job_id, state, payload, key, dedupe_key, attempt, max_attempts,
        run_at, created_at, updated_at, history
    )
    SELECT t.id, :job_id, 'waiting', t.payload, t.key, NULL, 0,
        CAST(:max_attempts AS integer), coalesce(t.run_at, {now}), {now}, {now},
        CAST('[]' AS jsonb)
    FROM ROWS FROM (
        unnest(CAST(:ids AS text[])), jsonb_array_elements(CAST(:payloads AS jsonb)),
        unnest(CAST(:keys AS text[])), unnest(CAST(:run_ats AS timestamptz[]))
    ) WITH ORDINALITY AS t(id, payload, key, run_at, ord), depth
    WHERE t.ord <= CAST(:depth_limit AS integer) - depth.n
)
SELECT greatest(CAST(:depth_limit AS integer) - depth.n, 0) AS room FROM depth
"""
"""ENQUEUE_PLAIN for a job with a ``queue_depth_limit`` (after ENQUEUE_GATE): fresh generated
ids and no dedupe key, so nothing can conflict and the only question is room. The first
``room`` requests (in request order) are inserted, the rest are queue-full; it answers
``room``. Same one-JSON-array payloads as ENQUEUE_PLAIN, and none of ENQUEUE_MANY's probes."""

ENQUEUE_MANY: Final = """
WITH input AS (
    SELECT t.id, t.payload, t.dedupe_key, t.key, t.run_at, t.ord
    FROM unnest(
        CAST(:ids AS text[]), CAST(:payloads AS text[]), CAST(:dedupe_keys AS text[]),
        CAST(:keys AS text[]), CAST(:run_ats AS timestamptz[])
    ) WITH ORDINALITY AS t(id, payload, dedupe_key, key, run_at, ord)
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
        ORDER BY run_at, seq
        LIMIT coalesce(CAST(:depth_limit AS integer), 0)
    ) d
), room AS (
    SELECT CASE WHEN CAST(:depth_limit AS integer) IS NULL THEN NULL
                ELSE CAST(:depth_limit AS integer) - depth.n END AS n
    FROM depth
), inserted AS (
    INSERT INTO {runs} (
        id, job_id, state, payload, key, dedupe_key, attempt, max_attempts,
        run_at, created_at, updated_at, history
    )
    SELECT f.id, :job_id, 'waiting', CAST(f.payload AS jsonb), f.key, f.dedupe_key, 0,
        CAST(:max_attempts AS integer), coalesce(f.run_at, {now}), {now}, {now},
        CAST('[]' AS jsonb)
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
"""
"""Insert many runs of one job in one statement (J1 dedupe, J2 queue-full, after ENQUEUE_GATE
when the backend has a ``queue_depth_limit``).

The requests must not repeat a run id or a dedupe key among themselves (the backend splits a
batch that does into consecutive statements, which keeps a batch equal to enqueueing its requests
one by one). Per request it reports: inserted; or ``existing_id`` (deduplicated against a stored
run, by id first, then by dedupe key); or, not inserted, queue-full (``rn > room``) or a lost race
with a concurrent insert."""

CLAIM_LOCK: Final = "SELECT pg_advisory_xact_lock(CAST(:claim_key AS bigint))"
CLAIM_LOCK_TUNED: Final = (
    "SELECT pg_advisory_xact_lock(CAST(:claim_key AS bigint)),"
    " set_config('plan_cache_mode', 'force_generic_plan', true),"
    " set_config('synchronous_commit', 'off', true)"
)
"""CLAIM_LOCK, plus two settings for the rest of the claim's own transaction only (the backend
uses it when it owns the connection, never inside an application's transaction):

- the prepared claim's generic plan: PostgreSQL otherwise keeps re-planning it (its LIMITs are
  parameters, which makes the generic plan look dearer than it is), about 0.5 ms per claim; the
  generic plan is the same two ordered index scans (test_job_explain.py checks both plans);
- no wait for the commit's WAL flush: a claim lost in a database crash only leaves its runs
  unclaimed (or their leases lapsing), and they are taken again, which at-least-once delivery
  (J6) already allows. Enqueues and settles keep the server's synchronous_commit."""

CLAIM_DUE_AND_LAPSED_SKIP_LOCKED: Final = """
WITH lapsed AS (
    -- <runs>_lease_idx: lapsed leases (their holders died or stalled: J6). Running runs never
    -- exceed concurrency.max, so this bound reads them all unless workers died en masse.
    SELECT id, seq, key, run_at, attempt >= max_attempts AS exhausted
    FROM {runs}
    WHERE job_id = :job_id AND state = 'running' AND lease_expires_at <= {now}
    ORDER BY lease_expires_at
    LIMIT CAST(:max_running AS integer) + CAST(:limit AS integer)
    FOR UPDATE SKIP LOCKED
), held AS (
    -- <runs>_lease_idx: the job's running runs, each holding a concurrency.max slot whatever
    -- its lease, counted up to concurrency.max; only the ones this claim buries give theirs
    -- up. A lapsed run keeps its slot until a claim retakes it (the slot moves) or buries it,
    -- so the bound never rests on when a lapsed holder learns that its lease is gone: a lapsed
    -- run whose row another statement holds (a heartbeat or settle in flight, skipped above)
    -- is counted too. The ORDER BY is the index's own: it keeps the planner off a LIMITed
    -- sequential scan (its row estimate for one job's running runs is often far too high).
    SELECT count(*) AS n FROM (
        SELECT 1 FROM {runs}
        WHERE job_id = :job_id AND state = 'running'
          AND id <> ALL(ARRAY(SELECT id FROM lapsed WHERE exhausted))
        ORDER BY lease_expires_at
        LIMIT CAST(:max_running AS integer)
    ) h
), room AS (
    -- Slots for due runs. Retaking a lapsed run moves its slot to this claim; it takes none.
    SELECT greatest(least(CAST(:limit AS integer), CAST(:max_running AS integer) - held.n), 0)
        AS n
    FROM held
), due AS (
    -- <runs>_due_idx: due waiting runs in (run_at, seq) order, read straight off the index; a
    -- claim reads about limit entries at any backlog (J3).
    SELECT id, seq, run_at
    FROM {runs}
    WHERE job_id = :job_id AND state = 'waiting' AND run_at <= {now}
      AND (key IS NULL OR key <> ALL(CAST(:exclude_keys AS text[])))
    ORDER BY run_at, seq
    LIMIT CAST(:limit AS integer)
    FOR UPDATE SKIP LOCKED
), picked AS (
    -- The small outer sort: retakable lapsed runs and at most room due runs together by
    -- (run_at, seq), at most limit of them. Rows the scans locked and these limits dropped
    -- stay locked until COMMIT, which is why a claim is its own short transaction.
    SELECT c.id FROM (
        SELECT id, seq, run_at FROM lapsed
        WHERE NOT exhausted AND (key IS NULL OR key <> ALL(CAST(:exclude_keys AS text[])))
        UNION ALL
        (SELECT id, seq, run_at FROM due ORDER BY run_at, seq LIMIT (SELECT n FROM room))
    ) c
    ORDER BY c.run_at, c.seq
    LIMIT CAST(:limit AS integer)
), buried AS (
    -- <runs>_pkey. A lease that lapsed on the final attempt is dead-lettered, not retried
    -- forever (J6), whether or not this claim has room; the lapsed attempt is its last history
    -- entry, and the claim returns the run so the runtime reports and counts it (J10).
    UPDATE {runs} r
    SET state = 'dead', finished_at = {now}, updated_at = {now}, lease_expires_at = NULL,
        claimed_by = NULL, last_error = CAST(:lapsed_final AS text),
        history = r.history || jsonb_build_array(jsonb_build_object(
            'attempt', r.attempt, 'at', {at}, 'error', CAST(:lapsed_final AS text)))
    WHERE r.id = ANY(ARRAY(SELECT id FROM lapsed WHERE exhausted))
    RETURNING r.id, r.attempt, r.key
), claimed AS (
    -- <runs>_pkey. A new fencing token per claim: strictly above the row's previous one (so
    -- never equal to any earlier holder's) plus a random step (so a deleted and re-inserted
    -- durable id does not repeat a token either). A retaken run (it was running: its lease
    -- lapsed) records the lapsed attempt in its history (J6); SET reads the row before it.
    UPDATE {runs} r
    SET state = 'running', attempt = r.attempt + 1,
        lease_token = coalesce(r.lease_token, 0) + 1 + CAST(floor(random() * 1048576) AS bigint),
        lease_expires_at = {now} + CAST(:lease AS double precision) * interval '1 second',
        claimed_by = CAST(:worker AS text), updated_at = {now},
        last_error = CASE WHEN r.state = 'running' THEN CAST(:lapsed AS text)
                          ELSE r.last_error END,
        history = CASE WHEN r.state = 'running'
            THEN r.history || jsonb_build_array(jsonb_build_object(
                'attempt', r.attempt, 'at', {at}, 'error', CAST(:lapsed AS text)))
            ELSE r.history END
    WHERE r.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING r.id, r.payload, r.attempt, r.max_attempts, r.lease_token, r.key,
        r.lease_expires_at, r.created_at, r.run_at, r.seq
)
SELECT c.id, c.payload, c.attempt, c.max_attempts, c.lease_token, c.key, c.lease_expires_at,
    c.created_at, c.run_at, c.seq, false AS buried
FROM claimed c
UNION ALL
SELECT b.id, NULL, b.attempt, NULL, NULL, b.key, NULL, NULL, NULL, NULL, true FROM buried b
ORDER BY buried, run_at, seq
"""
"""Claim up to ``limit`` runs of one job (J3, J6): lapsed leases retaken, due runs by
``(run_at, seq)`` (creation order), never more than ``concurrency.max`` running runs of the job
at once, live or lapsed leases alike. Heartbeats refuse a lapsed lease (so its holder stops), but
a lapsed run keeps its slot until it is retaken or buried: counting only live leases would make
the bound depend on whether a heartbeat that began before the lapse commits before or after
this claim's snapshot, one run above the cap when it loses that race.

Two ordered index scans (lapsed leases, due runs) then a small outer sort, so a claim costs the
same at any backlog; one ``state IN (...) OR ...`` scan could not be served in order. Returns
the claimed runs in claim order, ``(run_at, seq)``, then the runs it dead-lettered (``buried``:
id, attempt, key)."""

COMPLETE_IF_TOKEN_CURRENT: Final = """
WITH settle AS (
    SELECT t.id, t.token
    FROM unnest(CAST(:ids AS text[]), CAST(:tokens AS bigint[])) AS t(id, token)
)
UPDATE {runs} r
SET state = 'completed', finished_at = {now}, updated_at = {now}, lease_expires_at = NULL,
    claimed_by = NULL
FROM settle s
-- <runs>_pkey, one probe per settled run; the token fences out stale holders (J5).
WHERE r.id = s.id AND r.lease_token = s.token AND r.state = 'running'
RETURNING r.id, s.token
"""  # noqa: S105 - SQL naming a fencing token, not a secret
"""Complete many runs in one statement; the (id, token) pairs returned were current."""

HEARTBEAT_IF_TOKEN_CURRENT: Final = """
WITH beat AS (
    SELECT t.id, t.token, t.lease
    FROM unnest(CAST(:ids AS text[]), CAST(:tokens AS bigint[]),
                CAST(:leases AS double precision[])) AS t(id, token, lease)
)
UPDATE {runs} r
SET lease_expires_at = {now} + b.lease * interval '1 second', updated_at = {now}
FROM beat b
-- <runs>_pkey, one probe per run. A lapsed lease is never revived, even one no claim retook
-- yet: any claim may retake the run from the moment it lapsed, so its holder must stop.
WHERE r.id = b.id AND r.lease_token = b.token AND r.state = 'running'
  AND r.lease_expires_at > {now}
RETURNING r.id, b.token
"""  # noqa: S105 - SQL naming a fencing token, not a secret
"""Extend many live leases by their job's ``concurrency.lease``; the (id, token) pairs returned
were extended (the others were stale or had lapsed)."""

FAIL_IF_TOKEN_CURRENT: Final = """
UPDATE {runs} r
SET state = CASE WHEN CAST(:retry_at AS timestamptz) IS NULL OR r.attempt >= r.max_attempts
                 THEN 'dead' ELSE 'waiting' END,
    run_at = CASE WHEN CAST(:retry_at AS timestamptz) IS NULL OR r.attempt >= r.max_attempts
                  THEN r.run_at ELSE CAST(:retry_at AS timestamptz) END,
    finished_at = CASE WHEN CAST(:retry_at AS timestamptz) IS NULL OR r.attempt >= r.max_attempts
                       THEN {now} ELSE NULL END,
    lease_expires_at = NULL, claimed_by = NULL, updated_at = {now},
    last_error = CAST(:error AS text),
    history = r.history || jsonb_build_array(jsonb_build_object(
        'attempt', r.attempt, 'at', {at}, 'error', CAST(:error AS text)))
-- <runs>_pkey; fenced on the token (J5).
WHERE r.id = :id AND r.lease_token = CAST(:token AS bigint) AND r.state = 'running'
RETURNING r.state
"""  # noqa: S105 - SQL naming a fencing token, not a secret
"""Record a failed attempt (J7): waiting again at ``retry_at``, or dead when none is left."""

RELEASE_IF_TOKEN_CURRENT: Final = """
UPDATE {runs} r
SET state = 'waiting', run_at = CAST(:run_at AS timestamptz), attempt = r.attempt - 1,
    lease_expires_at = NULL, claimed_by = NULL, updated_at = {now},
    last_error = coalesce(CAST(:error AS text), r.last_error),
    history = CASE WHEN CAST(:error AS text) IS NULL THEN r.history
        ELSE r.history || jsonb_build_array(jsonb_build_object(
            'attempt', r.attempt, 'at', {at}, 'error', CAST(:error AS text))) END
-- <runs>_pkey; fenced on the token (J5).
WHERE r.id = :id AND r.lease_token = CAST(:token AS bigint) AND r.state = 'running'
RETURNING r.id
"""  # noqa: S105 - SQL naming a fencing token, not a secret
"""Return a claimed run to waiting without consuming its attempt (JOB_LOCK_HELD, J7; a drain
cancellation, J12), appending ``error`` to its history when given."""

QUEUE_DEPTHS: Final = """
SELECT j.job_id, q.depth,
    coalesce(extract(epoch FROM {now} - q.oldest_due), 0) AS oldest_due_age
FROM unnest(CAST(:job_ids AS text[])) AS j(job_id)
CROSS JOIN LATERAL (
    -- <runs>_due_idx: an index-only scan of one job's waiting runs (due or delayed).
    SELECT count(*) AS depth, min(r.run_at) FILTER (WHERE r.run_at <= {now}) AS oldest_due
    FROM {runs} r
    WHERE r.job_id = j.job_id AND r.state = 'waiting'
) q
"""
"""J10's queue gauges for the given jobs (every one answered, 0 when empty). Costs one entry
read per waiting run, so the runtime samples it every ``DEPTH_SAMPLE_INTERVAL`` seconds, not
per claim."""
