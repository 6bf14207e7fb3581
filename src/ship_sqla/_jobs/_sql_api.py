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
import re
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs
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
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import TIMESTAMP
from sqlalchemy.engine import Connection

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
    text_name,
)
from ship_sqla._notify import channel_name
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._plans.announce import BUDGET_KNEE, MAX_GAP, MIN_GAP, NOTIFY_BUDGET

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sqlalchemy.ext.asyncio import AsyncConnection

    from ship_sqla.kernel._jobs import JobDefinition

__all__ = [
    "SKIP_INSTALL_OPTION",
    "SQL_API_VERSIONS",
    "SqlEnqueueInstall",
    "definition_params",
    "enqueue_function_name",
    "install_sql_enqueue",
    "ship_job_definitions_table",
    "sql_enqueue_ddl",
    "sql_enqueue_installs",
    "sql_enqueue_status",
    "sync_job_definitions",
]

SQL_API_VERSIONS: Final = ("v1",)
"""E5: the published versions of the SQL enqueue API (each keeps its signature, result columns
and outcomes for a whole major release)."""

_TSTZ = TIMESTAMP(timezone=True)
_COMMENT_PREFIX: Final = "ship_sqla sql enqueue build "
_INFO_KEY: Final = "ship_sqla_sql_enqueue"

SKIP_INSTALL_OPTION: Final = "ship_sqla_skip_sql_enqueue"
"""An execution option: with it set, ``create_all`` does not install the SQL enqueue functions
(the schema check's scratch copy; ``schema apply``, which installs them itself when missing or
outdated)."""


@attrs.frozen(eq=False)
class SqlEnqueueInstall:
    """One install of the SQL enqueue API that a metadata declares (E6): its definitions table,
    the backend's runs, state and history tables, and the hardened variant's role (E7)."""

    definitions: Table
    runs: Table
    state: Table
    history: Table | None = None
    definer_role: str | None = None

    @property
    def function(self) -> str:
        """``<runs>_enqueue_v1``, schema-qualified as installed."""
        return enqueue_function_name(
            self.runs, schema="public" if self.definer_role is not None else None
        )

    def ddl(self) -> list[str]:
        """:func:`sql_enqueue_ddl` for this install: what ``schema apply`` runs, and the
        statements of a migration."""
        return sql_enqueue_ddl(
            self.runs,
            self.state,
            self.definitions,
            definer_role=self.definer_role,
            history=self.history,
        )


def sql_enqueue_installs(metadata: MetaData) -> list[SqlEnqueueInstall]:
    """E6: the SQL enqueue installs ``metadata`` declares (its definitions tables made by
    :func:`ship_job_definitions_table` with ``runs`` and ``state``)."""
    return [
        table.info[_INFO_KEY]
        # by name, not ``sorted_tables``: that resolves every foreign key of the metadata, and
        # one whose target another schema holds (or no table yet) is not this function's concern
        for table in sorted(metadata.tables.values(), key=lambda table: table.fullname)
        if isinstance(table.info.get(_INFO_KEY), SqlEnqueueInstall)
    ]


