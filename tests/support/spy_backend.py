"""The one recording spy of the job runtime's tests (unit and conformance): it wraps any job
backend, records every storage-port call the runtime makes in one shape (:class:`Call`), and
can script answers, one-off failures, outages and gates. Everything it does not spy on is the
wrapped backend's own behaviour.

``tests/support`` is on pytest's ``pythonpath`` (pyproject.toml), so tests import this module
by its name.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import anyio
import attrs

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from ship_sqla.kernel import JobBackend
    from ship_sqla.kernel._ports import ClaimedRun, ClaimRequest
    from ship_sqla.kernel._settlement import SettleRequest

SPIED = ("claim", "heartbeat", "settle", "queue_depths", "fence", "settle_within")
"""The port methods the spy records: the runtime's calls to its RunStore and QueueDepthSource,
and a transactional handler's fence and completion (J13: ``settle_within`` answers one outcome
for one settlement)."""


@attrs.frozen
class Call:
    """One call of a spied port method: its positional arguments (sequences as lists), its
    answer or the exception it raised, and when it was made (the backend clock's monotonic)."""

    name: str
    args: tuple[Any, ...]
    result: Any
    at: float

    @property
    def failed(self) -> bool:
        return isinstance(self.result, BaseException)


class SpyBackend:
    """Wraps ``inner`` and records every call of :data:`SPIED` in ``calls[name]``.

    Scripting, each per method name: ``answers[name]`` replaces the wrapped call (a function of
    the call's arguments, sync or async); ``raise_once[name]`` makes the next call raise; while
    ``down`` is true, the methods named in ``outage`` raise ``ConnectionRefusedError`` (a
    database outage); :meth:`gate` makes calls wait for an event before going through.
    """

    def __init__(self, inner: JobBackend, *, outage: Iterable[str] = ()) -> None:
        self.inner = inner
        self.calls: dict[str, list[Call]] = {}
        self.started: dict[str, int] = {}
        self.answers: dict[str, Callable[..., Any]] = {}
        self.raise_once: dict[str, BaseException] = {}
        self.outage = frozenset(outage)
        self.down = False
        self._gates: dict[str, anyio.Event] = {}
        self._changed = anyio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    # JobBackend's properties, spelled out so the Protocol check never depends on __getattr__.
    @property
    def clock(self) -> Any:
        return self.inner.clock

    @property
    def default_lock_provider(self) -> Any:
        return self.inner.default_lock_provider

    def report_error(self, error: BaseException) -> None:
        self.inner.report_error(error)

    # --- the spied port methods ------------------------------------------------------------------

    async def claim(self, request: ClaimRequest) -> Any:
        return await self._call("claim", request)

    async def heartbeat(self, runs: Sequence[ClaimedRun]) -> Any:
        return await self._call("heartbeat", list(runs))

    async def settle(self, settlements: Sequence[SettleRequest]) -> Any:
        return await self._call("settle", list(settlements))

    async def queue_depths(self, job_ids: Sequence[str]) -> Any:
        return await self._call("queue_depths", list(job_ids))

    async def fence(self, run: ClaimedRun) -> Any:
        return await self._call("fence", run)

    async def settle_within(self, settlement: SettleRequest) -> Any:
        return await self._call("settle_within", settlement)

    # --- scripting -------------------------------------------------------------------------------

    def gate(self, name: str) -> anyio.Event:
        """Make calls of ``name`` wait until the returned event is set."""
        gate = self._gates[name] = anyio.Event()
        return gate

    async def _call(self, name: str, *args: Any) -> Any:
        self.started[name] = self.started.get(name, 0) + 1
        self._signal()
        at = self.inner.clock.monotonic()
        gate = self._gates.get(name)
        if gate is not None:
            await gate.wait()
        try:
            result = await self._answer(name, args)
        except Exception as exc:
            self._record(Call(name, args, exc, at))
            raise
        self._record(Call(name, args, result, at))
        return result

    async def _answer(self, name: str, args: tuple[Any, ...]) -> Any:
        error = self.raise_once.pop(name, None)
        if error is None and self.down and name in self.outage:
            error = ConnectionRefusedError(f"{name}: connection refused")
        if error is not None:
            raise error
        answer = self.answers.get(name)
        result = answer(*args) if answer is not None else getattr(self.inner, name)(*args)
        return await result if inspect.isawaitable(result) else result

    def _record(self, call: Call) -> None:
        self.calls.setdefault(call.name, []).append(call)
        self._signal()

    def _signal(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    # --- reading what happened -------------------------------------------------------------------

    def answered(self, name: str) -> list[Call]:
        """The calls of ``name`` that answered (did not raise)."""
        return [call for call in self.calls.get(name, ()) if not call.failed]

    def settle_batches(self, kind: str | None = None) -> list[list[tuple[Any, str]]]:
        """Per answered ``settle`` call holding settlements of ``kind`` (None: any; else the
        first word of the settlement's ``label``: "complete", "fail", "release", "snooze",
        "cancel", "suspend"), those settlements with their outcomes, in order."""
        batches = []
        for call in self.answered("settle"):
            pairs = [
                (settlement, outcome)
                for settlement, outcome in zip(call.args[0], call.result, strict=True)
                if kind is None or settlement.label.split(" ", 1)[0] == kind
            ]
            if pairs:
                batches.append(pairs)
        return batches

    def settled(self, kind: str | None = None) -> list[tuple[Any, str]]:
        """Every answered settlement of ``kind`` (None: any) with its outcome, in order."""
        return [pair for batch in self.settle_batches(kind) for pair in batch]

    async def wait_calls(self, name: str, count: int, *, limit: float = 10.0) -> None:
        """Until ``name`` was called (answered or raised) at least ``count`` times."""
        await self._wait(lambda: len(self.calls.get(name, ())) >= count, limit)

    async def wait_for(self, done: Callable[[], bool], *, limit: float = 10.0) -> None:
        """Until ``done()`` holds (checked after every call's entry and answer)."""
        await self._wait(done, limit)

    async def wait_idle(self, *, limit: float = 10.0) -> None:
        """Until every call that was entered has answered (or raised): nothing in flight."""
        await self._wait(
            lambda: sum(self.started.values()) <= sum(map(len, self.calls.values())), limit
        )

    async def wait_started(self, name: str, count: int, *, limit: float = 10.0) -> None:
        """Until ``name`` was entered at least ``count`` times (its answer may be pending)."""
        await self._wait(lambda: self.started.get(name, 0) >= count, limit)

    async def wait_settled(self, kind: str | None, count: int, *, limit: float = 10.0) -> None:
        """Until at least ``count`` settlements of ``kind`` (None: any) were answered."""
        await self._wait(lambda: len(self.settled(kind)) >= count, limit)

    async def _wait(self, done: Callable[[], bool], limit: float) -> None:
        with anyio.fail_after(limit):
            while not done():
                await self._changed.wait()
