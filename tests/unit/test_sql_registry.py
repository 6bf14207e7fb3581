"""The one SQL registry and renderer (issue 26, item 4): a statement is declared once, as a
Template; one collector finds it; one renderer renders it once per table set."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from sqlalchemy import MetaData

from ship_sqla._jobs import (
    ship_job_events_table,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
    ship_job_workers_table,
)
from ship_sqla._jobs._sql import JobStatements, templates
from ship_sqla._jobs._sql.settle import SETTLE_IF_TOKEN_CURRENT
from ship_sqla._jobs._sql.workflows import LOAD_STEPS
from ship_sqla._sql import NOW, SERVER_NOW, TABLELESS, Statements, Template, collect
from ship_sqla._sql.locks import TRY_LOCK
from ship_sqla._sql_time import now_bound
from ship_sqla.kernel import SystemClock
from ship_sqla.testing import FrozenClock

_PLACEHOLDER = re.compile(r"\{[a-z]+\}")


def _all_tables(server_clock: bool = False) -> JobStatements:
    metadata = MetaData()
    return JobStatements.for_tables(
        ship_job_runs_table(metadata),
        ship_job_state_table(metadata),
        workers=ship_job_workers_table(metadata),
        steps=ship_job_steps_table(metadata),
        events=ship_job_events_table(metadata),
        history=ship_job_history_table(metadata),
        server_clock=server_clock,
    )


def test_every_job_statement_is_collected_once_and_rendered_whole() -> None:
    """Declaring a Template in a module of _jobs/_sql is all it takes: the collector finds each
    once (by its module.NAME), and each renders with every placeholder filled."""
    found = templates()
    assert len(set(found.values())) == len(found)
    assert found[SETTLE_IF_TOKEN_CURRENT] == "settle.SETTLE_IF_TOKEN_CURRENT"
    assert found[LOAD_STEPS] == "workflows.LOAD_STEPS"
    rendered = _all_tables().every_statement()
    assert set(rendered) == set(found.values())
    for name, statement in rendered.items():
        assert not _PLACEHOLDER.search(statement.text), name


def test_a_statement_is_rendered_once_per_table_set() -> None:
    """The registry hands back the same TextClause for a template every time (so SQLAlchemy
    caches its compiled form), one per table set."""
    statements, other = _all_tables(), _all_tables()
    assert statements[SETTLE_IF_TOKEN_CURRENT] is statements[SETTLE_IF_TOKEN_CURRENT]
    assert statements[SETTLE_IF_TOKEN_CURRENT] is not other[SETTLE_IF_TOKEN_CURRENT]
    assert statements[SETTLE_IF_TOKEN_CURRENT].text == other[SETTLE_IF_TOKEN_CURRENT].text
    assert TABLELESS[TRY_LOCK] is TABLELESS[TRY_LOCK]


def test_only_the_claims_follow_the_server_clock() -> None:
    """On the database's clock a claim_clock template says now(); every other statement says
    coalesce(:now, now()) whatever the clock."""
    frozen, server = _all_tables().every_statement(), _all_tables(server_clock=True)
    for template, name in templates().items():
        if template.claim_clock:
            assert NOW not in server[template].text, name
            assert SERVER_NOW in server[template].text, name
        else:
            assert server[template].text == frozen[name].text, name


def test_a_statement_naming_a_table_not_given_is_refused() -> None:
    """A store given no steps table cannot render a workflow statement: a wiring mistake,
    said plainly, not a statement naming ``{steps}``."""
    statements = JobStatements(runs='"r"', state='"s"')
    with pytest.raises(ValueError, match=r"\{steps\} table"):
        statements[LOAD_STEPS]
    assert "workflows.LOAD_STEPS" not in statements.every_statement()


def test_the_renderer_compacts_before_it_fills_and_escapes_names() -> None:
    """D3 (issue 25): the template is compacted, then the name put in whole (its ``--`` is not a
    comment, its colon not a bind parameter), in one pass (its ``{t}`` is not filled again)."""
    template = Template("SELECT 1 FROM {t} -- a comment\n  WHERE x = :x\n")
    statements = Statements({"{t}": '"a--b:{t}"'})
    assert statements[template].text == 'SELECT 1 FROM "a--b\\:{t}"\nWHERE x = :x\n'
    as_written = Template("SELECT 1 FROM {t} -- kept\n", compacted=False)
    assert statements[as_written].text == 'SELECT 1 FROM "a--b\\:{t}" -- kept\n'


def test_every_other_concerns_statement_is_collected() -> None:
    """The locks', announcements', RLS's and schema apply's templates are found by the same
    collector."""
    names = set(collect("ship_sqla._sql").values())
    assert {"locks.TRY_LOCK", "notify.NOTIFY", "rls.SET_TENANT_SETTING"} <= names
    assert "schema_apply.APPLY_LOCK" in names


def test_now_is_the_frozen_clocks_time_else_the_databases() -> None:
    """``:now`` of coalesce(:now, now()): a frozen clock's time (tests move time), else None."""
    start = datetime(2030, 1, 1, tzinfo=UTC)
    assert now_bound(FrozenClock(start)) == start
    assert now_bound(SystemClock()) is None
