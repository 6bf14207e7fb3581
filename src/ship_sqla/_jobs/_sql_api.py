"""Enqueue from any language (SPEC §18, E1-E8): the job definitions table, its upsert, and the
versioned SQL functions ``<runs>_enqueue_v1`` / ``<runs>_enqueue_many_v1`` /
``<runs>_enqueue_versions`` rendered for one set of job tables, with the build hash their
COMMENT carries so a schema check can tell a missing or outdated install (E6).

The functions' text is :mod:`ship_sqla._jobs._sql.sql_api`; K8's announce constants are read
from :mod:`ship_sqla.kernel._plans.announce`, so the database-side rule and the Python one are
the same numbers, written once.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Final, Literal

from sqlalchemy import (
    Boolean,
    Column,
    Integer,
    Interval,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    event,
    text,
)
from sqlalchemy.dialects.postgresql import TIMESTAMP

from ship_sqla._jobs._sql.sql_api import (
    ANNOUNCE,
    ENQUEUE_MANY_V1,
    ENQUEUE_V1,
    ENQUEUE_VERSIONS,
    ERROR,
    HISTORY_PROBE,
    JSON_SIZE,
    NEW_RUN_ID,
    RESULT_TYPE,
    UPSERT_DEFINITIONS,
)
from ship_sqla._naming import (
    MAX_IDENTIFIER_BYTES,
    derived_names,
    quoted_identifier,
    quoted_table,
)
from ship_sqla._notify import channel_name
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._plans.announce import BUDGET_KNEE, MAX_GAP, MIN_GAP, NOTIFY_BUDGET

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection

    from ship_sqla.kernel._jobs import JobDefinition

__all__ = [
    "SQL_API_VERSIONS",
    "definition_params",
    "enqueue_function_name",
    "install_sql_enqueue",
    "ship_job_definitions_table",
    "sql_enqueue_ddl",
    "sql_enqueue_status",
    "sync_job_definitions",
]

SQL_API_VERSIONS: Final = ("v1",)
"""E5: the published versions of the SQL enqueue API (each keeps its signature, result columns
and outcomes for a whole major release)."""

_TSTZ = TIMESTAMP(timezone=True)
_COMMENT_PREFIX: Final = "ship_sqla sql enqueue build "


def ship_job_definitions_table(
    metadata: MetaData,
    name: str = "ship_job_definitions",
    schema: str | None = None,
    *,
    runs: Table | None = None,
    state: Table | None = None,
    history: Table | None = None,
) -> Table:
    """E8: one row per job id, what SQL callers of ``<runs>_enqueue_v1`` need: ``max_attempts``,
    ``priority`` (the default, K6), ``max_payload_bytes``, ``queue_depth_limit`` (J2: the cap
    every enqueuer counts against, NULL: none), ``dedupe_required`` (an idempotency policy
    derives the dedupe key in Python: a SQL call must pass one), ``key_required`` (a
    single-runner job's key is derived in Python: a SQL call must pass ``key``),
    ``partition_by_key`` and ``partition_key_derived`` (F8: a limit per partition key; derived
    in Python: a SQL call must pass ``options.partition_key``), ``handler_version`` (D9: the
    version a run records at enqueue, NULL: unversioned), the retention columns
    ``completed_retention``, ``dead_retention``,
    ``cancelled_retention`` (intervals, NULL: the library's default; for the storage work) and
    ``updated_at``. Upserted by every worker at start and by ``ship-sqla jobs
    sync-definitions`` (:func:`sync_job_definitions`).

    With ``runs`` and ``state`` (the tables of the same backend), ``metadata.create_all`` also
    installs the SQL enqueue functions once the tables exist (E6); ``history``: the backend's
    history table (J16), which their durable-id probe reads too."""
    n = derived_names(name, ("_pkey",), "job definitions", schema=schema)
    table = Table(
        name,
        metadata,
        Column("job_id", Text, nullable=False),
        Column("max_attempts", Integer, nullable=False),
        Column("priority", SmallInteger, nullable=False),
        Column("max_payload_bytes", Integer, nullable=False),
        Column("queue_depth_limit", Integer, nullable=True),
        Column("dedupe_required", Boolean, nullable=False),
        Column("key_required", Boolean, nullable=False),
        Column("partition_by_key", Boolean, nullable=False),
        Column("partition_key_derived", Boolean, nullable=False),
        Column("handler_version", Integer, nullable=True),
        Column("completed_retention", Interval, nullable=True),
        Column("dead_retention", Interval, nullable=True),
        Column("cancelled_retention", Interval, nullable=True),
        Column("updated_at", _TSTZ, nullable=False, server_default=text("now()")),
        PrimaryKeyConstraint("job_id", name=n["_pkey"]),
        schema=schema,
        comment="ship_sqla job definitions for SQL enqueuers (ship_job_definitions_table)",
    )
    if runs is not None and state is not None:
        statements = sql_enqueue_ddl(runs, state, table, history=history)

        def install(_target: MetaData, connection: Connection, **_: Any) -> None:  # noqa: ANN401
            for statement in statements:
                connection.exec_driver_sql(statement)

        event.listen(metadata, "after_create", install)
    return table


def enqueue_function_name(runs: Table) -> str:
    """``<runs>_enqueue_v1``'s name prefix, ``<runs>``, schema-qualified and quoted as needed
    (the functions live in the runs table's schema)."""
    prefix = quoted_identifier(runs.name).strip('"')
    if runs.schema is not None:
        return f"{quoted_identifier(runs.schema)}.{prefix}"
    return prefix


def _render(template: str, values: dict[str, str]) -> str:
    for placeholder, value in values.items():
        template = template.replace("{" + placeholder + "}", value)
    return template


def sql_enqueue_ddl(
    runs: Table,
    state: Table,
    definitions: Table,
    *,
    definer_role: str | None = None,
    history: Table | None = None,
) -> list[str]:
    """The statements that install (or replace, E5: CREATE OR REPLACE only) the SQL enqueue API
    for these tables, in order, the last ones the COMMENTs with the build hash (E6).
    ``definer_role`` (E7): the hardened variant, ``SECURITY DEFINER`` with a fixed
    ``search_path``, EXECUTE revoked from PUBLIC and granted to that role only; None: ``SECURITY
    INVOKER`` (row-level security applies to the caller). ``history``: the backend's history
    table (J16), where a durable id that ended is found (J1)."""
    _require_short_names(runs)
    fn = enqueue_function_name(runs)
    security = "SECURITY INVOKER"
    names = [quoted_table(table) for table in (runs, state, definitions)]
    if definer_role is not None:
        # A fixed search_path: every name the body uses is schema-qualified.
        security = "SECURITY DEFINER SET search_path = pg_catalog, pg_temp"
        fn = fn if runs.schema is not None else f"public.{fn}"
        names = [
            name if table.schema is not None else f"public.{name}"
            for name, table in zip(names, (runs, state, definitions), strict=True)
        ]
    values = {
        "fn": fn,
        "fn_plain": runs.name,
        "result": f"{fn}_enqueue_result",
        "runs": names[0],
        "state": names[1],
        "defs": names[2],
        "channel": channel_name("ship_sqla.jobs", quoted_table(runs)).replace("'", "''"),
        "announce_row": f"{quoted_table(runs)}#sql-announce".replace("'", "''"),
        "security": security,
        "error": ERROR,
        "history_probe": ""
        if history is None
        else HISTORY_PROBE.replace(
            "{history}",
            quoted_table(history)
            if definer_role is None or history.schema is not None
            else f"public.{quoted_table(history)}",
        ),
        "budget": repr(NOTIFY_BUDGET),
        "knee": repr(BUDGET_KNEE),
        "min_gap": repr(MIN_GAP),
        "max_gap": repr(MAX_GAP),
    }
    bodies = [
        _render(t, values) for t in (JSON_SIZE, NEW_RUN_ID, ANNOUNCE, ENQUEUE_V1, ENQUEUE_MANY_V1)
    ]
    build = hashlib.sha256("\n".join(bodies).encode()).hexdigest()[:16]
    values["build"] = build
    statements = [_render(RESULT_TYPE, values), *bodies, _render(ENQUEUE_VERSIONS, values)]
    comment = f"'{_COMMENT_PREFIX}{build}'"
    statements += [f"COMMENT ON FUNCTION {sig} IS {comment}" for sig in _signatures(fn)]
    if definer_role is not None:
        role = quoted_identifier(definer_role)
        for signature in _signatures(fn):
            statements.append(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
            statements.append(f"GRANT EXECUTE ON FUNCTION {signature} TO {role}")
    return statements


_LONGEST_SUFFIX: Final = "_enqueue_versions"


def _require_short_names(runs: Table) -> None:
    """PostgreSQL cuts longer identifiers silently, which could make two of the functions one:
    refuse a runs table whose name leaves no room for the functions' suffixes."""
    longest = len(runs.name.encode()) + len(_LONGEST_SUFFIX)
    if longest > MAX_IDENTIFIER_BYTES:
        raise ConfigurationError(
            f"the runs table name {runs.name!r} is too long for the SQL enqueue functions"
            f" ({runs.name}{_LONGEST_SUFFIX} would be {longest} bytes, over"
            f" {MAX_IDENTIFIER_BYTES}).",
            fix=f"name the runs table in at most {MAX_IDENTIFIER_BYTES - len(_LONGEST_SUFFIX)}"
            " bytes to enqueue through SQL.",
        )


def _signatures(fn: str) -> tuple[str, str]:
    return (
        f"{fn}_enqueue_v1(text, jsonb, timestamptz, integer, text, text, text, text, jsonb, jsonb)",
        f"{fn}_enqueue_many_v1(jsonb)",
    )


def build_of(statements: list[str]) -> str:
    """The build hash the COMMENTs of ``statements`` (from :func:`sql_enqueue_ddl`) carry."""
    for statement in statements:
        if _COMMENT_PREFIX in statement:
            return statement.rsplit(_COMMENT_PREFIX, 1)[1].rstrip("'")
    raise ValueError("no COMMENT with a build hash in these statements")


async def install_sql_enqueue(
    connection: AsyncConnection,
    runs: Table,
    state: Table,
    definitions: Table,
    *,
    definer_role: str | None = None,
    history: Table | None = None,
) -> None:
    """Run :func:`sql_enqueue_ddl` on ``connection`` (in its transaction): ``schema apply`` and
    migrations call this (E6)."""
    ddl = sql_enqueue_ddl(runs, state, definitions, definer_role=definer_role, history=history)
    for statement in ddl:
        await connection.exec_driver_sql(statement)


async def sql_enqueue_status(
    connection: AsyncConnection, runs: Table, state: Table, definitions: Table
) -> Literal["current", "missing", "outdated"]:
    """E6: whether ``<runs>_enqueue_v1`` is installed, and with this library's build (the build
    hash of its COMMENT): the schema check's answer."""
    fn = enqueue_function_name(runs)
    signature = _signatures(fn)[0]
    found = await connection.execute(
        text(
            "SELECT obj_description(to_regprocedure(CAST(:signature AS text)), 'pg_proc'),"
            " to_regprocedure(CAST(:signature AS text)) IS NOT NULL"
        ),
        {"signature": signature},
    )
    comment, exists = found.one()
    if not exists:
        return "missing"
    wanted = build_of(sql_enqueue_ddl(runs, state, definitions))
    return "current" if comment == f"{_COMMENT_PREFIX}{wanted}" else "outdated"


def definition_params(
    definitions: Iterable[JobDefinition[Any]], *, queue_depth_limit: int | None = None
) -> dict[str, list[Any]]:
    """UPSERT_DEFINITIONS' parameters for ``definitions`` (E8); ``queue_depth_limit``: the
    backend's J2 cap, shared by every job it enqueues."""
    jobs = list(definitions)
    return {
        "job_ids": [job.id for job in jobs],
        "max_attempts": [job.retry.attempts for job in jobs],
        "priorities": [job.priority for job in jobs],
        "max_payload_bytes": [job.max_payload_bytes for job in jobs],
        "queue_depth_limits": [queue_depth_limit for _ in jobs],
        "dedupe_required": [job.idempotency is not None for job in jobs],
        "key_required": [job.concurrency.single_runner for job in jobs],
        "partition_by_key": [job.partition == "key" for job in jobs],
        "partition_key_derived": [job.partition_key is not None for job in jobs],
        "handler_versions": [job.version for job in jobs],
        "completed_s": [job.retention.completed.total_seconds() for job in jobs],
        "dead_s": [job.retention.dead.total_seconds() for job in jobs],
        "cancelled_s": [job.retention.cancelled.total_seconds() for job in jobs],
    }


async def sync_job_definitions(
    connection: AsyncConnection,
    definitions_table: Table,
    definitions: Iterable[JobDefinition[Any]],
    *,
    queue_depth_limit: int | None = None,
) -> None:
    """E8: upsert ``definitions``' rows (UPSERT_DEFINITIONS) in ``connection``'s transaction."""
    params = definition_params(definitions, queue_depth_limit=queue_depth_limit)
    if not params["job_ids"]:
        return
    sql = UPSERT_DEFINITIONS.replace("{defs}", quoted_table(definitions_table))
    await connection.execute(text(sql), params)
