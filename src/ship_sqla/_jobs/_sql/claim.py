"""The claim (J3, J4, J6, F1, F2, F3, F10): ONE autocommitted statement, one round trip, whichever
process claims. Rules: see :mod:`ship_sqla._jobs._sql`. ``:limit``, ``:max_running``,
``:rate_limit`` / ``:rate_period`` and ``:lease`` are the :class:`~ship_sqla.kernel.ClaimRequest`'s
(the runtime's free slots, the job's ``concurrency.max``, its ``RateLimit`` and
``concurrency.lease``).

Four texts of one template: how the claim's room is found (ungated or gated, below), and how
its due runs are chosen: the priority walk (K6), the walk plus the aged seek (F10,
:data:`CLAIM_AGED`, :data:`CLAIM_AGED_GATED`), or a fair job's shares across tenants (F2,
:data:`CLAIM_FAIR`, :data:`CLAIM_FAIR_GATED`; a fair claim takes each tenant's oldest runs
whatever their priority, so aging has nothing to change there).

- :data:`CLAIM_UNCAPPED` (no ``concurrency.max``, the default, and no rate limit): no exclusion
  at all: the room is the limit asked, and claimers of one job only meet on the rows
  ``FOR UPDATE SKIP LOCKED`` hands to each of them (F1: nothing serialises them).
- :data:`CLAIM_GATED` (a ``concurrency.max``, a ``RateLimit``, or both): the job's claim gate,
  ``<job_id>#claim-gate`` in the state table, taken by the statement's own upsert after the
  statement found its candidate runs (locked, SKIP LOCKED). Its row lock serialises the job's
  gated claims for that one statement, never across a round trip, and it reads the row's newest
  version (ON CONFLICT DO UPDATE locks and reads it whatever the snapshot), so it grants from
  what every earlier claim recorded, not from what this statement's snapshot saw:

  - the cap (F1): a statement's snapshot is taken when it starts, before it waits for the
    gate, so its count of running runs may miss the runs of a claim that committed in between.
    The gate keeps the total of due runs it ever granted (``claim_granted``); the newest total
    minus the one this snapshot saw is what claims committed since were granted, so the room is
    ``max - held (snapshot) - granted since the snapshot``: never above the cap. It may be
    below for a moment (a grant a concurrent claim did not fill, runs settled since): only a
    claim concurrent with those pays, and the next one counts afresh;
  - the rate (F3): the gate keeps the recent starts as (time, count) pairs (``rate_at``,
    ``rate_n``), the claim's time being ``greatest(now, the last recorded time)`` so recorded
    times never go back; a claim at time ``t`` starts at most ``limit`` minus the starts
    recorded in ``(t - period, t]``, and records exactly what it starts (its candidates are
    locked, so everything granted is claimed). So no window of ``period`` sees more than
    ``limit`` starts (claims that retake a lapsed lease included), and a claimed run's
    ``updated_at`` is its recorded start time.
"""

from __future__ import annotations

from typing import Final

from ship_sqla._sql import Template
from ship_sqla.kernel._ports import MAX_CLAIM_BATCH

__all__ = [
    "CLAIM_AGED",
    "CLAIM_AGED_GATED",
    "CLAIM_AGED_GATED_KEYED",
    "CLAIM_AGED_KEYED",
    "CLAIM_COLUMNS",
    "CLAIM_FAIR",
    "CLAIM_FAIR_GATED",
    "CLAIM_FAIR_GATED_KEYED",
    "CLAIM_FAIR_KEYED",
    "CLAIM_GATED",
    "CLAIM_GATED_KEYED",
    "CLAIM_PARTITIONED",
    "CLAIM_PARTITIONED_BY_KEY",
    "CLAIM_PARTITIONED_BY_KEY_KEYED",
    "CLAIM_PARTITIONED_KEYED",
    "CLAIM_UNCAPPED",
    "CLAIM_UNCAPPED_KEYED",
]

_HEAD: Final = """
WITH RECURSIVE paused AS (
    -- K3, <state>_pkey (one probe): whether the job is paused, read in the claim's own
    -- statement and snapshot: a pause committed before the claim began stops it (it takes and
    -- buries nothing); one committed later cannot stop a claim already under way.
    -- The set_config is the claim's own transaction only (it is one autocommitted statement):
    -- on the backend's own connections (:tuned) the commit does not wait for its WAL flush.
    -- A claim lost in a crash only leaves its runs unclaimed or their leases lapsing, and they
    -- are taken again, which at-least-once delivery (J6) already allows; enqueues and settles
    -- keep the server's synchronous_commit. Inside a caller's transaction (the test path) it
    -- sets the setting it already has.
    SELECT EXISTS (SELECT 1 FROM {state} p WHERE p.job_id = CAST(:pause_row AS text)) AS yes,
        set_config('synchronous_commit',
            CASE WHEN CAST(:tuned AS boolean) THEN 'off'
                 ELSE current_setting('synchronous_commit') END, true) AS tuned
), lapsed AS (
    -- <runs>_lease_idx: lapsed leases (their holders died or stalled: J6), at most
    -- :lapsed_limit (concurrency.max plus the limit, all of them unless workers died en masse;
    -- uncapped, the limit: the rest wait for the next claims).
    -- exhausted: the run ends here, never retaken: its final attempt lapsed (dead, J6), this
    -- lapse is its :max_lapses-th in a row (dead: a crash loop, J15), or an operator asked to
    -- cancel it (cancelled, K2).
    SELECT id, seq, key, run_at, priority,
        attempt >= max_attempts OR cancel_requested_at IS NOT NULL
            OR coalesce(consecutive_lapses + 1 >= CAST(:max_lapses AS integer), false)
            AS exhausted
    FROM {runs}
    WHERE job_id = :job_id AND state = 'running' AND lease_expires_at <= {now}
      -- J19 for J6 (kernel LapsedFloors): an index condition of <runs>_lease_idx: the probe
      -- starts above the leases this backend's last complete probe met (:lapsed_window
      -- seconds before now), past the dead entries of runs that ran since (kept while an MVCC
      -- horizon is held); NULL, every sweep: from the start.
      AND lease_expires_at > coalesce(
            {now} - CAST(:lapsed_window AS double precision) * interval '1 second',
            CAST('-infinity' AS timestamptz))
      AND NOT (SELECT yes FROM paused)
    ORDER BY lease_expires_at
    LIMIT CAST(:lapsed_limit AS integer)
    FOR UPDATE SKIP LOCKED
)"""

_ROOM_UNGATED: Final = """, room AS (
    -- No cap: slots for as many due runs as asked (the runtime asks its free slots).
    SELECT CASE WHEN (SELECT yes FROM paused) THEN 0 ELSE CAST(:limit AS integer) END AS n
)"""

_ROOM_GATED: Final = """, held AS (
    -- <runs>_lease_idx: the job's running runs in this statement's snapshot (none read when
    -- the job has no cap), each holding a concurrency.max slot whatever its lease, counted up
    -- to concurrency.max; only the ones this claim buries give theirs up. A lapsed run keeps
    -- its slot until a claim retakes it (the slot moves) or buries it, so the bound never rests
    -- on when a lapsed holder learns that its lease is gone: a lapsed run whose row another
    -- statement holds (a heartbeat or settle in flight, skipped above) is counted too. The
    -- ORDER BY is the index's own: it keeps the planner off a LIMITed sequential scan (its row
    -- estimate for one job's running runs is often far too high).
    SELECT count(*) AS n FROM (
        SELECT 1 FROM {runs}
        WHERE job_id = :job_id AND state = 'running'
          AND CAST(:max_running AS integer) IS NOT NULL
          AND id <> ALL(ARRAY(SELECT id FROM lapsed WHERE exhausted))
        ORDER BY lease_expires_at
        LIMIT CAST(:max_running AS integer)
    ) h
), seen AS (
    -- <state>_pkey: the gate's total as this statement's snapshot saw it (0: no gate yet).
    SELECT coalesce((SELECT g.claim_granted FROM {state} g
                     WHERE g.job_id = CAST(:gate_row AS text)), 0) AS total
), room AS (
    -- How many due runs to look for: the most the gate could grant (the cap as this snapshot
    -- counts it; what claims committed since were granted only lowers it).
    SELECT CASE WHEN (SELECT yes FROM paused) THEN 0
        WHEN CAST(:max_running AS integer) IS NULL THEN CAST(:limit AS integer)
        ELSE greatest(least(CAST(:limit AS integer), CAST(:max_running AS integer) - held.n), 0)
        END AS n
    FROM held
)"""

