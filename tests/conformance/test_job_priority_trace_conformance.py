"""Priorities (K6) and trace propagation (K7), run against every backend (in-memory reference,
PostgreSQL). Time moves only through the FrozenClock; nothing sleeps on the wall clock."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from global_tracer import global_tracer
from job_helpers import advance_until, claim_request, record_of
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags

from ship_sqla import define_job, start_job_runtime
from ship_sqla.errors import InvalidPriorityError
from ship_sqla.jobs import Concurrency, EnqueueRequest, RetryPolicy
from ship_sqla.kernel import completed, failed, released

LEASE = 30.0

# Spans of the test's own code (the "enqueuing request"): a local SDK provider is enough, the
# enqueue reads whatever span is current, whoever made it.
request_tracer = TracerProvider().get_tracer("test.request")


async def _noop(ctx, payload):
    return None


def job(job_id="conf.prio", *, max_=10, priority=0, handler=_noop, **kw):
    return define_job(
        job_id,
        handler,
        payload=dict,
        concurrency=Concurrency(max=max_, lease=LEASE),
        retry=RetryPolicy(attempts=3, backoff="fixed", base_delay=5, jitter="none"),
        priority=priority,
        **kw,
    )


async def _claim_one_by_one(backend, definition):
    order = []
    while claimed := await backend.claim(claim_request(definition, worker="A", limit=1)):
        order.append(claimed[0].payload["name"])
    return order


# --- K6: priorities ----------------------------------------------------------------------------


async def test_claims_take_higher_priority_first_then_run_at_then_creation_order(
    clock, job_backend_factory
):
    """K6: due runs are claimed higher priority first, then by run_at, then in creation order
    (one claim of many, and claims of one, agree); a delayed run of a higher priority is not
    taken before it is due, and then goes first."""
    backend = job_backend_factory(clock)
    definition = job()
    now = clock.now()

    def at(seconds):
        return now + timedelta(seconds=seconds)

    requests = [
        ("a", 0, at(-3)),
        ("b", 5, at(-1)),
        ("c", 5, at(-2)),
        ("d", -3, at(-10)),
        ("e", 5, at(-1)),  # same priority and run_at as b, created after it
        ("late", 10, at(10)),  # the highest priority, delayed
        ("g", 0, at(-3)),  # same as a, created after it
        ("h", 0, at(-30)),
    ]
    for name, priority, run_at in requests:
        await backend.enqueue(definition, {"name": name}, priority=priority, run_at=run_at)
    batch = await backend.claim(claim_request(definition, worker="A", limit=3))
    assert [run.payload["name"] for run in batch] == ["c", "b", "e"]
    assert [run.priority for run in batch] == [5, 5, 5]
    assert await _claim_one_by_one(backend, definition) == ["h", "a", "g", "d"]
    clock.advance(11)  # less than the lease: the claimed runs stay held
    [late] = await backend.claim(claim_request(definition, worker="A", limit=5))
    assert (late.payload["name"], late.priority) == ("late", 10)


async def test_priority_defaults_to_the_jobs_and_is_recorded(clock, job_backend_factory):
    """K6: a run's priority is its enqueue's, else its job definition's; claims and the
    operator's record carry it, and enqueue_many takes one per request."""
    backend = job_backend_factory(clock)
    definition = job("conf.prio.default", priority=4)
    plain = await backend.enqueue(definition, {"name": "plain"})
    low = await backend.enqueue(definition, {"name": "low"}, priority=-2)
    many = await backend.enqueue_many(
        definition,
        [
            EnqueueRequest({"name": "m-top"}, priority=10),
            EnqueueRequest({"name": "m-default"}),
            EnqueueRequest({"name": "m-durable"}, run_id="durable-1", priority=-10),
            EnqueueRequest({"name": "m-deduped"}, dedupe_key="k", priority=7),
        ],
    )
    assert (await record_of(backend, plain.run_id)).priority == 4
    assert (await record_of(backend, low.run_id)).priority == -2
    assert [(await record_of(backend, result.run_id)).priority for result in many] == [
        10,
        4,
        -10,
        7,
    ]
    claimed = await backend.claim(claim_request(definition, worker="A", limit=10))
    assert [(run.payload["name"], run.priority) for run in claimed] == [
        ("m-top", 10),
        ("m-deduped", 7),
        ("plain", 4),
        ("m-default", 4),
        ("low", -2),
        ("m-durable", -10),
    ]


@pytest.mark.parametrize("bad", [11, -11, True, 1.5, "3"])
async def test_a_bad_priority_is_refused_before_anything_is_written(
    clock, job_backend_factory, bad
):
    """K6: a priority that is not an int from -10 to 10 raises InvalidPriorityError before the
    store sees the call: one bad request of a batch writes nothing; a definition refuses it
    at declaration."""
    backend = job_backend_factory(clock)
    definition = job("conf.prio.bad")
    with pytest.raises(InvalidPriorityError, match="priority"):
        await backend.enqueue(definition, {}, priority=bad)
    with pytest.raises(InvalidPriorityError, match="priority"):
        await backend.enqueue_many(
            definition, [EnqueueRequest({}), EnqueueRequest({}, priority=bad)]
        )
    assert await backend.claim(claim_request(definition, worker="A", limit=10)) == []
    with pytest.raises(InvalidPriorityError, match="priority"):
        job("conf.prio.bad2", priority=bad)


