"""OpenTelemetry's GLOBAL meter provider for one test, with every global put back afterwards.

Metrics are on by default (J10): a backend or runtime given no ``meter_provider`` records
through ``opentelemetry.metrics.get_meter_provider()``. Testing that means installing an SDK
provider globally, which the API allows once per process (``set_meter_provider``). So, like
opentelemetry-python's own test utilities (``opentelemetry.test.globals_test.
reset_metrics_globals``), this resets the API's three module globals to a fresh, unset state for
the test and restores the saved ones after it, together with ship_sqla's process-wide default
``JobMetrics`` (which is bound to whatever global provider it first saw).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

from opentelemetry import metrics
from opentelemetry.metrics import _internal as otel_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.util._once import Once

from ship_sqla.kernel import _metrics

if TYPE_CHECKING:
    from collections.abc import Iterator

    from opentelemetry.sdk.metrics.export import Metric


class GlobalMeter:
    """The test's global-provider state: unset until :meth:`install` (the documented
    ``metrics.set_meter_provider``) puts an SDK provider with an in-memory reader in place."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.provider: MeterProvider | None = None

    def install(self) -> InMemoryMetricReader:
        self.provider = MeterProvider(metric_readers=[self.reader], shutdown_on_exit=False)
        metrics.set_meter_provider(self.provider)
        return self.reader

    def collect(self) -> dict[str, Metric]:
        """Every metric the reader holds now, by name (empty when nothing was recorded)."""
        data = self.reader.get_metrics_data()
        if data is None:
            return {}
        return {
            metric.name: metric
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }


@contextmanager
def global_meter() -> Iterator[GlobalMeter]:
    """A fresh, unset global meter provider for the ``with`` block; the saved one after it."""
    saved = (
        otel_metrics._METER_PROVIDER,
        otel_metrics._METER_PROVIDER_SET_ONCE,
        otel_metrics._PROXY_METER_PROVIDER,
        _metrics._global_default,
    )
    otel_metrics._METER_PROVIDER = None
    otel_metrics._METER_PROVIDER_SET_ONCE = Once()
    otel_metrics._PROXY_METER_PROVIDER = otel_metrics._ProxyMeterProvider()
    _metrics._global_default = None
    state = GlobalMeter()
    try:
        yield state
    finally:
        if state.provider is not None:
            state.provider.shutdown()
        (
            otel_metrics._METER_PROVIDER,
            otel_metrics._METER_PROVIDER_SET_ONCE,
            otel_metrics._PROXY_METER_PROVIDER,
            _metrics._global_default,
        ) = saved