_WALK_LEVELS: Final = """, walk (priority, ids, run_ats, seqs, taken) AS (
    -- <runs>_due_idx, highest priority first (K6): each step finds the next lower priority
    -- level that holds waiting runs (a loose index scan: one entry, the level's last), then
    -- takes that level's due runs in (run_at, seq) order straight off the index, at most the
    -- room still left. The walk stops once the room is filled or no level is left, so a claim
    -- reads about room entries plus two per level it visits (one when every run of the level
    -- is delayed), at any backlog (J3). It starts above every level with nothing taken.
    -- Both scans end with two ranges every run is in, which the planner cannot estimate
    -- (_UNSEEN), so neither is planned as a bitmap scan and a sort under a hold (J20).
    SELECT CAST(32767 AS smallint), CAST('{}' AS text[]), CAST('{}' AS timestamptz[]),
        CAST('{}' AS bigint[]), 0
    UNION ALL
    SELECT level.priority, got.ids, got.run_ats, got.seqs, w.taken + cardinality(got.ids)
    FROM walk w
    CROSS JOIN LATERAL (
        SELECT r.priority FROM {runs} r
        WHERE r.job_id = :job_id AND r.state = 'waiting' AND r.priority < w.priority{unseen_level}
        ORDER BY r.priority DESC
        LIMIT 1
    ) level{floor_join}
    CROSS JOIN LATERAL (
        SELECT coalesce(array_agg(d.id), CAST('{}' AS text[])) AS ids,
            coalesce(array_agg(d.run_at), CAST('{}' AS timestamptz[])) AS run_ats,
            coalesce(array_agg(d.seq), CAST('{}' AS bigint[])) AS seqs
        FROM (
            -- Two LIMITs: the outer one cuts at the room left; the inner one, a constant (the
            -- most a claim asks, MAX_CLAIM_BATCH), only lets the planner see how few rows this
            -- is: an expression LIMIT is costed at a tenth of the level (PostgreSQL would
            -- JIT-compile every claim), a parameter one too in a generic plan (it would plan
            -- every claim afresh at a large backlog). Rows past the room are never locked.
            SELECT * FROM (
                SELECT r.id, r.run_at, r.seq
                FROM {runs} r
                WHERE r.job_id = :job_id AND r.state = 'waiting' AND r.priority = level.priority
                  AND r.run_at <= {now}{floor_cond}{skip_keys_r}{unseen_due}
                ORDER BY r.run_at, r.seq
                LIMIT {claim_batch}
                FOR UPDATE SKIP LOCKED
            ) capped
            LIMIT (SELECT n FROM room) - w.taken
        ) d
    ) got
    WHERE w.taken < (SELECT n FROM room)
)"""

_WALK_DUE: Final = """, due AS (
    SELECT u.id, u.seq, u.run_at, w.priority, 0 AS rank
    FROM walk w, unnest(w.ids, w.run_ats, w.seqs) AS u(id, run_at, seq)
)"""

_FLOOR_JOIN: Final = """
    CROSS JOIN LATERAL (
        -- J19: where this level's walk starts (kernel ClaimFloors): the lowest (run_at, seq)
        -- this backend's previous claim took at this level, from three parallel arrays (one
        -- element per floored level; empty on a full walk, every sweep: from the start).
        SELECT coalesce(max(f.run_at), CAST('-infinity' AS timestamptz)) AS run_at,
            coalesce(max(f.seq), CAST(0 AS bigint)) AS seq
        FROM unnest(CAST(:floor_priorities AS smallint[]), CAST(:floor_run_ats AS timestamptz[]),
            CAST(:floor_seqs AS bigint[])) AS f(priority, run_at, seq)
        WHERE f.priority = level.priority
    ) fl"""

_FLOOR_COND: Final = """
                  -- J19: an index condition of <runs>_due_idx (job_id, priority, run_at, seq):
                  -- the walk starts at the floor, past the entries of runs claimed before it
                  -- (dead but kept while an MVCC horizon is held), not at the level's start.
                  AND (r.run_at, r.seq) >= (fl.run_at, fl.seq)"""

_WALK: Final = (
    _WALK_LEVELS.replace("{floor_join}", _FLOOR_JOIN).replace("{floor_cond}", _FLOOR_COND)
    + _WALK_DUE
)
"""K6's priority walk with J19's floor (CLAIM_UNCAPPED, CLAIM_GATED and their keyed forms)."""

_EFFECTIVE: Final = """CASE WHEN {p} >= CAST(:aging_ceiling AS integer) THEN CAST({p} AS integer)
        ELSE CAST(least(CAST(:aging_ceiling AS integer), {p} + CAST(:aging_step AS integer)
            * floor(extract(epoch FROM {now} - {run_at}) * 1000000
                    / CAST(:aging_every_us AS bigint))) AS integer) END"""
"""F10, kernel ``effective_priority``: ``min(ceiling, p + step * (wait // every))`` below the
ceiling, on whole microseconds (``extract(epoch ...)`` is exact numeric)."""

_AGED_WALK: Final = """, aged (priority, ids, run_ats, seqs) AS (
    -- F10, <runs>_due_idx: the bounded second seek. The walk above took the room's worth by
    -- stored priority and stopped at level s (its lowest, filled); every run it took has an
    -- effective priority of at least s. A run of a lower level q can only go before one of
    -- them once it has aged to s (ties go by run_at), i.e. waited ceil((s - q) / step) * every
    -- (never, when the ceiling is below s): on each lower level (one loose-index probe) this
    -- seeks only those runs, oldest first (they are the level's most aged), at most the room.
    -- So a claim reads, beside the walk's, at most room entries per lower level whose oldest
    -- runs have aged up to s, and one or two per lower level (21 levels at most, K6). It runs
    -- only when the walk filled the room (else the walk already has every due run).
    SELECT CAST(min(w.priority) AS smallint), CAST('{}' AS text[]),
        CAST('{}' AS timestamptz[]), CAST('{}' AS bigint[])
    FROM walk w
    HAVING max(w.taken) >= (SELECT n FROM room) AND (SELECT n FROM room) > 0
       AND min(w.priority) <= CAST(:aging_ceiling AS integer)
    UNION ALL
    SELECT level.priority, got.ids, got.run_ats, got.seqs
    FROM aged a
    CROSS JOIN LATERAL (
        SELECT r.priority FROM {runs} r
        WHERE r.job_id = :job_id AND r.state = 'waiting' AND r.priority < a.priority{unseen_level}
        ORDER BY r.priority DESC
        LIMIT 1
    ) level
    CROSS JOIN LATERAL (
        SELECT coalesce(array_agg(d.id), CAST('{}' AS text[])) AS ids,
            coalesce(array_agg(d.run_at), CAST('{}' AS timestamptz[])) AS run_ats,
            coalesce(array_agg(d.seq), CAST('{}' AS bigint[])) AS seqs
        FROM (
            SELECT * FROM (
                SELECT r.id, r.run_at, r.seq
                FROM {runs} r
                WHERE r.job_id = :job_id AND r.state = 'waiting' AND r.priority = level.priority
                  AND r.run_at <= {now} - CAST(ceil(
                        ((SELECT min(w.priority) FROM walk w) - level.priority)
                        / CAST(:aging_step AS numeric)) AS bigint)
                      * CAST(:aging_every_us AS bigint) * interval '1 microsecond'
                  {skip_keys_r}{unseen_due}
                ORDER BY r.run_at, r.seq
                LIMIT {claim_batch}
                FOR UPDATE SKIP LOCKED
            ) capped
            LIMIT (SELECT n FROM room)
        ) d
    ) got
), due AS (
    -- F10: the walk's runs and the aged ones, each with its effective priority, the room's
    -- worth by (effective priority DESC, run_at, seq): a small sort of at most the room per
    -- level visited. Candidates it drops stay locked until COMMIT, as the walk's do.
    SELECT * FROM (
        SELECT u.id, u.seq, u.run_at, {effective_u} AS priority, 0 AS rank
        FROM (SELECT * FROM walk UNION ALL SELECT priority, ids, run_ats, seqs, 0 FROM aged) w,
            unnest(w.ids, w.run_ats, w.seqs) AS u(id, run_at, seq)
    ) e
    ORDER BY e.priority DESC, e.run_at, e.seq
    LIMIT (SELECT n FROM room)
)"""

_AGED: Final = _WALK_LEVELS.replace("{floor_join}", "").replace(
    "{floor_cond}", ""
) + _AGED_WALK.replace(
    "{effective_u}", _EFFECTIVE.replace("{p}", "w.priority").replace("{run_at}", "u.run_at")
)
"""F10: the priority walk, then the aged seek, due runs by effective priority."""

_DUE_COUNT: Final = """(SELECT count(*) FROM (SELECT 1 FROM (
            SELECT 1 FROM {runs} r
            WHERE r.job_id = :job_id AND r.state = 'waiting' AND {match}
              AND r.run_at <= {now}
            ORDER BY r.tenant_id, r.run_at
            LIMIT {claim_batch}) b
            LIMIT {up_to}) c)"""
"""<runs>_tenant_idx: one partition's due runs, counted up to ``{up_to}`` (index-only, bounded).
Two LIMITs: the constant inner one is what the planner sees, the outer one stops the count. The
partitioned walk's count (``_PART_WALK_STEPS``) and the shares' counts (``_counted``) are this."""


def _due_count(match: str, up_to: str) -> str:
    """:data:`_DUE_COUNT` of the partition ``match`` selects (``r.tenant_id = x.tenant``, or
    ``r.tenant_id IS NULL``: the untenanted runs), up to ``up_to``."""
    return _DUE_COUNT.replace("{match}", match).replace("{up_to}", up_to)


