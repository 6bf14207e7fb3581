"""A bulk preview's count (issue 36 items 1 and 5; J16, S1, S2): how many runs a bulk action by
filter would take, counted in ONE statement, in SQL, up to a stated bound. Rules: see
:mod:`ship_sqla._jobs._sql`.

The walk the action itself takes (:func:`~ship_sqla.kernel._search.act_matching`) reads full
rows page by page and matches them in Python; counting that way read every matching run (up to
100,000) over the wire: 1-3.5 s at 1,000,000 runs. This statement reads the same index ranges
and answers two numbers, ``matched`` and ``scanned``, and ``stopped`` (a branch reached its
bound). One branch per (state, table), each enabled by its ``:<state>`` flag and reading at most
``:scan`` entries of that state's index (``LIMIT`` before any residual filter), its filters in
the SELECT list as one boolean ``hit``, counted with ``FILTER``:

- ``waiting``: ``<runs>_due_idx`` (partial ``r.state = 'waiting'``, leading ``job_id``); the
  time range on ``run_at``; no worker;
- ``running``: ``<runs>_lease_idx`` (partial ``r.state = 'running'``); the time range on the
  lease expiry; the worker is the holder (``claimed_by``);
- ``dead`` in the runs table (an older release's leftovers): ``<runs>_browse_idx``, the
  creation-time range in the index condition; no worker;
- ``dead`` in history (``_EITHER``): the history's dead partition(s) (LIST by state), by
  ``<history>_browse_idx`` (job_id, state, created_at) for one job; the worker is the last
  attempt's (``claimed_by``).

With one job and a tenant (issue 36: at 10,000,000 runs a job had ~200,000 live runs and the
tenant residual read each one's row, 600-750 ms), each live state also has branches on its
tenant index when the runs table has it (``<runs>_tenant_idx`` for waiting runs, declared by
``fair_claims`` or ``partitioned_claims``; ``<runs>_running_idx`` for running runs, by
``partitioned_claims``): the job's and tenant's entries only, ``:scan`` at most, counted
index-only when no other filter is asked, else their rows with the other filters residual.
Which branch runs is a one-time filter (:data:`_SERVED`: a tenant asked and ``to_regclass``
finds the index, its name a parameter the backend gives), so the statement is the same text
for every table and the claim index serves a table without the tenant indexes, as before.

The residual filters say what :meth:`~ship_sqla.kernel._search.RunFilter.matches` says, so
the count and the walk of the action it previews agree: run id, tenant and worker exact;
``error``: the last error contains the text with the letters A-Z in any case and every other
character as written (``lower(... COLLATE "C")`` folds ASCII only, whatever the database's
locale, as the walk's ``str.translate`` does); each ``payload`` field ``payload #> path =
value`` as jsonb (JSON ``true`` is not the number 1, in both).

Two bounds, the walk's own (:func:`~ship_sqla.kernel._search._walk`):

- ``:scan`` index entries in all, not per branch: the branches read in the walk's order (waiting,
  running, dead in the runs table, dead in history), each at most what the ones before it left;
  ``stopped`` when they read ``:scan`` in all.
- Across jobs (no ``:job_id``), the jobs a page across jobs reads (:func:`.browse.loose_jobs`):
  of each state, the first ``:max_jobs`` job ids with runs in it (for ``dead`` with history,
  those of the runs table's leftovers and those of history together, as
  LIST_FINISHED_ALL_JOBS_EITHER reads them). A run of any other job is neither counted nor
  acted on.
"""

from __future__ import annotations

from typing import Final

from ship_sqla._jobs._sql.browse import RUNNING, WAITING, loose_jobs
from ship_sqla._sql import Template

__all__ = [
    "COUNT_MATCHING_ALL_JOBS",
    "COUNT_MATCHING_ALL_JOBS_EITHER",
    "COUNT_MATCHING_OF_JOB",
    "COUNT_MATCHING_OF_JOB_EITHER",
]

_RESIDUAL: Final = """coalesce(
            (CAST(:run_id AS text) IS NULL OR ?.id = CAST(:run_id AS text))
            AND (CAST(:tenant AS text) IS NULL OR ?.tenant_id = CAST(:tenant AS text))
            AND (CAST(:worker AS text) IS NULL OR {worker} = CAST(:worker AS text))
            AND (CAST(:error AS text) IS NULL
                 OR strpos(lower(?.last_error COLLATE "C"),
                           lower(CAST(:error AS text) COLLATE "C")) > 0)
            AND ((CAST(:time_from AS timestamptz) IS NULL AND CAST(:time_to AS timestamptz) IS NULL)
                 OR ({at} >= coalesce(CAST(:time_from AS timestamptz),
                                      CAST('-infinity' AS timestamptz))
                     AND {at} < coalesce(CAST(:time_to AS timestamptz),
                                         CAST('infinity' AS timestamptz))))
            AND NOT EXISTS (
                SELECT 1 FROM jsonb_array_elements(CAST(:payload AS jsonb)) f
                WHERE (?.payload #> ARRAY(SELECT jsonb_array_elements_text(f -> 0)))
                      IS DISTINCT FROM (f -> 1)),
            false)"""
