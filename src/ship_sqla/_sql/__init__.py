"""The one way a ship statement written as SQL text is declared, collected and rendered.

- **Declared** once: a :class:`Template` module constant in its concern's SQL module (the job
  tables' in :mod:`ship_sqla._jobs._sql`, the audit log's in :mod:`ship_sqla._audit._sql`, the
  locks' in :mod:`.locks`, the notifications' in :mod:`.notify`, row-level security's in
  :mod:`.rls`, the schema apply's in :mod:`.schema_apply`), its docstring right after it, the
  index that serves it in a comment beside the hot ones. Its text names tables by
  placeholder (``{runs}``, ``{state}``, ``{audit}``...), reads time as ``{now}`` and writes a
  history entry's time as ``{at}`` (and the attempt's start, a running row ``r``'s
  ``updated_at``, as ``{began}``).
- **Collected** automatically: :func:`collect` finds every :class:`Template` of a package's
  public modules (each module whose name has no leading underscore), so a new statement is one
  declaration; tests walk the collection (every statement prepares on odd names, fits asyncpg's
  statement cache, holds no placeholder unfilled).
- **Rendered** once per table set, on first use: :class:`Statements` (a store's registry, built
  once per store) hands back the same ``TextClause`` for the same template every time, so
  SQLAlchemy caches its compiled form and asyncpg its prepared statement. Rendering first
  compacts the library's own text (:func:`compact`, once per process), THEN fills every
  placeholder in one pass (:func:`~ship_sqla._naming.fill`), each table name escaped for
  ``text()`` (:func:`~ship_sqla._naming.text_name`): a name is never altered, whatever it holds
  (``"jobs--v2"`` is not a comment; issue 25 D3). Nothing is rendered that is never run: a CLI
  command or a test that builds a store and runs two statements renders two. A statement that
  names no table is rendered once per process, by :data:`TABLELESS`.

The statements built with SQLAlchemy Core (outbox, idempotency, webhooks) read time through
:mod:`ship_sqla._sql_time` instead.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
import types
from typing import TYPE_CHECKING, Final

import attrs
from sqlalchemy import TextClause, text

from ship_sqla._naming import fill, text_name

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "ASYNCPG_CACHEABLE",
    "AT",
    "BEGAN",
    "NOW",
    "SERVER_NOW",
    "TABLELESS",
    "Statements",
    "Template",
    "collect",
    "compact",
]

NOW: Final = "coalesce(CAST(:now AS timestamptz), now())"
"""What ``{now}`` says: ``:now`` is the store's clock when it is frozen (tests move time), else
NULL and the database's clock rules (:func:`~ship_sqla._sql_time.now_bound`)."""
SERVER_NOW: Final = "now()"
"""``{now}`` of a claim on a backend whose clock is the database's (``:now`` is always NULL
there): the planner then sees the instant (a stable function, evaluated for its estimates),
where ``coalesce(:now, now())`` is costed at a default third of the due runs in a generic plan
and kept PostgreSQL from settling on one (see ``MAX_CLAIM_BATCH``)."""


def _at(now: str) -> str:
    return "to_char(" + now + """ AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')"""


AT: Final = _at(NOW)
"""A history entry's ``at`` (``{at}``): ISO-8601 UTC text whatever the session's TimeZone."""
BEGAN: Final = _at("r.updated_at")
"""A history entry's ``started`` (``{began}``, J18): the attempt's start, as ``at``'s text. A
running row's ``updated_at`` is its attempt's start as its claim recorded it (F3's start, see
:mod:`ship_sqla._jobs._sql.claim`), and nothing but the claim writes it while the run runs: the
heartbeat, a cancel request and a parent's wake leave it (they had overwritten it, and a lapsed
attempt's start was lost). Read through the SET of an UPDATE of alias ``r`` (the row before
it), or a DELETE's RETURNING."""

ASYNCPG_CACHEABLE: Final = 15 * 1024
"""asyncpg's default ``max_cacheable_statement_size``: a longer statement is never kept in its
statement cache, so it is parsed and planned at every execution (on the direct path the claim,
the settle and the heartbeat run through that cache)."""