def _counted(allowed: str) -> str:
    """F2, F8/F9: each visited partition's due runs counted for the water-filling, as the
    kernel's ``counted_for_shares`` counts them (issue 35 item 4). ``allowed``: the visited
    partitions (``tenant``, ``k``) with ``n``, what their limits allow (at most the limit)."""
    return (
        """, weighed AS (
    SELECT a.tenant, a.k, a.n, coalesce(w.weight, CAST(:default_weight AS integer)) AS weight
    FROM {allowed} a
    LEFT JOIN unnest(CAST(:weight_tenants AS text[]), CAST(:weights AS integer[]))
        AS w(tenant, weight) ON w.tenant = a.tenant
), firsts AS MATERIALIZED (
    -- Each partition's due runs counted up to an equal share of the room, rounded up, plus one
    -- (``top``, when the partitions whose limits allow any run have one weight; else one more
    -- than its limits allow: whole, as before): at most the room plus two entries a
    -- partition. A count that reaches ``top`` says the partition holds more than its share.
    -- The untenanted runs (one partition, the NULL tenant) are counted whole, up to what
    -- their limits allow (``c``).
    SELECT x.*, CASE WHEN x.tenant IS NULL THEN {untenanted} ELSE {first} END AS c
    FROM (SELECT e.*, CASE WHEN v.same THEN ((SELECT n FROM room) + v.v - 1) / v.v + 1
            ELSE e.n + 1 END AS top
          FROM weighed e,
            (SELECT count(*) AS v, min(weight) = max(weight) AS same FROM weighed WHERE n > 0) v
         ) x
), counted AS MATERIALIZED (
    -- Only when those counts fall short of the room: the partitions that hold more than their
    -- share counted again, each up to ``top`` plus the room the counts left (no partition's
    -- share can be more). MATERIALIZED: inlined into ``ordered``, each count ran once per use
    -- of due_n there (three times).
    SELECT f.tenant, f.k, f.weight, CASE
        WHEN f.c < f.top OR s.spare <= 0 THEN least(f.c, f.top)
        WHEN f.tenant IS NULL THEN least(f.c, f.top + s.spare)
        ELSE {again} END AS due_n
    FROM firsts f, (SELECT (SELECT n FROM room) - sum(least(c, top)) AS spare FROM firsts) s
)""".replace("{allowed}", allowed)
        .replace("{untenanted}", _due_count("r.tenant_id IS NULL", "x.n"))
        .replace("{first}", _due_count("r.tenant_id = x.tenant", "least(x.n, x.top)"))
        .replace("{again}", _due_count("r.tenant_id = f.tenant", "least(f.n, f.top + s.spare)"))
    )


_FAIR_WALK: Final = (
    """, tenant_walk (tenant, wrapped, k) AS (
    -- F2, <runs>_tenant_idx (job_id, tenant_id, run_at, seq), waiting runs: the tenants that
    -- have waiting runs, by a loose index scan (one entry per tenant), starting after the
    -- tenant where this backend's last fair claim of the job stopped (:after_tenant) and
    -- wrapping round once, at most :max_tenants of them.
    SELECT CAST(NULL AS text), false, 0
    UNION ALL
    SELECT nxt.tenant, nxt.wrapped, w.k + 1
    FROM tenant_walk w
    CROSS JOIN LATERAL (
        SELECT * FROM (
            SELECT * FROM (
                SELECT r.tenant_id AS tenant, false AS wrapped FROM {runs} r
                WHERE r.job_id = :job_id AND r.state = 'waiting' AND NOT w.wrapped
                  AND r.tenant_id > coalesce(w.tenant, CAST(:after_tenant AS text), '')
                ORDER BY r.tenant_id
                LIMIT 1
            ) onward
            UNION ALL
            SELECT * FROM (
                SELECT r.tenant_id AS tenant, true AS wrapped FROM {runs} r
                WHERE r.job_id = :job_id AND r.state = 'waiting'
                  AND CAST(:after_tenant AS text) IS NOT NULL
                  AND r.tenant_id > CASE WHEN w.wrapped THEN w.tenant ELSE '' END
                  AND r.tenant_id <= CAST(:after_tenant AS text)
                ORDER BY r.tenant_id
                LIMIT 1
            ) round
        ) candidates
        LIMIT 1
    ) nxt
    WHERE w.k < CAST(:max_tenants AS integer) AND NOT (SELECT yes FROM paused)
), tenants AS (
    -- The tenants found, and the untenanted runs as one more (tenant NULL), with weights.
    SELECT t.tenant, t.k FROM tenant_walk t WHERE t.k > 0
    UNION ALL
    SELECT NULL, 0
    WHERE NOT (SELECT yes FROM paused) AND (
        -- One probe; the ORDER BY is the index's, which keeps the planner off a sequential
        -- scan that would read the whole table when no untenanted run is due.
        SELECT r.run_at FROM {runs} r
        WHERE r.job_id = :job_id AND r.state = 'waiting' AND r.tenant_id IS NULL
          AND r.run_at <= {now}
        ORDER BY r.tenant_id, r.run_at
        LIMIT 1) IS NOT NULL
)"""  # noqa: S608 - constant text
    + _counted("(SELECT t.tenant, t.k, CAST(:limit AS integer) AS n FROM tenants t)")
    + """, ordered AS (
    -- Water-filling (kernel: fair_shares): tenants with the fewest due runs per weight first,
    -- each given at most its weighted share of the room still left, the rest passed on.
    SELECT c.*, row_number() OVER (
            ORDER BY CAST(c.due_n AS double precision) / c.weight, c.k) AS i,
        sum(c.weight) OVER () AS total_weight
    FROM counted c
    WHERE c.due_n > 0
), lined AS (
    -- The ordered partitions as arrays, so each water-filling step finds its row by position:
    -- a join of each step to ``ordered`` scanned every visited partition per step (the
    -- square of the partitions visited).
    SELECT count(*) AS n, coalesce(max(o.total_weight), 0) AS total_weight,
        array_agg(CAST(o.due_n AS bigint) ORDER BY o.i) AS due_n,
        array_agg(CAST(o.weight AS bigint) ORDER BY o.i) AS weight
    FROM ordered o
), steps (i, left_room, left_weight, share) AS (
    SELECT CAST(0 AS bigint), CAST((SELECT n FROM room) AS bigint),
        CAST((SELECT total_weight FROM lined) AS bigint), CAST(0 AS bigint)
    UNION ALL
    SELECT s.i + 1, s.left_room - g.share, s.left_weight - l.weight[s.i + 1], g.share
    FROM steps s
    CROSS JOIN lined l
    CROSS JOIN LATERAL (
        SELECT least(l.due_n[s.i + 1],
            CAST(ceil(s.left_room * l.weight[s.i + 1] / CAST(s.left_weight AS numeric))
                AS bigint),
            s.left_room) AS share
    ) g
    WHERE s.i < l.n
), shares AS (
    -- Each step with its partition, joined once on its position.
    SELECT s.i, s.left_room, s.left_weight, o.tenant, s.share
    FROM steps s
    JOIN ordered o ON o.i = s.i
), due AS (
    -- <runs>_tenant_idx: each tenant's oldest due runs, its share of them, in due order
    -- (rank: its place in the tenant's share, so a gate that grants less cuts every tenant
    -- alike). The inner LIMIT is a constant so the planner sees how few rows this is (as
    -- the walk's).
    SELECT d.id, d.seq, d.run_at, d.priority,
        row_number() OVER (PARTITION BY s.i ORDER BY d.run_at, d.seq) AS rank
    FROM shares s
    CROSS JOIN LATERAL (
        SELECT * FROM (
            SELECT * FROM (
                SELECT r.id, r.seq, r.run_at, r.priority FROM {runs} r
                WHERE r.job_id = :job_id AND r.state = 'waiting' AND s.tenant IS NOT NULL
                  AND r.tenant_id = s.tenant AND r.run_at <= {now}{skip_keys_r}
                ORDER BY r.tenant_id, r.run_at, r.seq
                LIMIT {claim_batch}
                FOR UPDATE SKIP LOCKED
            ) named
            UNION ALL
            SELECT * FROM (
                SELECT r.id, r.seq, r.run_at, r.priority FROM {runs} r
                WHERE r.job_id = :job_id AND r.state = 'waiting' AND s.tenant IS NULL
                  AND r.tenant_id IS NULL AND r.run_at <= {now}{skip_keys_r}
                ORDER BY r.tenant_id, r.run_at, r.seq
                LIMIT {claim_batch}
                FOR UPDATE SKIP LOCKED
            ) untenanted
        ) taken
        LIMIT s.share
    ) d
    WHERE s.i > 0 AND s.share > 0
)"""
)

