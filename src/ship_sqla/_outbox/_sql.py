"""Every statement the outbox runs, built once per table and named.

The outbox table's name and schema are the application's choice, so the statements are built from
the :class:`~sqlalchemy.Table` by :func:`build_statements` rather than written as module-level
text; each is still one named, stable statement (SQLAlchemy caches its compiled form, asyncpg its
prepared statement). Rules every statement here follows:

- Time is ``coalesce(:now, now())``: ``:now`` is the injected clock's time when it is frozen.
- Partial-index predicates are written word for word as the index declares them, as SQL
  literals, never as bound parameters: PostgreSQL uses a partial index only when the query's
  predicate implies the index's, and a generic prepared plan cannot prove that about ``$1``.
- Arrays, never expanding IN lists: ``= ANY(:ids)`` and ``unnest(:ids, :tokens)`` keep one SQL
  text whatever the batch size.
- Settles (complete, the batch settle, heartbeat) match ``id`` AND ``lease_token`` AND
  ``state = 'claimed'`` (O3): a holder whose claim was retaken changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
from sqlalchemy import (
    Float,
    Integer,
    Table,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    exists,
    func,
    insert,
    literal_column,
    null,
    select,
    text,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, REGCLASS, UUID

from ship_sqla._outbox._tables import LEASE_INDEX_PREDICATE, PENDING_INDEX_PREDICATE
from ship_sqla._sql import TABLELESS
from ship_sqla._sql.notify import ANNOUNCE_AFTER_COMMIT
from ship_sqla._sql_time import ONE_SECOND, TSTZ, now_param, seconds_param
from ship_sqla.kernel._outbox_records import (
    OUTBOX_LEASE_LAPSED_FINAL_ATTEMPT as LEASE_LAPSED_FINAL_ATTEMPT,
)

if TYPE_CHECKING:
    from sqlalchemy import TextClause
    from sqlalchemy.sql import ColumnElement
    from sqlalchemy.sql.dml import Delete, Insert, ReturningUpdate
    from sqlalchemy.sql.selectable import Select

__all__ = [
    "CLAIM_RETURNING",
    "LEASE_LAPSED_FINAL_ATTEMPT",
    "OutboxStatements",
    "build_statements",
]


_ZERO = literal_column("0", Integer)
_ONE = literal_column("1", Integer)


def _lit(value: str) -> ColumnElement[Any]:
    """A SQL string literal (never a bind parameter): see the module docstring on predicates."""
    if "'" in value:
        msg = f"state literal {value!r} must not contain a quote"
        raise ValueError(msg)
    return literal_column(f"'{value}'", Text)


PENDING = _lit("pending")
CLAIMED = _lit("claimed")
DELIVERED = _lit("delivered")
DEAD = _lit("dead")


@attrs.frozen
class OutboxStatements:
    """The outbox's statements for one table. Parameters are listed on each."""

    enqueue: Insert
    """:ids uuid[], :topics text[], :payloads text[] (JSON), :header_docs text[] (JSON),
    :ordering_keys text[], :available_ats timestamptz[] (NULL = now), :outbox, :tenant,
    :attempt_limit, :now. One row per array element, in one statement whatever the count."""

    enqueue_announced: Select[Any]
    """``enqueue`` and its announcement (K1) in ONE statement: ``WITH ship_enqueued AS
    (<enqueue>) SELECT pg_notify(:channel, :payload)``, the NOTIFY part of the inserting
    transaction (delivered at its commit, never after a rollback), no round trip added."""

    announce_after_commit: TextClause
    """:channel, :payloads text[]: the announcer's post-commit announcement of the outbox ids
    committed since its last one (:data:`~ship_sqla._sql.notify.ANNOUNCE_AFTER_COMMIT`). The
    outbox table has no sequence, so each process counts itself alone in the budget."""

    claim: ReturningUpdate[Any]
    """:outbox, :batch_size, :lease (seconds), :worker, :now. See :func:`_claim`."""

    claim_ordered: ReturningUpdate[Any]
    """As ``claim``, skipping rows whose ordering key has an earlier undelivered row."""

    complete: Select[Any]
    """:ids uuid[], :tokens uuid[], :now -> the (id, token) pairs NOT completed (stale); a pair
    already delivered under that same token counts as completed (idempotent retries)."""

    settle: Select[Any]
    """:ids uuid[], :tokens uuid[], :settled_as text[], :delays float8[] (seconds),
    :release_ats timestamptz[] (NULL = now), :errors text[], :now -> the (id, token, settled_as)
    settlements NOT applied (stale); see :func:`_settle`."""

    heartbeat: ReturningUpdate[Any]
    """:ids uuid[], :tokens uuid[], :lease (seconds), :now -> (id, token, lease_expires_at)."""

    list_dead_first: Select[Any]
    """:outbox, :limit -> dead rows by (created_at, id)."""

    list_dead_after: Select[Any]
    """:outbox, :limit, :after_created_at, :after_id -> the next page."""

    retry: ReturningUpdate[Any]
    """:ids uuid[], :now -> the ids moved from dead back to pending."""

    get: Select[Any]
    """:message_id -> the row, whatever its state."""

    heap_pages: Select[Any]
    """:relation (the quoted table name) -> its number of heap pages (what ``purge_delivered``
    walks)."""

    count_pending_capped: Select[Any]
    """:outbox, :cap -> pending rows of the outbox, counted up to ``cap`` through
    ``<outbox>_pending_idx`` (the dashboard's outbox page, S2)."""

    count_claimed_capped: Select[Any]
    """:outbox, :cap -> claimed rows, counted up to ``cap`` through ``<outbox>_lease_idx``."""

    purge_delivered_in_pages: Delete
    """:first_page, :end_page, :outbox, :age (seconds), :now: delete the delivered rows of one
    range of heap pages delivered at least ``age`` ago."""


