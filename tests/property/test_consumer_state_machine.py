"""The consumer loop (SPEC §15 C1, C2) against a model stream, step by step, in memory.

Hypothesis appends items to one key's stream, re-arms the consumer (its supervisor's run), and
runs the key's loop (the per-key job's handler, on a claimed run, through the in-memory unit of
work and the in-memory backend's J13 fence) with at most one fault at a chosen batch: ``handle``
raises after writing its effects; ``cursor.save`` raises (a crash between handle and commit);
the COMMIT fails before it applies, or applies and its answer is lost; the fence finds the claim
stale (J14); or a drain begins after a chosen number of items taken (J12). After every step:

- the committed cursor and the applied items agree: the effects committed are exactly the
  stream's items up to the cursor, in order, each once (no item skipped, none applied twice);
- the cursor never moves backwards;
- every batch delivered starts right after the cursor committed when it was delivered, is
  contiguous and at most ``batch`` long: an item is delivered again only when the batch that
  held it did not commit;
- a run without a fault reads its stream to the end (or, drained, stops after the batch in
  hand); a re-arm leaves one live run per key.

Hypothesis has no async rules, so the sync rules drive the async code through one event loop
kept for the whole test (an anyio blocking portal).
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import attrs
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from job_helpers import claim_request

from ship_sqla import JobContext, define_job
from ship_sqla.consumers import define_consumer
from ship_sqla.errors import JobLeaseStaleError
from ship_sqla.kernel import InMemoryJobBackend, InMemoryUnitOfWork
from ship_sqla.kernel._browse import RunQuery
from ship_sqla.kernel._memory.transactions import InMemoryCommitError, InMemoryTransaction
from ship_sqla.testing import FrozenClock

LARGE = os.environ.get("SHIP_SQLA_HYPOTHESIS_PROFILE") == "large"
BATCH = 3
FAULTS = ("handle", "save", "commit-before", "commit-after", "stale")


class SaveFailedError(RuntimeError):
    pass


class HandleFailedError(RuntimeError):
    pass


@attrs.define
class Tables:
    """The application's committed rows: effect rows (item ids) and the key's cursor."""

    effects: list[int] = attrs.Factory(list)
    cursor: int | None = None


class Repositories:
    def __init__(self, tables: Tables, tx: InMemoryTransaction) -> None:
        self.tables = tables
        self.tx = tx

    def add_effect(self, item: int) -> None:
        effects = self.tables.effects
        effects.append(item)
        self.tx.on_rollback(lambda: effects.remove(item))

    def save_cursor(self, cursor: int) -> None:
        tables = self.tables
        before, tables.cursor = tables.cursor, cursor

        def undo() -> None:
            tables.cursor = before

        self.tx.on_rollback(undo)


class FencingBackend:
    """The in-memory backend, its fence answering "stale" from a chosen call on (J14)."""

    def __init__(self, inner: InMemoryJobBackend) -> None:
        self.inner = inner
        self.stale_from: int | None = None
        self.fences = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def fence(self, run: Any) -> Any:
        self.fences += 1
        if self.stale_from is not None and self.fences >= self.stale_from:
            return "stale"
        return await self.inner.fence(run)


class ConsumerLoop(RuleBasedStateMachine):
    portal: ClassVar[BlockingPortal]

    def __init__(self) -> None:
        super().__init__()
        self.clock = FrozenClock()
        self.backend = InMemoryJobBackend(clock=self.clock)
        self.tables = Tables()
        self.uow: InMemoryUnitOfWork[Repositories] = InMemoryUnitOfWork(
            lambda tx: Repositories(self.tables, tx)
        )
        self.stream: list[int] = []
        self.delivered: list[tuple[int, list[int]]] = []  # (cursor when delivered, item ids)
        self.last_cursor = 0
        self.fault: str | None = None
        self.fault_at = 0
        self.drain_after: int | None = None
        self.handled = 0
        self.saved = 0
        self.ctx: JobContext[Any] | None = None
        self.consumer = self._declare()

        async def noop(ctx: Any, payload: Any) -> None:
            pass

        self.holder = define_job("machine.holder", noop, payload=dict)

    def _declare(self) -> Any:
        machine = self

        async def keys(ctx: Any) -> list[str]:
            return ["k"]

        async def open_stream(ctx: Any, key: str, cursor: int | None) -> Any:
            taken = 0
            for item in list(machine.stream):
                if cursor is not None and item <= cursor:
                    continue
                if machine.drain_after is not None and taken >= machine.drain_after:
                    ctx.cancellation.draining = True
                taken += 1
                yield item

        async def handle(ctx: Any, key: str, items: list[int], repositories: Any) -> int:
            machine.handled += 1
            machine.delivered.append((machine.tables.cursor or 0, list(items)))
            for item in items:
                repositories.add_effect(item)
            if machine.fault is not None and machine.handled == machine.fault_at:
                if machine.fault == "handle":
                    raise HandleFailedError("handle failed after its writes")
                if machine.fault == "commit-before":
                    machine.uow.commit_fault = "before"
                if machine.fault == "commit-after":
                    machine.uow.commit_fault = "after"
            return items[-1]

        class Cursors:
            async def load(self, key: str, repositories: Any) -> int | None:
                assert key == "k"
                return repositories.tables.cursor  # type: ignore[no-any-return]

            async def save(self, key: str, cursor: int, repositories: Any) -> None:
                assert key == "k"
                machine.saved += 1
                if machine.fault == "save" and machine.handled == machine.fault_at:
                    raise SaveFailedError("crashed between handle and commit")
                repositories.save_cursor(cursor)

        return define_consumer(
            "machine.consumer",
            keys=keys,
            open=open_stream,
            handle=handle,
            cursor=Cursors(),
            transaction=self.uow,
            batch=BATCH,
        )

    def _await(self, fn: Any, *args: Any) -> Any:
        return self.portal.call(fn, *args)

    @rule(count=st.integers(min_value=1, max_value=7))
    def append(self, count: int) -> None:
        start = len(self.stream)
        self.stream.extend(range(start + 1, start + count + 1))

    @rule()
    def rearm(self) -> None:
        """C2: the supervisor's run enqueues the key's run once; a live run is deduplicated."""

        async def arm() -> list[Any]:
            await self.backend.enqueue(self.consumer.supervisor, {})
            [run] = await self.backend.claim(claim_request(self.consumer.supervisor, worker="s"))
            ctx: JobContext[Any] = JobContext.standalone(run)
            ctx.bind_backend(self.backend)
            await self.consumer.supervisor.handler(ctx, {})
            query = RunQuery(state="waiting", limit=10, job_id=self.consumer.id)
            return await self.backend.admin.list_runs(query, max_jobs=1)

        waiting = self._await(arm)
        assert [browsed.record.key for browsed in waiting] == ["k"]

    @rule(
        fault=st.none() | st.sampled_from(FAULTS),
        fault_at=st.integers(min_value=1, max_value=4),
        drain_after=st.none() | st.integers(min_value=0, max_value=8),
    )
    def run(self, fault: str | None, fault_at: int, drain_after: int | None) -> None:
        """C1, J12, J13, J14: one run of the key's loop, with at most one fault."""
        self.fault, self.drain_after, self.handled = fault, drain_after, 0
        self.fault_at = fault_at
        fencing = FencingBackend(self.backend)
        if fault == "stale":
            fencing.stale_from = fault_at
        cursor_before = self.tables.cursor or 0

        async def one_run() -> BaseException | None:
            await self.backend.enqueue(self.holder, {})
            [run] = await self.backend.claim(claim_request(self.holder, worker="w"))
            ctx: JobContext[Any] = JobContext.standalone(run)
            ctx.bind_backend(fencing)  # type: ignore[arg-type]
            try:
                await self.consumer.job.handler(ctx, {"key": "k"})
            except (
                HandleFailedError,
                SaveFailedError,
                InMemoryCommitError,
                JobLeaseStaleError,
            ) as exc:
                return exc
            finally:
                self.uow.commit_fault = None
            return None

        raised = self._await(one_run)
        batches_needed = -(-(len(self.stream) - cursor_before) // BATCH)
        hit = fault is not None and fault_at <= batches_needed
        if drain_after is not None:
            # A drain may end the run before the faulty batch.
            assert raised is None or hit
        else:
            assert (raised is not None) == hit, (fault, fault_at, batches_needed, raised)
        if raised is None and drain_after is None:
            # C1: a run without a fault reads its stream to the end.
            assert (self.tables.cursor or 0) == len(self.stream)

    @invariant()
    def committed_cursor_and_effects_agree(self) -> None:
        """C1: the effects committed are the stream's items up to the committed cursor, in
        order, each once; the cursor never moves backwards."""
        cursor = self.tables.cursor or 0
        assert self.tables.effects == list(range(1, cursor + 1))
        assert cursor >= self.last_cursor
        self.last_cursor = cursor

    @invariant()
    def deliveries_start_at_the_committed_cursor(self) -> None:
        """C1: a batch starts right after the cursor committed when it was delivered: no item
        skipped, and an item comes again only when its batch did not commit."""
        for cursor, items in self.delivered:
            assert 1 <= len(items) <= BATCH
            assert items == list(range(cursor + 1, cursor + 1 + len(items)))


ConsumerLoop.TestCase.settings = settings(
    max_examples=300 if LARGE else 40,
    stateful_step_count=30,
    deadline=None,
)


class TestConsumerLoop(ConsumerLoop.TestCase):  # type: ignore[name-defined,misc]
    @classmethod
    def setUpClass(cls) -> None:
        cls._portal_cm = start_blocking_portal()
        ConsumerLoop.portal = cls._portal_cm.__enter__()

    @classmethod
    def tearDownClass(cls) -> None:
        cls._portal_cm.__exit__(None, None, None)