_PICK_UNGATED: Final = """, picked AS (
    -- The small outer sort: retakable lapsed runs and the due runs (at most room) together by
    -- (priority DESC, run_at, seq), at most limit of them. Rows the scans locked and this
    -- limit dropped stay locked until COMMIT, which is why a claim is its own short transaction.
    SELECT c.id FROM (
        SELECT id, seq, run_at, priority, 0 AS rank FROM lapsed
        WHERE NOT exhausted{skip_keys}
        UNION ALL
        SELECT id, seq, run_at, priority, rank FROM due
    ) c
    ORDER BY c.rank, c.priority DESC, c.run_at, c.seq
    LIMIT CAST(:limit AS integer)
)"""

_DELTA: Final = """(CASE WHEN coalesce(g.claim_granted, 0) >= (SELECT total FROM seen)
            THEN coalesce(g.claim_granted, 0) - (SELECT total FROM seen)
            ELSE coalesce(g.claim_granted, 0) END)"""
"""Due runs granted by the claims committed since this statement's snapshot (``g``: the gate's
newest version). A total below the one the snapshot saw means the row was deleted and made again
meanwhile: then all of it is counted."""

_T: Final = """greatest({now}, coalesce(g.rate_at[cardinality(g.rate_at)], {now}))"""
"""The claim's start time on the gate (F3): never before the last one recorded."""

_WINDOW: Final = """unnest(g.rate_at, g.rate_n) AS u(at, n)
            WHERE u.at > {t} - CAST(:rate_period AS double precision) * interval '1 second'"""
"""The starts recorded in the window ending at the claim's time."""

_RATE_ROOM: Final = """(CASE WHEN CAST(:rate_limit AS integer) IS NULL THEN CAST(:limit AS integer)
            ELSE CAST(:rate_limit AS integer)
                - coalesce((SELECT sum(u.n) FROM {window}), 0) END)"""

_DUE_GRANT: Final = """greatest(least((SELECT due_n FROM found),
            CASE WHEN CAST(:max_running AS integer) IS NULL THEN CAST(:limit AS integer)
                 ELSE CAST(:max_running AS integer) - (SELECT n FROM held) - {delta} END,
            {rate_room}), 0)"""
"""The due runs a gated claim may start: what it found, what the cap leaves, what the rate
leaves."""

_TOTAL: Final = """greatest(least(CAST(:limit AS integer),
            (SELECT lapsed_n FROM found) + {due_grant}, {rate_room}), 0)"""
"""Every run a rate-limited claim starts: lapsed ones it retakes and due ones, within the rate."""

_PICK_GATED: Final = """, found AS (
    -- The candidates this statement holds (locked, so whatever is granted is claimed).
    SELECT (SELECT count(*) FROM due) AS due_n,
        (SELECT count(*) FROM lapsed WHERE NOT exhausted
          {skip_keys}) AS lapsed_n
), gate AS (
    -- <state>_pkey, F1/F3: the job's claim gate. The upsert locks the row (gated claimers of
    -- the job take turns for this statement only) and reads its newest version. A new gate
    -- starts at nothing granted and grants nothing (the backend claims again at once).
    INSERT INTO {state} AS g (job_id, claim_granted, claim_grant, updated_at)
    VALUES (CAST(:gate_row AS text), 0, 0, {now})
    ON CONFLICT (job_id) DO UPDATE SET
        claim_grant = {due_grant},
        claim_granted = coalesce(g.claim_granted, 0) + {due_grant},
        -- F3: the pairs still in the window, then this claim's (its count may be 0: RETURNING
        -- reads this claim's count and time there).
        rate_at = CASE WHEN CAST(:rate_limit AS integer) IS NULL THEN NULL
            ELSE ARRAY(SELECT u.at FROM {window} ORDER BY u.at) || {t} END,
        rate_n = CASE WHEN CAST(:rate_limit AS integer) IS NULL THEN NULL
            ELSE ARRAY(SELECT u.n FROM {window} ORDER BY u.at) || {total} END,
        updated_at = {now}
    WHERE NOT (SELECT yes FROM paused)
    RETURNING g.claim_grant AS due_n,
        CASE WHEN CAST(:rate_limit AS integer) IS NULL
            THEN least(CAST(:limit AS integer), (SELECT lapsed_n FROM found) + g.claim_grant)
            ELSE g.rate_n[cardinality(g.rate_n)] END AS total_n,
        g.rate_at[cardinality(g.rate_at)] AS started_at,
        -- F3: the window is full: seconds until its oldest start leaves it.
        CASE WHEN CAST(:rate_limit AS integer) IS NOT NULL
              AND (SELECT sum(n) FROM unnest(g.rate_n) n) >= CAST(:rate_limit AS integer)
            THEN extract(epoch FROM (SELECT min(u.at) FROM unnest(g.rate_at, g.rate_n) u(at, n)
                                     WHERE u.n > 0)
                 + CAST(:rate_period AS double precision) * interval '1 second'
                 - g.rate_at[cardinality(g.rate_at)])
            END AS rate_wait,
        -- xmax 0: the row was inserted, not updated (a new gate).
        g.xmax = 0 AS created
), picked AS (
    -- The small outer sort: retakable lapsed runs and the due runs the gate granted together
    -- by (priority DESC, run_at, seq), at most what the gate allows. Rows the scans locked and
    -- this limit dropped stay locked until COMMIT, which is why a claim is its own short
    -- transaction.
    SELECT c.id FROM (
        SELECT id, seq, run_at, priority, 0 AS rank FROM lapsed
        WHERE NOT exhausted{skip_keys}
        UNION ALL
        SELECT * FROM (
            SELECT id, seq, run_at, priority, rank FROM due
            ORDER BY rank, priority DESC, run_at, seq
            LIMIT coalesce((SELECT due_n FROM gate), 0)
        ) granted
    ) c
    ORDER BY c.rank, c.priority DESC, c.run_at, c.seq
    LIMIT coalesce((SELECT total_n FROM gate), 0)
)"""

_CLAIM_TAIL: Final = """, buried AS (
    -- <runs>_pkey. A lease that lapsed on the final attempt is dead-lettered, not retried
    -- forever (J6), whether or not this claim has room, and so is one whose lapse is the
    -- :max_lapses-th in a row (J15: a crash loop, with its own error, attempts left or not);
    -- the lapsed attempt is its last history entry, and the claim returns the run so the
    -- runtime reports and counts it (J10). A cancel-requested one is cancelled instead,
    -- whatever attempts it has left (K2), and not returned: it is no dead letter, and nobody
    -- is left to tell. Each is one more lapse (J15); SET reads the row before it.
    UPDATE {runs} r
    SET state = CASE WHEN r.cancel_requested_at IS NULL THEN 'dead' ELSE 'cancelled' END,
        finished_at = {now}, updated_at = {now}, lease_expires_at = NULL, claimed_by = NULL,
        lapses = r.lapses + 1, consecutive_lapses = r.consecutive_lapses + 1,
        last_error = CASE WHEN r.cancel_requested_at IS NOT NULL THEN CAST(:cancel_lapsed AS text)
            WHEN r.consecutive_lapses + 1 >= CAST(:max_lapses AS integer)
            THEN CAST(:crash_loop AS text)
            ELSE CAST(:lapsed_final AS text) END,
        -- One entry, its error last_error's (J18: with the lapsed attempt's start and worker).
        history = r.history || jsonb_build_array(jsonb_build_object(
            'attempt', r.attempt, 'at', {at}, 'error', CASE
                WHEN r.cancel_requested_at IS NOT NULL THEN CAST(:cancel_lapsed AS text)
                WHEN r.consecutive_lapses + 1 >= CAST(:max_lapses AS integer)
                THEN CAST(:crash_loop AS text) ELSE CAST(:lapsed_final AS text) END,
            'kind', CASE WHEN r.cancel_requested_at IS NULL THEN 'lapsed' ELSE 'cancelled' END,
            'started', {began}, 'worker', r.claimed_by))
    WHERE r.id = ANY(ARRAY(SELECT id FROM lapsed WHERE exhausted))
    RETURNING r.id, r.attempt, r.key, r.state, r.parent_id, r.lapses, r.consecutive_lapses
), claimed AS (
    -- <runs>_pkey. A new fencing token per claim: strictly above the row's previous one (so
    -- never equal to any earlier holder's) plus a random step (so a deleted and re-inserted
    -- durable id does not repeat a token either). A retaken run (it was running: its lease
    -- lapsed) records the lapsed attempt in its history (J6) and one more lapse (J15); SET
    -- reads the row before it.
    UPDATE {runs} r
    SET state = 'running', attempt = r.attempt + 1,
        lapses = CASE WHEN r.state = 'running' THEN r.lapses + 1 ELSE r.lapses END,
        consecutive_lapses = CASE WHEN r.state = 'running'
            THEN r.consecutive_lapses + 1 ELSE r.consecutive_lapses END,
        lease_token = coalesce(r.lease_token, 0) + 1 + CAST(floor(random() * 1048576) AS bigint),
        lease_expires_at = {now} + CAST(:lease AS double precision) * interval '1 second',
        claimed_by = CAST(:worker AS text), updated_at = {started},
        last_error = CASE WHEN r.state = 'running' THEN CAST(:lapsed AS text)
                          ELSE r.last_error END,
        history = CASE WHEN r.state = 'running'
            THEN r.history || jsonb_build_array(jsonb_build_object(
                'attempt', r.attempt, 'at', {at}, 'error', CAST(:lapsed AS text),
                'kind', 'lapsed', 'started', {began}, 'worker', r.claimed_by))
            ELSE r.history END
    WHERE r.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING r.id, r.payload, r.attempt, r.max_attempts, r.lease_token, r.key,
        r.lease_expires_at, r.created_at, r.run_at, r.seq, r.priority, r.trace_context,
        r.snoozes, r.tenant_id, r.lapses, r.consecutive_lapses,
        r.id = ANY(ARRAY(SELECT id FROM lapsed)) AS retaken, r.handler_version
)
SELECT c.id, c.payload, c.attempt, c.max_attempts, c.lease_token, c.key, c.lease_expires_at,
    c.created_at, c.run_at, c.seq, c.priority, c.trace_context, c.snoozes, c.tenant_id,
    0 AS kind,
    CAST(NULL AS double precision) AS rate_wait, false AS created, CAST(NULL AS text) AS parent_id,
    c.lapses, c.consecutive_lapses, c.retaken, c.handler_version
FROM claimed c
UNION ALL
-- Kind 1: dead-lettered (reported, counted); kind 4: cancelled, returned only when a workflow
-- run is its parent, which the backend wakes (D5) once this claim committed.
SELECT b.id, NULL, b.attempt, NULL, NULL, b.key, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, CASE WHEN b.state = 'dead' THEN 1 ELSE 4 END, NULL, false, b.parent_id,
    b.lapses, b.consecutive_lapses, NULL, NULL
FROM buried b
WHERE b.state = 'dead' OR b.parent_id IS NOT NULL{gate_row}{fair_row}
{lapsed_row}
ORDER BY kind, priority DESC, run_at, seq
"""

