"""OpenTelemetry's GLOBAL tracer provider for one test, with every global put back afterwards.

Run spans go to the global provider (K7), which the API lets a process set once
(``trace.set_tracer_provider``). So, like opentelemetry-python's own test utilities
(``opentelemetry.test.globals_test.reset_trace_globals``), this resets the API's two module
globals to an unset state for the test, installs an SDK provider exporting to memory, and
restores the saved globals after it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from ship_sqla.kernel._tracing import forget_tracer

if TYPE_CHECKING:
    from collections.abc import Iterator


@contextmanager
def global_tracer() -> Iterator[InMemorySpanExporter]:
    """An SDK tracer provider installed globally for the ``with`` block (spans kept in the
    exporter it yields); the saved global state after it."""
    saved = (trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE)
    trace._TRACER_PROVIDER = None
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    forget_tracer()
    try:
        yield exporter
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = saved
        forget_tracer()
