"""The options every job backend takes, validated in one place, and the ``JobBackend``
properties and ``report_error`` over them (the in-memory and PostgreSQL backends share these).

Both backends also carry ``metrics``, the :class:`JobMetrics` a runtime on them records through
(J10): the ``meter_provider``'s, or OpenTelemetry's global provider's when none is given."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ship_sqla.kernel._clock import Clock, SystemClock
from ship_sqla.kernel._durations import MAX_POLL_INTERVAL, require_duration
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._metrics import JobMetrics, job_metrics_for
from ship_sqla.kernel._on_error import deliver_error

if TYPE_CHECKING:
    from ship_sqla.kernel._on_error import ErrorHandler
    from ship_sqla.kernel._ports import LockProvider

__all__ = ["BackendOptions"]

logger = logging.getLogger("ship_sqla.jobs")


class BackendOptions:
    """Base of the job backends: call :meth:`_set_options` first thing in ``__init__``."""

    _clock: Clock
    _lock_provider: LockProvider | None
    _poll_interval: float
    _queue_depth_limit: int | None
    _max_in_flight: int
    _on_error: ErrorHandler | None
    _meter_provider: Any
    metrics: JobMetrics
    """J10: where a runtime on this backend records, unless ``start_job_runtime`` got others."""

    def _set_options(
        self,
        *,
        clock: Clock | None,
        lock_provider: LockProvider | None,
        poll_interval: float,
        queue_depth_limit: int | None,
        max_in_flight: int,
        on_error: ErrorHandler | None,
        meter_provider: Any = None,  # noqa: ANN401 - an OpenTelemetry MeterProvider
    ) -> None:
        poll = require_duration(poll_interval, "poll_interval", maximum=MAX_POLL_INTERVAL)
        if queue_depth_limit is not None and queue_depth_limit < 1:
            raise ConfigurationError(
                f"queue_depth_limit must be at least 1, got {queue_depth_limit!r}.",
                fix="pass None for no limit.",
            )
        if max_in_flight < 1:
            raise ConfigurationError(f"max_in_flight must be at least 1, got {max_in_flight!r}.")
        self._clock = clock if clock is not None else SystemClock()
        self._lock_provider = lock_provider
        self._poll_interval = poll
        self._queue_depth_limit = queue_depth_limit
        self._max_in_flight = max_in_flight
        self._on_error = on_error
        self._meter_provider = meter_provider
        self.metrics = job_metrics_for(meter_provider)

    @property
    def meter_provider(self) -> Any:  # noqa: ANN401 - an OpenTelemetry MeterProvider or None
        """The provider given; None: OpenTelemetry's global one."""
        return self._meter_provider

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def lock_provider(self) -> LockProvider | None:
        return self._lock_provider

    @property
    def poll_interval(self) -> float:
        return self._poll_interval

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    @property
    def queue_depth_limit(self) -> int | None:
        return self._queue_depth_limit

    def report_error(self, error: BaseException) -> None:
        """Pass ``error`` to ``on_error`` (or log it when none is set). Never raises (J11)."""
        deliver_error(self._on_error, error, source="job runtime", log=logger)
