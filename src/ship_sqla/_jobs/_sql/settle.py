"""Settling claimed runs (J5, J7): every kind of settlement of a batch in ONE statement, and the
batched heartbeat. Rules: see :mod:`ship_sqla._jobs._sql`; above all, each matches ``id`` AND
``lease_token`` AND ``state = 'running'``, so a holder whose claim was retaken changes nothing.

**The one-path probe (J20).** A batch's rows are found by ``<runs>_pkey`` probes, one per
settlement, whatever the table's statistics (empty and never analyzed, 100,000 dead rows, a
million live rows), in custom and generic plans, because the statement leaves the planner no
other join worth costing:

- ``r.id = ANY(ARRAY[s.id])`` (a one-element array of the outer row's id) is an index condition
  of ``<runs>_pkey`` but no hash or merge join key;
- every other check on the row is one ``(...) IS TRUE`` over both sides (here the J5 fence,
  ``r.lease_token = s.token AND r.state = 'running'``): a join filter that neither hashes nor
  proves a partial index's predicate (a plain ``state = 'running'`` proves
  ``<runs>_lease_idx``'s, which the settle used to scan whole on an empty or dead table) and
  costs the same per pair in a pass over the table as on a probed row;
- the batch is padded to 32 rows for the planner (``generate_series(1, 32)`` in the
  ``ROWS FROM``; the padding has no id and is dropped before the join): it assumes 10 elements
  for an array parameter, and on a never-analyzed table (assumed 10 pages) one rescanned pass
  is priced below 10 probes but well above 32.

What is left is a nested loop with the probe inside, or one pass over the table joined by the
filter, priced above the probes in all three states. Bounds, measured on PostgreSQL 15: on an
analyzed table with next to no live rows the pass costs its pages and the probes ~8 each, so a
custom plan of a batch above ~250 settlements on the 100,000-dead table, or the generic plan
(32 priced) on one of fewer than ~260 pages (about 12,000 dead rows), takes the pass (then
roughly what it costs). No ``ctid``: a heartbeat's, lapse's or cancel's concurrent new row
version is rechecked by id, token and state (EvalPlanQual), as before. The moving settle
(:mod:`.live`) is the same shape. The claim's closing UPDATEs (:mod:`.claim`) are not: there
the shape flips them to a sequential scan on a small table analyzed under a held snapshot
(``test_job_plans_held.py``, below the ~260 pages above) and costs ~5-10 % of a claim's server
time (BENCHMARKS.md, "J20's two listed flips").
"""

from __future__ import annotations

from typing import Final

from ship_sqla._sql import Template

__all__ = [
    "CLAIM_STATE_IF_TOKEN",
    "FENCE_RUN_FOR_UPDATE",
    "HEARTBEAT_COLUMNS",
    "HEARTBEAT_IF_TOKEN_CURRENT",
    "RECORD_PROGRESS_IF_TOKEN_CURRENT",
    "SETTLE_COLUMNS",
    "SETTLE_IF_TOKEN_CURRENT",
    "SETTLE_INPUTS",
    "settle_batch",
]

SETTLE_INPUTS: Final = (
    ("ids", "text", "id"),
    ("tokens", "bigint", "token"),
    ("states", "text", "state"),
    ("ats", "timestamptz", "at"),
    ("refunds", "boolean", "refund"),
    ("snoozes_added", "integer", "snoozes_added"),
    ("errors", "text", "error"),
    ("entry_kinds", "text", "entry_kind"),
    ("keeps_lapses", "boolean", "keeps_lapses"),
    ("wait_fors", "text", "wait_for"),
)
"""A batched settle's input arrays, one element per settlement: (parameter, element type, the
column of ``t`` it becomes); J16's moving settle (:mod:`.live`) adds two before the last."""


def settle_batch(columns: tuple[tuple[str, str, str], ...]) -> str:
    """The ``FROM`` of a batched settle's input ``t``: each ``columns`` array unnested side by
    side (a shorter one padded with NULLs), numbered ``ord``, and padded to 32 rows for the
    planner by ``generate_series(1, 32)`` (J20, the module docstring: it assumes 10 elements for
    an array); the padding rows have no id and are dropped."""
    arrays = ", ".join(f"unnest(CAST(:{param} AS {kind}[]))" for param, kind, _ in columns)
    names = ", ".join(name for _, _, name in columns)
    return f"""FROM ROWS FROM (
        {arrays},
        generate_series(1, 32)
    ) WITH ORDINALITY AS t({names}, pad, ord)
    WHERE t.id IS NOT NULL"""