async def test_retries_and_releases_keep_their_priority(clock, job_backend_factory):
    """K6: a run failed (retry) or released back to waiting keeps its priority, so it goes
    before lower-priority runs that have waited longer."""
    backend = job_backend_factory(clock)
    definition = job("conf.prio.retry")
    now = clock.now()
    await backend.enqueue(definition, {"name": "old-low"}, priority=-1, run_at=now - timedelta(60))
    await backend.enqueue(definition, {"name": "failing"}, priority=3)
    await backend.enqueue(definition, {"name": "released"}, priority=2)
    first, second = await backend.claim(claim_request(definition, worker="A", limit=2))
    assert [first.payload["name"], second.payload["name"]] == ["failing", "released"]
    assert await backend.settle(
        [
            failed(first, "boom", retry_at=clock.now()),
            released(second, clock.now(), reason="lock-held"),
        ]
    ) == ["retrying", "released"]
    assert await _claim_one_by_one(backend, definition) == ["failing", "released", "old-low"]


async def test_a_retaken_lapsed_run_is_ordered_by_its_priority_too(clock, job_backend_factory):
    """K6 with J6: a lapsed lease retaken by a claim takes its place among the due runs by
    priority: a due run of a higher priority goes first, one of a lower priority after it."""
    backend = job_backend_factory(clock)
    definition = job("conf.prio.lapsed")
    await backend.enqueue(definition, {"name": "lapsing"}, priority=0)
    [lapsing] = await backend.claim(claim_request(definition, worker="A", limit=1))
    clock.advance(LEASE + 1)
    await backend.enqueue(definition, {"name": "high"}, priority=1)
    await backend.enqueue(definition, {"name": "low"}, priority=-1)
    assert await _claim_one_by_one(backend, definition) == ["high", "lapsing", "low"]
    assert await backend.settle([completed(lapsing)]) == ["stale"]


# --- K7: trace propagation ---------------------------------------------------------------------


async def test_enqueue_stores_the_current_trace_context_and_nothing_without_one(
    clock, job_backend_factory
):
    """K7: an enqueue inside a span stores its W3C trace context (traceparent) with each run,
    enqueue_many alike; one outside any span stores nothing; the API alone is enough (a span
    context made current without any SDK is stored too)."""
    backend = job_backend_factory(clock)
    definition = job("conf.trace.store")
    with request_tracer.start_as_current_span("request") as span:
        inside = await backend.enqueue(definition, {"name": "inside"})
        many = await backend.enqueue_many(definition, [EnqueueRequest({"name": "many"})] * 2)
    outside = await backend.enqueue(definition, {"name": "outside"})
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1))
    with trace.use_span(NonRecordingSpan(remote)):
        api_only = await backend.enqueue(definition, {"name": "api-only"})
    context = span.get_span_context()
    expected = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    claimed = {
        run.run_id: run
        for run in await backend.claim(claim_request(definition, worker="A", limit=10))
    }
    for result in [inside, *many]:
        assert claimed[result.run_id].trace_context == {"traceparent": expected}
    assert claimed[outside.run_id].trace_context is None
    assert claimed[api_only.run_id].trace_context == {
        "traceparent": f"00-{0xABC:032x}-{0xDEF:016x}-01"
    }


async def test_every_attempt_runs_in_a_child_span_of_the_enqueue(clock, job_backend_factory):
    """K7 across retries: each attempt of a run executes inside its own span whose parent is the
    span that enqueued it (100% of the run's spans, every attempt), with the job id, run id,
    attempt and outcome as attributes; a run enqueued outside any span gets a root span, not a
    child of the span the runtime was started in; the handler's own spans are the attempt's
    children."""
    backend = job_backend_factory(clock)
    completed = anyio.Event()
    inner_tracer = TracerProvider().get_tracer("test.handler")
    handler_parents = []

    async def handler(ctx, payload):
        with inner_tracer.start_as_current_span("handler work") as inner:
            handler_parents.append(inner.parent.span_id)
        if payload["fail"] and ctx.attempt < 3:
            raise ValueError(f"boom {ctx.attempt}")
        if payload["fail"]:
            completed.set()

    definition = define_job(
        "conf.trace.runs",
        handler,
        payload=dict,
        concurrency=Concurrency(lease=600),
        retry=RetryPolicy(attempts=3, backoff="fixed", base_delay=10, jitter="none"),
    )
    with global_tracer() as exporter:
        with request_tracer.start_as_current_span("request") as request:
            retried = await backend.enqueue(definition, {"fail": True})
        orphan = await backend.enqueue(definition, {"fail": False})
        with request_tracer.start_as_current_span("startup"):
            runtime = await start_job_runtime([definition], backend=backend)
        async with runtime:
            await advance_until(clock, completed, step=1.0, limit=30)
        spans = [s for s in exporter.get_finished_spans() if s.name == "process conf.trace.runs"]
    parent = request.get_span_context()
    mine = [s for s in spans if s.attributes["ship.job.run_id"] == retried.run_id]
    assert [s.attributes["ship.job.attempt"] for s in mine] == [1, 2, 3]
    for span in mine:
        assert span.parent is not None
        assert (span.parent.trace_id, span.parent.span_id) == (parent.trace_id, parent.span_id)
        assert span.kind is SpanKind.CONSUMER
        assert span.attributes["ship.job.id"] == "conf.trace.runs"
    assert [s.attributes["ship.job.outcome"] for s in mine] == ["retrying", "retrying", "completed"]
    errors = [StatusCode.ERROR, StatusCode.ERROR, StatusCode.UNSET]
    assert [s.status.status_code for s in mine] == errors
    assert "ValueError: boom 1" in (mine[0].status.description or "")
    [root] = [s for s in spans if s.attributes["ship.job.run_id"] == orphan.run_id]
    assert root.parent is None
    assert root.attributes["ship.job.outcome"] == "completed"
    assert sorted(handler_parents) == sorted(s.context.span_id for s in spans)
    assert (await record_of(backend, retried.run_id)).state == "completed"
