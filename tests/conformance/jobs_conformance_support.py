"""Helpers shared by the job backend conformance tests (imported by the test modules)."""

from __future__ import annotations

from typing import Any, Protocol

import anyio

from ship_sqla.kernel import FrozenClock, JobBackend

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


class SpyBackend:
    """Wraps a backend: records the runtime's calls (and signals them), and can make the next
    ``claim`` raise. Everything else is the wrapped backend's own behaviour."""

    SPIED = ("claim", "heartbeat", "complete", "fail", "release")

    def __init__(self, inner: JobBackend) -> None:
        self.inner = inner
        self.calls: dict[str, list[Any]] = {name: [] for name in self.SPIED}
        self.started: dict[str, int] = dict.fromkeys(self.SPIED, 0)
        self._called = anyio.Event()
        self.claim_error: Exception | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def clock(self) -> Any:
        return self.inner.clock

    @property
    def lock_provider(self) -> Any:
        return self.inner.lock_provider

    @property
    def poll_interval(self) -> float:
        return self.inner.poll_interval

    @property
    def max_in_flight(self) -> int:
        return self.inner.max_in_flight

    def _start(self, name: str) -> None:
        self.started[name] += 1
        self._called.set()
        self._called = anyio.Event()

    async def wait_started(self, name: str, count: int, *, limit: float = 10.0) -> None:
        """Until ``name`` was entered at least ``count`` times (its answer may be pending)."""
        with anyio.fail_after(limit):
            while self.started[name] < count:
                await self._called.wait()

    def _record(self, name: str, args: Any) -> None:
        self.calls[name].append(args)
        self._called.set()
        self._called = anyio.Event()

    async def wait_calls(self, name: str, count: int, *, limit: float = 10.0) -> None:
        """Until ``name`` was called at least ``count`` times (each call counts once)."""
        with anyio.fail_after(limit):
            while len(self.calls[name]) < count:
                await self._called.wait()

    async def claim(self, job: Any, **kwargs: Any) -> Any:
        if self.claim_error is not None:
            error, self.claim_error = self.claim_error, None
            self._record("claim", error)
            raise error
        claimed = await self.inner.claim(job, **kwargs)
        self._record("claim", claimed)
        return claimed

    async def heartbeat(self, runs: Any) -> Any:
        self._start("heartbeat")
        alive = await self.inner.heartbeat(runs)
        self._record("heartbeat", (list(runs), alive))
        return alive

    async def complete(self, runs: Any) -> Any:
        outcomes = await self.inner.complete(runs)
        self._record("complete", (list(runs), outcomes))
        return outcomes

    async def fail(self, run: Any, error: str, *, retry_at: Any) -> Any:
        outcome = await self.inner.fail(run, error, retry_at=retry_at)
        self._record("fail", (run, error, retry_at, outcome))
        return outcome

    async def release(self, run: Any, *, run_at: Any, error: str | None = None) -> Any:
        outcome = await self.inner.release(run, run_at=run_at, error=error)
        self._record("release", (run, run_at, error, outcome))
        return outcome
