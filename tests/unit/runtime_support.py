"""Helpers for the runtime's unit tests: a scriptable wrapper around the in-memory backend."""

from __future__ import annotations

from typing import Any

import anyio

from ship_sqla.kernel import InMemoryJobBackend


class ScriptedBackend:
    """Delegates to an in-memory backend and records every spied call. ``answers[name]``
    replaces a method's answer (a plain function of the call's arguments); ``raise_once[name]``
    makes the next call of ``name`` raise."""

    def __init__(self, inner: InMemoryJobBackend) -> None:
        self.inner = inner
        self.calls: dict[str, list[Any]] = {}
        self.raise_once: dict[str, Exception] = {}
        self.answers: dict[str, Any] = {}
        self._changed = anyio.Event()

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

    def report_error(self, error: BaseException) -> None:
        self.inner.report_error(error)

    async def wait_calls(self, name: str, count: int, *, limit: float = 10.0) -> None:
        with anyio.fail_after(limit):
            while len(self.calls.get(name, ())) < count:
                await self._changed.wait()

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        error = self.raise_once.pop(name, None)
        if error is None:
            answer = self.answers.get(name)
            if answer is not None:
                result = answer(*args, **kwargs)
            else:
                result = await getattr(self.inner, name)(*args, **kwargs)
        self.calls.setdefault(name, []).append((args, kwargs, error or result))
        self._changed.set()
        self._changed = anyio.Event()
        if error is not None:
            raise error
        return result

    async def claim(self, job: Any, **kwargs: Any) -> Any:
        return await self._call("claim", job, **kwargs)

    async def queue_depths(self, job_ids: Any) -> Any:
        return await self._call("queue_depths", list(job_ids))

    async def heartbeat(self, runs: Any) -> Any:
        return await self._call("heartbeat", list(runs))

    async def complete(self, runs: Any) -> Any:
        return await self._call("complete", list(runs))

    async def fail(self, run: Any, error: str, *, retry_at: Any) -> Any:
        return await self._call("fail", run, error, retry_at=retry_at)

    async def release(self, run: Any, *, run_at: Any, error: str | None = None) -> Any:
        return await self._call("release", run, run_at=run_at, error=error)
