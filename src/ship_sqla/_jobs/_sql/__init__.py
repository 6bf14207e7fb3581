"""Every statement on the job tables (runs and state): named, in one place, each hot one beside
the index that serves it, by concern:

- :mod:`.enqueue`: ``insert`` of prepared runs (J1, J2): the plain INSERT, the capped one, the
  J2 gate, the checked statement; the plain INSERT with its announcement and the announcement
  alone (K1: NOTIFY in the enqueueing transaction);
- :mod:`.claim`: the claim, ungated or through the job's claim gate, by priority or fair across
  tenants (J3, J4, J6, F1, F2, F3);
- :mod:`.settle`: every settlement of a batch in one statement, and the heartbeat (J5, J7);
- :mod:`.schedules`: the state rows of schedules (J9);
- :mod:`.admin`: the administration port (J8; cancel, K2; pause and resume, K3), the queue
  gauges (J10), ``jobs stats`` and the worker's table check;
- :mod:`.browse`: the dashboard's reads (S2): runs by state and filter, throughput, schedules.

The tables' names and schema are the application's choice, so each statement is a template
rendered ONCE per backend into :class:`JobStatements` (:meth:`JobStatements.for_tables`), which
the backend lends to its schedules, its admin port and the CLI. After that each is one stable
SQL text, so SQLAlchemy caches its compiled form and asyncpg its prepared statement. A template
is compacted (:func:`compact`: the library's own text, once per process) BEFORE the names are
put in (:func:`~ship_sqla._naming.fill`, one pass): a name is never altered, whatever it holds
(``"jobs--v2"`` is not a comment; issue 25 D3). Rules every statement follows:

- Time is ``coalesce(CAST(:now AS timestamptz), now())`` (``{now}``): ``:now`` is the injected
  clock's time when it is frozen, else NULL and the database's clock rules.
- Partial-index predicates are written as the index declares them (``_tables.py``), as SQL
  literals, never bound parameters: PostgreSQL uses a partial index only when the query's
  predicate implies the index's, and a generic prepared plan cannot prove that about ``$1``.
- Arrays, never expanding IN lists: ``unnest(CAST(:ids AS text[]), ...)`` and
  ``= ANY(...)`` keep one SQL text whatever the batch size.
- Every settle (complete, fail, release, heartbeat) matches ``id`` AND ``lease_token`` AND
  ``state = 'running'`` (J5): a holder whose claim was retaken changes nothing. A heartbeat also
  needs a live lease: a lapsed one is never revived.
- Statements store what they are given: run ids, payloads, keys, dedupe keys and
  ``max_attempts`` come prepared from the kernel (:mod:`ship_sqla.kernel._plans.prepare`);
  leases and ``max_running`` from the :class:`~ship_sqla.kernel.ClaimRequest` or the
  :class:`~ship_sqla.kernel.ClaimedRun`.

``tests/integration/test_job_explain.py`` proves each hot statement's index at 1,000,000 runs.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Final

import attrs
from sqlalchemy import TextClause, text

from ship_sqla._jobs._sql import admin, browse, claim, enqueue, schedules, settle
from ship_sqla._naming import fill, quoted_table, text_name

if TYPE_CHECKING:
    from sqlalchemy import Table

__all__ = ["ASYNCPG_CACHEABLE", "AT", "NOW", "SERVER_NOW", "JobStatements", "compact", "render"]

NOW: Final = "coalesce(CAST(:now AS timestamptz), now())"
SERVER_NOW: Final = "now()"
"""``{now}`` of a claim on a backend whose clock is the database's (``:now`` is always NULL
there): the planner then sees the instant (a stable function, evaluated for its estimates),
where ``coalesce(:now, now())`` is costed at a default third of the due runs in a generic plan
and kept PostgreSQL from settling on one (see ``MAX_CLAIM_BATCH``)."""


def _at(now: str) -> str:
    return "to_char(" + now + """ AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')"""


AT: Final = _at(NOW)
"""A history entry's ``at``: ISO-8601 UTC text whatever the session's TimeZone."""

_RUN_COLUMNS: Final = (
    "r.id, r.job_id, r.state, r.payload, r.key, r.dedupe_key, r.attempt, r.max_attempts,"
    " r.run_at, r.created_at, r.updated_at, r.finished_at, r.lease_expires_at, r.lease_token,"
    " r.claimed_by, r.last_error, r.history, r.snoozes, r.priority, r.cancel_requested_at,"
    " r.tenant_id, r.parent_id, r.wait_for"
)


