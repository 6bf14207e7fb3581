"""Trace propagation (K7), through the OpenTelemetry API only (never an SDK).

- An enqueue (jobs and the outbox alike) stores the W3C trace context current at the call
  (:func:`current_trace_context`: ``traceparent`` and, when set, ``tracestate``, as the
  :class:`~opentelemetry.trace.propagation.tracecontext.TraceContextTextMapPropagator` writes
  them); with no valid span current nothing is stored, so a process without tracing stores and
  sends nothing. Baggage is not carried: only the two W3C trace-context headers, which are
  bounded in size.
- Each attempt of a run executes inside its span (:func:`run_span`), whose parent is that stored
  context, the same for every attempt (a retry, a release, a retaken lapse), so every attempt of
  one run sits under the enqueue's span. It is a ``CONSUMER`` span named ``process <job id>``
  with ``ship.job.id``, ``ship.job.run_id``, ``ship.job.attempt``, ``ship.job.priority``,
  ``ship.job.key`` (keyed single-runner jobs) and, once the attempt ended,
  ``ship.job.outcome``. A run stored without a context gets a root span, never a child of
  whatever span happened to be current where the runtime was started.
- An outbox message carries the context to its sink as message headers
  (:data:`TRACE_HEADERS`); the relay publishes each message inside a span whose parent is that
  context (:func:`publish_span`), so whatever the sink does (an HTTP call, a job enqueue) is
  traced under the producer's span.

Spans go to the global tracer provider: nothing is recorded until the application installs an
SDK (before or after the runtime starts). Without one, a run that carries no context starts no
span at all (the API's no-op span alone costs a few microseconds per run); one that carries a
context still makes it current, so what the handler enqueues keeps the trace.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ship_sqla.kernel._json_text import encode_compact_json
from ship_sqla.kernel._settlement import Settlement

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from opentelemetry.trace import Span, Tracer

    from ship_sqla.kernel._ports import ClaimedRun
    from ship_sqla.kernel._settlement import SettleRequest

__all__ = [
    "ATTR_ATTEMPT",
    "ATTR_OUTCOME",
    "ATTR_RUN_ID",
    "TRACER_NAME",
    "TRACE_HEADERS",
    "attempt_outcome",
    "current_trace_context",
    "current_trace_context_json",
    "end_run_span",
    "forget_tracer",
    "publish_span",
    "run_span",
    "traces",
    "traces_message",
    "with_trace_context",
]

TRACER_NAME: Final = "ship_sqla"
TRACE_HEADERS: Final = ("traceparent", "tracestate")
"""The W3C trace-context headers stored with a run and carried in an outbox message's headers."""

ATTR_JOB_ID: Final = "ship.job.id"
ATTR_RUN_ID: Final = "ship.job.run_id"
ATTR_ATTEMPT: Final = "ship.job.attempt"
ATTR_PRIORITY: Final = "ship.job.priority"
ATTR_KEY: Final = "ship.job.key"
ATTR_OUTCOME: Final = "ship.job.outcome"
ATTR_FAILURE_KIND: Final = "ship.job.failure_kind"

_PROPAGATOR: Final = TraceContextTextMapPropagator()
_NO_SDK: Final = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
_cached: tuple[object, Tracer] | None = None
NO_SDK_RECHECK: Final = 1.0
"""Seconds a "no SDK installed" answer is kept: the API's lookup reads the environment on every
call while no provider is set (about a microsecond per run), so a process without tracing asks
about once a second; a provider installed later is used within that second."""
_no_sdk_until = -math.inf


def forget_tracer() -> None:
    """Forget the cached answers: the next run asks the global provider again (tests that
    install a provider call it; an application never needs to)."""
    global _cached, _no_sdk_until
    _cached, _no_sdk_until = None, -math.inf


def _tracer() -> Tracer | None:
    """The global provider's tracer, or None while no SDK is installed (the API's default
    provider, or an explicit no-op one). Looked up per span (a "no SDK" answer is kept for
    :data:`NO_SDK_RECHECK` seconds), so a provider installed after the runtime started is used
    from a run about a second later on."""
    global _cached, _no_sdk_until  # noqa: PLW0603 - one tracer per provider, not one per span
    if _cached is None and time.monotonic() < _no_sdk_until:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, _NO_SDK):
        _cached, _no_sdk_until = None, time.monotonic() + NO_SDK_RECHECK
        return None
    cached = _cached
    if cached is None or cached[0] is not provider:
        cached = (provider, provider.get_tracer(TRACER_NAME))
        _cached = cached
    return cached[1]


