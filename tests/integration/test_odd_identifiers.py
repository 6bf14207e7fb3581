"""Table and schema names holding SQL's own punctuation work end to end, or are refused when
declared (issue 25 D3).

A table's name is configuration: ``ship_job_runs_table(md, name="jobs--v2")`` was accepted and
created, then every enqueue and claim failed with a raw ``ProgrammingError``, because the job
statements were compacted (``--`` comments stripped) AFTER the quoted names were put in. The
rule now: a quoted name is never altered on its way into a statement (``ship_sqla._naming``).
Each name below is used as the schema AND in every table's name, and each store runs through
it: the schema apply and check (T2, T3), every job, worker and workflow statement prepared by
PostgreSQL, a job enqueued from "another process" waking a parked runtime through the runs
table's channel (K1) and completing a workflow step, a bulk enqueue by COPY, an outbox message
relayed through its channel and acknowledged, then purged, an idempotency key, a webhook event
linked to its message, a fenced lock, an audit entry and the row-level-security policy DDL
(``tenant_policy_ddl``) run on the webhook table. Names PostgreSQL cannot hold are
:class:`ConfigurationError` at declaration, naming the problem and the fix (T1).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import attrs
import pytest
from sqlalchemy import MetaData, func, select, text
from sqlalchemy.exc import DBAPIError
from wake_helpers import parked

from ship_sqla import (
    advisory_lock_provider,
    create_audit_log,
    create_idempotency_store,
    create_job_backend,
    create_outbox,
    create_webhook_event_store,
    define_job,
    ship_audit_table,
    ship_idempotency_table,
    ship_job_events_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
    ship_job_workers_table,
    ship_lock_fences_table,
    ship_outbox_table,
    ship_webhook_events_table,
    start_job_runtime,
    start_outbox_relay,
)
from ship_sqla._jobs._sql import JobStatements
from ship_sqla._jobs._sql.enqueue import ENQUEUE_COPY_MIN_RUNS
from ship_sqla._jobs._sql_api import enqueue_function_name, sync_job_definitions
from ship_sqla._naming import MAX_IDENTIFIER_BYTES
from ship_sqla._schema_apply import ShipTableNames, apply_ship_schema, ship_tables_metadata
from ship_sqla.backfills import create_backfill_ledger, ship_backfills_table
from ship_sqla.errors import ConfigurationError
from ship_sqla.idempotency import IdempotencyReplay, IdempotencyStarted, StoredResponse
from ship_sqla.jobs import EnqueueRequest
from ship_sqla.operators import AuditEntry
from ship_sqla.schema import tenant_policy_ddl
from ship_sqla.testing import FrozenClock
from ship_sqla.webhooks import ship_webhook_deliveries_table, ship_webhook_endpoints_table

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy import Table
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ship_sqla import JobContext
    from ship_sqla.outbox import OutboxMessage

ODD_NAMES = [
    "jobs--v2",
    "a/*b*/c",
    'q"uote',
    "it's",
    "semi;colon",
    "tâches",
    ":bind",
    "pct%s",
    "{state}",
    'x"; drop table t; --',
]
"""A comment, a block comment, both quotes, a statement separator, non-ASCII, a bind parameter
and a paramstyle marker as SQLAlchemy's text() and psycopg would read them, a template
placeholder, and an injection attempt."""

SUFFIXES = ShipTableNames(
    runs="",
    state="_state",
    workers="_workers",
    steps="_steps",
    events="_events",
    outbox="_outbox",
    idempotency="_idem",
    webhook_events="_webhooks",
    lock_fences="_fences",
    audit="_audit",
    backfills="_backfills",
)


def odd_tables(name: str) -> dict[str, Table]:
    """Every ship table, in schema ``name``, each named ``name`` and its kind's suffix, by kind."""
    names = ShipTableNames(**{k: name + v for k, v in attrs.asdict(SUFFIXES).items()})
    metadata = ship_tables_metadata(names, schema=name)
    by_name = {table.name: table for table in metadata.tables.values()}
    return {kind: by_name[table] for kind, table in attrs.asdict(names).items()}


