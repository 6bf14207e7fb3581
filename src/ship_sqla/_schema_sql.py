"""DDL for projects without Alembic: the statements ``metadata.create_all()`` would run.

The statements are produced by SQLAlchemy's own DDL compiler through a mock engine, so they are
exactly what ``create_all`` executes: types (PostgreSQL enums), sequences, ``CREATE TABLE``
with every named constraint, then ``CREATE INDEX`` with partial predicates
(``postgresql_where``), ``INCLUDE`` columns and methods; then the SQL enqueue functions of
the job definitions tables (E6, ``CREATE OR REPLACE``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import create_mock_engine
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from ship_sqla._jobs._sql_api import sql_enqueue_installs
from ship_sqla.kernel._errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sqlalchemy import MetaData, Table

__all__ = ["schema_sql"]


def schema_sql(
    metadata: MetaData,
    *,
    dialect: str = "postgresql",
    tables: Iterable[Table] | None = None,
) -> str:
    """The DDL that creates ``metadata``'s tables (or ``tables``) on an empty database.

    One statement per paragraph, each ending in ``;``, in dependency order. ``dialect`` is a
    SQLAlchemy dialect name (``"postgresql"``; the ship tables' partial indexes and JSONB need
    PostgreSQL). Apply it once, e.g. ``psql -v ON_ERROR_STOP=1 -f schema.sql``.
    """
    statements: list[str] = []

    def executor(sql: Any, *_multiparams: Any, **_params: Any) -> None:  # noqa: ANN401
        compiled = str(sql.compile(dialect=engine.dialect)).strip()
        # SQLAlchemy ends each column line with ", "; trailing blanks are noise in a .sql file.
        statements.append("\n".join(line.rstrip() for line in compiled.splitlines()) + ";")

    try:
        # paramstyle "named": a "format" one (the default driver's) doubles every % of a quoted
        # name ("a%b" printed as "a%%b"), and this text goes to psql, not to a driver.
        engine = create_mock_engine(f"{dialect}://", executor, paramstyle="named")
    except (ArgumentError, NoSuchModuleError) as exc:
        raise ConfigurationError(
            f"unknown SQLAlchemy dialect {dialect!r}.", fix="use 'postgresql'."
        ) from exc
    bind: Any = engine  # a MockConnection is accepted wherever a bind is; not typed as one
    chosen = list(tables) if tables is not None else None
    metadata.create_all(bind, tables=chosen, checkfirst=False)
    # E6: the SQL enqueue functions of the definitions tables printed (CREATE OR REPLACE).
    for install in sql_enqueue_installs(metadata):
        if chosen is None or any(table is install.definitions for table in chosen):
            statements.extend(f"{statement};" for statement in install.ddl())
    return "\n\n".join(statements) + ("\n" if statements else "")