_LAPSED_ROW: Final = """
UNION ALL
-- Kind 5 (J19 for J6, kernel lapsed_probe_complete): the lapsed probe was not complete: it
-- hit its limit, found runs this claim neither retook nor buried, or the job is paused; the
-- backend's next probe starts where this one did.
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 5,
    NULL, false, NULL, NULL, NULL, NULL, NULL
FROM lapsed
HAVING count(*) >= CAST(:lapsed_limit AS integer) OR (SELECT yes FROM paused)
    OR count(*) > (SELECT count(*) FROM claimed WHERE retaken) + (SELECT count(*) FROM buried)"""
"""The claim tail's kind 5 row, in every claim but the partitioned ones (whose lapsed probe
always starts from the start: they pass no ``:lapsed_window``, so they report no floor)."""

CLAIM_COLUMNS: Final = (
    "id",
    "payload",
    "attempt",
    "max_attempts",
    "lease_token",
    "key",
    "lease_expires_at",
    "created_at",
    "run_at",
    "seq",
    "priority",
    "trace_context",
    "snoozes",
    "tenant_id",
    "kind",
    "rate_wait",
    "created",
    "parent_id",
    "lapses",
    "consecutive_lapses",
    "retaken",
    "handler_version",
)
"""The columns of every claim statement's rows, in this order (``_CLAIM_TAIL``'s select list):
the backend reads a claim's rows by position, since looking a SQLAlchemy row's columns up by
name cost about a microsecond each (13 µs a claimed run, a fifth of a noop run's CPU). A test
holds the four statements to this order."""

_GATE_ROW: Final = """
UNION ALL
-- F3/F1: the gate's answer, one row: how long the rate keeps the job full, whether it is new.
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, 2, CAST(g.rate_wait AS double precision), g.created, NULL, NULL, NULL, NULL, NULL
FROM gate g
WHERE g.rate_wait IS NOT NULL OR g.created"""

_EXPAND: Final = (
    ("{due_grant}", _DUE_GRANT),
    ("{total}", _TOTAL),
    ("{due_grant}", _DUE_GRANT),
    ("{rate_room}", _RATE_ROOM),
    ("{delta}", _DELTA),
    ("{window}", _WINDOW),
    ("{t}", _T),
)
"""Fragment expansions of the gated claim, outermost first (``{now}`` and the tables are
:class:`~ship_sqla._sql.Statements`')."""


def _expanded(template: str) -> str:
    for name, fragment in _EXPAND:
        template = template.replace(name, fragment)
    return template


_FAIR_ROW: Final = """
UNION ALL
-- F2: the walk stopped at max_tenants: the tenant where the next fair claim starts after.
SELECT (SELECT t.tenant FROM tenant_walk t WHERE t.k = CAST(:max_tenants AS integer)), NULL,
    NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 3, NULL, false,
    NULL, NULL, NULL, NULL, NULL
WHERE EXISTS (SELECT 1 FROM tenant_walk t WHERE t.k = CAST(:max_tenants AS integer))"""


def _tail(*, started: str, gate_row: str, walk: str) -> str:
    fair_row = _FAIR_ROW if walk is _FAIR_WALK else ""
    return (
        _CLAIM_TAIL.replace("{started}", started)
        .replace("{gate_row}", gate_row)
        .replace("{fair_row}", fair_row)
        .replace("{lapsed_row}", _LAPSED_ROW)
    )


_UNSEEN_LEVEL: Final = """
          AND r.priority >= (SELECT -32768)"""
_UNSEEN_DUE: Final = """
          AND r.run_at >= (SELECT CAST('-infinity' AS timestamptz))"""
_UNSEEN: Final = """
          AND r.seq BETWEEN (SELECT CAST(-9e18 AS bigint)) AND (SELECT CAST(9e18 AS bigint))"""
"""J20 under a held snapshot: each scan of the priority walk and of the aged seek gets two
ranges that every run is in, on ``<runs>_due_idx``'s columns, whose bounds are uncorrelated
subqueries (InitPlans: their values are never seen by the planner, in custom and generic plans
alike). The first completes a range the scan already has on the column its start and stop are
placed on (the level probe's ``priority < w.priority``: ``_UNSEEN_LEVEL``; the due runs'
``run_at <= now``: ``_UNSEEN_DUE``), the second is on ``seq`` (``_UNSEEN``: +-9e18, so an
explicit seq of either sign a caller gave its insert is in it too). The rows returned
and the entries read are the same (index conditions each entry already passes; the J19 floor's
row comparison still places the start), one statement, no setting.

PostgreSQL prices a range with an unknown bound at 0.5 % (``DEFAULT_RANGE_INEQ_SEL``), so the
scan's index selectivity is 40,000 times smaller. That is what an ANALYZE under a held snapshot
needs: it counts the rows the hold keeps as dead, so the table is a few live rows on many pages
and the walk's range is estimated at one row; an ordered index scan is then charged, for the
index's correlation, a sequential read of its selectivity's share of the heap's pages
(``cost_index``'s ``min_IO_cost``: ``ceil(selectivity x pages)``) while a bitmap scan of one row
is charged one page, and a Bitmap Heap Scan plus a Sort of "one row" won (reading every entry
in range, the hold's dead ones included; BENCHMARKS.md, "Issue 39 follow-up 5"). At 1/40,000
that share is one page for heaps up to 40,000 pages (320 MB; more where the scan's other
conditions are unknown too, as the floor's row comparison is; measured: no flip at 17,000
pages, 1,000,000 runs dead to the hold), and an index scan of one row costs less than a bitmap
scan and a sort of it. Where more rows are estimated, the LIMITs charge the ordered scan only
for what it returns, as before: the level probe's LIMIT 1, the due runs' outer LIMIT (an
expression: a tenth of its input). The first range being on the start/stop column, the index's
own cost estimate (its entries in range) shrinks with the rows estimate, so that discount
holds at a large backlog too (test_job_claim_plan, test_job_aging_explain)."""


_SKIP_KEYS: Final = " AND ({key} IS NULL OR {key} <> ALL(CAST(:exclude_keys AS text[])))"
"""J4: leave the runs whose single-runner key this process runs (``:exclude_keys``)."""


def _finished(template: str, *, keyed: bool) -> str:
    """``template`` with the claim's size bound (MAX_CLAIM_BATCH) and, ``keyed``, the J4 key
    filters; unkeyed (the request excludes no key) it has none, so the planner's estimates do
    not depend on an array it cannot see in a generic plan."""
    skip, skip_r = "", ""
    if keyed:
        skip = _SKIP_KEYS.replace("{key}", "key")
        skip_r = "\n                 " + _SKIP_KEYS.replace("{key}", "r.key")
    return (
        template.replace("{claim_batch}", str(MAX_CLAIM_BATCH))
        .replace("{unseen_level}", _UNSEEN_LEVEL + _UNSEEN)
        .replace("{unseen_due}", _UNSEEN_DUE + _UNSEEN)
        .replace("{skip_keys_r}", skip_r)
        .replace("{skip_keys}", skip)
    )


def _ungated(walk: str, *, keyed: bool = False) -> str:
    return _finished(
        _HEAD
        + _ROOM_UNGATED
        + walk
        + _PICK_UNGATED
        + _tail(started="{now}", gate_row="", walk=walk),
        keyed=keyed,
    )


