"""K6's walk over each job's priority levels, as one SQL fragment: the dashboard's waiting pages
(``browse.py``) and the demand counts (``admin.py``'s ``DEMAND``) both read a job's waiting runs
level by level, highest first, through ``<runs>_due_idx``. (The claim walks the same levels in
its own shape: it carries each level's claimed ids along.)"""

from __future__ import annotations

__all__ = ["levels"]


def levels(source: str, *, start: str = "CAST(32767 AS smallint)") -> str:
    """A recursive CTE ``levels(job_id, priority)`` (no leading comma, no ``WITH``): for each
    job of ``source`` (a CTE with a ``job_id`` column), its priority levels holding waiting runs,
    from the highest at most ``start`` (SQL of a smallint) down, one row per level, then a row
    with priority NULL that ends the job's walk. ``{runs}`` stays a placeholder for
    :class:`~ship_sqla._sql.Statements`."""
    return f"""levels(job_id, priority) AS (
    -- <runs>_due_idx (job_id, priority, run_at, seq), a loose index scan per job: its priority
    -- levels holding waiting runs, highest first, one entry each (the claim's own walk, K6).
    -- Priorities are bounded (-10..10): at most 21 levels per job.
    SELECT s.job_id,
           (SELECT max(r.priority) FROM {{runs}} r
            WHERE r.job_id = s.job_id AND r.state = 'waiting' AND r.priority <= {start})
    FROM {source} s
    WHERE s.job_id IS NOT NULL
    UNION ALL
    SELECT l.job_id,
           (SELECT max(r.priority) FROM {{runs}} r
            WHERE r.job_id = l.job_id AND r.state = 'waiting' AND r.priority < l.priority)
    FROM levels l
    WHERE l.priority IS NOT NULL
)"""  # noqa: S608 - constant text and the callers' constant names
