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


def _branch(flag: str, table: str, where: str, *, worker: str, at: str, job: str) -> str:
    """One (state, table) branch: at most ``:scan`` entries, their hits counted."""
    alias = table[1]
    hit = _RESIDUAL.replace("{worker}", worker).replace("{at}", at).replace("?", alias)
    return f"""
    SELECT count(*) FILTER (WHERE b.hit) AS matched, count(*) AS scanned
    FROM (SELECT {hit} AS hit
          FROM {table} {alias}
          WHERE {where} AND CAST(:{flag} AS boolean){job.replace("?", alias)}
          LIMIT CAST(:scan AS integer)) b"""  # noqa: S608 - constant text


def _count(job: str, *, history: bool) -> Template:
    finished = "r.state IN ('completed', 'dead', 'discarded', 'cancelled') AND r.state = 'dead'"
    no_worker = "CAST(NULL AS text)"
    branches = [
        _branch(
            "waiting", "{runs}", "r.state = 'waiting'", worker=no_worker, at="r.run_at", job=job
        ),
        _branch(
            "running",
            "{runs}",
            "r.state = 'running'",
            worker="r.claimed_by",
            at="r.lease_expires_at",
            job=job,
        ),
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