def build_statements(table: Table) -> OutboxStatements:
    return OutboxStatements(
        enqueue=_enqueue(table),
        enqueue_announced=_announced(_enqueue(table)),
        announce_after_commit=TABLELESS[ANNOUNCE_AFTER_COMMIT],
        claim=_claim(table, ordered=False),
        claim_ordered=_claim(table, ordered=True),
        complete=_complete(table),
        settle=_settle(table),
        heartbeat=_heartbeat(table),
        list_dead_first=_list_dead(table, after=False),
        list_dead_after=_list_dead(table, after=True),
        retry=_retry(table),
        get=select(table).where(table.c.id == bindparam("message_id")),
        heap_pages=_heap_pages(),
        purge_delivered_in_pages=_purge_delivered_in_pages(table),
        count_pending_capped=_count_capped(table, PENDING_INDEX_PREDICATE),
        count_claimed_capped=_count_capped(table, LEASE_INDEX_PREDICATE),
    )


def _count_capped(t: Table, predicate: str) -> Select[Any]:
    # The index predicate as a literal, word for word, so a generic plan can use the partial
    # index; at most :cap index entries are read.
    capped = (
        select(t.c.id)
        .where(t.c.outbox_id == bindparam("outbox"), text(predicate))
        .limit(bindparam("cap", type_=Integer))
        .subquery()
    )
    return select(func.count()).select_from(capped)


def _enqueue(t: Table) -> Insert:
    rows = func.unnest(
        bindparam("ids", type_=ARRAY(UUID(as_uuid=True))),
        bindparam("topics", type_=ARRAY(Text)),
        bindparam("payloads", type_=ARRAY(Text)),
        bindparam("header_docs", type_=ARRAY(Text)),
        bindparam("ordering_keys", type_=ARRAY(Text)),
        bindparam("available_ats", type_=ARRAY(TSTZ)),
    ).table_valued("id", "topic", "payload", "headers", "ordering_key", "available_at")
    rows = rows.render_derived(name="r", with_types=False)
    now = now_param()
    source = select(
        rows.c.id,
        bindparam("outbox", type_=Text),
        rows.c.topic,
        cast(rows.c.payload, JSONB),
        cast(rows.c.headers, JSONB),
        rows.c.ordering_key,
        bindparam("tenant", type_=Text),
        PENDING,
        _ZERO,
        bindparam("attempt_limit", type_=Integer),
        func.coalesce(rows.c.available_at, now),
        now,
    )
    columns = [
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
    ]
    return insert(t).from_select(columns, source)


def _announced(enqueue: Insert) -> Select[Any]:
    """``enqueue`` with the NOTIFY of its outbox on ``:channel`` (``:payload``: the sender and
    the outbox id, :func:`~ship_sqla._notify.announcement`)."""
    notify = func.pg_notify(bindparam("channel", type_=Text), bindparam("payload", type_=Text))
    return select(notify).add_cte(enqueue.cte("ship_enqueued"))