async def _noop(_ctx: JobContext, _payload: dict[str, Any]) -> None:
    return None


@pytest.mark.parametrize("name", ODD_NAMES)
async def test_every_store_works_with_odd_table_and_schema_names(
    ship_engine: AsyncEngine, name: str
) -> None:
    """T1, T2, T3 and K1, issue 25 D3: a table or schema name holding ``--``, ``/*``, quotes,
    ``;``, ``:``, ``%``, braces or non-ASCII is created by the schema apply and passes the
    schema check, every job statement PostgreSQL prepares as rendered, and each store runs end
    to end on it; the name reaches the database unaltered (no statement ever fails with a
    driver error)."""
    tables = odd_tables(name)
    metadata = next(iter(tables.values())).metadata
    report = await apply_ship_schema(ship_engine, metadata)
    assert report.created_schemas == (name,)
    assert report.ok, report.check.format_text()

    await _every_job_statement_prepares(ship_engine, tables)
    await _a_job_runs_end_to_end(ship_engine, tables)
    await _an_outbox_message_is_relayed_and_purged(ship_engine, tables)
    await _idempotency_webhooks_locks_and_audit(ship_engine, tables)
    await _sql_enqueue(ship_engine, tables)


async def _every_job_statement_prepares(engine: AsyncEngine, tables: dict[str, Table]) -> None:
    """Every statement of the job, worker and workflow stores, rendered for these tables, is
    parsed and planned by PostgreSQL (the dashboard's reads, the admin port's, the claims:
    including those this test does not run)."""
    async with engine.connect() as connection:
        driver = (await connection.get_raw_connection()).driver_connection
        assert driver is not None
        for server_clock in (False, True):
            statements = JobStatements.for_tables(
                tables["runs"],
                tables["state"],
                workers=tables["workers"],
                steps=tables["steps"],
                events=tables["events"],
                server_clock=server_clock,
            )
            for statement in statements.every_statement().values():
                await driver.prepare(str(statement.compile(dialect=engine.dialect)))


async def _a_job_runs_end_to_end(engine: AsyncEngine, tables: dict[str, Table]) -> None:
    """A workflow job enqueued by another backend (its announcement on the runs table's
    channel wakes the parked runtime: its clock is frozen, so no poll runs it), its step
    stored, completed; an event published; a bulk enqueue by COPY."""
    clock = FrozenClock()
    wanted: dict[str, Any] = {
        "table": tables["runs"],
        "state_table": tables["state"],
        "workers_table": tables["workers"],
        "steps_table": tables["steps"],
        "events_table": tables["events"],
    }
    worker = create_job_backend(database=engine, clock=clock, **wanted)
    elsewhere = create_job_backend(database=engine, listen=False, queue_depth_limit=10, **wanted)
    done = anyio.Event()

    async def handler(ctx: JobContext, payload: dict[str, Any]) -> None:
        async def one() -> int:
            return 1

        assert await ctx.step("one", one) == 1
        done.set()

    job = define_job("odd.names", handler, payload=dict)
    async with await start_job_runtime([job], backend=worker):
        assert worker.listener is not None
        with anyio.fail_after(10):
            await worker.listener.wait_live()
        await parked(worker)
        result = await elsewhere.enqueue(job, {"from": "elsewhere"}, dedupe_key="d")
        with anyio.fail_after(10):
            await done.wait()
    assert result.run_id is not None
    assert worker.workflows is not None
    record = await worker.admin.get_run(result.run_id)
    assert record is not None
    assert record.state == "completed"
    [step] = await worker.workflows.list_steps(result.run_id)
    assert step.result == 1
    await elsewhere.publish_event("odd.event", {"n": 1}, key="k")

    bulk = define_job("odd.bulk", _noop, payload=dict)
    results = await worker.enqueue_many(bulk, [EnqueueRequest({})] * ENQUEUE_COPY_MIN_RUNS)
    assert all(r.accepted for r in results)
    async with engine.connect() as connection:
        runs = tables["runs"]
        count = select(func.count()).select_from(runs).where(runs.c.job_id == bulk.id)
        assert await connection.scalar(count) == ENQUEUE_COPY_MIN_RUNS


