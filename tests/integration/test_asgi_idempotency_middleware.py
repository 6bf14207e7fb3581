"""The Idempotency-Key middleware in a Starlette app, driven with httpx, on real PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import httpx
import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ship_sqla import TransactionScope, create_unit_of_work
from ship_sqla._idempotency import create_idempotency_store, ship_idempotency_table
from ship_sqla._idempotency._middleware import parse_idempotency_key
from ship_sqla.asgi import IdempotencyKeyMiddleware, request_fingerprint

pytestmark = pytest.mark.anyio

metadata = MetaData()
keys = ship_idempotency_table(metadata)
items = Table(
    "mw_items",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String, nullable=False),
    Column("tenant", String, nullable=True),
)


class BoomError(Exception):
    pass


def scope_only(scope: TransactionScope) -> TransactionScope:
    return scope


class Harness:
    """An app whose POST /items writes a row through its own unit of work on the same engine."""

    def __init__(self, engine: AsyncEngine, **middleware: Any) -> None:
        self.engine = engine
        self.store = create_idempotency_store(
            database=engine, table=keys, lock_timeout=timedelta(milliseconds=200)
        )
        self.uow = create_unit_of_work(engine, repositories=scope_only)
        self.gate: anyio.Event | None = None
        self.entered = anyio.Event()
        self.fail_with: int | None = None
        self.raise_error = False
        self.calls = 0
        self.app = Starlette(
            routes=[
                Route("/items", self.create_item, methods=["POST", "GET"]),
                Route("/other", self.create_item, methods=["POST"]),
                Route("/stream", self.stream, methods=["POST"]),
                Route("/bytes", self.binary, methods=["POST"]),
            ],
            middleware=[Middleware(IdempotencyKeyMiddleware, store=self.store, **middleware)],
        )

    async def create_item(self, request: Request) -> Response:
        if request.method == "GET":
            return JSONResponse({"items": await self.count()})
        payload = await request.json()
        self.calls += 1

        async def write(tx: TransactionScope) -> int:
            result = await tx.connection.execute(
                insert(items).values(name=payload["name"], tenant=tx.tenant).returning(items.c.id)
            )
            return int(result.scalar_one())

        item_id = await self.uow.run(write)
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.raise_error:
            raise BoomError
        if self.fail_with is not None:
            return JSONResponse({"error": "try again"}, status_code=self.fail_with)
        if payload["name"] == "invalid":
            return JSONResponse({"error": "invalid name"}, status_code=400)
        return JSONResponse(
            {"id": item_id, "name": payload["name"]},
            status_code=201,
            headers={"location": f"/items/{item_id}"},
        )

    async def stream(self, _request: Request) -> Response:
        async def chunks() -> Any:
            for part in (b"one,", b"two,", b"three"):
                yield part

        self.calls += 1
        return StreamingResponse(chunks(), media_type="text/plain")

    async def binary(self, _request: Request) -> Response:
        self.calls += 1
        response = Response(b"\x00\xff\xfe", media_type="application/octet-stream")
        response.set_cookie("a", "1")
        response.set_cookie("b", "2")
        return response

    def client(self) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)
        return httpx.AsyncClient(transport=transport, base_url="http://test")

    async def count(self, table: Table = items) -> int:
        async with self.engine.connect() as c:
            return int((await c.execute(select(func.count()).select_from(table))).scalar_one())


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as c:
        await c.run_sync(metadata.create_all)
    return ship_engine


@pytest.fixture
def harness(engine: AsyncEngine) -> Harness:
    return Harness(engine)


def key(value: str) -> dict[str, str]:
    return {"idempotency-key": f'"{value}"'}


async def test_first_request_runs_and_its_response_is_replayed(harness: Harness) -> None:
    """I1 over HTTP: the first request's write and its stored response commit together; the
    retry replays status, headers and body with the marker header and writes nothing."""
    async with harness.client() as client:
        first = await client.post("/items", json={"name": "a"}, headers=key("k1"))
        second = await client.post("/items", json={"name": "a"}, headers=key("k1"))
    assert first.status_code == 201
    assert "idempotent-replayed" not in first.headers
    assert second.status_code == 201
    assert second.headers["idempotent-replayed"] == "true"
    assert second.json() == first.json()
    assert second.headers["location"] == first.headers["location"]
    assert harness.calls == 1
    assert await harness.count() == 1
    assert await harness.count(keys) == 1


async def test_missing_and_malformed_keys_are_400(harness: Harness) -> None:
    async with harness.client() as client:
        missing = await client.post("/items", json={"name": "a"})
        doubled = await client.post(
            "/items",
            json={"name": "a"},
            headers=[("idempotency-key", '"a"'), ("idempotency-key", '"b"')],
        )
        broken = await client.post("/items", json={"name": "a"}, headers=key("x" * 300))
        read = await client.get("/items")
    assert missing.status_code == 400
    assert missing.headers["content-type"] == "application/problem+json"
    assert missing.json()["code"] == "SHIP_SQLA_IDEMPOTENCY_KEY_MISSING"
    assert doubled.status_code == 400
    assert broken.status_code == 400
    assert broken.json()["code"] == "SHIP_SQLA_IDEMPOTENCY_KEY_INVALID"
    assert read.status_code == 200  # GET is not a configured method
    assert harness.calls == 0


async def test_key_reused_for_another_request_is_422(harness: Harness) -> None:
    """I2: fingerprint = method + path + body hash; a mismatch is 422 and runs nothing."""
    async with harness.client() as client:
        await client.post("/items", json={"name": "a"}, headers=key("k1"))
        other_body = await client.post("/items", json={"name": "b"}, headers=key("k1"))
        other_path = await client.post("/other", json={"name": "a"}, headers=key("k1"))
    assert other_body.status_code == 422
    assert other_body.json()["code"] == "SHIP_SQLA_IDEMPOTENCY_FINGERPRINT_MISMATCH"
    assert other_path.status_code == 422
    assert harness.calls == 1


async def test_concurrent_retry_is_409_while_the_first_runs(harness: Harness) -> None:
    """I2: a retry racing the first request (whose claim is not committed yet) is answered 409
    within the store's lock_timeout, never hangs, and never runs the effect again."""
    harness.gate = anyio.Event()
    first_status: list[int] = []
    async with harness.client() as client:

        async def first() -> None:
            response = await client.post("/items", json={"name": "a"}, headers=key("k1"))
            first_status.append(response.status_code)

        with anyio.fail_after(15):
            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                await harness.entered.wait()
                racing = await client.post("/items", json={"name": "a"}, headers=key("k1"))
                harness.gate.set()
        replay = await client.post("/items", json={"name": "a"}, headers=key("k1"))
    assert racing.status_code == 409
    assert racing.json()["code"] == "SHIP_SQLA_IDEMPOTENCY_IN_PROGRESS"
    assert first_status == [201]
    assert replay.headers["idempotent-replayed"] == "true"
    assert harness.calls == 1
    assert await harness.count() == 1