def current_trace_context() -> dict[str, str] | None:
    """The W3C trace context of the span current here (``traceparent``, and ``tracestate``
    when it has entries), or None when no valid span is current."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier or None


def current_trace_context_json() -> str | None:
    """:func:`current_trace_context` as compact JSON text (what a run stores), or None."""
    carrier = current_trace_context()
    return None if carrier is None else encode_compact_json(carrier)


def with_trace_context(
    headers: Mapping[str, Any] | None, carrier: Mapping[str, str] | None
) -> Mapping[str, Any] | None:
    """An outbox message's ``headers`` carrying ``carrier`` (the enqueue's
    :func:`current_trace_context`) as well; unchanged without a carrier, or when the caller set
    ``traceparent`` itself (the caller's wins)."""
    if carrier is None or (headers is not None and "traceparent" in headers):
        return headers
    return {**headers, **carrier} if headers else dict(carrier)


def _parent(carrier: Mapping[str, Any] | None) -> Context:
    """The context a stored carrier names; an empty one (a root span) without a valid one.
    Extracted onto an empty context: never onto whatever is current in the runtime's task."""
    if not carrier:
        return Context()
    return _PROPAGATOR.extract(
        {name: value for name, value in carrier.items() if isinstance(value, str)},
        context=Context(),
    )


def traces(run: ClaimedRun) -> bool:
    """Whether an attempt of ``run`` needs :func:`run_span` at all: it carries a trace context,
    or an SDK is installed. The executor skips the span's machinery otherwise."""
    return bool(run.trace_context) or _tracer() is not None


@contextlib.contextmanager
def run_span(job_id: str, run: ClaimedRun) -> Iterator[Span | None]:
    """The span of one attempt of ``run``, current for the body, a child of the run's stored
    trace context (K7); None (and no context change) when no SDK is installed and the run
    carries no context. End it with :func:`end_run_span` before leaving the block."""
    carrier = run.trace_context
    tracer = _tracer()
    if tracer is None:
        if not carrier:
            yield None
            return
        # No SDK here, but the trace goes on: what the handler enqueues keeps the context.
        token = otel_context.attach(_parent(carrier))
        try:
            yield None
        finally:
            otel_context.detach(token)
        return
    attributes: dict[str, str | int] = {
        ATTR_JOB_ID: job_id,
        ATTR_RUN_ID: run.run_id,
        ATTR_ATTEMPT: run.attempt,
        ATTR_PRIORITY: run.priority,
    }
    if run.key:
        attributes[ATTR_KEY] = run.key
    with tracer.start_as_current_span(
        f"process {job_id}",
        context=_parent(carrier),
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def end_run_span(span: Span | None, settlement: SettleRequest | None) -> None:
    """Record how the attempt ended on its span (:func:`attempt_outcome`): ``ship.job.outcome``,
    ``ship.job.failure_kind`` for a failed attempt, and an error status with the first line of
    its error."""
    if span is None:
        return
    outcome, error = attempt_outcome(settlement)
    span.set_attribute(ATTR_OUTCOME, outcome)
    if isinstance(settlement, Settlement) and settlement.failure_kind is not None:
        span.set_attribute(ATTR_FAILURE_KIND, settlement.failure_kind)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error.split("\n", 1)[0]))


def attempt_outcome(settlement: SettleRequest | None) -> tuple[str, str | None]:
    """``(outcome, error)`` of the attempt the executor ended with ``settlement`` (what it handed
    to the completer, before the store answered), in the words of ``ship.job.runs``' outcome
    (the settlement's ``recorded``): ``completed``; ``retrying`` / ``dead`` (a failure; its
    error); ``snoozed``; ``suspended``; ``cancelled`` (an operator's cancel, or a drain);
    ``lock_held``; ``released`` (handed back unstarted); ``stale`` (no settlement: the claim
    was lost, another worker may hold the run)."""
    if settlement is None:
        return "stale", None
    outcome = settlement.recorded or "released"
    if isinstance(settlement, Settlement) and settlement.failure_kind is not None:
        return outcome, None if settlement.entry is None else settlement.entry.error
    return outcome, None


def traces_message(headers: Mapping[str, Any]) -> bool:
    """Whether publishing a message with ``headers`` needs :func:`publish_span` at all: they
    carry a trace context, or an SDK is installed. The relay calls its sink directly otherwise."""
    return "traceparent" in headers or _tracer() is not None


@contextlib.contextmanager
def publish_span(
    headers: Mapping[str, Any], *, outbox_id: str, topic: str, message_id: str, attempt: int
) -> Iterator[None]:
    """The relay's span around one sink call, a child of the trace context the message's
    headers carry (K7); no span and no context change without an SDK and without a context."""
    carrier = {name: headers[name] for name in TRACE_HEADERS if name in headers}
    tracer = _tracer()
    if tracer is None:
        if not carrier:
            yield
            return
        token = otel_context.attach(_parent(carrier))
        try:
            yield
        finally:
            otel_context.detach(token)
        return
    with tracer.start_as_current_span(
        f"publish {topic}",
        context=_parent(carrier),
        kind=SpanKind.PRODUCER,
        attributes={
            "ship.outbox.id": outbox_id,
            "ship.outbox.topic": topic,
            "ship.outbox.message_id": message_id,
            "ship.outbox.attempt": attempt,
        },
    ):
        yield