SETTLE_IF_TOKEN_CURRENT: Final = Template(
    """
WITH settle AS (
    -- unnest pads arrays shorter than :ids with NULLs: a NULL state is a completion, so a batch
    -- of completions sends :ids and :tokens only (the completer's common batch, at the old cost).
    SELECT t.ord, t.id, t.token, coalesce(t.state, 'completed') AS state, t.at,
        coalesce(t.refund, false) AS refund, coalesce(t.snoozes_added, 0) AS snoozes_added,
        t.error, t.entry_kind, coalesce(t.keeps_lapses, false) AS keeps_lapses, t.wait_for
    -- J20: padded to 32 rows (settle_batch), so the planner prices at least 32 probes.
    """
    + settle_batch(SETTLE_INPUTS)
    + """
)
UPDATE {runs} r
-- Each field applies the kernel's settlement as built (ship_sqla/kernel/_settlement.py decided
-- retry or dead, the refund, the snooze and the entry). The one rule of the store's own is K2:
-- once a cancel was requested, anything but a completion ends the run cancelled (a failure or
-- release that raced the request must not put it back or dead-letter it), its attempt counted
-- and no snooze added; written out in each column (an UPDATE's SET cannot share an expression
-- that reads the row).
SET state = CASE WHEN s.state <> 'completed' AND r.cancel_requested_at IS NOT NULL
        THEN 'cancelled' ELSE s.state END,
    run_at = CASE WHEN s.state = 'waiting' AND r.cancel_requested_at IS NULL
        THEN s.at ELSE r.run_at END,
    finished_at = CASE WHEN s.state = 'waiting' AND r.cancel_requested_at IS NULL
        THEN NULL ELSE {now} END,
    attempt = CASE WHEN s.refund AND r.cancel_requested_at IS NULL
        THEN r.attempt - 1 ELSE r.attempt END,
    snoozes = CASE WHEN r.cancel_requested_at IS NULL
        THEN r.snoozes + s.snoozes_added ELSE r.snoozes END,
    lease_expires_at = NULL, claimed_by = NULL, updated_at = {now},
    -- D10: a parked run waits for '#diverged'; every other settlement ends any wait.
    wait_for = CASE WHEN s.state = 'waiting' AND r.cancel_requested_at IS NULL
        THEN s.wait_for ELSE NULL END,
    -- J15: an end the handler reached ends the run's streak of lapses; a release keeps it.
    consecutive_lapses = CASE WHEN s.keeps_lapses THEN r.consecutive_lapses ELSE 0 END,
    last_error = coalesce(s.error, r.last_error),
    -- J18: the entry keeps the attempt's start and worker ({began}: its claim's start).
    history = CASE WHEN s.error IS NULL THEN r.history
        ELSE r.history || jsonb_build_array(jsonb_build_object(
            'attempt', r.attempt, 'at', {at}, 'error', s.error, 'kind', s.entry_kind,
            'started', {began}, 'worker', r.claimed_by)) END
FROM settle s
-- <runs>_pkey, one probe per settlement; the token fences out stale holders (J5). J20: the
-- one-path probe (module docstring): the id as a one-element array, the fence one IS TRUE.
WHERE r.id = ANY(ARRAY[s.id]) AND (r.lease_token = s.token AND r.state = 'running') IS TRUE
RETURNING s.ord, r.state, r.parent_id
"""
)
"""Apply a batch of settlements (:class:`~ship_sqla.kernel._settlement.Settlement`) in one round
trip (as River's ``JobSetStateIfRunningMany``): parallel arrays, one element per settlement, its
fields as the kernel built them: ``:states`` (``'completed'`` | ``'waiting'`` | ``'dead'`` |
``'cancelled'``), ``:ats`` (the ``run_at`` of a waiting one), ``:refunds`` (true: the attempt is
not spent, J7, K4), ``:snoozes_added`` (K4), ``:errors`` and ``:entry_kinds`` (the history entry
to append, and its :data:`~ship_sqla.kernel._ports.HistoryKind`; NULL: none), ``:keeps_lapses``
(true: a release, which leaves ``consecutive_lapses`` as it was; else it goes back to 0, J15),
``:wait_fors`` (D10: ``'#diverged'`` for a parked run; NULL: no wait).
All but ``:ids`` and ``:tokens`` may be shorter than ``:ids`` (empty for a batch of
completions): missing elements are NULL, and a NULL state is ``'completed'``. One row comes
back per settlement that landed: its ordinal and the run's new state (``'cancelled'`` where K2
turned it into one); a settlement with no row was stale and changed nothing. ``parent_id``
(D5): a child run's parent, which the backend wakes (WAKE_PARENTS) once the child's end
committed.

The batch must not name one (run, token) twice (one UPDATE changes a row once, with whichever
duplicate the join met first): the backend settles the first and answers its repeats stale,
as one-by-one settles would."""

