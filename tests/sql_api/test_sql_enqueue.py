"""The SQL enqueue API (SPEC §18, E1-E8): ``<runs>_enqueue_v1`` and ``_enqueue_many_v1`` store
the run Python's ``enqueue`` stores, with the same outcomes and error codes, join the caller's
transaction, announce by K8's rule, and install with the tables."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import MetaData, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla import define_job
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._sql_api import (
    ship_job_definitions_table,
    sync_job_definitions,
)
from ship_sqla.kernel._errors import ShipError

if TYPE_CHECKING:
    from collections.abc import Sequence

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)
defs = ship_job_definitions_table(metadata, runs=runs, state=state)
CAP = 3
TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


async def noop(ctx: Any, payload: Any) -> None:
    return None


PLAIN = define_job("sql.plain", noop, payload=dict, priority=2, version=3)
CAPPED = define_job("sql.capped", noop, payload=dict)
SMALL = define_job("sql.small", noop, payload=dict, max_payload_bytes=32)
STORED = (
    "job_id, state, payload, key, dedupe_key, attempt, max_attempts, priority, trace_context,"
    " tenant_id, history, partition_key, handler_version"
)


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await sync_job_definitions(connection, defs, [PLAIN, SMALL])
        await sync_job_definitions(connection, defs, [CAPPED], queue_depth_limit=CAP)
    return ship_engine


async def call(engine: AsyncEngine, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    async with engine.begin() as connection:
        return [tuple(row) for row in await connection.execute(text(sql), params)]


async def sql_enqueue(engine: AsyncEngine, job_id: str, payload: Any, **args: Any) -> Any:
    names = ", ".join(f"{name} => :{name}" for name in args)
    extra = f", {names}" if names else ""
    for name in ("trace_context", "options"):
        if name in args and args[name] is not None:
            args[name] = json.dumps(args[name])
    sql = f"SELECT * FROM ship_job_runs_enqueue_v1(:job_id, CAST(:payload AS jsonb){extra})"
    sql = sql.replace(":trace_context", "CAST(:trace_context AS jsonb)").replace(
        ":options", "CAST(:options AS jsonb)"
    )
    [row] = await call(engine, sql, job_id=job_id, payload=json.dumps(payload), **args)
    return row


async def stored(engine: AsyncEngine) -> list[tuple[Any, ...]]:
    return await call(engine, f"SELECT {STORED} FROM ship_job_runs ORDER BY seq")


async def sql_error(engine: AsyncEngine, job_id: str, payload: Any, **args: Any) -> str:
    with pytest.raises(DBAPIError) as caught:
        await sql_enqueue(engine, job_id, payload, **args)
    cause = caught.value.orig.__cause__  # type: ignore[union-attr]
    assert isinstance(cause, asyncpg.PostgresError)
    assert cause.sqlstate == "22023"
    assert (cause.hint or "").startswith("Fix: ")
    return str(cause.message).split(":", 1)[0]


async def test_the_function_answers_every_outcome(engine: AsyncEngine) -> None:
    """E1, J1, J2: inserted (the new or given id), deduplicated (the live run's id, by dedupe
    key or by a durable id) and queue-full (no id) once the job holds its cap of waiting runs;
    the bulk form answers the same outcomes in request order."""
    run_id, outcome = await sql_enqueue(engine, "sql.plain", {"a": 1}, dedupe_key="k")
    assert outcome == "inserted"
    assert await sql_enqueue(engine, "sql.plain", {"a": 2}, dedupe_key="k") == (
        run_id,
        "deduplicated",
    )
    assert await sql_enqueue(engine, "sql.plain", {}, run_id="mine") == ("mine", "inserted")
    assert await sql_enqueue(engine, "sql.plain", {}, run_id="mine") == ("mine", "deduplicated")
    outcomes = [(await sql_enqueue(engine, "sql.capped", {"n": i}))[1] for i in range(CAP + 1)]
    assert outcomes == ["inserted"] * CAP + ["queue-full"]
    bulk = await call(
        engine,
        "SELECT * FROM ship_job_runs_enqueue_many_v1(CAST(:r AS jsonb))",
        r=json.dumps(
            [
                {"job_id": "sql.plain", "payload": {"b": 1}, "dedupe_key": "k"},
                {"job_id": "sql.plain", "payload": {"b": 2}, "run_id": "bulk-1"},
                {"job_id": "sql.capped", "payload": {}},
            ]
        ),
    )
    assert bulk == [(run_id, "deduplicated"), ("bulk-1", "inserted"), (None, "queue-full")]


async def test_errors_start_with_pythons_codes(engine: AsyncEngine) -> None:
    """E4, K6, K7: bad input is SQLSTATE 22023, the message starting with the SHIP_SQLA_* code
    Python raises for it, the hint its fix; an unknown job or option key is refused, and
    nothing is stored."""
    cases: Sequence[tuple[str, Any, dict[str, Any], str]] = [
        ("no.such.job", {}, {}, "SHIP_SQLA_JOB_UNKNOWN"),
        ("sql.plain", {}, {"options": {"colour": "red"}}, "SHIP_SQLA_CONFIGURATION"),
        ("sql.plain", {}, {"options": {"partition_key": "p"}}, "SHIP_SQLA_CONFIGURATION"),
        ("sql.plain", {}, {"priority": 11}, "SHIP_SQLA_JOB_PRIORITY_INVALID"),
        ("sql.plain", {}, {"dedupe_key": ""}, "SHIP_SQLA_KEY_INVALID"),
        ("sql.plain", {}, {"run_id": "x" * 256}, "SHIP_SQLA_KEY_INVALID"),
        ("sql.small", {"text": "é" * 5}, {}, "SHIP_SQLA_JOB_PAYLOAD_TOO_LARGE"),
        ("sql.plain", {}, {"trace_context": {"traceparent": "nope"}}, "SHIP_SQLA_USAGE"),
    ]
    for job_id, payload, args, code in cases:
        assert await sql_error(engine, job_id, payload, **args) == code, (job_id, args)
    assert await stored(engine) == []


async def test_python_and_sql_raise_the_same_codes(engine: AsyncEngine) -> None:
    """E4, K6: the same bad input raises the same code from Python's enqueue."""
    backend = create_job_backend(database=engine, table=runs, state_table=state)
    for job, payload, kwargs, code in (
        (PLAIN, {}, {"priority": 11}, "SHIP_SQLA_JOB_PRIORITY_INVALID"),
        (PLAIN, {}, {"dedupe_key": ""}, "SHIP_SQLA_KEY_INVALID"),
        (SMALL, {"text": "é" * 5}, {}, "SHIP_SQLA_JOB_PAYLOAD_TOO_LARGE"),
    ):
        with pytest.raises(ShipError) as caught:
            await backend.enqueue(job, payload, **kwargs)
        assert caught.value.code == code
        assert await sql_error(engine, job.id, payload, **kwargs) == code


