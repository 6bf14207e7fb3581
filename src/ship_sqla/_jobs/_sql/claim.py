"""The claim (J3, J4, J6): one short transaction of the backend's own, the per-job advisory lock
then ONE statement. Rules: see :mod:`ship_sqla._jobs._sql`. ``:max_running`` and ``:lease`` are
the :class:`~ship_sqla.kernel.ClaimRequest`'s (the job's ``concurrency.max`` and
``concurrency.lease``, as the runtime asks them).
"""

from __future__ import annotations

from typing import Final

__all__ = ["CLAIM_DUE_AND_LAPSED_SKIP_LOCKED", "CLAIM_LOCK", "CLAIM_LOCK_TUNED"]

_PAUSED: Final = (
    "EXISTS (SELECT 1 FROM {state} p WHERE p.job_id = CAST(:pause_row AS text)) AS paused"
)
"""K3, ``<state>_pkey`` (one probe): whether the job is paused, read in the claim lock's own
statement, so in the claim's transaction at no extra round trip. Its snapshot is the
statement's start: a pause committed before the claim began is seen, and the claim takes
nothing; one committed later cannot stop a claim already under way (its runs were claimed
before the pause), which is what "no claim that STARTS after the pause" promises."""

CLAIM_LOCK: Final = "SELECT pg_advisory_xact_lock(CAST(:claim_key AS bigint)), " + _PAUSED
CLAIM_LOCK_TUNED: Final = (
    "SELECT pg_advisory_xact_lock(CAST(:claim_key AS bigint)), " + _PAUSED + ","
    " set_config('plan_cache_mode', 'force_generic_plan', true),"
    " set_config('synchronous_commit', 'off', true),"
    " set_config('jit', 'off', true)"
)
"""CLAIM_LOCK (the lock, and whether the job is paused: K3), plus three settings for the rest of
the claim's own transaction only (the backend
uses it when it owns the connection, never inside an application's transaction):

- the prepared claim's generic plan: PostgreSQL otherwise keeps re-planning it (its LIMITs are
  parameters, which makes the generic plan look dearer than it is), about 0.5 ms per claim; the
  generic plan is the same ordered index scans (test_job_explain.py checks both plans);
- no wait for the commit's WAL flush: a claim lost in a database crash only leaves its runs
  unclaimed (or their leases lapsing), and they are taken again, which at-least-once delivery
  (J6) already allows. Enqueues and settles keep the server's synchronous_commit;
- no JIT: a generic plan's cost grows with the backlog (its LIMITs are costed at a tenth of
  what they read), and past ``jit_above_cost`` PostgreSQL would spend tens of milliseconds
  compiling a claim that runs in one."""