def ship_job_definitions_table(
    metadata: MetaData,
    name: str = "ship_job_definitions",
    schema: str | None = None,
    *,
    runs: Table | None = None,
    state: Table | None = None,
    history: Table | None = None,
    definer_role: str | None = None,
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
    installs the SQL enqueue functions once the tables exist (E6), and so do ``ship-sqla schema
    apply`` and the schema check's report (:func:`sql_enqueue_installs`); ``history``: the
    backend's history table (J16), which their durable-id probe reads too; ``definer_role``
    (E7): install the hardened ``SECURITY DEFINER`` variant, EXECUTE granted to that role."""
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
        declared = SqlEnqueueInstall(table, runs, state, history, definer_role)
        table.info[_INFO_KEY] = declared
        statements = declared.ddl()

        def install(_target: MetaData, connection: object, **_: Any) -> None:  # noqa: ANN401
            # A mock engine's connection (``schema sql``, which prints them itself) runs nothing.
            if not isinstance(connection, Connection):
                return
            if connection.get_execution_options().get(SKIP_INSTALL_OPTION):
                return
            for statement in statements:
                connection.exec_driver_sql(statement)

        event.listen(metadata, "after_create", install)
    return table


_PREPARER: Final = postgresql.dialect(paramstyle="named").identifier_preparer  # type: ignore[no-untyped-call]


def enqueue_function_name(
    runs: Table, suffix: str = "_enqueue_v1", *, schema: str | None = None
) -> str:
    """The function ``<runs><suffix>`` (default ``<runs>_enqueue_v1``), quoted as needed and
    qualified by the runs table's schema (the functions live there), else by ``schema``."""
    name = _PREPARER.quote(f"{runs.name}{suffix}")
    owner = runs.schema if runs.schema is not None else schema
    return name if owner is None else f"{_PREPARER.quote_schema(owner)}.{name}"


_PLACEHOLDER: Final = re.compile(r"\{fn\}(_[a-z0-9_]+)|\{([a-z_]+)\}")
"""A template's ``{fn}_<suffix>`` (a function's name) or ``{name}`` (a value)."""


def _render(template: str, values: dict[str, str], functions: dict[str, str]) -> str:
    """``template`` with its placeholders filled in one pass: a table's name holding ``{state}``
    is never read as a placeholder (values are not rendered again)."""

    def fill(found: re.Match[str]) -> str:
        if found.group(1) is not None:
            return functions[found.group(1)]
        return values.get(found.group(2), found.group(0))

    return _PLACEHOLDER.sub(fill, template)


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
    owner: str | None = None
    security = "SECURITY INVOKER"
    names = [quoted_table(table) for table in (runs, state, definitions)]
    if definer_role is not None:
        # A fixed search_path: every name the body uses is schema-qualified.
        security = "SECURITY DEFINER SET search_path = pg_catalog, pg_temp"
        owner = "public"
        names = [
            name if table.schema is not None else f"public.{name}"
            for name, table in zip(names, (runs, state, definitions), strict=True)
        ]
    functions = _Functions(runs, owner)
    result = enqueue_function_name(runs, "_enqueue_result", schema=owner)
    values = {
        "fn_plain": runs.name.replace("'", "''"),
        "result_literal": result.replace("'", "''"),
        "result": result,
        "runs": names[0],
        "state": names[1],
        "defs": names[2],
        "defs_literal": names[2].replace("'", "''"),
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
        _render(t, values, functions)
        for t in (JSON_SIZE, NEW_RUN_ID, ANNOUNCE, ENQUEUE_V1, ENQUEUE_MANY_V1)
    ]
    build = hashlib.sha256("\n".join(bodies).encode()).hexdigest()[:16]
    values["build"] = build
    statements = [
        _render(RESULT_TYPE, values, functions),
        *bodies,
        _render(ENQUEUE_VERSIONS, values, functions),
    ]
    comment = f"'{_COMMENT_PREFIX}{build}'"
    signatures = _signatures(runs, owner)
    statements += [f"COMMENT ON FUNCTION {sig} IS {comment}" for sig in signatures]
    if definer_role is not None:
        role = quoted_identifier(definer_role)
        for signature in signatures:
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


class _Functions(dict[str, str]):
    """``{fn}<suffix>`` of the templates -> the function's quoted, qualified name."""

    def __init__(self, runs: Table, owner: str | None) -> None:
        super().__init__()
        self.runs = runs
        self.owner = owner

    def __missing__(self, suffix: str) -> str:
        return enqueue_function_name(self.runs, suffix, schema=self.owner)


def _signatures(runs: Table, owner: str | None = None) -> tuple[str, str]:
    """E5: the published signatures, ``<runs>_enqueue_v1(...)`` and ``_enqueue_many_v1``."""
    one = enqueue_function_name(runs, schema=owner)
    many = enqueue_function_name(runs, "_enqueue_many_v1", schema=owner)
    return (
        f"{one}(text, jsonb, timestamptz, integer, text, text, text, text, jsonb, jsonb)",
        f"{many}(jsonb)",
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


STATUS = text(
    "SELECT count(p.signature), count(*) FILTER (WHERE obj_description(p.signature, 'pg_proc')"
    " = CAST(:comment AS text)) FROM unnest(CAST(:signatures AS text[])) AS s(name)"
    " CROSS JOIN LATERAL (SELECT to_regprocedure(s.name) AS signature) AS p"
)
"""E6: of the published signatures, how many exist, and how many carry this build's COMMENT."""


def status_of(
    connection: Connection, install: SqlEnqueueInstall
) -> Literal["current", "missing", "outdated"]:
    """E6: whether ``install``'s functions exist (every published signature, E5), and with this
    library's build (the build hash of their COMMENT)."""
    owner = "public" if install.definer_role is not None else None
    signatures = list(_signatures(install.runs, owner))
    comment = f"{_COMMENT_PREFIX}{build_of(install.ddl())}"
    found, current = connection.execute(
        STATUS, {"signatures": signatures, "comment": comment}
    ).one()
    if found < len(signatures):
        return "missing"
    return "current" if current == len(signatures) else "outdated"


async def sql_enqueue_status(
    connection: AsyncConnection,
    runs: Table,
    state: Table,
    definitions: Table,
    *,
    definer_role: str | None = None,
    history: Table | None = None,
) -> Literal["current", "missing", "outdated"]:
    """E6: whether ``<runs>_enqueue_v1`` and ``_enqueue_many_v1`` are installed, and with this
    library's build (the build hash of their COMMENT): the schema check's answer."""
    install = SqlEnqueueInstall(definitions, runs, state, history, definer_role)
    return await connection.run_sync(status_of, install)


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
    sql = UPSERT_DEFINITIONS.replace("{defs}", text_name(quoted_table(definitions_table)))
    await connection.execute(text(sql), params)