"""Whether a row (alias ``?``) matches the filters no index serves; ``{at}``: the state's own
time, ``{worker}``: the row's worker. ``:payload``: a JSON array of ``[[path...], value]``."""

_CREATED: Final = """
          AND ?.created_at >= coalesce(CAST(:time_from AS timestamptz),
                                       CAST('-infinity' AS timestamptz))
          AND ?.created_at < coalesce(CAST(:time_to AS timestamptz),
                                      CAST('infinity' AS timestamptz))"""

_DEAD: Final = "r.state IN ('completed', 'dead', 'discarded', 'cancelled') AND r.state = 'dead'"
"""``<runs>_browse_idx``'s predicate word for word, then the state."""

_ENDED_JOBS: Final = """ended_jobs(job_id, n) AS (
    -- the history's (job_id, state, finished_at) index, a loose scan over its jobs.
    SELECT (SELECT min(h.job_id) FROM {history} h WHERE h.state = 'dead'), 1
    UNION ALL
    SELECT (SELECT min(h.job_id) FROM {history} h
            WHERE h.state = 'dead' AND h.job_id > j.job_id), j.n + 1
    FROM ended_jobs j
    WHERE j.job_id IS NOT NULL AND j.n < CAST(:max_jobs AS integer)
), dead_jobs(job_id) AS (
    SELECT job_id FROM live_dead_jobs WHERE job_id IS NOT NULL
    UNION
    SELECT job_id FROM ended_jobs WHERE job_id IS NOT NULL
)"""
"""J16: the jobs a page of dead runs across jobs reads: the first ``:max_jobs`` with leftovers
in the runs table and the first ``:max_jobs`` in history (LIST_FINISHED_ALL_JOBS_EITHER)."""


_SERVED: Final = (
    "(CAST(:tenant AS text) IS NOT NULL AND to_regclass(CAST(:{index} AS text)) IS NOT NULL)"
)
"""Whether a live state's tenant index serves this count: a tenant asked, and the runs table
has the index (``:tenant_index``: ``<runs>_tenant_idx``, ``:running_index``:
``<runs>_running_idx``, their names as ``to_regclass`` reads them). Parameters and a stable
function only: the planner makes it a one-time filter, so of a state's branches one runs."""

_ONLY_TENANT: Final = """(CAST(:run_id AS text) IS NULL AND CAST(:worker AS text) IS NULL
          AND CAST(:error AS text) IS NULL AND CAST(:time_from AS timestamptz) IS NULL
          AND CAST(:time_to AS timestamptz) IS NULL
          AND CAST(:payload AS jsonb) = CAST('[]' AS jsonb))"""
"""No filter but the job and the tenant: the tenant index's entries are the matches."""


_TENANT_HIT: Final = (
    """coalesce(CAST(:tenant AS text) IS NULL OR ?.tenant_id = CAST(:tenant AS text), false)"""
)
""":data:`_RESIDUAL` when no filter but the tenant is asked (:data:`_ONLY_TENANT`)."""


def _branch(
    name: str,
    table: str,
    where: str,
    *,
    worker: str,
    at: str,
    jobs: str | None,
    before: tuple[str, ...],
    tenant_index: str | None = None,
) -> str:
    """One (state, table) branch ``name(matched, scanned)``: at most what ``:scan`` leaves after
    the branches ``before`` it, of one job (``jobs`` None) or of the jobs of CTE ``jobs``.
    ``tenant_index`` (a live state's, one job): its rows come from that index instead when it
    serves (:data:`_SERVED`), of the job's and tenant's entries only (:func:`_of_job`)."""
    alias = table[1]
    hit = _RESIDUAL.replace("{worker}", worker).replace("{at}", at).replace("?", alias)
    limit = "CAST(:scan AS integer)"
    if before:
        read = " + ".join(f"(SELECT {b}.scanned FROM {b})" for b in before)  # noqa: S608
        limit = f"greatest({limit} - ({read}), 0)"
    flag = name.split("_", maxsplit=1)[0]
    if jobs is None:
        rows = _of_job(table, where, hit=hit, flag=flag, tenant_index=tenant_index)
    else:
        rows = f"""SELECT {hit} AS hit
          FROM {jobs} j CROSS JOIN LATERAL (
              SELECT * FROM {table} {alias}
              WHERE {where} AND {alias}.job_id = j.job_id) {alias}
          WHERE j.job_id IS NOT NULL AND CAST(:{flag} AS boolean)"""  # noqa: S608
    return f"""{name}(matched, scanned) AS (
    SELECT count(*) FILTER (WHERE b.hit), count(*)
    FROM ({rows}
          LIMIT {limit}) b
)"""  # noqa: S608 - constant text