SETTLE_COLUMNS: Final = ("ord", "state", "parent_id")
"""The columns of SETTLE_IF_TOKEN_CURRENT's rows, in this order: the backend reads them by
position (as a claim's, :data:`~ship_sqla._jobs._sql.claim.CLAIM_COLUMNS`)."""

HEARTBEAT_IF_TOKEN_CURRENT: Final = Template("""
WITH beat AS (
    SELECT t.id, t.token, t.lease
    FROM unnest(CAST(:ids AS text[]), CAST(:tokens AS bigint[]),
                CAST(:leases AS double precision[])) AS t(id, token, lease)
)
UPDATE {runs} r
-- updated_at stays the attempt's start (J18: a lapsed attempt's history entry reads it, see
-- ship_sqla._sql.BEGAN); the last beat is lease_expires_at less the lease.
SET lease_expires_at = {now} + b.lease * interval '1 second'
FROM beat b
-- <runs>_pkey, one probe per run. A lapsed lease is never revived, even one no claim retook
-- yet: any claim may retake the run from the moment it lapsed, so its holder must stop.
WHERE r.id = b.id AND r.lease_token = b.token AND r.state = 'running'
  AND r.lease_expires_at > {now}
-- K2: the answer says whether the lease is still the holder's (a row) AND whether an operator
-- asked to cancel the run: the fallback that carries a cancel to a holder without a listener.
RETURNING r.id, b.token, r.cancel_requested_at IS NOT NULL AS cancel_requested
""")
"""Extend many live leases, each by the lease its claim was granted (``ClaimedRun.lease``); the
(id, token) pairs returned were extended (the others were stale or had lapsed), each with
``cancel_requested`` (K2). A cancel-requested lease is extended like any other: its holder is
stopping the handler and settles the run cancelled; no claim may retake it meanwhile."""

HEARTBEAT_COLUMNS: Final = ("id", "token", "cancel_requested")
"""The columns of HEARTBEAT_IF_TOKEN_CURRENT's rows, in this order: read by position."""

FENCE_RUN_FOR_UPDATE: Final = Template("""
-- J13: a transactional handler's first statement. The row lock is held to the transaction's end,
-- so no claim retakes the run (claims skip locked rows) and no cancel commits before the
-- completion. The server ends a holder idle in the transaction for longer than the lease (a
-- process stopped or hung) and releases the lock: the run's lease lapses and it is retaken (J14).
SELECT r.lease_token = :token AND r.state = 'running' AS current,
    r.cancel_requested_at IS NOT NULL AS cancel_requested,
    set_config('idle_in_transaction_session_timeout', :idle_ms, true) AS bound
FROM {runs} r
-- <runs>_pkey, one probe.
WHERE r.id = :id
FOR UPDATE OF r
""")
"""Lock run ``:id`` until the transaction ends and say whether claim ``:token`` is current
(``current``: still running under it) and whether an operator asked to cancel it
(``cancel_requested``, K2); ``:idle_ms`` (text, milliseconds: the lease) bounds how long the
transaction may sit idle holding the lock (``SET LOCAL idle_in_transaction_session_timeout``).
No row: the run is gone (purged), which is stale too."""

CLAIM_STATE_IF_TOKEN: Final = Template("""
-- <runs>_pkey, one probe: how an ambiguous COMMIT of a transactional handler is resolved (J13).
SELECT r.state FROM {runs} r WHERE r.id = :id AND r.lease_token = :token
""")
"""The state of run ``:id`` while its row carries claim ``:token``; no row: another claim holds
it (or it is gone)."""

RECORD_PROGRESS_IF_TOKEN_CURRENT: Final = Template("""
-- C3: a consumer's batch's last statement but its cursor's, in the batch's transaction (after
-- the J13 fence locked the row). <runs>_pkey, one probe; the token fences out a stale holder.
UPDATE {runs} r SET progress = CAST(:progress AS jsonb)
WHERE r.id = :id AND r.lease_token = :token AND r.state = 'running'
RETURNING r.id
""")
"""Store ``:progress`` (JSON object text) as run ``:id``'s while claim ``:token`` holds it; no
row: the claim is not current and nothing changed. The settle never touches the column, so the
last batch's values stay on the finished run."""