def _no_earlier_undelivered_row(t: Table) -> ColumnElement[bool]:
    """True when the candidate row's ordering key has no earlier pending or claimed row.

    Served by ``<table>_ordering_idx`` (predicate word for word): the first index entry of
    (outbox_id, ordering_key) decides it. It reads the statement's snapshot without SKIP LOCKED,
    so a row another relay is claiming right now still counts as pending and blocks its key.
    """
    earlier = t.alias("earlier")
    return ~exists().where(
        earlier.c.outbox_id == t.c.outbox_id,
        earlier.c.ordering_key == t.c.ordering_key,
        earlier.c.ordering_key.is_not(None),
        earlier.c.state.in_([PENDING, CLAIMED]),
        tuple_(earlier.c.created_at, earlier.c.id) < tuple_(t.c.created_at, t.c.id),
    )


def _claim(t: Table, *, ordered: bool) -> ReturningUpdate[Any]:
    """O2: lapsed leases first, then due pending rows; each scan index-ordered and SKIP LOCKED.

    ``lapsed`` walks ``<table>_lease_idx`` (outbox_id, lease_expires_at) WHERE state = 'claimed';
    ``due`` walks ``<table>_pending_idx`` (outbox_id, available_at, created_at) WHERE state =
    'pending', limited to what the lapsed scan left of the batch so no row is locked only to be
    dropped. Both stop after about ``batch_size`` entries whatever the backlog. The claim runs in
    its own short transaction: rows a SKIP LOCKED scan locked stay locked until it ends.

    A lapsed row already on its final attempt becomes 'dead' (with LEASE_LAPSED_FINAL_ATTEMPT)
    instead of being handed out again; the caller sees its state in RETURNING.
    """
    now = now_param()
    batch = bindparam("batch_size", type_=Integer)
    lapsed_q = (
        select(t.c.id)
        .where(t.c.outbox_id == bindparam("outbox", type_=Text))
        .where(t.c.state == CLAIMED)
        .where(t.c.lease_expires_at <= now)
    )
    due_q = (
        select(t.c.id)
        .where(t.c.outbox_id == bindparam("outbox", type_=Text))
        .where(t.c.state == PENDING)
        .where(t.c.available_at <= now)
    )
    if ordered:
        lapsed_q = lapsed_q.where(_no_earlier_undelivered_row(t))
        due_q = due_q.where(_no_earlier_undelivered_row(t))
    lapsed = (
        lapsed_q.order_by(t.c.lease_expires_at)
        .limit(batch)
        .with_for_update(skip_locked=True)
        .cte("lapsed")
        .prefix_with("MATERIALIZED", dialect="postgresql")
    )
    left = func.greatest(batch - select(func.count()).select_from(lapsed).scalar_subquery(), _ZERO)
    due = (
        due_q.order_by(t.c.available_at, t.c.created_at)
        .limit(left)
        .with_for_update(skip_locked=True)
        .cte("due")
        .prefix_with("MATERIALIZED", dialect="postgresql")
    )
    picked = union_all(select(lapsed.c.id), select(due.c.id)).scalar_subquery()
    dies = and_(t.c.state == CLAIMED, t.c.attempts >= t.c.max_attempts)
    return (
        update(t)
        # = ANY(ARRAY(...)) pins the update to primary-key probes: a join against the CTEs
        # could be planned as a hash join over the whole table when the LIMIT is a parameter.
        .where(t.c.id == func.any(func.array(picked)))
        .values(
            state=case((dies, DEAD), else_=CLAIMED),
            attempts=case((dies, t.c.attempts), else_=t.c.attempts + _ONE),
            lease_token=case((dies, null()), else_=func.gen_random_uuid()),
            claimed_by=case((dies, t.c.claimed_by), else_=bindparam("worker", type_=Text)),
            lease_expires_at=case((dies, null()), else_=now + seconds_param("lease")),
            last_error=case(
                (dies, literal_column(f"'{LEASE_LAPSED_FINAL_ATTEMPT}'", Text)),
                else_=t.c.last_error,
            ),
        )
        .returning(*_claim_returning(t))
    )


