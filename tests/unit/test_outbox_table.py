"""The outbox table factory and its statements, without a database (T1, O2 predicates)."""

from __future__ import annotations

import pytest
from sqlalchemy import MetaData
from sqlalchemy.dialects.postgresql import asyncpg
from sqlalchemy.schema import CreateIndex

from ship_sqla._outbox import ship_outbox_table
from ship_sqla._outbox._sql import build_statements
from ship_sqla._outbox._tables import (
    LEASE_INDEX_PREDICATE,
    ORDERING_INDEX_PREDICATE,
    PENDING_INDEX_PREDICATE,
)
from ship_sqla.errors import ConfigurationError

COLUMNS = [
    "id",
    "outbox_id",
    "topic",
    "payload",
    "headers",
    "ordering_key",
    "tenant_id",
    "state",
    "attempts",
    "max_attempts",
    "available_at",
    "created_at",
    "lease_expires_at",
    "lease_token",
    "claimed_by",
    "delivered_at",
    "last_error",
]


def sql(statement) -> str:
    return str(statement.compile(dialect=asyncpg.dialect()))


def test_columns_and_nullability():
    table = ship_outbox_table(MetaData())
    assert list(table.c.keys()) == COLUMNS
    nullable = {c.name for c in table.c if c.nullable}
    assert nullable == {
        "ordering_key",
        "tenant_id",
        "lease_expires_at",
        "lease_token",
        "claimed_by",
        "delivered_at",
        "last_error",
    }
    assert [c.name for c in table.primary_key] == ["id"]


def test_every_name_is_explicit_derived_and_survives_a_naming_convention():
    """T1: index and constraint names derive from the table name; a naming convention does not
    rename them."""
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "pk": "pk_%(table_name)s",
        }
    )
    table = ship_outbox_table(metadata, name="events_outbox", schema="app")
    assert {i.name for i in table.indexes} == {
        "events_outbox_pending_idx",
        "events_outbox_lease_idx",
        "events_outbox_ordering_idx",
    }
    assert {c.name for c in table.constraints} == {
        "events_outbox_pkey",
        "events_outbox_state_check",
    }
    assert table.schema == "app"
    ddl = {i.name: str(CreateIndex(i).compile(dialect=asyncpg.dialect())) for i in table.indexes}
    assert ddl["events_outbox_pending_idx"].endswith(
        "(outbox_id, available_at, created_at) WHERE state = 'pending'"
    )
    assert ddl["events_outbox_lease_idx"].endswith(
        "(outbox_id, lease_expires_at) WHERE state = 'claimed'"
    )


def test_names_longer_than_postgres_allows_are_refused():
    """T1: every derived name fits PostgreSQL's 63 bytes, or the factory says how to fix it."""
    ship_outbox_table(MetaData(), name="x" * 50)
    with pytest.raises(ConfigurationError, match="63-byte"):
        ship_outbox_table(MetaData(), name="x" * 51)


def test_claim_predicates_are_the_index_predicates_word_for_word():
    """O2: the claim writes each partial index's predicate as a literal, exactly as declared, so
    PostgreSQL can prove the index applies even under a generic prepared plan."""
    table = ship_outbox_table(MetaData())
    statements = build_statements(table)
    for statement in (statements.claim, statements.claim_ordered):
        text = sql(statement)
        assert f"ship_outbox.{PENDING_INDEX_PREDICATE}" in text
        assert f"ship_outbox.{LEASE_INDEX_PREDICATE}" in text
        assert "FOR UPDATE SKIP LOCKED" in text
        assert "coalesce($" in text
        assert "now())" in text
    ordered = sql(statements.claim_ordered)
    for part in ORDERING_INDEX_PREDICATE.split(" AND "):
        assert f"earlier.{part}" in ordered


def test_settles_are_fenced_on_the_lease_token():
    """O3: every settle matches the id, the lease token and state = 'claimed'."""
    statements = build_statements(ship_outbox_table(MetaData()))
    for statement in (
        statements.complete,
        statements.settle,
        statements.heartbeat,
    ):
        text = sql(statement)
        assert "ship_outbox.lease_token = " in text
        assert "ship_outbox.state = 'claimed'" in text


def test_batch_statements_use_arrays_not_expanding_lists():
    statements = build_statements(ship_outbox_table(MetaData()))
    assert "unnest($" in sql(statements.enqueue)
    assert "unnest($" in sql(statements.complete)
    assert "unnest($" in sql(statements.settle)
    assert "any($" in sql(statements.retry)
    assert "POSTCOMPILE" not in "".join(
        sql(s)
        for s in (statements.enqueue, statements.retry, statements.complete, statements.settle)
    )
