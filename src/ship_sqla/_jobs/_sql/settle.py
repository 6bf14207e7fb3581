"""Settling claimed runs (J5, J7): every kind of settlement of a batch in ONE statement, and the
batched heartbeat. Rules: see :mod:`ship_sqla._jobs._sql`; above all, each matches ``id`` AND
``lease_token`` AND ``state = 'running'``, so a holder whose claim was retaken changes nothing.
"""

from __future__ import annotations

from typing import Final

__all__ = ["HEARTBEAT_IF_TOKEN_CURRENT", "SETTLE_IF_TOKEN_CURRENT"]

SETTLE_IF_TOKEN_CURRENT: Final = """
WITH settle AS (
    -- unnest pads arrays shorter than :ids with NULLs: a NULL kind is a complete, so a batch of
    -- completes sends :ids and :tokens only (the completer's common batch, at the old cost).
    SELECT t.ord, t.id, t.token, coalesce(t.kind, 'complete') AS kind, t.at, t.error
    FROM unnest(
        CAST(:ids AS text[]), CAST(:tokens AS bigint[]), CAST(:kinds AS text[]),
        CAST(:ats AS timestamptz[]), CAST(:errors AS text[])
    ) WITH ORDINALITY AS t(id, token, kind, at, error, ord)
)
UPDATE {runs} r
-- A run goes back to waiting when it has a time to go back at (a complete has none) and either
-- is released or has attempts left: that one test is written out in state, run_at and
-- finished_at (an UPDATE's SET cannot share an expression that reads the row).
SET state = CASE
        WHEN s.kind = 'complete' THEN 'completed'
        WHEN s.at IS NOT NULL AND (s.kind = 'release' OR r.attempt < r.max_attempts)
            THEN 'waiting'
        ELSE 'dead' END,
    run_at = CASE
        WHEN s.at IS NOT NULL AND (s.kind = 'release' OR r.attempt < r.max_attempts) THEN s.at
        ELSE r.run_at END,
    finished_at = CASE
        WHEN s.at IS NOT NULL AND (s.kind = 'release' OR r.attempt < r.max_attempts) THEN NULL
        ELSE {now} END,
    -- J7: a release never spent its attempt; the next claim takes the same number again.
    attempt = CASE WHEN s.kind = 'release' THEN r.attempt - 1 ELSE r.attempt END,
    lease_expires_at = NULL, claimed_by = NULL, updated_at = {now},
    last_error = coalesce(s.error, r.last_error),
    history = CASE WHEN s.error IS NULL THEN r.history
        ELSE r.history || jsonb_build_array(jsonb_build_object(
            'attempt', r.attempt, 'at', {at}, 'error', s.error)) END
FROM settle s
-- <runs>_pkey, one probe per settlement; the token fences out stale holders (J5).
WHERE r.id = s.id AND r.lease_token = s.token AND r.state = 'running'
RETURNING s.ord, r.state
"""  # noqa: S105 - SQL naming a fencing token, not a secret
"""Settle a batch of any kinds in one round trip (as River's ``JobSetStateIfRunningMany``):
parallel arrays, one element per settlement, ``:kinds`` ``'complete'`` | ``'fail'`` |
``'release'``, ``:ats`` the fail's ``retry_at`` (NULL: dead now) or the release's ``run_at``
(NULL for a complete), ``:errors`` the history entry to append (a fail's always, a release's
when given, a complete's never). ``:kinds``, ``:ats`` and ``:errors`` may be shorter than
``:ids`` (empty for a batch of completes): missing elements are NULL, and a NULL kind is
``'complete'``. One row comes back per settlement that landed: its ordinal and
the run's new state (a fail's ``'waiting'`` is a retry, its ``'dead'`` a dead letter); a
settlement with no row was stale and changed nothing.

- complete: ``completed``, ``finished_at`` now;
- fail: the error appended to the history and kept as ``last_error``; waiting again at
  ``retry_at``, or ``dead`` (``finished_at`` now) when ``retry_at`` is NULL or the attempts are
  spent (J7);
- release: waiting again at ``run_at``, the attempt not consumed, the error (when given)
  appended (JOB_LOCK_HELD, J7; a drain cancellation, J12).

The batch must not name one (run, token) twice (one UPDATE changes a row once, with whichever
duplicate the join met first): the backend settles the first and answers its repeats stale,
as one-by-one settles would."""

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
"""Extend many live leases, each by the lease its claim was granted (``ClaimedRun.lease``); the
(id, token) pairs returned were extended (the others were stale or had lapsed)."""
