"""Values PostgreSQL cannot store are refused with the stores' typed errors before any SQL, and
nothing is written (issue 25 D6), on PostgreSQL.

A lone surrogate (``"\\ud800"``: not valid Unicode, no UTF-8 encoding) in a job or outbox
payload used to reach the server as the JSON escape ``\\ud800`` and fail there with a raw
``DBAPIError: invalid input syntax for type json``. The kernel's one rule (the one that refused
NUL characters) now refuses it in every JSON value and key a store writes: each test below
records every statement the engine sends and proves none was sent and no row was written.
SPEC has no invariant of its own for input validation; each test names the invariant of the
operation it guards (J1/J2 enqueue, O1, J23, I1, §6).
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from job_helpers import record_of
from sqlalchemy import MetaData, event, func, select
from starlette.applications import Starlette
from starlette.routing import Route
from workflow_helpers import execute_once

from ship_sqla import (
    create_idempotency_store,
    create_job_backend,
    create_outbox,
    create_unit_of_work,
    create_webhook_event_store,
    define_job,
    ship_idempotency_table,
    ship_job_events_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
    ship_outbox_table,
    ship_webhook_events_table,
    start_job_runtime,
)
from ship_sqla.asgi import WebhookEndpoint, WebhookReceiver
from ship_sqla.errors import (
    ConfigurationError,
    IdempotencyKeyError,
    InvalidKeyError,
    InvalidPayloadError,
    OutboxPayloadError,
)
from ship_sqla.jobs import EnqueueRequest, RetryPolicy
from ship_sqla.outbox import OutboxIntent
from ship_sqla.testing import FrozenClock
from ship_sqla.webhooks import webhook_headers

if TYPE_CHECKING:
    from sqlalchemy import Table
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ship_sqla import JobContext, TransactionScope

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)
steps = ship_job_steps_table(metadata)
events = ship_job_events_table(metadata)
outbox_table = ship_outbox_table(metadata)
keys = ship_idempotency_table(metadata)
webhook_events = ship_webhook_events_table(metadata)

SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()


async def _noop(_ctx: JobContext, _payload: dict[str, Any]) -> None:
    return None


JOB = define_job("unstorable.job", _noop, payload=dict)


class Statements:
    """Every statement the engine sends while the block runs."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.sent: list[str] = []

    def _record(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        self.sent.append(statement)

    def __enter__(self) -> list[str]:
        event.listen(self.engine.sync_engine, "before_cursor_execute", self._record)
        return self.sent

    def __exit__(self, *_: object) -> None:
        event.remove(self.engine.sync_engine, "before_cursor_execute", self._record)


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return ship_engine


async def rows(engine: AsyncEngine, table: Table) -> int:
    async with engine.connect() as connection:
        return int(await connection.scalar(select(func.count()).select_from(table)) or 0)


def scope_only(scope: TransactionScope) -> TransactionScope:
    return scope


async def test_a_job_payload_or_key_with_a_surrogate_is_refused_before_any_sql(
    engine: AsyncEngine,
) -> None:
    """J1/J2 enqueue, issue 25 D6: a lone surrogate in a job payload (a value or a key, nested)
    is InvalidPayloadError naming its path, one in a run id or dedupe key InvalidKeyError:
    through the runtime, the backend (enqueue, enqueue_many among good requests) and a unit of
    work, before any statement; no run is stored. Astral characters are stored as given."""
    backend = create_job_backend(database=engine, table=runs, state_table=state)
    uow = create_unit_of_work(engine, repositories=scope_only)
    async with await start_job_runtime([JOB], backend=backend, mode="enqueue-only") as runtime:
        with Statements(engine) as sent:
            with pytest.raises(InvalidPayloadError, match=r"payload\['x'\]") as caught:
                await runtime.enqueue(JOB, {"x": "\ud800"})
            assert caught.value.code == "SHIP_SQLA_JOB_PAYLOAD_INVALID"
            with pytest.raises(InvalidPayloadError, match=r"the key 'k\\udfff' of payload\['a'\]"):
                await backend.enqueue(JOB, {"a": {"k\udfff": 1}})
            with pytest.raises(InvalidPayloadError):
                await backend.enqueue_many(
                    JOB, [EnqueueRequest({"ok": 1}), EnqueueRequest({"bad": ["\udc80"]})]
                )
            with pytest.raises(InvalidKeyError, match="surrogate"):
                await runtime.enqueue(JOB, {}, dedupe_key="d\ud800")

            async def in_unit(scope: TransactionScope) -> None:
                await backend.enqueue(JOB, {"x": "\ud800"}, scope=scope)

            with pytest.raises(InvalidPayloadError):
                await uow.run(in_unit)
        assert sent == []
        assert await rows(engine, runs) == 0
        stored = await runtime.enqueue(JOB, {"e": "😀 tâches"})
    assert (await record_of(backend, stored.run_id)).payload == {"e": "😀 tâches"}


async def test_an_outbox_message_with_a_surrogate_is_refused_before_any_sql(
    engine: AsyncEngine,
) -> None:
    """O1, issue 25 D6: a lone surrogate in an outbox payload or header is OutboxPayloadError
    naming its path, before any statement, and one bad intent refuses the whole batch; no
    message is stored. Astral characters are stored as given."""
    outbox = create_outbox(database=engine, table=outbox_table)
    with Statements(engine) as sent:
        with pytest.raises(OutboxPayloadError, match=r"payload\['x'\]") as caught:
            await outbox.enqueue("o", "t", {"x": "\udfff"})
        assert caught.value.code.startswith("SHIP_SQLA_OUTBOX_PAYLOAD")
        with pytest.raises(OutboxPayloadError, match=r"headers\['h'\]"):
            await outbox.enqueue("o", "t", {}, headers={"h": "\ud800"})
        with pytest.raises(OutboxPayloadError):
            await outbox.enqueue_many(
                "o", [OutboxIntent("t", {"ok": 1}), OutboxIntent("t", {"\ud800": 1})]
            )
    assert sent == []
    assert await rows(engine, outbox_table) == 0
    stored = await outbox.enqueue("o", "t", {"e": "😀 tâches"})
    record = await outbox.get(stored)
    assert record is not None
    assert record.payload == {"e": "😀 tâches"}


async def test_a_workflow_value_with_a_surrogate_is_refused_before_it_is_stored(
    engine: AsyncEngine,
) -> None:
    """J23, issue 25 D6: a step result holding a lone surrogate fails the step with a
    ConfigurationError naming it (the run is failed with it in its history) and no step row
    is written; an event payload or key holding one is refused before any statement and no
    event is stored."""
    clock = FrozenClock()
    backend = create_job_backend(
        database=engine,
        table=runs,
        state_table=state,
        steps_table=steps,
        events_table=events,
        clock=clock,
    )

    async def handler(ctx: JobContext, _payload: dict[str, Any]) -> None:
        async def bad() -> dict[str, str]:
            return {"r": "\ud800"}

        await ctx.step("bad", bad)

    job = define_job("unstorable.wf", handler, payload=dict, retry=RetryPolicy(attempts=1))
    result = await backend.enqueue(job, {})
    execution = await execute_once(backend, job, clock)
    assert isinstance(execution.error, ConfigurationError)
    assert "value['r']" in execution.error.message
    assert result.run_id is not None
    assert backend.workflows is not None
    assert await backend.workflows.list_steps(result.run_id) == []
    record = await record_of(backend, result.run_id)
    assert record.state == "dead"
    assert "surrogate" in (record.last_error or "")

    with Statements(engine) as sent:
        with pytest.raises(ConfigurationError, match=r"value\['p'\]"):
            await backend.publish_event("unstorable.event", {"p": "\udfff"})
        with pytest.raises(ConfigurationError, match="surrogate"):
            await backend.publish_event("unstorable.event", {}, key="k\ud800")
    assert sent == []
    assert await rows(engine, events) == 0


async def test_idempotency_keys_and_fingerprints_with_a_surrogate_are_refused_before_any_sql(
    engine: AsyncEngine,
) -> None:
    """I1, issue 25 D6: an idempotency key or request fingerprint holding a lone surrogate is
    IdempotencyKeyError before any statement (not the driver's UnicodeEncodeError); no key is
    stored."""
    store = create_idempotency_store(database=engine, table=keys)
    with Statements(engine) as sent:
        with pytest.raises(IdempotencyKeyError) as caught:
            await store.begin("k\ud800", "fp")
        assert caught.value.code == "SHIP_SQLA_IDEMPOTENCY_KEY_INVALID"
        with pytest.raises(IdempotencyKeyError, match="surrogate"):
            await store.begin("k", "sha256:\udfff")
    assert sent == []
    assert await rows(engine, keys) == 0


async def test_a_webhook_event_jsonb_cannot_store_is_refused_before_any_sql(
    engine: AsyncEngine,
) -> None:
    """§6 webhook store, issue 25 D6: record() refuses a payload or header holding a lone
    surrogate, a payload that is not JSON (NaN, as Python's json reads it from a body) and an
    event id holding a surrogate, with a ConfigurationError naming it, before any statement;
    nothing is recorded."""
    store = create_webhook_event_store(
        database=engine, table=webhook_events, outbox_table=outbox_table, idempotency_table=keys
    )
    with Statements(engine) as sent:
        with pytest.raises(ConfigurationError, match=r"payload\['x'\]\[0\]"):
            await store.record("hook", "evt", {"x": ["\ud800"]})
        with pytest.raises(ConfigurationError, match=r"headers\['h'\]"):
            await store.record("hook", "evt", {}, headers={"h": "\udfff"})
        with pytest.raises(ConfigurationError, match="not JSON"):
            await store.record("hook", "evt", {"n": float("nan")})
        with pytest.raises(ConfigurationError, match="event id"):
            await store.record("hook", "evt\ud800", {})
    assert sent == []
    assert await rows(engine, webhook_events) == 0


@pytest.mark.parametrize(
    ("body", "extra"),
    [
        (b'{"note": "a\\ud800b"}', {}),
        (b'{"k\\udfff": 1}', {}),
        (b'{"n": NaN}', {}),
        (b"{}", {"x-note": "a\x00b"}),
    ],
    ids=["surrogate", "surrogate-key", "nan", "nul-header"],
)
async def test_a_signed_delivery_jsonb_cannot_store_is_400_and_writes_nothing(
    engine: AsyncEngine, ship_clock: FrozenClock, body: bytes, extra: dict[str, str]
) -> None:
    """§6 enqueue-mode receiving, issue 25 D6: a verified delivery whose JSON holds a lone
    surrogate escape or NaN (valid to Python's json, refused by jsonb), or whose recorded
    headers hold a NUL, is answered 400 SHIP_SQLA_WEBHOOK_BODY_UNSTORABLE before any SQL, not
    500: no idempotency key, no event, no outbox message."""
    receiver = WebhookReceiver(
        endpoints=[WebhookEndpoint("stripe", secrets=SECRET)],
        events=create_webhook_event_store(
            database=engine,
            table=webhook_events,
            outbox_table=outbox_table,
            idempotency_table=keys,
            clock=ship_clock,
        ),
        idempotency=create_idempotency_store(database=engine, table=keys, clock=ship_clock),
        outbox=create_outbox(database=engine, table=outbox_table, clock=ship_clock),
        clock=ship_clock,
    )
    app = Starlette(routes=[Route("/webhooks/{name}", receiver, methods=["POST"])])
    headers = {**webhook_headers(SECRET, "evt_bad", ship_clock.now(), body), **extra}
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    with Statements(engine) as sent:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            response = await client.post("/webhooks/stripe", content=body, headers=headers)
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "SHIP_SQLA_WEBHOOK_BODY_UNSTORABLE"
    assert sent == []
    for table in (keys, webhook_events, outbox_table):
        assert await rows(engine, table) == 0
    json.loads(body)  # valid JSON to Python: the refusal is jsonb's rule, not the parser's