@attrs.frozen(eq=False)
class Template:
    """One statement's SQL text, with placeholders, declared once as a module constant of its
    concern's SQL module (see the module docstring). Compared and hashed by identity: a
    registry indexes its rendered statements by the template itself."""

    sql: str = attrs.field(repr=False)
    """The text as written, comments and all (the reader's copy)."""
    claim_clock: bool = attrs.field(default=False, kw_only=True)
    """``{now}`` (and ``{at}``) say SERVER_NOW on a store whose clock is the database's: the
    claims only (see SERVER_NOW); every other statement says NOW whatever the clock."""
    compacted: bool = attrs.field(default=True, kw_only=True)
    """Sent without its comments and indentation (:func:`compact`). False: sent as written (the
    worker-registry and workflow statements, as they always were)."""


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

    A bind parameter's cast is sent in PostgreSQL's shorter form, the same cast:
    ``CAST(:limit AS integer)`` as ``:limit ::integer`` (the space keeps it a bind parameter to
    SQLAlchemy's ``text()``; ``double precision`` as ``float8``). The longest claims fit the
    statement cache by what that saves.

    Only ever given the library's own template text, before any table name is put in (see
    :class:`Statements`): a quoted name such as ``"jobs--v2"`` must never pass through it."""
    lines = [code for line in sql.splitlines() if (code := _without_comment(line).strip())]
    return _BIND_CAST.sub(_short_cast, "\n".join(lines) + "\n")


_BIND_CAST: Final = re.compile(r"CAST\((:\w+) AS ([a-z][a-z0-9_]*(?: precision)?(?:\[\])?)\)")
"""``CAST(:name AS type)``, ``type`` a plain type name (``integer``, ``text[]``, ``double
precision``), never one with a modifier (``numeric(10, 2)``, left as written)."""


def _short_cast(match: re.Match[str]) -> str:
    name, kind = match.groups()
    return f"{name} ::{kind.replace('double precision', 'float8')}"


_compacted: Final = functools.cache(compact)
""":func:`compact` of each template's text once per process (a bounded set: this package's
constants)."""


@functools.cache
def collect(package: str) -> Mapping[Template, str]:
    """Every :class:`Template` of ``package``'s public modules (their names have no leading
    underscore), each with its ``module.NAME``, in the modules' and declarations' order; a
    template one module imports from another is listed once, under its first name."""
    found: dict[Template, str] = {}
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, Template):
                found.setdefault(value, f"{info.name}.{name}")
    return types.MappingProxyType(found)


class Statements:
    """A store's statements for one table set: ``statements[TEMPLATE]`` is ``TEMPLATE``
    rendered for these tables, the same ``TextClause`` every time (rendered on first use, see
    the module docstring). Build one per store, at its construction."""

    __slots__ = ("_absent", "_claim_values", "_rendered", "_values")

    def __init__(
        self,
        tables: Mapping[str, str | None],
        *,
        fragments: Mapping[str, str] | None = None,
        server_clock: bool = False,
    ) -> None:
        """``tables``: each table placeholder (``"{runs}"``) and its quoted, schema-qualified
        name (:func:`~ship_sqla._naming.quoted_table`), or None for a table this store was not
        given (a statement naming it is a wiring mistake, said plainly). ``fragments``: other
        placeholders and the SQL they stand for. ``server_clock``: the store's clock is the
        database's, so a :attr:`Template.claim_clock` statement says SERVER_NOW."""
        values = dict(fragments or {})
        values.update({key: text_name(name) for key, name in tables.items() if name is not None})
        values["{began}"] = BEGAN
        self._values: Final = {**values, "{at}": AT, "{now}": NOW}
        claim_now = SERVER_NOW if server_clock else NOW
        self._claim_values: Final = {**values, "{at}": _at(claim_now), "{now}": claim_now}
        self._absent: Final = tuple(key for key, name in tables.items() if name is None)
        self._rendered: dict[Template, TextClause] = {}

    def __getitem__(self, template: Template) -> TextClause:
        rendered = self._rendered.get(template)
        if rendered is None:
            rendered = self._rendered[template] = self._render(template)
        return rendered

    def _render(self, template: Template) -> TextClause:
        sql = _compacted(template.sql) if template.compacted else template.sql
        for key in self._absent:
            if key in sql:  # a wiring mistake, said plainly
                raise ValueError(f"this statement names the {key} table, which was not given")
        return text(fill(sql, self._claim_values if template.claim_clock else self._values))

    def every(self, templates: Mapping[Template, str]) -> dict[str, TextClause]:
        """Each of ``templates`` (from :func:`collect`) whose tables this set has, rendered, by
        its ``module.NAME`` (for tests that check every statement)."""
        return {
            name: self[template]
            for template, name in templates.items()
            if not any(key in template.sql for key in self._absent)
        }


TABLELESS: Final = Statements({})
"""The registry of the statements that name no table (``TABLELESS[TRY_LOCK]``), shared by the
whole process: each is rendered once, on its first use."""
