"""Helpers shared by the job backend conformance tests (imported by the test modules). The
runtime's recording spy is tests/support/spy_backend.py."""

from __future__ import annotations

from typing import Any, Protocol

from ship_sqla.kernel import InMemoryLockProvider, JobBackend, LockProvider
from ship_sqla.testing import FrozenClock

JOB_LEASE = 30.0


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
