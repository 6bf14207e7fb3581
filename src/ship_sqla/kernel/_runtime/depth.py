"""J10's queue gauges: a worker runtime with metrics samples its jobs' queues from the backend.

The gauges are observed by the OpenTelemetry SDK's reader thread, which cannot run a query, so
the runtime refreshes :class:`JobMetrics`'s snapshot every ``DEPTH_SAMPLE_INTERVAL`` seconds
instead. Each worker process samples (and reports) the same database-wide values: dashboards
aggregate them with ``max``.

A sample costs one index entry read per waiting run (about 0.23 s at a million waiting runs), so
it is taken only once a metric reader has collected the gauges: metrics are on by default (the
global provider), but a process without an SDK, or whose SDK drops these instruments, never
queries its queues. The first sample follows the first collection within one interval; from then
on one per interval. With a backend that is not a :class:`QueueDepthSource`, or with
``queue_sample_interval=None``, nothing is ever sampled.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

from ship_sqla.kernel._waiting import wait_event

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._metrics import JobMetrics
    from ship_sqla.kernel._ports import QueueDepthSource

__all__ = ["DEPTH_SAMPLE_INTERVAL", "DepthSampler"]

DEPTH_SAMPLE_INTERVAL: Final = 15.0
"""Seconds between samples: a metrics exporter's usual period, and one count per job's waiting
runs (an index-only scan of ``<runs>_due_idx``) at most this often per worker process."""


class DepthSampler:
    """Samples ``job_ids``' queues into ``metrics`` every ``interval`` seconds of ``clock`` once
    the gauges were collected (:attr:`JobMetrics.gauges_collected`), until :meth:`close`. A
    failed sample goes to ``report_error`` (J11) and the previous snapshot stays until the next
    one succeeds. Only these jobs' gauges are replaced (a process's runtimes share one
    :class:`JobMetrics`); at close they stop being reported."""

    def __init__(
        self,
        source: QueueDepthSource,
        metrics: JobMetrics,
        job_ids: Sequence[str],
        *,
        clock: Clock,
        report_error: Callable[[BaseException], None],
        interval: float = DEPTH_SAMPLE_INTERVAL,
    ) -> None:
        self._source = source
        self._metrics = metrics
        self._job_ids = tuple(job_ids)
        self._clock = clock
        self._report_error = report_error
        self._interval = interval
        self._closing = asyncio.Event()

    async def sample(self) -> None:
        """Query the queues once and replace these jobs' gauges."""
        depths = await self._source.queue_depths(self._job_ids)
        self._metrics.update_depths(
            {job_id: (queue.depth, queue.oldest_due_age) for job_id, queue in depths.items()}
        )

    async def run(self) -> None:
        try:
            while not self._closing.is_set():
                if self._metrics.gauges_collected:
                    try:
                        await self.sample()
                    except Exception as exc:  # noqa: BLE001 - J11: reported; the next retries
                        self._report_error(exc)
                await wait_event(self._closing, self._clock, self._interval)
        finally:
            for job_id in self._job_ids:
                self._metrics.forget_depth(job_id)

    def close(self) -> None:
        self._closing.set()