async def _an_outbox_message_is_relayed_and_purged(
    engine: AsyncEngine, tables: dict[str, Table]
) -> None:
    """An outbox message enqueued by another outbox (its announcement on the outbox table's
    channel wakes the parked relay), published, acknowledged; then purged by the heap walk,
    which names the table to ``to_regclass``."""
    clock = FrozenClock()
    outbox = create_outbox(database=engine, table=tables["outbox"], clock=clock)
    elsewhere = create_outbox(database=engine, table=tables["outbox"])
    published: list[OutboxMessage] = []
    arrived = anyio.Event()

    async def sink(message: OutboxMessage) -> None:
        published.append(message)
        arrived.set()

    async with await start_outbox_relay(
        outbox, "odd", sink, poll_interval=3600, clock=clock
    ) as relay:
        assert relay.listener is not None
        with anyio.fail_after(10):
            await relay.listener.wait_live()
            while clock.sleepers < 1:
                await anyio.lowlevel.checkpoint()
        message_id = await elsewhere.enqueue("odd", "t", {"n": 1}, headers={"h": "v"})
        with anyio.fail_after(10):
            await arrived.wait()
    assert [m.id for m in published] == [message_id]
    record = await outbox.get(message_id)
    assert record is not None
    assert record.state == "delivered"
    deleted = await outbox.admin.purge_delivered("odd", older_than=0, pages_per_statement=10)
    assert deleted == 1


async def _sql_enqueue(engine: AsyncEngine, tables: dict[str, Table]) -> None:
    """E1, E6: the SQL enqueue functions schema apply installed, named after the runs table,
    enqueue (their bodies compile) and refuse an unknown job naming the definitions table."""
    async with engine.begin() as connection:
        await sync_job_definitions(
            connection, tables["definitions"], [define_job("odd.sql", _noop, payload=dict)]
        )
    fn = enqueue_function_name(tables["runs"]).replace(":", "\\:")
    async with engine.begin() as connection:
        outcome = await connection.scalar(text(f"SELECT outcome FROM {fn}('odd.sql', '{{}}')"))
        assert outcome == "inserted"
        many = enqueue_function_name(tables["runs"], "_enqueue_many_v1").replace(":", "\\:")
        refused = text(f"""SELECT * FROM {many}('[{{"job_id": "odd.none"}}]')""")
        with pytest.raises(DBAPIError, match="SHIP_SQLA_JOB_UNKNOWN"):
            await connection.execute(refused)