CLAIM_RETURNING = (
    "id",
    "outbox_id",
    "topic",
    "payload",
    "headers",
    "ordering_key",
    "tenant_id",
    "attempts",
    "max_attempts",
    "lease_token",
    "claimed_by",
    "lease_expires_at",
    "available_at",
    "created_at",
    "last_error",
    "state",
    "delivered_at",
)
"""The claim's RETURNING columns, in order: the first fifteen are :class:`OutboxMessage`'s fields
in its field order (built positionally, per row), then what a dead-lettered row's record adds.
``headers`` comes back NULL when it is the empty object, the usual case: no JSON to decode."""


def _claim_returning(t: Table) -> list[ColumnElement[Any]]:
    columns: list[ColumnElement[Any]] = [t.c[name] for name in CLAIM_RETURNING]
    headers = CLAIM_RETURNING.index("headers")
    columns[headers] = func.nullif(t.c.headers, literal_column("'{}'::jsonb"), type_=JSONB).label(
        "headers"
    )
    return columns


def _uuid_param(name: str) -> ColumnElement[Any]:
    return bindparam(name, type_=UUID(as_uuid=True))


def _held_under(
    t: Table, message_id: ColumnElement[Any], token: ColumnElement[Any]
) -> tuple[ColumnElement[bool], ...]:
    """O3, the fence of every settle (complete, settle, heartbeat): the row is still
    claimed under this very lease token. A holder whose claim was retaken (a new token) or
    settled (not 'claimed') matches nothing and changes nothing."""
    return (t.c.id == message_id, t.c.lease_token == token, t.c.state == CLAIMED)


def _settle_pairs() -> Any:  # noqa: ANN401 - a table-valued unnest
    pairs = func.unnest(
        bindparam("ids", type_=ARRAY(UUID(as_uuid=True))),
        bindparam("tokens", type_=ARRAY(UUID(as_uuid=True))),
    ).table_valued("id", "token")
    return pairs.render_derived(name="held", with_types=False)


def _complete(t: Table) -> Select[Any]:
    """The given (id, token) pairs that were NOT completed: usually none, so a batch's answer is
    empty rather than a row per message. Pairs, not ids: a batch may carry a stale and the
    current claim of one message, and only the matching pair is completed.

    Idempotent per claim: a delivered row keeps the token it was delivered under, so a retried
    completion whose first attempt committed but whose reply was lost (a connection that died
    at the wrong moment) answers "delivered" again, not "stale". The NOT EXISTS probe runs only
    for the pairs the update did not match (usually none), each one primary-key lookup."""
    pairs = _settle_pairs()
    given = select(pairs.c.id, pairs.c.token).cte("given")
    completed = (
        update(t)
        .where(*_held_under(t, given.c.id, given.c.token))
        .values(
            state=DELIVERED,
            delivered_at=now_param(),
            lease_expires_at=null(),
        )
        .returning(given.c.id, given.c.token)
        .cte("completed")
    )
    unmatched = (
        select(given.c.id, given.c.token)
        .except_(select(completed.c.id, completed.c.token))
        .subquery("unmatched")
    )
    # The statement's snapshot predates its own update: this sees rows delivered earlier only.
    delivered_before = exists().where(
        t.c.id == unmatched.c.id, t.c.lease_token == unmatched.c.token, t.c.state == DELIVERED
    )
    return select(unmatched.c.id, unmatched.c.token).where(~delivered_before)


