"""J21: the storage options (reloptions) the ship tables need, declared by their factories.

A factory declares its table's options with :func:`declare_storage_options`, which keeps them
in ``table.info[STORAGE_OPTIONS_INFO]``. One ``after_create`` listener on every
:class:`~sqlalchemy.Table` (registered when this module is imported, i.e. with ``ship_sqla``)
sets them right after the table's ``CREATE TABLE`` (``ALTER TABLE ... SET (...)``, one
statement): so ``metadata.create_all()``, ``ship-sqla schema apply``, :func:`schema_sql` and
Alembic's ``op.create_table(..., info={...})`` (autogenerate writes the table's ``info`` into
the migration, and Alembic fires the table's DDL events) all create them. The schema check (T3)
compares them with the live table's ``pg_class.reloptions``; ``schema apply`` sets those
missing on an existing table (never changes one set to another value: that is reported).

Why a DDL hook and not ``Table(..., postgresql_with=...)``: table-level ``postgresql_with`` is
SQLAlchemy 2.1's, and ship_sqla supports SQLAlchemy from 2.0.30; raising the floor for one
clause would drop every 2.0 application, while the hook works on both and is one statement
(an ``ALTER TABLE ... SET`` of storage parameters takes a SHARE UPDATE EXCLUSIVE lock: reads
and writes go on; only VACUUM and other DDL wait).

The values, and why (research: ../shared/research/storage-and-sql-enqueue.md, topic 1):

- ``autovacuum_vacuum_scale_factor = 0``, ``autovacuum_vacuum_threshold = 1000``: vacuum after
  every 1,000 dead versions whatever the table's size. PostgreSQL's default waits for
  50 + 20 % of the live rows: at 1,000,000 finished runs kept, 200,000 dead versions, which the
  claim's index scans walk (Oban's guide: 0 / 100 on ``oban_jobs``; pgqueuer: 0.01 / 1,000;
  PgQue#61: 14,000 dead tuples on a five-row table made its consumer 5x slower).
- ``autovacuum_vacuum_insert_scale_factor = 0``, ``autovacuum_vacuum_insert_threshold = 1000``
  (PostgreSQL 13+): vacuum after every 1,000 inserts too, so new pages are marked all-visible
  and the index-only counts (the queue gauges' and ``demand``'s over ``<runs>_due_idx``) do not
  visit the heap; the default waits for 20 % of the table again.
- ``autovacuum_vacuum_cost_delay = 0``: a vacuum of a small, hot table finishes in one pass
  instead of sleeping 2 ms per 200 cost units while dead versions pile up (pgqueuer's value).
- ``fillfactor = 50`` on the state table only: its updates (claim gates, enqueue gates,
  schedules' ``next_at``) change no indexed column, so each can be a HOT update, pruned within
  the page, when the page has room; the table holds a few rows per job, so half-empty pages
  cost nothing. No other table gets one: every update of a run or an outbox row changes an
  indexed column (``state`` is in every partial predicate, ``lease_expires_at`` keys
  ``<runs>_lease_idx``), so none can be HOT and reserved space would only make the heap of
  kept finished rows bigger.

- ``vacuum_index_cleanup = on`` on the runs table only (J16: it holds live runs, so its
  indexes are small): PostgreSQL 14+ skips a vacuum's index pass when under 2 % of the heap's
  pages hold dead items, and those items then keep the heap's tail pages from being emptied,
  so the table is never truncated back after a held snapshot's backlog is vacuumed (seen in
  ``steady --quick``: the heap stuck at 62 MiB of 9 pre-hold in two runs of four; BENCHMARKS.md,
  issue 39 follow-up 3). ``on`` makes every vacuum clean the indexes.

The server settings a table cannot carry (``autovacuum_naptime``, ``max_wal_size``,
``idle_in_transaction_session_timeout``...) are docs/production.md's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import DDL, Table, event

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "CHURN_OPTIONS",
    "HOT_ROW_OPTIONS",
    "LIVE_RUNS_OPTIONS",
    "STORAGE_OPTIONS_INFO",
    "OptionValue",
    "declare_storage_options",
    "storage_options",
    "storage_options_ddl",
    "storage_options_sql",
]

OptionValue = int | float | str
"""A storage option's value: a number, or a word (``on``)."""

