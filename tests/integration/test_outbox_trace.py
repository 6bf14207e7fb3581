"""Trace propagation through the outbox (K7): the enqueue's W3C trace context rides in the
message's headers to the relay, which publishes under it, so a job the sink enqueues is traced
under the producer's span too. Real PostgreSQL; time is a FrozenClock."""

from __future__ import annotations

from typing import Any

from global_tracer import global_tracer
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla import define_job
from ship_sqla._outbox import (
    OutboxIntent,
    OutboxMessage,
    OutboxRelay,
    create_outbox,
    job_sink,
    ship_outbox_table,
)
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.kernel._ports import ClaimRequest
from ship_sqla.testing import FrozenClock

metadata = MetaData()
table = ship_outbox_table(metadata)
request_tracer = TracerProvider().get_tracer("test.request")


def traceparent_of(span: trace.Span) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


async def test_enqueue_carries_the_trace_context_in_the_headers(
    ship_engine: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """K7: a message enqueued inside a span carries its traceparent in its headers, beside the
    caller's own; a caller's traceparent wins; outside any span nothing is added."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    outbox = create_outbox(database=ship_engine, table=table, clock=ship_clock)
    with request_tracer.start_as_current_span("request") as span:
        await outbox.enqueue_many(
            "main",
            [
                OutboxIntent("t", {"n": 1}, headers={"x-app": "a"}),
                OutboxIntent("t", {"n": 2}, headers={"traceparent": "00-mine-01"}),
            ],
        )
    await outbox.enqueue("main", "t", {"n": 3})
    messages = await outbox.claim("main", 10, lease=30)
    assert [dict(m.headers) for m in messages] == [
        {"x-app": "a", "traceparent": traceparent_of(span)},
        {"traceparent": "00-mine-01"},
        {},
    ]


async def test_the_relay_publishes_under_the_enqueue_span_down_to_a_job_run(
    ship_engine: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """K7: the relay calls the sink inside a ``publish <topic>`` span whose parent is the
    enqueue's span, so the job the sink enqueues stores that publish span's context: the run's
    attempts will be children of it, in the producer's trace."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    outbox = create_outbox(database=ship_engine, table=table, clock=ship_clock)
    backend = InMemoryJobBackend(clock=ship_clock)

    async def handler(ctx: Any, payload: Any) -> None:
        return None

    job = define_job("trace.email", handler, payload=dict)
    enqueue_run = job_sink(backend, job)
    seen: list[trace.SpanContext] = []

    async def sink(message: OutboxMessage) -> None:
        seen.append(trace.get_current_span().get_span_context())
        await enqueue_run(message)

    with global_tracer() as exporter:
        with request_tracer.start_as_current_span("request") as request:
            await outbox.enqueue("main", "email", {"to": "a@example.com"})
        relay = OutboxRelay(outbox, "main", sink, clock=ship_clock)
        assert await relay.run_once() == 1
        [publish] = [s for s in exporter.get_finished_spans() if s.name == "publish email"]
    parent = request.get_span_context()
    assert publish.parent is not None
    assert (publish.parent.trace_id, publish.parent.span_id) == (parent.trace_id, parent.span_id)
    assert publish.attributes is not None
    assert publish.attributes["ship.outbox.topic"] == "email"
    assert seen == [publish.context]
    [run] = await backend.claim(ClaimRequest(job.id, "w", 1, 10, 30.0))
    assert publish.context is not None
    assert run.trace_context == {
        "traceparent": f"00-{parent.trace_id:032x}-{publish.context.span_id:016x}-"
        f"{publish.context.trace_flags:02x}"
    }
