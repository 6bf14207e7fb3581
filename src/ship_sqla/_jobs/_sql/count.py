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

The residual filters say what :meth:`~ship_sqla.kernel._search.RunFilter.matches` says: run
id, tenant and worker exact; ``error``: ``lower(last_error)`` contains ``lower(:error)`` (Python's
``casefold`` folds a few more characters, e.g. ``ß``); each ``payload`` field
``payload #> path = value`` as jsonb (a JSON ``true`` is not the number 1 here).
"""

from __future__ import annotations

from typing import Final

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
                 OR strpos(lower(?.last_error), lower(CAST(:error AS text))) > 0)
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


def _branch(
    flag: str, table: str, where: str, *, worker: str, at: str, job: str, hit: str | None = None
) -> str:
    """One (state, table) branch: at most ``:scan`` entries, their hits counted (``hit``
    given: that instead of the residual filters)."""
    alias = table[1]
    if hit is None:
        hit = _RESIDUAL.replace("{worker}", worker).replace("{at}", at).replace("?", alias)
    return f"""
    SELECT count(*) FILTER (WHERE b.hit) AS matched, count(*) AS scanned
    FROM (SELECT {hit} AS hit
          FROM {table} {alias}
          WHERE {where} AND CAST(:{flag} AS boolean){job.replace("?", alias)}
          LIMIT CAST(:scan AS integer)) b"""  # noqa: S608 - constant text


def _live(state: str, index: str, *, worker: str, at: str, job: str) -> list[str]:
    """A live state's branches: its claim index (``<runs>_due_idx`` / ``_lease_idx``) with
    every filter residual; with a job (``job``) and a tenant asked and the tenant index there
    (:data:`_SERVED`), that index instead: the job's and tenant's entries only, index-only
    when no other filter is asked (:data:`_ONLY_TENANT`), else with the others residual."""
    where = f"r.state = '{state}'"
    if not job:
        return [_branch(state, "{runs}", where, worker=worker, at=at, job=job)]
    served = _SERVED.replace("{index}", index)
    tenant = " AND r.tenant_id = CAST(:tenant AS text)"
    return [
        _branch(state, "{runs}", f"{where} AND NOT {served}", worker=worker, at=at, job=job),
        _branch(
            state,
            "{runs}",
            f"{where} AND {served} AND {_ONLY_TENANT}",
            worker=worker,
            at=at,
            job=job + tenant,
            hit="true",
        ),
        _branch(
            state,
            "{runs}",
            f"{where} AND {served} AND NOT {_ONLY_TENANT}",
            worker=worker,
            at=at,
            job=job + tenant,
        ),
    ]


def _count(job: str, *, history: bool) -> Template:
    finished = "r.state IN ('completed', 'dead', 'discarded', 'cancelled') AND r.state = 'dead'"
    no_worker = "CAST(NULL AS text)"
    branches = [
        *_live("waiting", "tenant_index", worker=no_worker, at="r.run_at", job=job),
        *_live("running", "running_index", worker="r.claimed_by", at="r.lease_expires_at", job=job),
        _branch(
            "dead",
            "{runs}",
            finished + _CREATED.replace("?", "r"),
            worker=no_worker,
            at="r.created_at",
            job=job,
        ),
    ]
    if history:
        where = "h.state = 'dead'" + _CREATED.replace("?", "h")
        branches.append(
            _branch("dead", "{history}", where, worker="h.claimed_by", at="h.created_at", job=job)
        )
    union = "\n    UNION ALL".join(branches)
    return Template(
        f"""
SELECT coalesce(sum(c.matched), 0) AS matched, coalesce(sum(c.scanned), 0) AS scanned,
       coalesce(bool_or(c.scanned >= CAST(:scan AS integer)), false) AS stopped
FROM ({union}
) c
"""  # noqa: S608 - constant text
    )


_OF_JOB: Final = " AND ?.job_id = CAST(:job_id AS text)"

COUNT_MATCHING_OF_JOB: Final = _count(_OF_JOB, history=False)
"""One job's runs a bulk action would take, counted (module doc)."""
COUNT_MATCHING_ALL_JOBS: Final = _count("", history=False)
"""Every job's runs a bulk action would take, counted (module doc)."""
COUNT_MATCHING_OF_JOB_EITHER: Final = _count(_OF_JOB, history=True)
"""COUNT_MATCHING_OF_JOB over both tables (J16)."""
COUNT_MATCHING_ALL_JOBS_EITHER: Final = _count("", history=True)
"""COUNT_MATCHING_ALL_JOBS over both tables (J16)."""