STORAGE_OPTIONS_INFO: Final = "ship_sqla.storage_options"
"""The ``Table.info`` key of a table's declared storage options."""

CHURN_OPTIONS: Final[Mapping[str, OptionValue]] = {
    "autovacuum_vacuum_scale_factor": 0,
    "autovacuum_vacuum_threshold": 1000,
    "autovacuum_vacuum_insert_scale_factor": 0,
    "autovacuum_vacuum_insert_threshold": 1000,
    "autovacuum_vacuum_cost_delay": 0,
}
"""Every ship table whose rows are inserted, updated and deleted all day (see the module
docstring for each value's reason)."""

HOT_ROW_OPTIONS: Final[Mapping[str, OptionValue]] = {**CHURN_OPTIONS, "fillfactor": 50}
"""A table of few rows updated in place without touching an index (the job state table)."""

LIVE_RUNS_OPTIONS: Final[Mapping[str, OptionValue]] = {
    **CHURN_OPTIONS,
    "vacuum_index_cleanup": "on",
}
"""The runs table (live runs only, J16): :data:`CHURN_OPTIONS`, and every vacuum cleans its
indexes (see the module docstring)."""


def declare_storage_options(table: Table, options: Mapping[str, OptionValue]) -> Table:
    """Declare ``table``'s storage options (J21); the ``after_create`` hook sets them."""
    table.info[STORAGE_OPTIONS_INFO] = dict(options)
    return table


def storage_options(table: Table) -> dict[str, OptionValue]:
    """The storage options ``table`` declares (empty: none)."""
    declared: Mapping[str, OptionValue] = table.info.get(STORAGE_OPTIONS_INFO) or {}
    return dict(declared)


def storage_options_sql(options: Mapping[str, OptionValue]) -> str:
    """``(name = value, ...)`` as ``ALTER TABLE ... SET`` takes it."""
    return "(" + ", ".join(f"{name} = {value}" for name, value in options.items()) + ")"


def storage_options_ddl(table: Table, options: Mapping[str, OptionValue] | None = None) -> str:
    """``ALTER TABLE <table> SET (...)`` of ``table``'s declared options (or ``options``): for a
    migration that creates the table without the hook (``op.execute(...)``), or sets them on a
    table created before they were declared. Empty when there are none."""
    wanted = storage_options(table) if options is None else dict(options)
    if not wanted:
        return ""
    from sqlalchemy.dialects import postgresql  # noqa: PLC0415 - only for rendering text

    preparer = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]
    return f"ALTER TABLE {preparer.format_table(table)} SET {storage_options_sql(wanted)}"


def _alter(table: Table) -> DDL:
    # %(fullname)s is the table's name as the dialect (and a schema_translate_map) renders it.
    sql = f"ALTER TABLE %(fullname)s SET {storage_options_sql(storage_options(table))}"
    return DDL(sql)  # type: ignore[no-untyped-call]


@event.listens_for(Table, "after_create")
def _set_storage_options(table: Table, connection: Any, **kw: Any) -> None:  # noqa: ANN401
    """After a declared table's CREATE TABLE: its storage options, in the same transaction.
    Alembic hands its own DDL runner, which also renders ``--sql`` (offline) migrations."""
    if not storage_options(table):
        return
    statement = _alter(table).against(table)
    runner: Any = kw.get("_ddl_runner")
    if type(runner).__module__.startswith("alembic."):
        runner._exec(statement)  # noqa: SLF001 - Alembic's one way to run (or print) DDL
        return
    connection.execute(statement)
