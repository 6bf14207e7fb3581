"""The one start-time probe of the ship tables: does every table a surface needs exist?

A worker runtime (:meth:`PostgresJobBackend.require_support`, which ``start_job_runtime``
calls), the outbox relay, the dashboard and the Idempotency-Key middleware each ask once, when
they start (the dashboard and the middleware at their application's startup, else at their first
request), with ONE statement (:data:`~ship_sqla._sql.schema_probe.MISSING_RELATIONS`). A table
that is missing is refused there with :class:`MissingTablesError`, naming every missing table
and the exact ``ship-sqla schema apply`` command that creates them, instead of a database error
at each poll or request. The fair claims' index (F2) is probed the same way, its fix its DDL
(``schema apply`` creates tables, it never alters one).

A probe that cannot run (the database is down, or refuses the connection) decides nothing: by
default the surface starts anyway, as it always could while its database was away, and its loop
reports that error as it always did (J11; the check is asked again at the surface's next
start, or next request for the dashboard and the middleware). ``strict=True`` (``ship-sqla
worker``) raises it instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import attrs
from sqlalchemy.exc import SQLAlchemyError

from ship_sqla._naming import quoted_identifier, quoted_table
from ship_sqla._scope import OWN, StoreConnections
from ship_sqla._sql import TABLELESS
from ship_sqla._sql.schema_probe import MISSING_RELATIONS
from ship_sqla.kernel._errors import ConfigurationError, OutageError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sqlalchemy import Table

    from ship_sqla._scope import Database

__all__ = [
    "MissingTablesError",
    "Needed",
    "apply_command",
    "missing_relations",
    "require_tables",
]

_COMPONENTS: Final = {
    "runs": "jobs",
    "state": "jobs",
    "workers": "jobs",
    "history": "jobs",
    "stats": "jobs",
    "steps": "workflows",
    "events": "workflows",
    "outbox": "outbox",
    "idempotency": "idempotency",
    "audit": "audit",
    "backfills": "backfills",
    "webhook-endpoints": "webhooks_out",
    "webhook-deliveries": "webhooks_out",
}
"""Each ship table's kind, and the ``schema apply --only`` component that creates it (its name
option is ``--<kind>-table``, but the history's and the stats': ``schema apply`` creates them by
their default names beside the runs table)."""


class MissingTablesError(ConfigurationError):
    """A surface (a worker runtime, the outbox relay, the dashboard, the Idempotency-Key
    middleware) checked at its start that the ship tables it needs exist, and some do not:
    ``missing`` names them (schema-qualified), and the fix is the command that creates them."""

    code = "SHIP_SQLA_TABLES_MISSING"

    def __init__(self, message: str, *, fix: str, missing: tuple[str, ...]) -> None:
        super().__init__(message, fix=fix)
        self.missing = missing


@attrs.frozen
class Needed:
    """One relation a surface needs: a ship table of a kind (:meth:`table`), or an index with
    the DDL that adds it to an existing table (:meth:`index`)."""

    relation: str
    """Schema-qualified and quoted, as ``to_regclass`` reads it (and the message shows it)."""
    kind: str | None = None
    name: str = ""
    schema: str | None = None
    ddl: str | None = None

    @classmethod
    def table(cls, table: Table, kind: str) -> Needed:
        return cls(quoted_table(table), kind=kind, name=table.name, schema=table.schema)

    @classmethod
    def index(cls, table: Table, name: str, ddl: str) -> Needed:
        """The index ``name`` of ``table`` (an index lives in its table's schema)."""
        schema = f"{quoted_identifier(table.schema)}." if table.schema else ""
        return cls(f"{schema}{quoted_identifier(name)}", ddl=ddl)


def apply_command(tables: Sequence[Needed], *, fair_claims: bool = False) -> str:
    """The ``ship-sqla schema apply`` command that creates ``tables`` under their names."""
    components = dict.fromkeys(_COMPONENTS[t.kind] for t in tables if t.kind is not None)
    parts = ["ship-sqla schema apply", *(f"--only {c}" for c in components)]
    schema = next((t.schema for t in tables if t.schema is not None), None)
    if schema is not None:
        parts.append(f"--schema {schema}")
    parts.extend(
        f"--{t.kind}-table {t.name}" for t in tables if t.kind not in (None, "history", "stats")
    )
    if fair_claims:
        parts.append("--fair-claims")
    return " ".join(parts)


async def missing_relations(
    database: Database | StoreConnections, needed: Sequence[Needed], *, surface: str
) -> list[Needed]:
    """The relations of ``needed`` the database does not have, in one statement; an outage is
    the store's (:class:`~ship_sqla.errors.DatabaseUnavailableError`)."""
    connections = (
        database
        if isinstance(database, StoreConnections)
        else StoreConnections(database, name=surface)
    )
    rows = await connections.rows(
        "check of its tables",
        TABLELESS[MISSING_RELATIONS],
        {"names": [n.relation for n in needed]},
        scope=OWN,
    )
    absent = {row[0] for row in rows}
    return [n for n in needed if n.relation in absent]


async def require_tables(
    database: Database | StoreConnections,
    needed: Sequence[Needed],
    *,
    surface: str,
    fair_claims: bool = False,
    strict: bool = False,
) -> bool:
    """True when every relation of ``needed`` exists; raise :class:`MissingTablesError` naming
    the missing ones, ``surface`` (who asked) and the fix (``fair_claims``: the runs table the
    command creates has the fair claims' index, F2). False when the probe could not run (see
    the module docstring; ``strict``: raise that error)."""
    try:
        missing = await missing_relations(database, needed, surface=surface)
    except (OutageError, SQLAlchemyError, OSError):
        if strict:
            raise
        return False
    if not missing:
        return True
    raise MissingTablesError(
        f"{surface} needs {', '.join(n.relation for n in missing)}, which the database does"
        " not have (checked at its start, so nothing runs against a missing table).",
        fix=_fix(missing, needed, fair_claims=fair_claims),
        missing=tuple(n.relation for n in missing),
    )


def _fix(missing: Sequence[Needed], needed: Sequence[Needed], *, fair_claims: bool) -> str:
    """The command names every needed table (their names, so ``--only`` creates no other),
    and creates the missing ones (``schema apply`` leaves existing tables as they are)."""
    tables = [n for n in missing if n.kind is not None]
    named = [n for n in needed if n.kind is not None]
    steps = []
    if tables:
        steps.append(
            f"create the tables: `{apply_command(named, fair_claims=fair_claims)}`"
            " (with --database-url or SHIP_SQLA_DATABASE_URL), or add their factories"
            " (ship_job_runs_table, ship_outbox_table...) to your migrations and migrate"
        )
    # With --fair-claims the apply that creates the runs table creates its index too.
    steps.extend(
        f"add the index to the existing table (Alembic autogenerate adds it; by hand: {n.ddl})"
        for n in missing
        if n.ddl is not None and not (tables and fair_claims)
    )
    return "; ".join(steps) + "."
