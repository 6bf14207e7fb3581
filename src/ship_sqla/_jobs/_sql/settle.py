"""Settling claimed runs (J5, J7): every kind of settlement of a batch in ONE statement, and the
batched heartbeat. Rules: see :mod:`ship_sqla._jobs._sql`; above all, each matches ``id`` AND
``lease_token`` AND ``state = 'running'``, so a holder whose claim was retaken changes nothing.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "HEARTBEAT_COLUMNS",
    "HEARTBEAT_IF_TOKEN_CURRENT",
    "SETTLE_COLUMNS",
    "SETTLE_IF_TOKEN_CURRENT",
]

SETTLE_IF_TOKEN_CURRENT: Final = """
WITH settle AS (
    -- unnest pads arrays shorter than :ids with NULLs: a NULL kind is a complete, so a batch of
    -- completes sends :ids and :tokens only (the completer's common batch, at the old cost).
    SELECT t.ord, t.id, t.token, coalesce(t.kind, 'complete') AS kind, t.at, t.error,
        t.entry_kind
    FROM unnest(
        CAST(:ids AS text[]), CAST(:tokens AS bigint[]), CAST(:kinds AS text[]),
        CAST(:ats AS timestamptz[]), CAST(:errors AS text[]), CAST(:entry_kinds AS text[])
    ) WITH ORDINALITY AS t(id, token, kind, at, error, entry_kind, ord)
)
UPDATE {runs} r
-- A run goes back to waiting when it has a time to go back at (a complete has none) and either
-- is released or snoozed, or has attempts left: that one test is written out in state, run_at
-- and finished_at (an UPDATE's SET cannot share an expression that reads the row).
SET state = CASE
        WHEN s.kind = 'complete' THEN 'completed'
        -- K2: a cancel ends the run; so does any other kind once a cancel was requested (a
        -- failure or release that raced the request must not put it back or dead-letter it).
        WHEN s.kind = 'cancel' OR r.cancel_requested_at IS NOT NULL THEN 'cancelled'
        WHEN s.at IS NOT NULL
            AND (s.kind IN ('release', 'snooze') OR r.attempt < r.max_attempts) THEN 'waiting'
        ELSE 'dead' END,
    run_at = CASE
        WHEN s.at IS NOT NULL AND r.cancel_requested_at IS NULL
            AND (s.kind IN ('release', 'snooze') OR r.attempt < r.max_attempts) THEN s.at
        ELSE r.run_at END,
    finished_at = CASE
        WHEN s.at IS NOT NULL AND r.cancel_requested_at IS NULL
            AND (s.kind IN ('release', 'snooze') OR r.attempt < r.max_attempts) THEN NULL
        ELSE {now} END,
    -- J7, K4: a release or a snooze never spent its attempt; the next claim takes the same
    -- number again. A snooze is counted: the kernel bounds the count (retry.max_snoozes).
    -- A cancelled run's attempt stays counted (it ran), and its snooze never happened.
    attempt = CASE WHEN s.kind IN ('release', 'snooze') AND r.cancel_requested_at IS NULL
        THEN r.attempt - 1 ELSE r.attempt END,
    snoozes = CASE WHEN s.kind = 'snooze' AND r.cancel_requested_at IS NULL
        THEN r.snoozes + 1 ELSE r.snoozes END,
    lease_expires_at = NULL, claimed_by = NULL, updated_at = {now}, wait_for = NULL,
    last_error = coalesce(s.error, r.last_error),
    history = CASE WHEN s.error IS NULL THEN r.history
        ELSE r.history || jsonb_build_array(jsonb_build_object(
            'attempt', r.attempt, 'at', {at}, 'error', s.error, 'kind', s.entry_kind)) END
FROM settle s
-- <runs>_pkey, one probe per settlement; the token fences out stale holders (J5).
WHERE r.id = s.id AND r.lease_token = s.token AND r.state = 'running'
RETURNING s.ord, r.state, r.parent_id
"""  # noqa: S105 - SQL naming a fencing token, not a secret
"""Settle a batch of any kinds in one round trip (as River's ``JobSetStateIfRunningMany``):
parallel arrays, one element per settlement, ``:kinds`` ``'complete'`` | ``'fail'`` |
``'release'`` | ``'snooze'`` | ``'cancel'``, ``:ats`` the fail's ``retry_at`` (NULL: dead now)
or the release's or snooze's ``run_at`` (NULL for a complete and a cancel), ``:errors`` the
history entry to append (a fail's and a snooze's always, a release's and a cancel's when given,
a complete's never) and ``:entry_kinds`` its
``kind`` (:data:`~ship_sqla.kernel._ports.HistoryKind`: a fail's own, ``'snooze'``,
``'released'``). ``:kinds``, ``:ats``, ``:errors`` and ``:entry_kinds`` may be shorter than
``:ids`` (empty for a batch of completes): missing elements are NULL, and a NULL kind is
``'complete'``. One row comes back per settlement that landed: its ordinal and
the run's new state (a fail's ``'waiting'`` is a retry, its ``'dead'`` a dead letter); a
settlement with no row was stale and changed nothing. ``parent_id`` (D5): a child run's parent,
which the backend wakes (WAKE_PARENTS) once the child's end committed.

- complete: ``completed``, ``finished_at`` now;
- fail: the error appended to the history and kept as ``last_error``; waiting again at
  ``retry_at``, or ``dead`` (``finished_at`` now) when ``retry_at`` is NULL or the attempts are
  spent (J7);
- release: waiting again at ``run_at``, the attempt not consumed, the error (when given)
  appended (JOB_LOCK_HELD, J7; a drain cancellation, J12);
- snooze: waiting again at ``run_at``, the attempt not consumed, ``snoozes`` one more, the
  snooze's text appended (K4);
- cancel: ``cancelled`` (``finished_at`` now), the error (when given) appended (K2). Any other
  kind but a complete of a run whose cancel was requested (``cancel_requested_at``) lands the
  same way, its own error appended: a run an operator cancelled never goes back to waiting or
  dead, whatever raced the request.

The batch must not name one (run, token) twice (one UPDATE changes a row once, with whichever
duplicate the join met first): the backend settles the first and answers its repeats stale,
as one-by-one settles would."""

SETTLE_COLUMNS: Final = ("ord", "state", "parent_id")
"""The columns of SETTLE_IF_TOKEN_CURRENT's rows, in this order: the backend reads them by
position (as a claim's, :data:`~ship_sqla._jobs._sql.claim.CLAIM_COLUMNS`)."""

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
-- K2: the answer says whether the lease is still the holder's (a row) AND whether an operator
-- asked to cancel the run: the fallback that carries a cancel to a holder without a listener.
RETURNING r.id, b.token, r.cancel_requested_at IS NOT NULL AS cancel_requested
"""  # noqa: S105 - SQL naming a fencing token, not a secret
"""Extend many live leases, each by the lease its claim was granted (``ClaimedRun.lease``); the
(id, token) pairs returned were extended (the others were stale or had lapsed), each with
``cancel_requested`` (K2). A cancel-requested lease is extended like any other: its holder is
stopping the handler and settles the run cancelled; no claim may retake it meanwhile."""

HEARTBEAT_COLUMNS: Final = ("id", "token", "cancel_requested")
"""The columns of HEARTBEAT_IF_TOKEN_CURRENT's rows, in this order: read by position."""