async def test_server_error_response_releases_the_claim(harness: Harness) -> None:
    """A 5xx response rolls the unit of work back (the write and the claim): a retry runs."""
    harness.fail_with = 503
    async with harness.client() as client:
        failed = await client.post("/items", json={"name": "a"}, headers=key("k1"))
        assert (await harness.count(), await harness.count(keys)) == (0, 0)
        harness.fail_with = None
        retried = await client.post("/items", json={"name": "a"}, headers=key("k1"))
    assert failed.status_code == 503
    assert failed.json() == {"error": "try again"}
    assert retried.status_code == 201
    assert "idempotent-replayed" not in retried.headers
    assert harness.calls == 2
    assert await harness.count() == 1


async def test_exception_releases_the_claim(harness: Harness) -> None:
    harness.raise_error = True
    async with harness.client() as client:
        failed = await client.post("/items", json={"name": "a"}, headers=key("k1"))
        assert (await harness.count(), await harness.count(keys)) == (0, 0)
        harness.raise_error = False
        retried = await client.post("/items", json={"name": "a"}, headers=key("k1"))
    assert failed.status_code == 500
    assert retried.status_code == 201
    assert await harness.count() == 1


async def test_client_error_responses_are_stored(harness: Harness) -> None:
    async with harness.client() as client:
        first = await client.post("/items", json={"name": "invalid"}, headers=key("k1"))
        again = await client.post("/items", json={"name": "invalid"}, headers=key("k1"))
    assert (first.status_code, again.status_code) == (400, 400)
    assert again.headers["idempotent-replayed"] == "true"
    assert harness.calls == 1


async def test_streamed_and_binary_responses_replay_exactly(harness: Harness) -> None:
    async with harness.client() as client:
        streamed = await client.post("/stream", content=b"", headers=key("s"))
        streamed_again = await client.post("/stream", content=b"", headers=key("s"))
        binary = await client.post("/bytes", content=b"\x01", headers=key("b"))
        binary_again = await client.post("/bytes", content=b"\x01", headers=key("b"))
    assert streamed.content == streamed_again.content == b"one,two,three"
    assert binary.content == binary_again.content == b"\x00\xff\xfe"
    assert binary_again.headers.get_list("set-cookie") == binary.headers.get_list("set-cookie")
    assert len(binary.headers.get_list("set-cookie")) == 2
    assert harness.calls == 2