def _of_job(table: str, where: str, *, hit: str, flag: str, tenant_index: str | None) -> str:
    """One job's rows of a branch, each with its ``hit``. With ``tenant_index`` (issue 36: at
    10,000,000 runs the tenant residual read ~200,000 rows of one job), four sources of which
    one-time filters run one: when the tenant index does not serve, the state's own index with
    the tenant alone tested when no other filter is asked (:data:`_TENANT_HIT`: the whole
    residual, evaluated per row, cost 40 % of that count) or with every filter residual; else
    the job's and tenant's entries of the tenant index, all hits when no other filter is asked
    (:data:`_ONLY_TENANT`, index-only), or with the others residual."""
    alias = table[1]
    base = f"""FROM {table} {alias}
          WHERE {where} AND CAST(:{flag} AS boolean)
            AND {alias}.job_id = CAST(:job_id AS text)"""
    if tenant_index is None:
        return f"SELECT {hit} AS hit\n          {base}"
    served = _SERVED.replace("{index}", tenant_index)
    tenant = f"\n            AND {alias}.tenant_id = CAST(:tenant AS text)"
    only_tenant = _TENANT_HIT.replace("?", alias)
    return f"""SELECT {only_tenant} AS hit
          {base} AND NOT {served} AND {_ONLY_TENANT}
          UNION ALL
          SELECT {hit}
          {base} AND NOT {served} AND NOT {_ONLY_TENANT}
          UNION ALL
          SELECT true
          {base}{tenant} AND {served} AND {_ONLY_TENANT}
          UNION ALL
          SELECT {hit}
          {base}{tenant} AND {served} AND NOT {_ONLY_TENANT}"""


_TENANT_INDEXES: Final = {"waiting": "tenant_index", "running": "running_index"}
"""The live states' tenant indexes, by the parameter naming each (:data:`_SERVED`)."""


def _count(*, of_job: bool, history: bool) -> Template:
    no_worker = "CAST(NULL AS text)"
    created = _CREATED.replace("?", "r")
    dead_jobs = "dead_jobs" if history else "live_dead_jobs"
    parts = [
        ("waiting", "{runs}", "r.state = 'waiting'", no_worker, "r.run_at", "waiting_jobs"),
        (
            "running",
            "{runs}",
            "r.state = 'running'",
            "r.claimed_by",
            "r.lease_expires_at",
            "running_jobs",
        ),
        ("dead_live", "{runs}", _DEAD + created, no_worker, "r.created_at", dead_jobs),
    ]
    if history:
        where = "h.state = 'dead'" + _CREATED.replace("?", "h")
        parts.append(("dead_ended", "{history}", where, "h.claimed_by", "h.created_at", dead_jobs))
    ctes: list[str] = []
    if not of_job:
        ctes += [
            loose_jobs(WAITING, "r.job_id, r.priority", "<runs>_due_idx", name="waiting_jobs"),
            loose_jobs(
                RUNNING, "r.job_id, r.lease_expires_at", "<runs>_lease_idx", name="running_jobs"
            ),
            loose_jobs(_DEAD, "r.job_id, r.created_at", "<runs>_browse_idx", name="live_dead_jobs"),
        ]
        if history:
            ctes.append(_ENDED_JOBS)
    names: list[str] = []
    for name, table, where, worker, at, jobs in parts:
        ctes.append(
            _branch(
                name,
                table,
                where,
                worker=worker,
                at=at,
                jobs=None if of_job else jobs,
                before=tuple(names),
                tenant_index=_TENANT_INDEXES.get(name),
            )
        )
        names.append(name)
    union = "\n    UNION ALL ".join(f"SELECT * FROM {name}" for name in names)  # noqa: S608
    return Template(
        "\nWITH RECURSIVE "
        + ",\n".join(ctes)
        + f"""
SELECT coalesce(sum(c.matched), 0) AS matched, coalesce(sum(c.scanned), 0) AS scanned,
       coalesce(sum(c.scanned), 0) >= CAST(:scan AS integer) AS stopped
FROM ({union}
) c
"""  # noqa: S608 - constant text
    )


COUNT_MATCHING_OF_JOB: Final = _count(of_job=True, history=False)
"""One job's runs a bulk action would take, counted (module doc)."""
COUNT_MATCHING_ALL_JOBS: Final = _count(of_job=False, history=False)
"""Every job's runs a bulk action would take (of the first ``:max_jobs`` jobs of each state),
counted (module doc)."""
COUNT_MATCHING_OF_JOB_EITHER: Final = _count(of_job=True, history=True)
"""COUNT_MATCHING_OF_JOB over both tables (J16)."""
COUNT_MATCHING_ALL_JOBS_EITHER: Final = _count(of_job=False, history=True)
"""COUNT_MATCHING_ALL_JOBS over both tables (J16)."""
