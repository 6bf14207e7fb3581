"""D9's statements: live runs per handler version, for the version gauges
(``ship.workflow.runs``, ``ship.workflow.runs.stranded``) and ``ship-sqla workflows versions``.
Rules: see :mod:`ship_sqla._jobs._sql`.
"""

from __future__ import annotations

from typing import Final

from ship_sqla._sql import Template

__all__ = ["VERSION_COUNTS"]

VERSION_COUNTS: Final = Template("""
SELECT r.job_id, r.handler_version, r.state, count(*) AS runs
FROM {runs} r
-- <runs>_version_idx (its predicate word for word): an index-only scan of the live runs of
-- versioned jobs, in (job_id, handler_version, state) order, so the groups come out sorted
-- with no sort; an unversioned job's runs are not in it. One entry read per live versioned run.
WHERE r.handler_version IS NOT NULL AND r.state IN ('waiting', 'running')
  AND (CAST(:job_ids AS text[]) IS NULL OR r.job_id = ANY(CAST(:job_ids AS text[])))
GROUP BY r.job_id, r.handler_version, r.state
ORDER BY r.job_id, r.handler_version, r.state
LIMIT CAST(:limit AS integer)
""")
"""D9: live (waiting, running) runs per (job, handler version, state), of ``:job_ids`` (NULL:
every job), at most ``:limit`` groups."""
