"""Every statement the idempotency store runs, built once per table and named.

The table's name and schema are the application's choice, so statements are built from the
:class:`~sqlalchemy.Table` by :func:`build_statements`; each is one stable statement (SQLAlchemy
caches its compiled form, asyncpg its prepared statement). Time is ``coalesce(:now, now())``,
``:now`` being the injected clock's time when it is frozen. Bind names never repeat a column name
(SQLAlchemy reserves those in SET/VALUES clauses): keys are ``:k_prefix``, ``:k_tenant`` and
``:k_key``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
from sqlalchemy import (
    Integer,
    Table,
    Text,
    TextClause,
    and_,
    bindparam,
    delete,
    literal_column,
    null,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert

from ship_sqla._sql_time import now_param, seconds_param

if TYPE_CHECKING:
    from sqlalchemy.sql.dml import Delete, ReturningDelete, ReturningInsert, ReturningUpdate
    from sqlalchemy.sql.elements import ColumnElement
    from sqlalchemy.sql.selectable import Select

__all__ = [
    "LOCK_NOT_AVAILABLE",
    "RESTORE_LOCK_TIMEOUT",
    "SET_LOCK_TIMEOUT",
    "IdempotencyStatements",
    "build_statements",
]

LOCK_NOT_AVAILABLE = "55P03"
"""SQLSTATE lock_not_available: ``lock_timeout`` elapsed while waiting for a row lock."""

SET_LOCK_TIMEOUT: TextClause = text(
    "SELECT current_setting('lock_timeout') AS previous, set_config('lock_timeout', :timeout, true)"
)
""":timeout ('<n>ms') -> the setting in force before, to put back with RESTORE_LOCK_TIMEOUT.
``is_local = true``: it ends with the (sub)transaction, and a ROLLBACK TO SAVEPOINT undoes it."""

RESTORE_LOCK_TIMEOUT: TextClause = text("SELECT set_config('lock_timeout', :previous, true)")
""":previous -> puts the unit of work's own lock_timeout back for the rest of its transaction."""

IN_PROGRESS = literal_column("'in_progress'", Text)
COMPLETED = literal_column("'completed'", Text)


@attrs.frozen
class IdempotencyStatements:
    """The store's statements for one table. Parameters are listed on each."""

    claim_new: ReturningInsert[Any]
    """:k_prefix, :k_tenant, :k_key, :fingerprint, :token, :lease, :ttl (seconds), :now ->
    (locked_until, expires_at) when this call inserted the key; no row when it exists (after
    waiting for an uncommitted inserter: the caller bounds that wait with lock_timeout)."""

    take_over: ReturningUpdate[Any]
    """Same parameters -> a row when the key had expired, or was left in progress past its
    ``locked_until`` by a request with the same fingerprint: the key is claimed afresh."""

    read: Select[Any]
    """:k_prefix, :k_tenant, :k_key -> the key's row, if any."""

    complete: ReturningUpdate[Any]
    """:k_prefix, :k_tenant, :k_key, :token, :response (jsonb), :ttl, :now -> one row while
    the claim token is current; no row when the claim was lost (released, taken over)."""

    release: ReturningDelete[Any]
    """:k_prefix, :k_tenant, :k_key, :token -> one row when an in-progress claim was deleted."""

    cleanup: Delete
    """:k_prefix, :limit, :now -> deletes up to ``limit`` expired keys of the prefix."""


def _key_matches(table: Table) -> ColumnElement[bool]:
    c = table.c
    return and_(
        c.prefix == bindparam("k_prefix", type_=Text),
        c.tenant_id == bindparam("k_tenant", type_=Text),
        c.key == bindparam("k_key", type_=Text),
    )


def _claims(table: Table) -> tuple[ReturningInsert[Any], ReturningUpdate[Any]]:
    """``claim_new`` and ``take_over`` (see :class:`IdempotencyStatements`)."""
    c = table.c
    fresh_claim: dict[str, Any] = {
        "fingerprint": bindparam("fingerprint", type_=Text),
        "status": IN_PROGRESS,
        "claim_token": bindparam("token", type_=UUID(as_uuid=True)),
        "response": null(),
        "locked_until": now_param() + seconds_param("lease"),
        "expires_at": now_param() + seconds_param("ttl"),
        "created_at": now_param(),
        "completed_at": null(),
    }
    # Served by <table>_pkey (ON CONFLICT arbiter).
    claim_new = (
        pg_insert(table)
        .values(
            prefix=bindparam("k_prefix", type_=Text),
            tenant_id=bindparam("k_tenant", type_=Text),
            key=bindparam("k_key", type_=Text),
            **fresh_claim,
        )
        .on_conflict_do_nothing(index_elements=[c.prefix, c.tenant_id, c.key])
        .returning(c.locked_until, c.expires_at)
    )
    # Served by <table>_pkey.
    take_over = (
        update(table)
        .where(
            _key_matches(table),
            or_(
                c.expires_at <= now_param(),
                and_(
                    c.status == IN_PROGRESS,
                    c.locked_until <= now_param(),
                    c.fingerprint == bindparam("fingerprint", type_=Text),
                ),
            ),
        )
        .values(**fresh_claim)
        .returning(c.locked_until, c.expires_at)
    )
    return claim_new, take_over


def _ends(table: Table) -> tuple[ReturningUpdate[Any], ReturningDelete[Any], Delete]:
    """``complete``, ``release`` and ``cleanup`` (see :class:`IdempotencyStatements`)."""
    c = table.c
    held = (
        _key_matches(table),
        c.claim_token == bindparam("token", type_=UUID(as_uuid=True)),
        c.status == IN_PROGRESS,
    )
    complete = (
        update(table)
        .where(*held)
        .values(
            status=COMPLETED,
            response=bindparam("response", type_=JSONB),
            completed_at=now_param(),
            locked_until=null(),
            expires_at=now_param() + seconds_param("ttl"),
        )
        .returning(c.completed_at, c.expires_at)
    )
    release = delete(table).where(*held).returning(c.key)
    # Served by <table>_expires_idx (prefix, expires_at): one range scan, LIMIT n. SKIP LOCKED
    # leaves keys a request is taking over right now to the next pass.
    victims = (
        select(c.prefix, c.tenant_id, c.key)
        .where(c.prefix == bindparam("k_prefix", type_=Text), c.expires_at <= now_param())
        .order_by(c.expires_at)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
    )
    cleanup = delete(table).where(tuple_(c.prefix, c.tenant_id, c.key).in_(victims))
    return complete, release, cleanup


def build_statements(table: Table) -> IdempotencyStatements:
    c = table.c
    claim_new, take_over = _claims(table)
    complete, release, cleanup = _ends(table)
    read = select(
        c.prefix,
        c.tenant_id,
        c.key,
        c.fingerprint,
        c.status,
        c.response,
        c.locked_until,
        c.expires_at,
        c.created_at,
        c.completed_at,
    ).where(_key_matches(table))
    return IdempotencyStatements(
        claim_new=claim_new,
        take_over=take_over,
        read=read,
        complete=complete,
        release=release,
        cleanup=cleanup,
    )