async def _idempotency_webhooks_locks_and_audit(
    engine: AsyncEngine, tables: dict[str, Table]
) -> None:
    """An idempotency key started, completed and replayed; a webhook event recorded, linked
    to its outbox message and cleaned up; a fenced lock drawn twice; an audit entry."""
    idempotency = create_idempotency_store(database=engine, table=tables["idempotency"])
    started = await idempotency.begin("k", "fp")
    assert isinstance(started, IdempotencyStarted)
    await started.claim.complete(StoredResponse(201, {"x": "y"}, b"done"))
    replay = await idempotency.begin("k", "fp")
    assert isinstance(replay, IdempotencyReplay)
    assert replay.response.body == b"done"

    outbox = create_outbox(database=engine, table=tables["outbox"])
    webhooks = create_webhook_event_store(
        database=engine,
        table=tables["webhook_events"],
        outbox_table=tables["outbox"],
        idempotency_table=tables["idempotency"],
    )
    recorded = await webhooks.record("hook", "evt-1", {"a": 1}, headers={"h": "v"})
    assert not recorded.duplicate
    await webhooks.link("hook", "evt-1", await outbox.enqueue("odd.hooks", "t", {}))
    event = await webhooks.get("hook", "evt-1")
    assert event is not None
    assert event.outbox_message_id is not None
    cleaned = await webhooks.cleanup("hook", retention=timedelta(days=1))
    assert (cleaned.events_deleted, cleaned.claims_deleted) == (0, 0)

    locks = advisory_lock_provider(engine, fence_table=tables["lock_fences"])
    for fence in (1, 2):
        async with locks.with_lock("key", 30.0) as held:
            assert held.fence == fence

    audit = create_audit_log(database=engine, table=tables["audit"])
    await audit.require_writable()
    await audit.record(AuditEntry(actor="t", operation="odd.names", target="x", count=1))
    [entry] = await audit.list_entries(limit=10)
    assert entry.operation == "odd.names"

    ledger = create_backfill_ledger(database=engine, table=tables["backfills"])
    assert (await ledger.request("odd.backfill", pace=1.0)).state == "pending"
    common = {"run_id": "r", "token": 1}
    await ledger.begin("odd.backfill", pace=1.0, stall_after=60.0, required_by="x", **common)
    ledger_args = {"pages_before": 0, "last_key": ("k",), "rows": 1}
    assert await ledger.checkpoint("odd.backfill", **common, **ledger_args)
    assert await ledger.finish("odd.backfill", **common, state="completed")
    assert await ledger.cancel("odd.backfill") is not None
    [backfill] = await ledger.list_backfills(limit=10)
    assert (backfill.state, backfill.last_key) == ("completed", ("k",))

    hooks = tables["webhook_events"]
    async with engine.begin() as connection:
        for statement in tenant_policy_ddl(hooks.name, schema=hooks.schema):
            await connection.exec_driver_sql(statement)
        policies = text("SELECT count(*) FROM pg_policies WHERE schemaname = :s AND tablename = :t")
        assert await connection.scalar(policies, {"s": hooks.schema, "t": hooks.name}) == 1


# --- names that cannot work are refused when declared ----------------------------------------

FACTORIES: list[tuple[str, Callable[..., Table]]] = [
    ("job runs", ship_job_runs_table),
    ("job state", ship_job_state_table),
    ("job workers", ship_job_workers_table),
    ("job steps", ship_job_steps_table),
    ("job events", ship_job_events_table),
    ("outbox", ship_outbox_table),
    ("idempotency", ship_idempotency_table),
    ("webhook events", ship_webhook_events_table),
    ("lock fences", ship_lock_fences_table),
    ("audit", ship_audit_table),
    ("backfills", ship_backfills_table),
    ("webhook endpoints", ship_webhook_endpoints_table),
    ("webhook deliveries", ship_webhook_deliveries_table),
]

UNUSABLE = [
    ("", "empty or blank"),
    ("   ", "empty or blank"),
    ("a\x00b", "NUL"),
    ("a\ud800b", "surrogate code point"),
    ("x" * (MAX_IDENTIFIER_BYTES + 1), "over PostgreSQL's 63"),
    ("é" * 32, "64 bytes"),
]


@pytest.mark.parametrize(("what", "factory"), FACTORIES, ids=[w for w, _ in FACTORIES])
@pytest.mark.parametrize(
    ("bad", "problem"), UNUSABLE, ids=["empty", "blank", "nul", "surrogate", "long", "utf8-long"]
)
def test_a_name_postgresql_cannot_hold_is_refused_at_declaration(
    what: str, factory: Callable[..., Table], bad: str, problem: str
) -> None:
    """T1, issue 25 D3: a table or schema name PostgreSQL cannot hold as given (empty, blank,
    NUL, a surrogate code point: not UTF-8; longer than 63 bytes, which PostgreSQL would
    silently truncate) is a ConfigurationError when the table is declared, naming the problem
    and the fix: never accepted and then failing with a driver error."""
    for kwargs, part in (({"name": bad}, "table name"), ({"schema": bad}, "table schema")):
        with pytest.raises(ConfigurationError, match=problem) as caught:
            factory(MetaData(), **kwargs)
        assert caught.value.code == "SHIP_SQLA_CONFIGURATION"
        assert f"{what} {part}" in caught.value.message
        assert "bytes" in (caught.value.fix or "")
