"""One producer process of the trickle and flood figures (``benchmarks/_trickle.py``).

``python -m benchmarks._producer URL DSN``: ``URL`` is the SQLAlchemy (``postgresql+asyncpg``) URL
of the benchmark's database, ``DSN`` the same database for plain asyncpg. The process makes its
engine and a job backend at its defaults but ``listen=False`` (it enqueues; it runs nothing but
the children of the workflow figures), prints one JSON line ``{"ready": ...}`` and then answers
one JSON line per command line on its stdin. Times are ``time.monotonic()``: Linux's
CLOCK_MONOTONIC is one clock for every process of the machine, so the parent subtracts them from
its own. At EOF on stdin it stops what it runs, closes its connections and exits (status 0).

Commands (``{"cmd": ..., ...}``):

- ``trickle``: ``count`` enqueues numbered ``first``, ``first + 1``, ... on a FIXED schedule:
  enqueue ``i`` starts at ``start_at + i * spacing`` (absolute deadlines: an enqueue that takes
  longer than the spacing does not delay the next one, each runs in a task of its own). What one
  enqueue is (``mode``):

  - ``ship``: ``await backend.enqueue(job, {"n": n})`` outside any unit of work (one
    autocommitted statement, announced as the library decides);
  - ``raw``: the floor: one autocommitted asyncpg statement that INSERTs the row into
    ``raw_table`` and ``pg_notify(channel, n)`` (one transaction, one round trip);
  - ``outbox``: ``await outbox.enqueue(outbox_id, "bench", {"n": n})`` outside any unit of
    work (``create_outbox`` at its defaults);
  - ``event``: ``await backend.publish_event(event, None, key=str(n))`` outside any unit of
    work (a workflow run waits for it);
  - ``pgq``: pgqueuer's ``Queries(AsyncpgPoolDriver(pool)).enqueue(job_id, b'{"n": n}')``.

  Answer: ``{"commits": [[n, t], ...], "late": s, "errors": [...]}``: ``t`` is read right after
  the awaited enqueue returned (its commit), ``late`` the most an enqueue started after its
  deadline.
- ``flood``: ``tasks`` concurrent loops of ``await backend.enqueue(job, {})`` (each its own
  autocommitted statement) from ``start_at`` until ``end_at``; ``announce`` false enqueues
  through a second backend whose announcements are off (``create_job_backend(...,
  announce=False)``, or, where that keyword does not exist yet, its throttle removed). Answer:
  ``{"count": enqueues committed in the window, "errors": [...]}``.
- ``children``: (re)start the child figure: a runtime here (``create_job_backend`` at its
  defaults, listening) executes ``job_id``, whose handler waits for ``release``; answers
  ``{"arrived": k}`` once ``expect`` children wait (or after 30 s with fewer).
- ``rest``: stop the children's runtime and close every connection this process holds (its
  pools open again when a later command needs them); answers ``{"rested": true}``. Before a
  phase that starts many more producers: the server's ``max_connections`` is shared by all.
- ``release``: the waiting children finish on the fixed schedule (slot ``i`` of the payload at
  ``start_at + i * spacing``); answers ``{"commits": [[n, t], ...], "source": ...}`` once each
  child's completion committed: ``t`` is read when its settle statement has returned (the
  backend's parent wake, ``_wake_parents``, is entered right after that commit), or, where the
  backend has no such method, when the handler returned (``"source": "handler"``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import sys
import time
from typing import TYPE_CHECKING, Any, cast

import asyncpg
from sqlalchemy.ext.asyncio import create_async_engine

from benchmarks._raw_sql import job_sql
from ship_sqla import JobContext, create_outbox, define_job, start_job_runtime
from ship_sqla._jobs import create_job_backend
from ship_sqla.kernel._plans.announce import AnnouncePlan

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sqlalchemy.ext.asyncio import AsyncEngine

    from ship_sqla._jobs._backend import PostgresJobBackend
    from ship_sqla._outbox import Outbox
    from ship_sqla.jobs import JobDefinition, JobRuntime

__all__ = ["main"]

POOL = 5
"""Connections of each pool here (SQLAlchemy's default pool size, no overflow): a producer that
cannot keep its schedule queues its enqueues for a connection instead of opening ever more (16
producers must stay under the server's max_connections)."""
WAIT_LIMIT = 30.0
"""Seconds a command may wait for what it needs (children arriving, settles landing)."""


async def _nothing(_ctx: JobContext, _payload: dict[str, Any]) -> None:
    return None


def _announce_off_backend(engine: AsyncEngine) -> tuple[PostgresJobBackend, str]:
    """A backend whose enqueues never announce, and how that was done."""
    if "announce" in inspect.signature(create_job_backend).parameters:
        backend = create_job_backend(database=engine, listen=False, announce=False)  # type: ignore[call-arg,unused-ignore]
        return backend, "announce=False"
    backend = create_job_backend(database=engine, listen=False)
    # Before announce= existed the only switch: no throttle, no announcement.
    cast("Any", backend)._throttle = None  # noqa: SLF001
    return backend, "_throttle=None"


class _Children:
    """The child runs of the workflow figure, executed here."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.runtime: JobRuntime | None = None
        self.source = "handler"
        self.expect = 0
        self.parents: dict[str, int] = {}
        self.arrived: set[int] = set()
        self.settled: dict[int, float] = {}
        self.ended: dict[int, float] = {}
        self.go = asyncio.Event()
        self.start_at = 0.0
        self.spacing = 0.0
        self.changed = asyncio.Event()

    def _signal(self) -> None:
        self.changed.set()

    async def _until(self, done: Callable[[], bool]) -> bool:
        try:
            async with asyncio.timeout(WAIT_LIMIT):
                while not done():
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            return False
        return True

    async def child(self, _ctx: JobContext, payload: dict[str, Any]) -> None:
        n = int(payload["n"])
        self.parents[str(payload["parent"])] = n
        self.arrived.add(n)
        self._signal()
        go = self.go
        await go.wait()
        delay = self.start_at + int(payload["slot"]) * self.spacing - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        self.ended[n] = time.monotonic()
        self._signal()

    async def start(self, job_id: str, expect: int) -> dict[str, Any]:
        self.go.set()  # a previous round's stragglers finish
        self.go = asyncio.Event()
        self.expect = expect
        self.arrived.clear()
        self.settled.clear()
        self.ended.clear()
        self.parents.clear()
        if self.runtime is None:
            backend = create_job_backend(database=self.engine)
            original = getattr(backend, "_wake_parents", None)
            if original is not None:
                self.source = "settle"

                async def wake_parents(parent_ids: Any) -> None:  # noqa: ANN401 - as the backend's
                    at = time.monotonic()
                    parent_ids = list(parent_ids)
                    for parent in parent_ids:
                        n = self.parents.get(parent)
                        if n is not None:
                            self.settled.setdefault(n, at)
                    self._signal()
                    await original(parent_ids)

                backend._wake_parents = wake_parents  # type: ignore[method-assign]  # noqa: SLF001
            job: JobDefinition[dict[str, Any]] = define_job(job_id, self.child, payload=dict)
            self.runtime = await start_job_runtime(job, backend=backend)
        await self._until(lambda: len(self.arrived) >= self.expect)
        return {"arrived": len(self.arrived)}

    async def release(self, spacing: float, start_at: float) -> dict[str, Any]:
        self.spacing = spacing
        self.start_at = start_at
        self.go.set()
        landed = self.settled if self.source == "settle" else self.ended
        await self._until(lambda: len(landed) >= len(self.arrived))
        return {"commits": sorted(landed.items()), "source": self.source}

    async def stop(self) -> None:
        self.go.set()
        if self.runtime is not None:
            await self.runtime.stop()
            self.runtime = None


class _CountingPlan(AnnouncePlan):
    """The library's announce rule, counting its notifying commits: a fold (the enqueue's own
    transaction notified) or a send (one notify-only transaction, however many keys)."""

    __slots__ = ("notifying_commits",)

    def __init__(self) -> None:
        super().__init__()
        self.notifying_commits = 0

    def fold(self, now: float) -> bool:
        folded = super().fold(now)
        self.notifying_commits += folded
        return folded

    def take(self, now: float) -> tuple[str, ...]:
        self.notifying_commits += 1
        return super().take(now)


class _Producer:
    def __init__(self, url: str, dsn: str) -> None:
        self.dsn = dsn
        self.engine = create_async_engine(url, pool_size=POOL, max_overflow=0)
        self.backend = create_job_backend(database=self.engine, listen=False)
        self.plan = _CountingPlan()
        if self.backend._announcer is not None:  # noqa: SLF001 - counted, not changed
            self.backend._announcer.plan = self.plan  # noqa: SLF001
        self.silent, self.silenced_by = _announce_off_backend(self.engine)
        self.jobs: dict[str, JobDefinition[dict[str, Any]]] = {}
        self.pool: asyncpg.Pool | None = None
        self.outbox: Outbox | None = None
        self.pgq: Any = None
        self.pgq_pool: asyncpg.Pool | None = None
        self.children = _Children(self.engine)

    def job(self, job_id: str) -> JobDefinition[dict[str, Any]]:
        if job_id not in self.jobs:
            self.jobs[job_id] = define_job(job_id, _nothing, payload=dict)
        return self.jobs[job_id]

    async def _raw_pool(self) -> asyncpg.Pool:
        if self.pool is None:
            self.pool = await asyncpg.create_pool(self.dsn, min_size=2, max_size=POOL)
        return self.pool

    async def enqueuer(self, spec: dict[str, Any]) -> Callable[[int], Awaitable[object]]:
        """What one enqueue of ``n`` is in ``spec``'s mode (see the module docstring)."""
        mode = spec["mode"]
        if mode == "ship":
            backend, job = self.backend, self.job(spec["job_id"])
            return lambda n: backend.enqueue(job, {"n": n})
        if mode == "raw":
            pool = await self._raw_pool()
            insert = job_sql(spec["raw_table"]).insert_one.strip()
            statement = f"WITH raw_enqueued AS ({insert}) SELECT pg_notify($4, $5)"
            job_id, channel = spec["job_id"], spec["channel"]

            async def raw(n: int) -> None:
                payload = json.dumps({"n": n})
                await pool.execute(statement, f"raw-{n:012d}", job_id, payload, channel, str(n))

            return raw
        if mode == "outbox":
            if self.outbox is None:
                self.outbox = create_outbox(database=self.engine)
            outbox, outbox_id = self.outbox, spec["outbox_id"]
            return lambda n: outbox.enqueue(outbox_id, "bench", {"n": n})
        if mode == "event":
            backend, event = self.backend, spec["event"]
            return lambda n: backend.publish_event(event, None, key=str(n))
        if mode == "pgq":
            if self.pgq is None:
                from pgqueuer.db import AsyncpgPoolDriver  # noqa: PLC0415 - optional peer
                from pgqueuer.queries import Queries  # noqa: PLC0415 - optional peer

                self.pgq_pool = await asyncpg.create_pool(self.dsn, min_size=2, max_size=POOL)
                self.pgq = Queries(AsyncpgPoolDriver(self.pgq_pool))
            queries, entrypoint = self.pgq, spec["job_id"]
            return lambda n: queries.enqueue(entrypoint, json.dumps({"n": n}).encode())
        raise ValueError(f"unknown trickle mode {mode!r}")

    async def trickle(self, spec: dict[str, Any]) -> dict[str, Any]:
        enqueue = await self.enqueuer(spec)
        first, count = int(spec["first"]), int(spec["count"])
        spacing, start_at = float(spec["spacing"]), float(spec["start_at"])
        commits: list[tuple[int, float]] = []
        errors: list[str] = []

        async def one(n: int) -> None:
            try:
                await enqueue(n)
            except Exception as exc:  # noqa: BLE001 - reported to the parent, which refuses the round
                errors.append(f"{type(exc).__name__}: {exc}")
                return
            commits.append((n, time.monotonic()))

        tasks: list[asyncio.Task[None]] = []
        late = 0.0
        for index in range(count):
            deadline = start_at + index * spacing
            delay = deadline - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            late = max(late, time.monotonic() - deadline)
            tasks.append(asyncio.create_task(one(first + index)))
        await asyncio.gather(*tasks)
        return {"commits": commits, "late": late, "errors": errors[:5]}

    async def flood(self, spec: dict[str, Any]) -> dict[str, Any]:
        backend = self.backend if spec["announce"] else self.silent
        job = self.job(spec["job_id"])
        start_at, end_at = float(spec["start_at"]), float(spec["end_at"])
        counted = 0
        errors: list[str] = []

        async def loop() -> None:
            nonlocal counted
            delay = start_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            while time.monotonic() < end_at:
                try:
                    await backend.enqueue(job, {})
                except Exception as exc:  # noqa: BLE001 - reported to the parent
                    errors.append(f"{type(exc).__name__}: {exc}")
                    return
                if time.monotonic() < end_at:
                    counted += 1

        notifying = self.plan.notifying_commits
        await asyncio.gather(*(loop() for _ in range(int(spec["tasks"]))))
        notifying = self.plan.notifying_commits - notifying
        return {"count": counted, "notifying_commits": notifying, "errors": errors[:5]}

    async def answer(self, spec: dict[str, Any]) -> dict[str, Any]:
        command = spec["cmd"]
        if command == "trickle":
            return await self.trickle(spec)
        if command == "flood":
            return await self.flood(spec)
        if command == "children":
            return await self.children.start(spec["job_id"], int(spec["expect"]))
        if command == "release":
            return await self.children.release(float(spec["spacing"]), float(spec["start_at"]))
        if command == "rest":
            await self.close()
            return {"rested": True}
        raise ValueError(f"unknown command {command!r}")

    async def close(self) -> None:
        """Stop the children's runtime, close the pools and dispose of the engine's (which
        opens a new one when used again)."""
        await self.children.stop()
        pools = (self.pool, self.pgq_pool)
        self.pool = self.pgq_pool = None
        self.pgq = None
        for pool in pools:
            if pool is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pool.close(), 10)
        await self.engine.dispose()


def _say(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


async def _run(url: str, dsn: str) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    producer = _Producer(url, dsn)
    try:
        _say({"ready": True, "silenced_by": producer.silenced_by})
        while line := (await reader.readline()).strip():
            try:
                _say(await producer.answer(json.loads(line)))
            except Exception as exc:  # noqa: BLE001 - the parent reports it and stops the benchmark
                _say({"failed": f"{type(exc).__name__}: {exc}"})
    finally:
        await producer.close()


def main() -> None:
    asyncio.run(_run(sys.argv[1], sys.argv[2]))


if __name__ == "__main__":
    main()