CLAIM_DUE_AND_LAPSED_SKIP_LOCKED: Final = """
WITH RECURSIVE lapsed AS (
    -- <runs>_lease_idx: lapsed leases (their holders died or stalled: J6). Running runs never
    -- exceed concurrency.max, so this bound reads them all unless workers died en masse.
    -- exhausted: the run ends here, never retaken: its final attempt lapsed (dead, J6), or an
    -- operator asked to cancel it (cancelled, K2).
    SELECT id, seq, key, run_at, priority,
        attempt >= max_attempts OR cancel_requested_at IS NOT NULL AS exhausted
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
), walk (priority, ids, run_ats, seqs, taken) AS (
    -- <runs>_due_idx, highest priority first (K6): each step finds the next lower priority
    -- level that holds waiting runs (a loose index scan: one entry, the level's last), then
    -- takes that level's due runs in (run_at, seq) order straight off the index, at most the
    -- room still left. The walk stops once the room is filled or no level is left, so a claim
    -- reads about room entries plus two per level it visits (one when every run of the level
    -- is delayed), at any backlog (J3). It starts above every level with nothing taken.
    SELECT CAST(32767 AS smallint), CAST('{}' AS text[]), CAST('{}' AS timestamptz[]),
        CAST('{}' AS bigint[]), 0
    UNION ALL
    SELECT level.priority, got.ids, got.run_ats, got.seqs, w.taken + cardinality(got.ids)
    FROM walk w
    CROSS JOIN LATERAL (
        SELECT r.priority FROM {runs} r
        WHERE r.job_id = :job_id AND r.state = 'waiting' AND r.priority < w.priority
        ORDER BY r.priority DESC
        LIMIT 1
    ) level
    CROSS JOIN LATERAL (
        SELECT coalesce(array_agg(d.id), CAST('{}' AS text[])) AS ids,
            coalesce(array_agg(d.run_at), CAST('{}' AS timestamptz[])) AS run_ats,
            coalesce(array_agg(d.seq), CAST('{}' AS bigint[])) AS seqs
        FROM (
            -- Two LIMITs: the outer one cuts at the room left; the inner one, a parameter,
            -- only lets the planner see how few rows this is (an expression LIMIT is costed at
            -- a tenth of the level, which would have PostgreSQL JIT-compile every claim).
            SELECT * FROM (
                SELECT r.id, r.run_at, r.seq
                FROM {runs} r
                WHERE r.job_id = :job_id AND r.state = 'waiting' AND r.priority = level.priority
                  AND r.run_at <= {now}
                  AND (r.key IS NULL OR r.key <> ALL(CAST(:exclude_keys AS text[])))
                ORDER BY r.run_at, r.seq
                LIMIT CAST(:limit AS integer)
                FOR UPDATE SKIP LOCKED
            ) capped
            LIMIT (SELECT n FROM room) - w.taken
        ) d
    ) got
    WHERE w.taken < (SELECT n FROM room)
), due AS (
    SELECT u.id, u.seq, u.run_at, w.priority
    FROM walk w, unnest(w.ids, w.run_ats, w.seqs) AS u(id, run_at, seq)
), picked AS (
    -- The small outer sort: retakable lapsed runs and the due runs (at most room) together by
    -- (priority DESC, run_at, seq), at most limit of them. Rows the scans locked and this
    -- limit dropped stay locked until COMMIT, which is why a claim is its own short transaction.
    SELECT c.id FROM (
        SELECT id, seq, run_at, priority FROM lapsed
        WHERE NOT exhausted AND (key IS NULL OR key <> ALL(CAST(:exclude_keys AS text[])))
        UNION ALL
        SELECT id, seq, run_at, priority FROM due
    ) c
    ORDER BY c.priority DESC, c.run_at, c.seq
    LIMIT CAST(:limit AS integer)
), buried AS (
    -- <runs>_pkey. A lease that lapsed on the final attempt is dead-lettered, not retried
    -- forever (J6), whether or not this claim has room; the lapsed attempt is its last history
    -- entry, and the claim returns the run so the runtime reports and counts it (J10). A
    -- cancel-requested one is cancelled instead, whatever attempts it has left (K2), and not
    -- returned: it is no dead letter, and nobody is left to tell.
    UPDATE {runs} r
    SET state = CASE WHEN r.cancel_requested_at IS NULL THEN 'dead' ELSE 'cancelled' END,
        finished_at = {now}, updated_at = {now}, lease_expires_at = NULL, claimed_by = NULL,
        last_error = CASE WHEN r.cancel_requested_at IS NULL THEN CAST(:lapsed_final AS text)
            ELSE CAST(:cancel_lapsed AS text) END,
        history = r.history || CASE WHEN r.cancel_requested_at IS NULL
            THEN jsonb_build_array(jsonb_build_object(
                'attempt', r.attempt, 'at', {at}, 'error', CAST(:lapsed_final AS text),
                'kind', 'lapsed'))
            ELSE jsonb_build_array(jsonb_build_object(
                'attempt', r.attempt, 'at', {at}, 'error', CAST(:cancel_lapsed AS text),
                'kind', 'cancelled')) END
    WHERE r.id = ANY(ARRAY(SELECT id FROM lapsed WHERE exhausted))
    RETURNING r.id, r.attempt, r.key, r.state
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
                'attempt', r.attempt, 'at', {at}, 'error', CAST(:lapsed AS text),
                'kind', 'lapsed'))
            ELSE r.history END
    WHERE r.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING r.id, r.payload, r.attempt, r.max_attempts, r.lease_token, r.key,
        r.lease_expires_at, r.created_at, r.run_at, r.seq, r.priority, r.trace_context,
        r.snoozes
)
SELECT c.id, c.payload, c.attempt, c.max_attempts, c.lease_token, c.key, c.lease_expires_at,
    c.created_at, c.run_at, c.seq, c.priority, c.trace_context, c.snoozes, false AS buried
FROM claimed c
UNION ALL
SELECT b.id, NULL, b.attempt, NULL, NULL, b.key, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    true
FROM buried b
WHERE b.state = 'dead'
ORDER BY buried, priority DESC, run_at, seq
"""
"""Claim up to ``limit`` runs of one job (J3, J6, K6): lapsed leases retaken, due runs by
``(priority DESC, run_at, seq)`` (higher priority first, then due time, then creation order),
never more than ``concurrency.max`` running runs of the job
at once, live or lapsed leases alike. Heartbeats refuse a lapsed lease (so its holder stops), but
a lapsed run keeps its slot until it is retaken or buried: counting only live leases would make
the bound depend on whether a heartbeat that began before the lapse commits before or after
this claim's snapshot, one run above the cap when it loses that race.

Ordered index scans (lapsed leases; per priority level, highest first, the due runs: the walk
stops as soon as it has the room's worth) then a small outer sort, so a claim costs the same at
any backlog: about ``limit`` index entries plus two per priority level it visits; one
``state IN (...) OR ...`` scan, or one scan ordered by ``priority DESC, run_at``, could not be
served in order past delayed runs. Returns the claimed runs in claim order, ``(priority DESC,
run_at, seq)``, then the runs it dead-lettered (``buried``: id, attempt, key)."""