_payloads = st.dictionaries(
    st.sampled_from(["a", "b", "ü"]),
    st.one_of(st.integers(-5, 5), st.text("xé☃", max_size=4), st.none()),
    max_size=3,
)
_requests = st.lists(
    st.fixed_dictionaries(
        {
            "job": st.sampled_from(["sql.plain", "sql.capped", "sql.small"]),
            "payload": _payloads,
            "dedupe_key": st.sampled_from([None, "d1", "d2"]),
            "run_id": st.sampled_from([None, "r1", "r2"]),
            "priority": st.sampled_from([None, -10, 3, 10, 11]),
        }
    ),
    max_size=8,
)
JOBS = {job.id: job for job in (PLAIN, CAPPED, SMALL)}


async def _through_python(engine: AsyncEngine, requests: list[dict[str, Any]]) -> list[Any]:
    backends = {
        None: create_job_backend(database=engine, table=runs, state_table=state),
        CAP: create_job_backend(
            database=engine, table=runs, state_table=state, queue_depth_limit=CAP
        ),
    }
    outcomes: list[Any] = []
    for r in requests:
        backend = backends[CAP if r["job"] == "sql.capped" else None]
        kwargs = {k: r[k] for k in ("dedupe_key", "run_id", "priority") if r[k] is not None}
        try:
            result = await backend.enqueue(JOBS[r["job"]], r["payload"], **kwargs)
        except ShipError as error:
            outcomes.append(error.code)
            continue
        outcome = "queue-full" if result.rejected else "inserted"
        outcomes.append("deduplicated" if result.deduplicated else outcome)
    return outcomes


