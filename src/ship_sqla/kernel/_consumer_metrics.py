"""Consumer metrics (C3): each key's lag and last batch time, and the batches and items handled,
through the OpenTelemetry metrics API (the API only: a no-op until the application installs an
SDK).

- ``ship.consumer.lag``: observable gauge, ``{item}``: the key's last reported lag (``total -
  done`` in the application's unit; reported only by a consumer that declares ``lag``).
- ``ship.consumer.last_batch``: observable gauge, ``s``: when the key's last batch committed,
  in seconds since the Unix epoch (alert on ``time() - ship.consumer.last_batch``).
- ``ship.consumer.batches``: counter, ``{batch}``: batches committed.
- ``ship.consumer.items``: counter, ``{item}``: items committed.

Attributes: ``ship.job.id`` (the consumer's id, its per-key job's) and ``ship.job.key`` (the
key), as the job metrics (J10) name them. Each process reports the keys it consumed: a key
moves between workers, so aggregate the gauges with ``max`` (the newest ``last_batch`` wins).
The consumer records through the global provider: a consumer is a definition, and a runtime's
``meter_provider`` does not reach it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Final

from opentelemetry import metrics

from ship_sqla.kernel._metrics import ATTR_JOB_ID, ATTR_JOB_KEY, INSTRUMENTATION_SCOPE

if TYPE_CHECKING:
    from collections.abc import Iterable

    from opentelemetry.metrics import CallbackOptions

__all__ = ["CONSUMER_METRIC_NAMES", "ConsumerMetrics", "consumer_metrics"]

LAG: Final = "ship.consumer.lag"
LAST_BATCH: Final = "ship.consumer.last_batch"
BATCHES: Final = "ship.consumer.batches"
ITEMS: Final = "ship.consumer.items"

CONSUMER_METRIC_NAMES: Final = (LAG, LAST_BATCH, BATCHES, ITEMS)


class ConsumerMetrics:
    """The consumer instruments of one process (:func:`consumer_metrics`). Safe from any
    thread: the gauges' snapshot is replaced under a lock and read by the SDK's reader."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lags: dict[tuple[str, str], int] = {}
        self._last: dict[tuple[str, str], float] = {}
        meter = metrics.get_meter(INSTRUMENTATION_SCOPE)
        self._batches = meter.create_counter(
            BATCHES, unit="{batch}", description="Consumer batches committed, per key."
        )
        self._items = meter.create_counter(
            ITEMS, unit="{item}", description="Consumer items committed, per key."
        )
        meter.create_observable_gauge(
            LAG,
            callbacks=[self._observe_lag],
            unit="{item}",
            description="How far behind a consumer's key is (total - done), as last reported.",
        )
        meter.create_observable_gauge(
            LAST_BATCH,
            callbacks=[self._observe_last],
            unit="s",
            description="When a consumer key's last batch committed (Unix time).",
        )

    def record_batch(
        self, consumer_id: str, key: str, items: int, at_unix: float, lag: int | None
    ) -> None:
        """One batch of ``items`` committed at ``at_unix``; ``lag`` as reported after it (None:
        the consumer declares no ``lag``)."""
        attributes = {ATTR_JOB_ID: consumer_id, ATTR_JOB_KEY: key}
        self._batches.add(1, attributes)
        self._items.add(items, attributes)
        with self._lock:
            self._last[consumer_id, key] = at_unix
            if lag is not None:
                self._lags[consumer_id, key] = lag

    def _observe_lag(self, _options: CallbackOptions) -> Iterable[metrics.Observation]:
        with self._lock:
            lags = list(self._lags.items())
        return [
            metrics.Observation(lag, {ATTR_JOB_ID: consumer_id, ATTR_JOB_KEY: key})
            for (consumer_id, key), lag in lags
        ]

    def _observe_last(self, _options: CallbackOptions) -> Iterable[metrics.Observation]:
        with self._lock:
            last = list(self._last.items())
        return [
            metrics.Observation(at, {ATTR_JOB_ID: consumer_id, ATTR_JOB_KEY: key})
            for (consumer_id, key), at in last
        ]


_made_lock = threading.Lock()
_made: ConsumerMetrics | None = None


def consumer_metrics() -> ConsumerMetrics:
    """The process's one :class:`ConsumerMetrics` (on the global provider: the SDK answers a
    second observable gauge of one name with the first, so there is one instance)."""
    global _made  # noqa: PLW0603 - the process-wide instance, made on first use
    with _made_lock:
        if _made is None:
            _made = ConsumerMetrics()
        return _made
