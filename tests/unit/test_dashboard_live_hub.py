"""The live overview's hub (issue 36 item 3) without a database: a short injected period, a
read that counts itself."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from ship_sqla._dashboard._live import LiveHub

PERIOD = 0.02


class Reads:
    def __init__(self) -> None:
        self.count = 0
        self.fail_next = False

    async def __call__(self) -> dict[str, Any]:
        self.count += 1
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("database gone")
        return {"n": self.count}


async def test_a_slow_client_holds_only_the_newest_snapshot_and_a_failed_read_goes_on() -> None:
    """A client that reads nothing while the hub reads many times holds one snapshot, the
    newest (no queue grows); every client shares the same readings; a failed read is a
    ``problem`` snapshot and the next period reads again; the hub stops with the last client."""
    reads = Reads()
    hub = LiveHub(reads, period=PERIOD)
    async with hub.watching(PERIOD) as slow, hub.watching(PERIOD) as fast:
        for _ in range(5):
            await asyncio.wait_for(fast.wake.wait(), 2)
            fast.wake.clear()
        assert slow.latest is not None
        assert slow.latest == fast.latest  # one reading for both
        assert slow.latest.seq == reads.count == hub.readings
        reads.fail_next = True
        while fast.latest is None or fast.latest.event != "problem":
            await asyncio.wait_for(fast.wake.wait(), 2)
            fast.wake.clear()
        assert "server log" in fast.latest.data
        await asyncio.wait_for(fast.wake.wait(), 2)
        assert fast.latest.event == "overview"
    await asyncio.wait_for(hub.idle(), 2)
    assert not hub.running
    assert hub.watchers == 0


async def test_the_hub_reads_only_as_often_as_its_most_eager_client_needs() -> None:
    """A client asking every 10 periods alone: the hub reads once per 10 periods, not each
    period (counted over the client's first three snapshots)."""
    reads = Reads()
    hub = LiveHub(reads, period=PERIOD)
    async with hub.watching(10 * PERIOD) as patient:
        for _ in range(3):
            await asyncio.wait_for(patient.wake.wait(), 2)
            patient.wake.clear()
        assert reads.count == 3
    await asyncio.wait_for(hub.idle(), 2)


REQUEST_STATE: contextvars.ContextVar[str | None] = contextvars.ContextVar("request", default=None)


async def test_the_hub_reads_outside_the_first_clients_request_context() -> None:
    """The hub's task does not inherit the context of the request that started it (an ambient
    transaction scope or tenant set by the application would apply to every client)."""
    seen: list[str | None] = []

    async def read() -> dict[str, Any]:
        seen.append(REQUEST_STATE.get())
        return {}

    hub = LiveHub(read, period=PERIOD)
    REQUEST_STATE.set("first client's")
    async with hub.watching(PERIOD) as watcher:
        await asyncio.wait_for(watcher.wake.wait(), 2)
    await asyncio.wait_for(hub.idle(), 2)
    assert seen
    assert set(seen) == {None}