async def _through_sql(engine: AsyncEngine, requests: list[dict[str, Any]]) -> list[Any]:
    outcomes: list[Any] = []
    for r in requests:
        kwargs = {k: r[k] for k in ("dedupe_key", "run_id", "priority") if r[k] is not None}
        try:
            outcomes.append((await sql_enqueue(engine, r["job"], r["payload"], **kwargs))[1])
        except DBAPIError as error:
            message = str(error.orig.__cause__.message)  # type: ignore[union-attr]
            outcomes.append(message.split(":", 1)[0])
    return outcomes


async def _clear(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.execute(text("DELETE FROM ship_job_runs"))


@pytest.mark.anyio
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(requests=_requests)
async def test_python_and_sql_store_the_same_runs(
    engine: AsyncEngine, requests: list[dict[str, Any]]
) -> None:
    """E2, E1, E4, J1, J2, K6: random request sequences through Python's enqueue and through
    the function give the same outcomes (or error codes) and the same stored runs."""
    await _clear(engine)
    by_python = await _through_python(engine, requests)
    python_rows = await stored(engine)
    await _clear(engine)
    by_sql = await _through_sql(engine, requests)
    assert by_sql == by_python
    assert await stored(engine) == python_rows


async def test_the_bulks_set_path_stores_what_single_calls_store(engine: AsyncEngine) -> None:
    """E1, E2, K6, F2: a bulk of plain requests (the set path: one INSERT) stores the rows the
    same requests store one call at a time, answers inserted for each in order, and a bulk
    with one bad request raises that request's error and stores nothing."""
    requests = [
        {"job_id": "sql.plain", "payload": {"n": i, "s": "é"}, "priority": [None, -3, 10][i % 3]}
        | ({"tenant": "acme"} if i % 2 else {})
        | ({"run_at": "2030-01-01T00:00:00Z"} if i % 5 == 0 else {})
        for i in range(20)
    ]
    for request in requests:
        args = {
            k: v for k, v in request.items() if k not in ("job_id", "payload") and v is not None
        }
        if "run_at" in args:
            args["run_at"] = datetime.fromisoformat(args["run_at"])
        answer = await sql_enqueue(engine, request["job_id"], request["payload"], **args)
        assert answer[1] == "inserted"
    singles = await stored(engine)
    await _clear(engine)
    bulk = await call(
        engine,
        "SELECT outcome FROM ship_job_runs_enqueue_many_v1(CAST(:r AS jsonb))",
        r=json.dumps(requests),
    )
    assert bulk == [("inserted",)] * len(requests)
    assert await stored(engine) == singles
    await _clear(engine)
    bad = [*requests[:3], {"job_id": "sql.plain", "payload": {}, "priority": 11}]
    with pytest.raises(DBAPIError, match="SHIP_SQLA_JOB_PRIORITY_INVALID"):
        await call(
            engine,
            "SELECT * FROM ship_job_runs_enqueue_many_v1(CAST(:r AS jsonb))",
            r=json.dumps(bad),
        )
    assert await stored(engine) == []
