"""Helpers shared by the job backend conformance tests (imported by the test modules). The
runtime's recording spy is tests/support/spy_backend.py."""

from __future__ import annotations

import os
from typing import Any, Final, Protocol

from ship_sqla.kernel import InMemoryLockProvider, JobBackend, LockProvider
from ship_sqla.testing import FrozenClock

JOB_LEASE = 30.0

JOB_BACKENDS: Final = os.environ.get("SHIP_SQLA_CONFORMANCE_BACKENDS", "memory,postgres").split(",")
"""The job backends the conformance suite runs on: memory and postgres by default, both in
the default shape (J16: live runs only, ended runs in history); ``memory-inplace`` and
``postgres-inplace`` (the legacy shape: runs end in the runs table) on request.
test_job_backend_conformance.py runs on the in-place shapes too, always (INPLACE_BACKENDS)."""

INPLACE_BACKENDS: Final = ["memory-inplace", "postgres-inplace"]
"""The legacy in-place shape (no history table declared), kept under test by the core suite."""


class BackendFactory(Protocol):
    """Builds a fresh backend on a clean store. Every backend of one test shares that store."""

    def __call__(
        self,
        clock: FrozenClock,
        *,
        queue_depth_limit: int | None = None,
        on_error: Any = None,
    ) -> JobBackend: ...


def single_runner_locks(backend: JobBackend, clock: FrozenClock) -> LockProvider:
    """J4: the lock provider a runtime on ``backend`` takes single-runner locks from when given
    none (PostgreSQL: advisory locks on its engine), or, for a backend that has none (in
    memory), an :class:`InMemoryLockProvider` to start the runtime with."""
    default = backend.default_lock_provider
    return default if default is not None else InMemoryLockProvider(clock)
