"""The pieces of the statements that move a run between the runs table and its history (J16),
shared by the single-run statements (:mod:`.live`) and the bulk batches (:mod:`.bulk`): the
history's columns, the INSERT that ends the rows of a CTE into history, and the INSERT that
moves history rows back into the runs table. SQL text with ``{runs}``, ``{history}`` and
``{now}`` left as placeholders for :class:`~ship_sqla._sql.Statements`."""

from __future__ import annotations

from typing import Final

__all__ = ["HISTORY_COLUMNS", "INSERT_BACK", "insert_ended"]

HISTORY_COLUMNS: Final = (
    "id, seq, job_id, state, payload, key, dedupe_key, attempt, max_attempts, priority, run_at,"
    " created_at, started_at, finished_at, claimed_by, last_error, history, trace_context,"
    " snoozes, tenant_id, parent_id, lapses, progress, consecutive_lapses, handler_version,"
    " partition_key"
)
"""The history table's columns an ending statement writes, in this order."""


def insert_ended(
    source: str, state: str, keep_payload: str, started: str, finished: str = "{now}"
) -> str:
    """``INSERT INTO {history} AS h`` of the rows of CTE ``source`` (aliased ``e``, the runs
    table's columns), ended in ``state`` at ``finished``, keeping the payload when
    ``keep_payload``."""
    return f"""INSERT INTO {{history}} AS h ({HISTORY_COLUMNS})
    SELECT e.id, e.seq, e.job_id, {state},
        CASE WHEN {keep_payload} THEN e.payload END, e.key, e.dedupe_key, e.attempt,
        e.max_attempts, e.priority, e.run_at, e.created_at, {started}, {finished}, e.claimed_by,
        e.last_error, nullif(e.history, CAST('[]' AS jsonb)),
        CASE WHEN {keep_payload} THEN e.trace_context END, e.snoozes, e.tenant_id, e.parent_id,
        e.lapses, e.progress, nullif(e.consecutive_lapses, 0), e.handler_version, e.partition_key
    FROM {source} e"""  # noqa: S608 - constant text


INSERT_BACK: Final = """INSERT INTO {runs} AS r (
    id, seq, job_id, state, payload, key, dedupe_key, attempt, max_attempts, run_at, created_at,
    updated_at, last_error, history, priority, trace_context, snoozes, tenant_id, parent_id,
    lapses, consecutive_lapses, progress, handler_version, partition_key
)
SELECT b.id, b.seq, b.job_id, 'waiting', coalesce(b.payload, CAST('null' AS jsonb)), b.key,
    b.dedupe_key, b.attempt, b.attempt + 1, {now}, b.created_at, {now}, b.last_error,
    coalesce(b.history, CAST('[]' AS jsonb)), b.priority, b.trace_context, b.snoozes,
    b.tenant_id, b.parent_id, b.lapses, 0, b.progress, b.handler_version, b.partition_key
FROM back b
"""
"""A history row (CTE ``back``, aliased ``b``) moved back into the runs table: waiting, due
now, with one more attempt (an operator's retry, J8; a rerun from a step, D6)."""
