"""Helpers shared by the job backend conformance tests (imported by the test modules). The
runtime's recording spy is tests/support/spy_backend.py."""

from __future__ import annotations

from typing import Any, Protocol

from ship_sqla.kernel import JobBackend
from ship_sqla.testing import FrozenClock

JOB_LEASE = 30.0


class BackendFactory(Protocol):
    """Builds a fresh backend on a clean store. Every backend of one test shares that store."""

    def __call__(
        self,
        clock: FrozenClock,
        *,
        queue_depth_limit: int | None = None,
        max_in_flight: int = 100,
        poll_interval: float = 1.0,
        on_error: Any = None,
        with_locks: bool = False,
    ) -> JobBackend: ...
