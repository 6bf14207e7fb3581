"""#36's history statements (``_jobs/_stats.py``): ``{stats}`` is the quoted stats table.

One statement each: a worker's flush (``ADD_STATS``, all its (job, minute) rows at once, sent
as parallel arrays so its size does not change the text), the fleet sampler's backlog gauge
(``RECORD_BACKLOG``) and prune (``PRUNE_STATS``), and a chart's read (``READ_STATS``, a range
of the primary key). Histograms travel as ``int[]`` texts (``'{0,3,1}'``): a ragged array of
arrays cannot be a bind parameter.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ADD_STATS",
    "PRUNE_STATS",
    "READ_STATS",
    "READ_STATS_BUCKETS",
    "RECORD_BACKLOG",
]

ADD_STATS: Final = """
INSERT INTO {stats} AS s (job_id, minute, completed, retried, dead, cancelled,
                            run_hist, wait_hist)
SELECT r.job_id, r.minute, r.completed, r.retried, r.dead, r.cancelled,
       CAST(r.run_hist AS bigint[]), CAST(r.wait_hist AS bigint[])
  FROM unnest(CAST(:job_ids AS text[]), CAST(:minutes AS timestamptz[]),
              CAST(:completed AS bigint[]), CAST(:retried AS bigint[]),
              CAST(:dead AS bigint[]), CAST(:cancelled AS bigint[]),
              CAST(:run_hists AS text[]), CAST(:wait_hists AS text[]))
       AS r(job_id, minute, completed, retried, dead, cancelled, run_hist, wait_hist)
 ORDER BY r.job_id, r.minute
ON CONFLICT (job_id, minute) DO UPDATE
   SET completed = s.completed + excluded.completed,
       retried = s.retried + excluded.retried,
       dead = s.dead + excluded.dead,
       cancelled = s.cancelled + excluded.cancelled,
       run_hist = (SELECT coalesce(array_agg(coalesce(u.a, 0) + coalesce(u.b, 0) ORDER BY u.i),
                                  CAST('{}' AS bigint[]))
                  FROM unnest(s.run_hist, excluded.run_hist) WITH ORDINALITY AS u(a, b, i)),
       wait_hist = (SELECT coalesce(array_agg(coalesce(u.a, 0) + coalesce(u.b, 0) ORDER BY u.i),
                                  CAST('{}' AS bigint[]))
                  FROM unnest(s.wait_hist, excluded.wait_hist) WITH ORDINALITY AS u(a, b, i))
"""
"""A flush: each row added to its (job, minute) row, or inserted (rows in key order, so two
processes' flushes lock the rows they share in one order); a histogram is summed element by
element (unnest pads the shorter with NULLs)."""

RECORD_BACKLOG: Final = """
INSERT INTO {stats} AS s (job_id, minute, waiting, oldest_due_age)
SELECT b.job_id, CAST(:minute AS timestamptz), b.waiting, b.age
  FROM unnest(CAST(:job_ids AS text[]), CAST(:waitings AS bigint[]),
              CAST(:ages AS double precision[])) AS b(job_id, waiting, age)
 ORDER BY b.job_id
ON CONFLICT (job_id, minute) DO UPDATE
   SET waiting = excluded.waiting, oldest_due_age = excluded.oldest_due_age
"""
"""The fleet sampler's backlog gauge into each job's row of the minute (the last sample of a
minute wins)."""

PRUNE_STATS: Final = "DELETE FROM {stats} WHERE minute < :before"
"""Retention: the minutes before ``:before`` (``<stats>_minute_idx``)."""

READ_STATS: Final = """
SELECT minute, completed, retried, dead, cancelled, run_hist, wait_hist, waiting, oldest_due_age
  FROM {stats}
 WHERE job_id = :job_id AND minute >= :start AND minute < :end
 ORDER BY minute
"""
"""A job's minutes in [start, end): a range of the primary key (at most 10,080 rows a week)."""

READ_STATS_BUCKETS: Final = """
WITH m AS MATERIALIZED (
  -- <stats>_pkey (job_id, minute): one range per job asked; each minute's bucket
  SELECT CAST(floor(extract(epoch FROM s.minute - CAST(:start AS timestamptz))
                    / CAST(:step AS float8)) AS int) AS b,
         s.minute, s.completed, s.retried, s.dead, s.cancelled, s.run_hist, s.wait_hist,
         s.waiting, s.oldest_due_age
    FROM {stats} s
   WHERE s.job_id = ANY(CAST(:job_ids AS text[])) AND s.minute >= :start AND s.minute < :end
), h AS (
  -- the histograms summed per (bucket, index), int4 sums (an int8 result, not numeric: a
  -- minute's count in one bucket fits an int), then each bucket's arrays in index order
  SELECT t.b, array_agg(t.x ORDER BY t.k) AS run_hist, array_agg(t.y ORDER BY t.k) AS wait_hist
    FROM (SELECT m.b, u.k, coalesce(sum(CAST(u.x AS int)), 0) AS x,
                 coalesce(sum(CAST(u.y AS int)), 0) AS y
            FROM m CROSS JOIN LATERAL unnest(m.run_hist, m.wait_hist) WITH ORDINALITY AS u(x, y, k)
           GROUP BY m.b, u.k) AS t
   GROUP BY t.b
), c AS (
  -- the counters, and the newest sampled minute's gauge: [epoch, waiting, age], the
  -- largest epoch wins
  SELECT m.b, sum(m.completed) AS completed, sum(m.retried) AS retried, sum(m.dead) AS dead,
         sum(m.cancelled) AS cancelled,
         max(ARRAY[extract(epoch FROM m.minute), m.waiting, m.oldest_due_age])
           FILTER (WHERE m.waiting IS NOT NULL) AS sample
    FROM m GROUP BY m.b
)
SELECT c.b, CAST(c.completed AS bigint), CAST(c.retried AS bigint), CAST(c.dead AS bigint),
       CAST(c.cancelled AS bigint), coalesce(h.run_hist, CAST('{}' AS bigint[])),
       coalesce(h.wait_hist, CAST('{}' AS bigint[])), CAST(c.sample[2] AS bigint),
       CAST(c.sample[3] AS float8)
  FROM c LEFT JOIN h ON h.b = c.b
 ORDER BY c.b
"""
"""The jobs' minutes in [start, end) summed per bucket of ``:step`` seconds from ``:start``
(issue 36: a chart reads its buckets, so 7 days are 84 rows, not 10,080): each bucket's
counters, its two histograms summed element-wise (one ``unnest(run_hist, wait_hist) WITH
ORDINALITY`` per minute, hashed by bucket and index: the longer histogram sets the length,
the shorter padded with zeros as ``merge_histograms`` pads), and its last backlog sample (the
newest minute with one). The sums are the minute rows' own, so a series built from these rows
has the same counts and percentiles as one built from the minutes."""