ASYNCPG_CACHEABLE: Final = 15 * 1024
"""asyncpg's default ``max_cacheable_statement_size``: a longer statement is never kept in its
statement cache, so it is parsed and planned at every execution (on the direct path the claim,
the settle and the heartbeat run through that cache)."""


def _without_comment(line: str) -> str:
    """``line`` up to a ``--`` comment that is not inside a quoted literal or a double-quoted
    identifier."""
    # Most lines hold no comment, or no quote before it: only the rest need the scan (it
    # was most of create_job_backend's time).
    start = line.find("--")
    if start < 0:
        return line
    head = line[:start]
    if "'" not in head and '"' not in head:
        return head
    quote = ""
    for index, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif line.startswith("--", index):
            return line[:index]
    return line


def compact(sql: str) -> str:
    """``sql`` as sent: its comments and indentation dropped (they stay in the source, where the
    reader is), one line per line of code. The largest claim is then well under
    ASYNCPG_CACHEABLE, so asyncpg keeps it prepared and PostgreSQL keeps its plan.

    Only ever given the library's own template text, before any table name is put in (see
    :func:`render`): a quoted name such as ``"jobs--v2"`` must never pass through it."""
    lines = [code for line in sql.splitlines() if (code := _without_comment(line).strip())]
    return "\n".join(lines) + "\n"


_compacted: Final = functools.cache(compact)
""":func:`compact` of each template once per process: the templates are this package's
constants (a bounded set), and every backend renders all of them at its construction."""


def render(template: str, *, runs: str, state: str = "", now: str = NOW) -> TextClause:
    """``template`` for one pair of tables (``runs``, ``state``: quoted, schema-qualified names,
    from :func:`~ship_sqla._naming.quoted_table`); ``now``: what ``{now}`` says (NOW, or
    SERVER_NOW for a claim on the database's clock).

    The template is compacted first, then every placeholder is filled in one pass, the names
    escaped for ``text()`` (:func:`~ship_sqla._naming.text_name`): a name must reach
    PostgreSQL exactly as quoted, never cut at a ``--``, read as a bind parameter or filled
    again."""
    if "{state}" in template and not state:  # pragma: no cover - a wiring mistake, said plainly
        raise ValueError("this statement names the state table: pass state=")
    return text(
        fill(
            _compacted(template),
            {
                "{runs}": text_name(runs),
                "{state}": text_name(state),
                "{at}": _at(now),
                "{now}": now,
                "{cols}": _RUN_COLUMNS,
            },
        )
    )


