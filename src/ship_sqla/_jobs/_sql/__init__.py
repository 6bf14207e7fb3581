"""Every statement on the job tables (runs, state, workers, steps, events): named, in one place,
each hot one beside the index that serves it, by concern:

- :mod:`.enqueue`: ``insert`` of prepared runs (J1, J2): the plain INSERT, the capped one, the
  J2 gate, the checked statement; the plain INSERT with its announcement and the announcement
  alone (K1: NOTIFY in the enqueueing transaction);
- :mod:`.claim`: the claim, ungated or through the job's claim gate, by priority or fair across
  tenants (J3, J4, J6, F1, F2, F3);
- :mod:`.settle`: every settlement of a batch in one statement, and the heartbeat (J5, J7);
- :mod:`.schedules`: the state rows of schedules (J9);
- :mod:`.admin`: the administration port (J8; cancel, K2; pause and resume, K3), the queue
  gauges (J10), ``jobs stats`` and the worker's table check;
- :mod:`.browse`: the dashboard's reads (S2): runs by state and filter, throughput, schedules;
- :mod:`.workers`: the worker registry (F6) and the queue-sampler lease (F5);
- :mod:`.workflows`: workflow steps, suspends, events and child wakes (SPEC §13).

The tables' names and schema are the application's choice, so each statement is a
:class:`~ship_sqla._sql.Template` (a module constant of its concern, its docstring after it),
rendered at most ONCE per backend, on its first use, by the backend's :class:`JobStatements`
(:meth:`JobStatements.for_tables`), which it lends to its inserter, schedules, admin port,
worker registry, workflow store and the CLI: ``statements[settle.SETTLE_IF_TOKEN_CURRENT]``.
After that each is one stable SQL text, so SQLAlchemy caches its compiled form and asyncpg its
prepared statement. A template is
compacted (:func:`~ship_sqla._sql.compact`: the library's own text, once per process) BEFORE the
names are put in (:func:`~ship_sqla._naming.fill`, one pass): a name is never altered, whatever
it holds (``"jobs--v2"`` is not a comment; issue 25 D3). :func:`templates` collects every
template of these modules (:func:`~ship_sqla._sql.collect`): declaring one is all it takes.
Rules every statement follows:

- Time is ``coalesce(CAST(:now AS timestamptz), now())`` (``{now}``): ``:now`` is the injected
  clock's time when it is frozen, else NULL and the database's clock rules
  (:func:`~ship_sqla._sql_time.now_bound`). A claim says ``now()`` on the database's clock
  (``Template(..., claim_clock=True)``, SERVER_NOW).
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

from typing import TYPE_CHECKING, Final

from ship_sqla._naming import quoted_table, text_name
from ship_sqla._sql import Statements, collect

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sqlalchemy import Table, TextClause

    from ship_sqla._sql import Template

__all__ = ["RUN_COLUMNS", "JobStatements", "templates"]

RUN_COLUMNS: Final = (
    "r.id, r.job_id, r.state, r.payload, r.key, r.dedupe_key, r.attempt, r.max_attempts,"
    " r.run_at, r.created_at, r.updated_at, r.finished_at, r.lease_expires_at, r.lease_token,"
    " r.claimed_by, r.last_error, r.history, r.snoozes, r.priority, r.cancel_requested_at,"
    " r.tenant_id, r.parent_id, r.wait_for, r.lapses, r.consecutive_lapses,"
    " r.progress, r.handler_version"
)
"""``{cols}``: a run record's columns (:func:`~ship_sqla._jobs._admin.run_record` reads them)
from the runs table aliased ``r``."""


def _workflow_run(steps: str | None) -> str:
    """``{stepped}``: whether the ended run ``e`` is a workflow run with stored steps (its
    payload is kept in history for D11's export, J18); one ``<steps>_pkey`` probe, or false
    without a steps table."""
    if steps is None:
        return "false"
    return f"EXISTS (SELECT 1 FROM {text_name(steps)} st WHERE st.run_id = e.id)"  # noqa: S608 - constant text


def templates() -> Mapping[Template, str]:
    """Every job-table template, by its ``module.NAME`` (:func:`~ship_sqla._sql.collect`)."""
    return collect(__name__)


class JobStatements(Statements):
    """Every statement of one backend's job tables (see the module docstring), with the
    tables' names."""

    __slots__ = (
        "history_name",
        "live_only",
        "runs_name",
        "runs_schema",
        "runs_table",
        "state_name",
    )

    def __init__(
        self,
        *,
        runs: str,
        state: str,
        workers: str | None = None,
        steps: str | None = None,
        events: str | None = None,
        history: str | None = None,
        server_clock: bool = False,
        runs_table: str = "",
        runs_schema: str | None = None,
        live_only: bool = False,
    ) -> None:
        """Each table's quoted, schema-qualified name (:func:`~ship_sqla._naming.quoted_table`);
        None: not given (no statement naming it may run). ``runs_table`` / ``runs_schema``: the
        runs table's unquoted parts (COPY names it by them). ``server_clock``: the backend's
        clock is the database's (not frozen), so its claims say ``now()`` (SERVER_NOW)."""
        super().__init__(
            {
                "{runs}": runs,
                "{state}": state,
                "{workers}": workers,
                "{steps}": steps,
                "{events}": events,
                "{history}": history,
            },
            fragments={"{cols}": RUN_COLUMNS, "{stepped}": _workflow_run(steps)},
            server_clock=server_clock,
        )
        self.runs_name: Final = runs
        """The runs table's quoted, schema-qualified name (for messages and lock keys)."""
        self.state_name: Final = state
        """The state table's quoted, schema-qualified name."""
        self.runs_table: Final = runs_table
        """The runs table's name, unquoted (COPY names it by its parts: ENQUEUE_COPY_COLUMNS)."""
        self.runs_schema: Final = runs_schema
        """The runs table's schema, unquoted; None: the search path."""
        self.history_name: Final = history
        """The history table's quoted, schema-qualified name; None: none."""
        self.live_only: Final = live_only
        """J16: runs that end move into the history table, and reads of finished runs read
        both tables (the backend's ``live_only``)."""

    @classmethod
    def for_tables(
        cls,
        runs: Table,
        state: Table,
        *,
        workers: Table | None = None,
        steps: Table | None = None,
        events: Table | None = None,
        history: Table | None = None,
        server_clock: bool = False,
        live_only: bool = False,
    ) -> JobStatements:
        """The statements on these tables (see :meth:`__init__`)."""

        def name(table: Table | None) -> str | None:
            return None if table is None else quoted_table(table)

        return cls(
            runs=quoted_table(runs),
            state=quoted_table(state),
            workers=name(workers),
            steps=name(steps),
            events=name(events),
            history=name(history),
            server_clock=server_clock,
            runs_table=runs.name,
            runs_schema=runs.schema,
            live_only=live_only,
        )

    def every_statement(self) -> dict[str, TextClause]:
        """Every job-table statement this table set can run, rendered, by ``module.NAME``."""
        return self.every(templates())