def _gated(walk: str, *, keyed: bool = False) -> str:
    return _finished(
        _expanded(
            _HEAD
            + _ROOM_GATED
            + walk
            + _PICK_GATED
            + _tail(
                started="coalesce((SELECT started_at FROM gate), {now})",
                gate_row=_GATE_ROW,
                walk=walk,
            )
        ),
        keyed=keyed,
    )


CLAIM_UNCAPPED: Final = Template(_ungated(_WALK), claim_clock=True)
"""Claim up to ``limit`` runs of one job with no cap and no rate limit (J3, J6, K6): lapsed
leases retaken, due runs by ``(priority DESC, run_at, seq)`` (higher priority first, then due
time, then creation order), the room being the limit.

Ordered index scans (lapsed leases; per priority level, highest first, the due runs: the walk
stops as soon as it has the room's worth) then a small outer sort, so a claim costs the same at
any backlog: about ``limit`` index entries plus two per priority level it visits; one
``state IN (...) OR ...`` scan, or one scan ordered by ``priority DESC, run_at``, could not be
served in order past delayed runs. Returns the claimed runs in claim order, ``(priority DESC,
run_at, seq)`` (``kind`` 0), then the runs it dead-lettered (``kind`` 1: id, attempt, key),
and last (every claim template) a ``kind`` 5 row when its lapsed probe was not complete (J19
for J6: the lapsed probe starts ``:lapsed_window`` seconds before now, NULL: from the start)."""

CLAIM_GATED: Final = Template(_gated(_WALK), claim_clock=True)
"""Claim as :data:`CLAIM_UNCAPPED` does, through the job's claim gate (see the module docstring):
never more than ``concurrency.max`` running runs of the job at once, live or lapsed leases
alike, and never more than the rate limit's starts in any window of its period. Heartbeats
refuse a lapsed lease (so its holder stops), but a lapsed run keeps its slot until it is retaken
or buried: counting only live leases would make the bound depend on whether a heartbeat that
began before the lapse commits before or after this claim's snapshot, one run above the cap
when it loses that race. After the claimed and buried rows, at most one ``kind`` 2 row: the
gate's ``rate_wait`` (seconds until the rate lets another run start, when this claim left the
window full) and ``created`` (the gate was made by this claim, which granted nothing)."""

CLAIM_FAIR: Final = Template(_ungated(_FAIR_WALK), claim_clock=True)
"""Claim as :data:`CLAIM_UNCAPPED` does for a job with ``fairness`` (F2): the due runs are shared
out across the tenants that have due runs, by weight, work-conserving (what a tenant with few
due runs leaves goes to the others), each tenant's oldest first, priorities not used. A claim
visits at most ``:max_tenants`` tenants, from the one after where this backend's last fair claim
of the job stopped, so every tenant comes round in turn; each tenant's due runs are counted up
to its share of the room plus one (``_counted``, kernel ``counted_for_shares``), so a claim reads
about ``limit`` entries plus a few per tenant. Index: ``<runs>_tenant_idx``, which a
runs table has only when declared with ``fair_claims=True`` (the backend probes for it first:
``PostgresJobBackend.require_support``)."""

CLAIM_FAIR_GATED: Final = Template(_gated(_FAIR_WALK), claim_clock=True)
""":data:`CLAIM_FAIR` through the job's claim gate (a cap, a rate limit, or both): a gate that
grants less than the claim found cuts every tenant's share alike (by rank in its share)."""

CLAIM_AGED: Final = Template(_ungated(_AGED), claim_clock=True)
"""Claim as :data:`CLAIM_UNCAPPED` does for a job with ``aging`` (F10): due runs by effective
priority (:func:`~ship_sqla.kernel._priority.effective_priority`), then ``run_at``, then
creation order. The priority walk finds the room's worth by stored priority; the aged seek
(``_AGED_WALK``) adds, from each lower level, only the runs that have aged up to where the walk
stopped, so a claim reads about ``limit`` entries plus one or two per level, plus at most
``limit`` per lower level whose oldest runs have aged that far. The rows come back ordered by
stored priority (the output's order; the choice was by effective priority)."""

CLAIM_AGED_GATED: Final = Template(_gated(_AGED), claim_clock=True)
""":data:`CLAIM_AGED` through the job's claim gate (a cap, a rate limit, or both)."""

CLAIM_AGED_KEYED: Final = Template(_ungated(_AGED, keyed=True), claim_clock=True)
CLAIM_AGED_GATED_KEYED: Final = Template(_gated(_AGED, keyed=True), claim_clock=True)
"""The aged claims for a request that excludes single-runner keys (J4)."""

CLAIM_UNCAPPED_KEYED: Final = Template(_ungated(_WALK, keyed=True), claim_clock=True)
CLAIM_GATED_KEYED: Final = Template(_gated(_WALK, keyed=True), claim_clock=True)
CLAIM_FAIR_KEYED: Final = Template(_ungated(_FAIR_WALK, keyed=True), claim_clock=True)
CLAIM_FAIR_GATED_KEYED: Final = Template(_gated(_FAIR_WALK, keyed=True), claim_clock=True)
"""The four claims for a request that excludes single-runner keys (J4: the keys this process
runs): the same statements with the key filter on every scan. Without keys to exclude, the
claims above carry no filter (every run's key passes), so their estimates, custom and generic,
are the same."""


# --- F8/F9: partitioned limits, one gate row per (job, partition) --------------------------------

_PART_GATE_ID: Final = "CAST(:gate_row AS text) || '/' || coalesce({part}, '')"
"""A partition's gate row: ``<job_id>#claim-gate/<tenant>`` (``/`` alone: the untenanted runs;
a tenant is never blank, so no tenant's row is theirs)."""

_PARTS: Final = """, running_n AS MATERIALIZED (
    -- F9, <runs>_running_idx: the running runs of the visited partitions, counted in one scan
    -- (none read without a cap). One scan, not one per partition: on a table analysed with no
    -- run running, every index over running runs looks empty to the planner, and a generic
    -- plan reads a partition's count off <runs>_lease_idx filtered on the partition (the two
    -- cost the same to it, measured again on PostgreSQL 15: a scalar count per partition took
    -- <runs>_lease_idx in its generic plan); per partition, that read every running run of
    -- the job once per partition visited, here once per claim.
    SELECT r.tenant_id AS tenant, count(*) AS n
    FROM {runs} r
    WHERE r.job_id = :job_id AND r.state = 'running'
      AND CAST(:max_running AS integer) IS NOT NULL
      -- The walk's span (it visits partitions in index order, from where the last claim
      -- stopped): an index condition of <runs>_running_idx, so the scan reads the running
      -- runs of the visited partitions (and of the partitions between them that had none
      -- waiting), not every running run of the job; a claim whose walk wrapped round spans
      -- them all. Off <runs>_lease_idx it is a filter that spares most rows the list's.
      AND r.tenant_id BETWEEN (SELECT min(tenant) FROM tenants)
          AND (SELECT max(tenant) FROM tenants)
      AND r.tenant_id = ANY(ARRAY(SELECT w.tenant FROM tenants w WHERE w.tenant IS NOT NULL))
    GROUP BY r.tenant_id
), parts AS MATERIALIZED (
    -- F8/F9: each visited partition's gate as this statement's snapshot saw it (the total it
    -- granted; its starts in the window) and its running runs up to concurrency.max (running_n;
    -- none read without a cap): live or lapsed leases alike, each holding a slot, but the
    -- lapsed runs this claim buries (min(running - the partition's buried ones, max)). The
    -- untenanted runs' count (one partition) is read on its own, up to max plus the buried
    -- ones, index-only. What the partition allows from here is an upper bound of what its
    -- gate grants below.
    -- The gate row is one <state>_pkey lookup per visited partition, in every table state
    -- (J20): the first row from the gate's id on, in the index's order, kept if it is the
    -- gate's. Joined to the state table, the planner hashed a sequential scan of every gate
    -- row ever made (they grow with the partitions ever claimed: 10,000 by the end of a
    -- drain over 10,000 tenants); an equality lookup LIMIT 1 took a sequential scan per
    -- partition in a generic plan made while the table was small (a LIMITed scan looks
    -- cheap), kept as it grew. The ORDER BY is what only the index serves without a sort.
    SELECT t.tenant, t.k, t.gate, coalesce(g.claim_granted, 0) AS seen,
        CASE WHEN CAST(:max_running AS integer) IS NULL THEN 0
             WHEN t.tenant IS NULL THEN least(CAST(:max_running AS integer), (SELECT count(*) FROM (
                SELECT 1 FROM {runs} r
                WHERE r.job_id = :job_id AND r.state = 'running' AND r.tenant_id IS NULL
                ORDER BY r.tenant_id
                LIMIT CAST(:max_running AS integer)
                    + (SELECT count(*) FROM lapsed WHERE exhausted)) h)
                - (SELECT count(*) FROM lapsed l JOIN {runs} r ON r.id = l.id
                   WHERE l.exhausted AND r.tenant_id IS NULL))
             ELSE least(CAST(:max_running AS integer), coalesce(h.n, 0)
                - (SELECT count(*) FROM lapsed l JOIN {runs} r ON r.id = l.id
                   WHERE l.exhausted AND r.tenant_id = t.tenant))
        END AS held,
        CASE WHEN CAST(:rate_limit AS integer) IS NULL THEN 0
             ELSE coalesce((SELECT sum(u.n) FROM unnest(g.rate_at, g.rate_n) AS u(at, n)
                 WHERE u.at > greatest({now}, g.rate_at[cardinality(g.rate_at)])
                     - CAST(:rate_period AS double precision) * interval '1 second'), 0)
        END AS used
    FROM (SELECT w.tenant, w.k, {gate_of_w} AS gate FROM tenants w) t
    LEFT JOIN LATERAL (SELECT * FROM (
        SELECT * FROM {state} g WHERE g.job_id >= t.gate ORDER BY g.job_id LIMIT 1) g
        WHERE g.job_id = t.gate) g ON true
    LEFT JOIN running_n h ON h.tenant = t.tenant
), allowed AS (
    -- What each partition's limits let it take, as this snapshot sees them (at most the limit
    -- asked): max - running, limit - starts in the window.
    SELECT p.tenant, p.k, greatest(least(CAST(:limit AS integer),
            CASE WHEN CAST(:max_running AS integer) IS NULL THEN CAST(:limit AS integer)
                 ELSE CAST(:max_running AS integer) - p.held END,
            CASE WHEN CAST(:rate_limit AS integer) IS NULL THEN CAST(:limit AS integer)
                 ELSE CAST(:rate_limit AS integer) - p.used END), 0) AS n
    FROM parts p
)""" + _counted("allowed")  # noqa: S608 - constant text