def _settle(t: Table) -> Select[Any]:
    """O3, O4: the one fenced batch settle, ``OutboxSettlement`` records as arrays (the kernel
    decided each one: delivered, retrying, dead or released), applied in ONE statement; served
    by ``<outbox>_pkey`` (one primary-key probe per pair), like the runs'
    ``SETTLE_IF_TOKEN_CURRENT``.

    Answers the settlements that were NOT applied (usually none), as ``complete`` does; a
    delivered settlement whose row was already delivered under that same token counts as
    applied (a retried completion whose reply was lost). A release gives back the attempt the
    claim counted; a delivered row keeps its token, every other settle clears it."""
    rows = func.unnest(
        bindparam("ids", type_=ARRAY(UUID(as_uuid=True))),
        bindparam("tokens", type_=ARRAY(UUID(as_uuid=True))),
        bindparam("settled_as", type_=ARRAY(Text)),
        bindparam("delays", type_=ARRAY(Float)),
        bindparam("release_ats", type_=ARRAY(TSTZ)),
        bindparam("errors", type_=ARRAY(Text)),
    ).table_valued("id", "token", "settled_as", "delay", "release_at", "error")
    rows = rows.render_derived(name="s", with_types=False)
    given = select(rows).cte("given")
    now = now_param()
    kind = given.c.settled_as
    settled = (
        update(t)
        .where(*_held_under(t, given.c.id, given.c.token))
        .values(
            state=case((kind == DELIVERED, DELIVERED), (kind == DEAD, DEAD), else_=PENDING),
            attempts=case(
                (kind == _lit("released"), func.greatest(t.c.attempts - _ONE, _ZERO)),
                else_=t.c.attempts,
            ),
            available_at=case(
                (kind == _lit("retrying"), now + given.c.delay * ONE_SECOND),
                (kind == _lit("released"), func.coalesce(given.c.release_at, now)),
                else_=t.c.available_at,
            ),
            delivered_at=case((kind == DELIVERED, now), else_=t.c.delivered_at),
            last_error=case(
                (kind.in_([_lit("retrying"), DEAD]), given.c.error), else_=t.c.last_error
            ),
            lease_expires_at=null(),
            lease_token=case((kind == DELIVERED, t.c.lease_token), else_=null()),
        )
        .returning(given.c.id, given.c.token, given.c.settled_as)
        .cte("settled")
    )
    unmatched = (
        select(given.c.id, given.c.token, given.c.settled_as)
        .except_(select(settled.c.id, settled.c.token, settled.c.settled_as))
        .subquery("unmatched")
    )
    # The statement's snapshot predates its own update: this sees rows delivered earlier only.
    delivered_before = exists().where(
        unmatched.c.settled_as == DELIVERED,
        t.c.id == unmatched.c.id,
        t.c.lease_token == unmatched.c.token,
        t.c.state == DELIVERED,
    )
    return select(unmatched.c.id, unmatched.c.token, unmatched.c.settled_as).where(
        ~delivered_before
    )


def _heartbeat(t: Table) -> ReturningUpdate[Any]:
    held = _settle_pairs()
    return (
        update(t)
        .where(*_held_under(t, held.c.id, held.c.token))
        .values(lease_expires_at=now_param() + seconds_param("lease"))
        .returning(held.c.id, held.c.token, t.c.lease_expires_at)
    )


def _list_dead(t: Table, *, after: bool) -> Select[Any]:
    # An operator query: no index serves dead rows (the seed declares only the two claim
    # indexes), so a page is a scan of the outbox's rows filtered to 'dead'.
    query = select(t).where(t.c.outbox_id == bindparam("outbox", type_=Text), t.c.state == DEAD)
    if after:
        query = query.where(
            tuple_(t.c.created_at, t.c.id)
            > tuple_(
                bindparam("after_created_at", type_=TSTZ),
                bindparam("after_id", type_=UUID(as_uuid=True)),
            )
        )
    return query.order_by(t.c.created_at, t.c.id).limit(bindparam("limit", type_=Integer))


def _retry(t: Table) -> ReturningUpdate[Any]:
    return (
        update(t)
        .where(
            t.c.id == func.any(bindparam("ids", type_=ARRAY(UUID(as_uuid=True)))),
            t.c.state == DEAD,
        )
        .values(
            state=PENDING,
            attempts=_ZERO,
            available_at=now_param(),
            lease_expires_at=null(),
            lease_token=null(),
            delivered_at=null(),
        )
        .returning(t.c.id)
    )


def _heap_pages() -> Select[Any]:
    return select(
        func.pg_relation_size(cast(bindparam("relation", type_=Text), REGCLASS))
        / cast(func.current_setting("block_size"), Integer)
    )


def _purge_delivered_in_pages(t: Table) -> Delete:
    # No index serves delivered rows (the seed declares only the two claim indexes, and one on
    # delivered_at would make every completion a non-HOT update), so the purge walks the heap
    # in ranges of pages: a TID range scan reads just those pages, whatever the table's size.
    return delete(t).where(
        text(
            "ctid >= CAST('(' || CAST(:first_page AS bigint) || ',0)' AS tid)"
            " AND ctid < CAST('(' || CAST(:end_page AS bigint) || ',0)' AS tid)"
        ),
        t.c.outbox_id == bindparam("outbox", type_=Text),
        t.c.state == DELIVERED,
        t.c.delivered_at <= now_param() - seconds_param("age"),
    )