async def test_optional_key_tenant_scoping_and_body_limit(engine: AsyncEngine) -> None:
    """required=False lets keyless requests through; keys are scoped per tenant; the request
    body is bounded."""
    harness = Harness(
        engine,
        required=False,
        tenant=lambda scope: dict(scope["headers"]).get(b"x-tenant", b"").decode() or None,
        max_body_bytes=64,
    )
    async with harness.client() as client:
        keyless = await client.post("/items", json={"name": "a"})
        t1 = await client.post("/items", json={"name": "a"}, headers={**key("k"), "x-tenant": "t1"})
        t2 = await client.post("/items", json={"name": "a"}, headers={**key("k"), "x-tenant": "t2"})
        too_large = await client.post("/items", json={"name": "a" * 100}, headers=key("big"))
    assert (keyless.status_code, t1.status_code, t2.status_code) == (201, 201, 201)
    assert "idempotent-replayed" not in t2.headers
    assert too_large.status_code == 413
    async with engine.connect() as c:
        scoped = sorted((await c.execute(select(keys.c.tenant_id, keys.c.key))).all())
    assert scoped == [("t1", "k"), ("t2", "k")]
    assert harness.calls == 3


def test_fingerprint_separates_method_path_query_and_body() -> None:
    base = request_fingerprint("POST", "/items", b"", b"{}")
    assert base == request_fingerprint("post", "/items", b"", b"{}")
    assert base != request_fingerprint("PATCH", "/items", b"", b"{}")
    assert base != request_fingerprint("POST", "/items/", b"", b"{}")
    assert base != request_fingerprint("POST", "/items", b"a=1", b"{}")
    assert base != request_fingerprint("POST", "/items", b"", b"{ }")
    assert request_fingerprint("POST", "/a", b"b", b"") != request_fingerprint(
        "POST", "/ab", b"", b""
    )


async def test_client_errors_can_roll_back_instead(engine: AsyncEngine) -> None:
    """store_client_errors=False: a 4xx response rolls back the writes made before it and
    releases the key, so a corrected retry with the same key runs."""
    harness = Harness(engine, store_client_errors=False)
    async with harness.client() as client:
        first = await client.post("/items", json={"name": "invalid"}, headers=key("k1"))
        assert (await harness.count(), await harness.count(keys)) == (0, 0)
        again = await client.post("/items", json={"name": "invalid"}, headers=key("k1"))
    assert (first.status_code, again.status_code) == (400, 400)
    assert "idempotent-replayed" not in again.headers
    assert harness.calls == 2


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        ('"8e03978e-40d5-43e8-bc93-6894a57f9324"', "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ("bare-token", "bare-token"),
        ('"with \\"quote\\""', 'with "quote"'),
        ('""', None),
        ('"unbalanced "quote"', None),
        ('"' + "x" * 256 + '"', None),
        ('"caf\u00e9"', None),
    ],
)
def test_idempotency_key_is_a_structured_field_string(raw: str, parsed: str | None) -> None:
    assert parse_idempotency_key(raw) == parsed


async def test_nested_failure_turned_into_a_response_is_never_stored(engine: AsyncEngine) -> None:
    """U5/I1: a joined nested uow.run that raised, whose exception the framework turned into a
    4xx, is sent to the client but neither its writes nor the response nor the claim commit;
    a retry with the same key runs again."""
    harness = Harness(engine)

    async def domain_error(_request: Request, _exc: Exception) -> Response:
        return JSONResponse({"error": "rejected by the domain"}, status_code=422)

    async def create_then_fail(request: Request) -> Response:
        payload = await request.json()
        harness.calls += 1

        async def write_then_raise(tx: TransactionScope) -> None:
            await tx.connection.execute(insert(items).values(name=payload["name"]))
            raise BoomError

        await harness.uow.run(write_then_raise)
        return JSONResponse({"never": True})

    harness.app = Starlette(
        routes=[Route("/items", create_then_fail, methods=["POST"])],
        middleware=[Middleware(IdempotencyKeyMiddleware, store=harness.store)],
        exception_handlers={BoomError: domain_error},
    )
    async with harness.client() as client:
        first = await client.post("/items", json={"name": "x"}, headers=key("k-nested"))
        again = await client.post("/items", json={"name": "x"}, headers=key("k-nested"))
    assert (first.status_code, again.status_code) == (422, 422)
    assert "idempotent-replayed" not in again.headers
    assert (await harness.count(), await harness.count(keys)) == (0, 0)
    assert harness.calls == 2