@attrs.frozen
class JobStatements:
    """Every statement of one backend's tables, rendered once (see the module docstring)."""

    runs_name: str
    """The runs table's quoted, schema-qualified name (for messages and lock keys)."""
    state_name: str
    """The state table's quoted, schema-qualified name."""
    runs_table: str
    """The runs table's name, unquoted (COPY names it by its parts: ENQUEUE_COPY_COLUMNS)."""
    runs_schema: str | None
    """The runs table's schema, unquoted; None: the search path."""
    enqueue_plain: TextClause
    enqueue_plain_capped: TextClause
    enqueue_gate: TextClause
    enqueue_many: TextClause
    enqueue_plain_announced: TextClause
    enqueue_one: TextClause
    enqueue_copy_allowed: TextClause
    enqueue_one_announced: TextClause
    announce: TextClause
    announce_after_commit: TextClause
    enqueue_one_sampled: TextClause
    enqueue_plain_sampled: TextClause
    claim_uncapped: TextClause
    claim_gated: TextClause
    claim_fair: TextClause
    claim_fair_gated: TextClause
    claim_uncapped_keyed: TextClause
    claim_gated_keyed: TextClause
    claim_fair_keyed: TextClause
    claim_fair_gated_keyed: TextClause
    fair_claims_served: TextClause
    settle: TextClause
    heartbeat: TextClause
    db_now: TextClause
    upsert_schedule_states: TextClause
    lock_due_states: TextClause
    set_next_at: TextClause
    get_run: TextClause
    list_dead_of_job: TextClause
    list_dead_all_jobs: TextClause
    retry_dead: TextClause
    discard: TextClause
    cancel_run: TextClause
    pause_job: TextClause
    resume_job: TextClause
    list_paused: TextClause
    delete_finished: TextClause
    queue_depths: TextClause
    demand: TextClause
    state_counts: TextClause
    probe_runs_table: TextClause
    probe_state_table: TextClause
    list_waiting_of_job: TextClause
    list_waiting_all_jobs: TextClause
    list_running_of_job: TextClause
    list_running_all_jobs: TextClause
    list_finished_of_job: TextClause
    list_finished_all_jobs: TextClause
    throughput: TextClause
    schedule_states: TextClause

    @classmethod
    def for_tables(cls, runs: Table, state: Table, *, server_clock: bool = False) -> JobStatements:
        """The statements on ``runs`` and ``state``; ``server_clock``: the backend's clock is the
        database's (not frozen), so its claims say ``now()`` (SERVER_NOW)."""
        runs_name, state_name = quoted_table(runs), quoted_table(state)
        claim_now = SERVER_NOW if server_clock else NOW

        def r(template: str) -> TextClause:
            return render(template, runs=runs_name, state=state_name)

        def c(template: str) -> TextClause:
            return render(template, runs=runs_name, state=state_name, now=claim_now)

        return cls(
            runs_name=runs_name,
            state_name=state_name,
            runs_table=runs.name,
            runs_schema=runs.schema,
            enqueue_plain=r(enqueue.ENQUEUE_PLAIN),
            enqueue_plain_capped=r(enqueue.ENQUEUE_PLAIN_CAPPED),
            enqueue_gate=r(enqueue.ENQUEUE_GATE),
            enqueue_many=r(enqueue.ENQUEUE_MANY),
            enqueue_plain_announced=r(enqueue.ENQUEUE_PLAIN_ANNOUNCED),
            enqueue_one=r(enqueue.ENQUEUE_ONE),
            enqueue_copy_allowed=r(enqueue.ENQUEUE_COPY_ALLOWED),
            enqueue_one_announced=r(enqueue.ENQUEUE_ONE_ANNOUNCED),
            announce=r(enqueue.ANNOUNCE),
            announce_after_commit=r(enqueue.ANNOUNCE_AFTER_COMMIT),
            enqueue_one_sampled=r(enqueue.ENQUEUE_ONE_SAMPLED),
            enqueue_plain_sampled=r(enqueue.ENQUEUE_PLAIN_SAMPLED),
            claim_uncapped=c(claim.CLAIM_UNCAPPED),
            claim_gated=c(claim.CLAIM_GATED),
            claim_fair=c(claim.CLAIM_FAIR),
            claim_fair_gated=c(claim.CLAIM_FAIR_GATED),
            claim_uncapped_keyed=c(claim.CLAIM_UNCAPPED_KEYED),
            claim_gated_keyed=c(claim.CLAIM_GATED_KEYED),
            claim_fair_keyed=c(claim.CLAIM_FAIR_KEYED),
            claim_fair_gated_keyed=c(claim.CLAIM_FAIR_GATED_KEYED),
            fair_claims_served=r(claim.FAIR_CLAIMS_SERVED),
            settle=r(settle.SETTLE_IF_TOKEN_CURRENT),
            heartbeat=r(settle.HEARTBEAT_IF_TOKEN_CURRENT),
            db_now=r(schedules.DB_NOW),
            upsert_schedule_states=r(schedules.UPSERT_SCHEDULE_STATES),
            lock_due_states=r(schedules.LOCK_DUE_STATES_SKIP_LOCKED),
            set_next_at=r(schedules.SET_NEXT_AT),
            get_run=r(admin.GET_RUN),
            list_dead_of_job=r(admin.LIST_DEAD_OF_JOB),
            list_dead_all_jobs=r(admin.LIST_DEAD_ALL_JOBS),
            retry_dead=r(admin.RETRY_DEAD),
            discard=r(admin.DISCARD_WAITING_OR_DEAD),
            cancel_run=r(admin.CANCEL_LIVE_RUN),
            pause_job=r(admin.PAUSE_JOB),
            resume_job=r(admin.RESUME_JOB),
            list_paused=r(admin.LIST_PAUSED),
            delete_finished=r(admin.DELETE_FINISHED_BATCH),
            queue_depths=r(admin.QUEUE_DEPTHS),
            demand=r(admin.DEMAND),
            state_counts=r(admin.STATE_COUNTS),
            probe_runs_table=r(admin.PROBE_RUNS_TABLE),
            probe_state_table=r(admin.PROBE_STATE_TABLE),
            list_waiting_of_job=r(browse.LIST_WAITING_OF_JOB),
            list_waiting_all_jobs=r(browse.LIST_WAITING_ALL_JOBS),
            list_running_of_job=r(browse.LIST_RUNNING_OF_JOB),
            list_running_all_jobs=r(browse.LIST_RUNNING_ALL_JOBS),
            list_finished_of_job=r(browse.LIST_FINISHED_OF_JOB),
            list_finished_all_jobs=r(browse.LIST_FINISHED_ALL_JOBS),
            throughput=r(browse.THROUGHPUT),
            schedule_states=r(browse.SCHEDULE_STATES),
        )