_ROOM_PARTITIONED: Final = """, room AS (
    -- F8/F9: the due runs to look for: the limit asked less the lapsed runs this claim may
    -- retake (each a start too), so all it takes fits the runtime's free slots.
    SELECT CASE WHEN (SELECT yes FROM paused) THEN 0
        ELSE greatest(CAST(:limit AS integer)
            - (SELECT count(*) FROM lapsed WHERE NOT exhausted{skip_keys}), 0) END AS n
)"""


_PART_WALK_STEPS: Final = (
    (
        "tenant_walk (tenant, wrapped, k) AS (",
        "tenant_walk (tenant, wrapped, k, due) AS (",
    ),
    (
        "    SELECT CAST(NULL AS text), false, 0\n",
        "    SELECT CAST(NULL AS text), false, 0, CAST(0 AS bigint)\n",
    ),
    (
        "    SELECT nxt.tenant, nxt.wrapped, w.k + 1\n",
        """    -- F8/F9: and each partition's due runs, counted (index-only) up to the room the
    -- partitions before it left: ``due`` is the due runs found so far, at most the room, so
    -- the counts read at most the room's worth of entries in all.
    SELECT nxt.tenant, nxt.wrapped, w.k + 1, w.due + """  # noqa: S608 - constant text
        + _due_count("r.tenant_id = nxt.tenant", "(SELECT n FROM room) - w.due")
        + "\n",
    ),
    (
        "    WHERE w.k < CAST(:max_tenants AS integer) AND NOT (SELECT yes FROM paused)\n",
        """    -- At least :max_tenants partitions (partition_walk), then on while those visited
    -- hold fewer due runs than the room, up to :widest (kernel partition_walk_widest): a
    -- claim over many small partitions fills its room in one statement.
    WHERE (w.k < CAST(:max_tenants AS integer) OR w.k < CAST(:widest AS integer)
            AND w.due < (SELECT n FROM room))
        AND NOT (SELECT yes FROM paused)
""",
    ),
)
"""The partitioned claim's walk (F8/F9) from the fair claim's (F2): it also counts the due
runs it finds, and goes past :max_tenants while they fall short of the claim's room (the
in-memory model's ``_walk``)."""

_PART_CURSOR: Final = """t.k >= CAST(:max_tenants AS integer)
    AND (t.k >= CAST(:widest AS integer) OR t.due >= (SELECT n FROM room))"""
"""The partitioned walk stopped at its width (not for want of partitions): its last row, the
only one that passes (``due`` only grows, and the walk stops at the first row past both)."""


def _part_walk() -> str:
    """The fair claim's walk (F2) over the partitions (the tenants), its due-run counts capped
    by each partition's limits (:data:`_PARTS`), then its water-filling, then each partition's
    due runs, each row carrying its partition (``part``)."""
    walk = _FAIR_WALK
    for fair, partitioned in _PART_WALK_STEPS:
        if fair not in walk:  # the fair walk changed under these replacements
            raise AssertionError(fair)
        walk = walk.replace(fair, partitioned)
    counted = walk.index("), weighed AS (")
    ordered = walk.index("), ordered AS (")
    due = walk.index("), due AS (")
    # The slices start at a CTE's closing parenthesis: _PARTS brings its own.
    head, shares, tail = walk[:counted] + ")", walk[ordered + 1 : due], walk[due:]
    tail = tail.replace(
        "    SELECT d.id, d.seq, d.run_at, d.priority,\n",
        "    SELECT d.id, d.seq, d.run_at, d.priority, s.tenant AS part,\n",
    )
    parts = _PARTS.replace("{gate_of_w}", _PART_GATE_ID.replace("{part}", "w.tenant"))
    return head + parts + shares + tail


