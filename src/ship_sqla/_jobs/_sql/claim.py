"""The claim (J3, J4, J6): one short transaction of the backend's own, the per-job advisory lock
then ONE statement. Rules: see :mod:`ship_sqla._jobs._sql`. ``:max_running`` and ``:lease`` are
the :class:`~ship_sqla.kernel.ClaimRequest`'s (the job's ``concurrency.max`` and
``concurrency.lease``, as the runtime asks them).
"""

from __future__ import annotations

from typing import Final

__all__ = ["CLAIM_DUE_AND_LAPSED_SKIP_LOCKED", "CLAIM_LOCK", "CLAIM_LOCK_TUNED"]

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