_PICK_PARTITIONED: Final = """, cands AS MATERIALIZED (
    -- Every run this statement holds (locked), with its partition: the retakable lapsed runs
    -- (rank 0; <runs>_pkey for each one's tenant) and the due runs of the partitions' shares.
    SELECT l.id, l.seq, l.run_at, l.priority, 0 AS rank,
        (SELECT r.tenant_id FROM {runs} r WHERE r.id = l.id) AS part
    FROM lapsed l
    WHERE NOT exhausted{skip_keys}
    UNION ALL
    SELECT d.id, d.seq, d.run_at, d.priority, d.rank, d.part FROM due d
), found AS MATERIALIZED (
    -- Per partition with candidates: its gate row, its due and lapsed candidates, and what the
    -- snapshot saw of it (a partition with only lapsed runs was not visited: it reads 0, and
    -- is granted no due run).
    -- Counted per partition first, then joined to its walk row by hash (a partition is never
    -- blank, so '' stands for the untenanted runs): IS NOT DISTINCT FROM cannot be hashed, and
    -- a nested loop of every candidate against every partition cost more than the gates.
    SELECT {gate_of_c} AS gate, c.due_n, c.lapsed_n,
        coalesce(p.held, 0) AS held, coalesce(p.seen, 0) AS seen
    FROM (
        SELECT c.part, count(*) FILTER (WHERE c.rank > 0) AS due_n,
            count(*) FILTER (WHERE c.rank = 0) AS lapsed_n
        FROM cands c
        GROUP BY c.part
    ) c
    LEFT JOIN parts p ON coalesce(p.tenant, '') = coalesce(c.part, '')
), gates AS (
    -- <state>_pkey, F8/F9: each partition's claim gate, as the job's gate (F1/F3, CLAIM_GATED)
    -- but one row per partition. The upsert locks the rows in gate order (so concurrent claims
    -- never deadlock) and reads each one's newest version: the cap's room is max - held (this
    -- snapshot) - granted since this snapshot; the rate's, the limit less the starts in the
    -- window ending at the partition's claim time. A partition's first claim makes its row and
    -- grants at once: no claim of the partition committed before it (it would have made the
    -- row, and this insert would have met it), so the snapshot's count is current.
    INSERT INTO {state} AS g (job_id, claim_granted, claim_grant, rate_at, rate_n, updated_at)
    SELECT f.gate, f.due, f.due,
        CASE WHEN CAST(:rate_limit AS integer) IS NULL THEN NULL ELSE ARRAY[{now}] END,
        CASE WHEN CAST(:rate_limit AS integer) IS NULL THEN NULL ELSE ARRAY[{new_total}] END,
        {now}
    FROM (SELECT f.*, {new_due_grant} AS due FROM found f) f
    ORDER BY f.gate
    -- The SET reads the row's newest version (g) and the partition's own candidates (x): the
    -- claim's time t on the gate (never before its last recorded one), the rate's room in the
    -- window ending at t, then the due grant (what the candidates, the cap less what was
    -- granted since this snapshot, and the rate allow), as CLAIM_GATED's gate computes them.
    ON CONFLICT (job_id) DO UPDATE SET
        (claim_grant, claim_granted, rate_at, rate_n, updated_at) = (
        SELECT k.due, coalesce(g.claim_granted, 0) + k.due,
            CASE WHEN CAST(:rate_limit AS integer) IS NULL THEN NULL
                ELSE ARRAY(SELECT u.at FROM unnest(g.rate_at, g.rate_n) AS u(at, n)
                           WHERE u.at > w.since ORDER BY u.at) || w.t END,
            CASE WHEN CAST(:rate_limit AS integer) IS NULL THEN NULL
                ELSE ARRAY(SELECT u.n FROM unnest(g.rate_at, g.rate_n) AS u(at, n)
                           WHERE u.at > w.since ORDER BY u.at)
                    || greatest(least(CAST(:limit AS integer), x.lapsed_n + k.due, w.room), 0)
                END,
            {now}
        FROM found x
        CROSS JOIN LATERAL (
            SELECT greatest({now}, coalesce(g.rate_at[cardinality(g.rate_at)], {now})) AS t
        ) t0
        CROSS JOIN LATERAL (
            SELECT t0.t, t0.t - CAST(:rate_period AS double precision) * interval '1 second'
                AS since
        ) w0
        CROSS JOIN LATERAL (
            SELECT w0.t, w0.since,
                CASE WHEN CAST(:rate_limit AS integer) IS NULL THEN CAST(:limit AS integer)
                     ELSE CAST(:rate_limit AS integer) - coalesce((SELECT sum(u.n)
                         FROM unnest(g.rate_at, g.rate_n) AS u(at, n) WHERE u.at > w0.since), 0)
                END AS room
        ) w
        CROSS JOIN LATERAL (
            SELECT greatest(least(x.due_n,
                CASE WHEN CAST(:max_running AS integer) IS NULL THEN CAST(:limit AS integer)
                     ELSE CAST(:max_running AS integer) - x.held
                         - (CASE WHEN coalesce(g.claim_granted, 0) >= x.seen
                                 THEN coalesce(g.claim_granted, 0) - x.seen
                                 ELSE coalesce(g.claim_granted, 0) END) END,
                w.room), 0) AS due
        ) k
        WHERE x.gate = g.job_id)
    -- total_n: every run the partition starts, its lapsed ones and its due grant, within
    -- the rate (F8); none without a rate (NULL): then it is all its lapsed runs and its due
    -- grant, which picked's rank test alone keeps to (a lookup of the partition's row of
    -- found here was a scan of found per gate: the square of the partitions visited).
    RETURNING g.job_id AS gate, g.claim_grant AS due_n, g.rate_n[cardinality(g.rate_n)] AS total_n,
        g.rate_at[cardinality(g.rate_at)] AS started_at,
        -- F8: the partition's window is full: seconds until its oldest start leaves it.
        CASE WHEN CAST(:rate_limit AS integer) IS NOT NULL
              AND (SELECT sum(n) FROM unnest(g.rate_n) n) >= CAST(:rate_limit AS integer)
            THEN extract(epoch FROM (SELECT min(u.at) FROM unnest(g.rate_at, g.rate_n) u(at, n)
                                     WHERE u.n > 0)
                 + CAST(:rate_period AS double precision) * interval '1 second'
                 - g.rate_at[cardinality(g.rate_at)])
            END AS rate_wait
), picked AS (
    -- Per partition, lapsed runs first then its due runs by rank, at most what its gate
    -- granted (due ones: at most its due grant). Rows locked and not picked stay locked until
    -- COMMIT, as in every claim.
    SELECT c.id, c.started_at FROM (
        SELECT c.id, c.rank, c.priority, c.run_at, c.seq, g.due_n, g.total_n, g.started_at,
            -- COLLATE "C": a grouping only (its order is no one's), so the sort compares
            -- bytes, not the database's collation (strcoll per comparison).
            row_number() OVER (
                PARTITION BY c.part COLLATE "C"
                ORDER BY c.rank, c.priority DESC, c.run_at, c.seq) AS place
        FROM cands c
        JOIN gates g ON g.gate = {gate_of_c}
    ) c
    WHERE c.place <= coalesce(c.total_n, c.place) AND c.rank <= c.due_n
    -- At most the limit in all (lapsed runs past it were granted and recorded all the same:
    -- a start not made only narrows its window; they are retaken by a later claim).
    ORDER BY c.rank, c.priority DESC, c.run_at, c.seq
    LIMIT CAST(:limit AS integer)
)"""

_PART_NEW_DUE_GRANT: Final = """greatest(least(f.due_n,
            CASE WHEN CAST(:max_running AS integer) IS NULL THEN CAST(:limit AS integer)
                 ELSE CAST(:max_running AS integer) - f.held END,
            coalesce(CAST(:rate_limit AS integer), CAST(:limit AS integer))), 0)"""
"""A new gate's due grant: what the partition's candidates, its cap and its (empty) window
allow."""

_PART_NEW_TOTAL: Final = """greatest(least(CAST(:limit AS integer), f.lapsed_n + f.due,
            coalesce(CAST(:rate_limit AS integer), CAST(:limit AS integer))), 0)"""

_CLAIMED_WHERE: Final = "    WHERE r.id = ANY(ARRAY(SELECT id FROM picked))\n"
_CLAIMED_FROM_PICKED: Final = "    FROM picked p\n    WHERE r.id = p.id\n"
"""The partitioned claim's ``claimed`` update joins ``picked`` (each run's start time)."""

_PART_GATE_ROW: Final = """
UNION ALL
-- F8: the soonest a full partition's window frees (how long the rate keeps it full).
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, 2, CAST(min(g.rate_wait) AS double precision), false, NULL, NULL, NULL, NULL, NULL
FROM gates g
HAVING min(g.rate_wait) IS NOT NULL"""


def _partitioned(*, keyed: bool = False, by_key: bool = False) -> str:
    """CLAIM_PARTITIONED's text: the claim's head, the partition walk and the partitions'
    gates, the common tail (each claimed run's start time is its partition's). ``by_key``:
    the partition is the run's ``partition_key`` (its indexes ``<runs>_part_idx`` and
    ``<runs>_part_run_idx``), not its tenant."""
    pick = (
        _PICK_PARTITIONED.replace("{new_total}", _PART_NEW_TOTAL)
        .replace("{new_due_grant}", _PART_NEW_DUE_GRANT)
        .replace("{gate_of_c}", _PART_GATE_ID.replace("{part}", "c.part"))
    )
    body = _part_walk() + pick
    if by_key:
        body = (
            body.replace("r.tenant_id", "r.partition_key")
            .replace("_tenant_idx", "_part_idx")
            .replace("_running_idx", "_part_run_idx")
        )
    # Each claimed run's start time is its partition's, carried by ``picked`` and joined once
    # (a lookup of the gates per claimed run was a scan of every gate per run).
    tail = (
        _CLAIM_TAIL.replace(_CLAIMED_WHERE, _CLAIMED_FROM_PICKED)
        .replace("{started}", "coalesce(p.started_at, {now})")
        .replace("{gate_row}", _PART_GATE_ROW)
        .replace(
            "{fair_row}", _FAIR_ROW.replace("t.k = CAST(:max_tenants AS integer)", _PART_CURSOR)
        )
        .replace("{lapsed_row}", "")
    )
    return _finished(_HEAD + _ROOM_PARTITIONED + body + tail, keyed=keyed)


CLAIM_PARTITIONED: Final = Template(_partitioned(), claim_clock=True)
"""F8/F9: claim a job whose ``concurrency.max`` and ``RateLimit`` hold per partition (the
run's tenant): one gate row per partition (``<job_id>#claim-gate/<tenant>``), each exact as the
job's gate is (F1, F3), taken together by the statement's one upsert in gate order.

The claim walks the partitions with waiting runs as a fair claim walks tenants (F2:
``<runs>_tenant_idx``, one entry per partition, at most ``:max_tenants``, from where the last
claim stopped; on past them, up to ``:widest``, while the partitions visited hold fewer due
runs than the room: ``_PART_WALK_STEPS``), counts each one's due runs up to its share of the
room plus one and up to what its limits allow from the snapshot (``_counted``: a partition at
its limit counts none), shares the room out by weight, and takes each share's
oldest due runs; then the gates grant from their newest versions. So its cost is about twice
the room in index entries (the walk's count of the due runs it finds, then the shares) plus a
handful per partition visited (its walk entry, its gate row, its count
and, with a cap, its running runs, counted for every visited partition in one scan of
``<runs>_running_idx``), at any backlog and any number of partitions. After the claimed and
buried rows, at most one ``kind`` 2 row (the soonest a full partition frees, ``rate_wait``)
and one ``kind`` 3 row (the walk's cursor)."""

CLAIM_PARTITIONED_KEYED: Final = Template(_partitioned(keyed=True), claim_clock=True)
""":data:`CLAIM_PARTITIONED` for a request that excludes single-runner keys (J4)."""

CLAIM_PARTITIONED_BY_KEY: Final = Template(_partitioned(by_key=True), claim_clock=True)
""":data:`CLAIM_PARTITIONED` for limits per partition key (``partition="key"``): the partition is
the run's ``partition_key``, read off ``<runs>_part_idx`` and ``<runs>_part_run_idx`` (gate rows
``<job_id>#claim-gate/<key>``)."""

CLAIM_PARTITIONED_BY_KEY_KEYED: Final = Template(
    _partitioned(keyed=True, by_key=True), claim_clock=True
)
""":data:`CLAIM_PARTITIONED_BY_KEY` for a request that excludes single-runner keys (J4)."""
