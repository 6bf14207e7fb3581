"""What a handler knows about the run it executes: ``async def handler(ctx, payload)``."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, TypeVar, cast

from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._recording import recorded_store
from ship_sqla.kernel._transactional import take_fence

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence
    from datetime import datetime, timedelta

    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._jobs import Determinism, JobDefinition, PayloadCodec
    from ship_sqla.kernel._ports import ClaimedRun, JobBackend, SettleOutcome
    from ship_sqla.kernel._settlement import Settlement
    from ship_sqla.kernel._workflows import (
        ChildOutcome,
        EventWait,
        StepRetry,
        UnitOfWorkLike,
        Workflow,
        WorkflowEvent,
        WorkflowStore,
    )

T = TypeVar("T")
if TYPE_CHECKING:
    # A bare ``JobContext`` is ``JobContext[Any]``: handlers that read no resources need not
    # name their type (PEP 696; typing_extensions for the type checker only).
    from typing_extensions import TypeVar as _DefaultedTypeVar

    R = _DefaultedTypeVar("R", default=Any)
else:
    R = TypeVar("R")

__all__ = [
    "NO_RESOURCES",
    "CancelReason",
    "Cancellation",
    "JobContext",
    "ResourcesNotConfiguredError",
]


class _NoResources:
    """The resources of a context whose runtime was given no ``lifespan``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_RESOURCES"


NO_RESOURCES: Final = _NoResources()


class ResourcesNotConfiguredError(ConfigurationError):
    """A handler read ``ctx.resources``, but the runtime that runs it was given no
    ``lifespan`` to make them."""

    code = "SHIP_SQLA_RESOURCES_NOT_CONFIGURED"


CancelReason = Literal["lease-lost", "lock-lost", "drain", "cancelled", "timeout"]
"""Why a run was cancelled: its lease was retaken or could not be extended (J5); its single-runner
lock ended before the run did (L2); the runtime's drain deadline passed (J12); an operator
cancelled the run (``"cancelled"``, K2: it ends cancelled, it is not retried); the job's
``timeout`` passed (``"timeout"``, K5: the attempt is a failure, the retry policy decides)."""


class Cancellation:
    """The cancellation signal of one run. Set at most once; the first reason wins.

    The runtime cancels the handler's task as well, so a handler need not poll this; it is for
    handlers that shield work from cancellation or hand the signal to code that is not async.
    """

    __slots__ = ("_event", "draining", "fenced", "reason")

    def __init__(self) -> None:
        self.reason: CancelReason | None = None
        # Created on first wait only: most runs are never waited on, and an Event per run would
        # be pure overhead on the hot path.
        self._event: asyncio.Event | None = None
        # J12: set when the runtime began to drain, before any deadline cancels the handler: a
        # long-running handler (a consumer, C2) ends its unit in hand and returns.
        self.draining = False
        # J13: true while a transaction of the handler may hold the run's row lock (the fence):
        # no heartbeat is sent (no claim can retake the run meanwhile, and a heartbeat would
        # wait on the lock), and a refused one is not a lost lease (the transaction decides).
        self.fenced = False

    def cancel(self, reason: CancelReason) -> bool:
        """Record ``reason``; False when the run was already cancelled (the first reason stays)."""
        if self.reason is not None:
            return False
        self.reason = reason
        if self._event is not None:
            self._event.set()
        return True

    @property
    def cancelled(self) -> bool:
        return self.reason is not None

    async def wait(self) -> None:
        """Return once the run is cancelled."""
        if self.reason is not None:
            return
        if self._event is None:
            self._event = asyncio.Event()
        await self._event.wait()


class JobContext(Generic[R]):
    """The run a handler executes, its cancellation signal, and the application's resources.

    ``resources`` is the value the runtime's ``lifespan`` yielded (an engine, a unit of work,
    an HTTP client, a container: whatever the application's lifespan builds once per worker);
    annotate the handler's context as ``JobContext[MyResources]`` and ``ctx.resources`` is
    typed. Reading it in a runtime given no lifespan raises
    :class:`ResourcesNotConfiguredError`.

    ``token`` is the claim's fencing token (J5): any external write the handler fences (a version
    column, a conditional PUT) can carry it so a zombie holder's late write is refused.
    ``cancelled`` becomes true, and the handler's task is cancelled, when the lease is lost
    (another worker may now run it), the single-runner lock ended, the drain deadline passed, or
    an operator cancelled the run (``cancel_reason == "cancelled"``, K2), or the job's
    ``timeout`` passed (``"timeout"``, K5). ``snoozes`` counts the run's earlier snoozes (K4).
    ``tenant`` is the tenant the run was enqueued for (F2).

    A handler that calls the workflow methods (:meth:`step`, :meth:`transaction`,
    :meth:`sleep`, :meth:`sleep_until`, :meth:`wait_for_event`, :meth:`expect_event`,
    :meth:`spawn`, :meth:`wait_for_children`) is a durable workflow (SPEC §13): its steps are
    stored and replayed (:mod:`ship_sqla.kernel._workflows`).
    """

    __slots__ = (
        "_backend",
        "_cancellation",
        "_determinism",
        "_resources",
        "_run",
        "_transactional",
        "_workflow",
        "_workflow_parts",
        "worker_id",
    )

    def __init__(
        self,
        run: ClaimedRun,
        cancellation: Cancellation,
        *,
        worker_id: str,
        resources: R | _NoResources = NO_RESOURCES,
    ) -> None:
        self._run = run
        self._cancellation = cancellation
        self.worker_id = worker_id
        self._resources = resources
        self._workflow: Workflow | None = None
        self._workflow_parts: tuple[WorkflowStore, JobBackend, Clock] | None = None
        self._determinism: Determinism = "strict"
        self._transactional = False
        self._backend: JobBackend | None = None

    def bind_backend(self, backend: JobBackend) -> None:
        """Give the context the backend that claimed its run (the runtime does, per claim; a
        test of a handler outside a runtime may too): :attr:`backend`,
        :meth:`fenced_transaction`."""
        self._backend = backend

    def bind_workflows(
        self,
        store: WorkflowStore,
        backend: JobBackend,
        clock: Clock,
        *,
        determinism: Determinism = "strict",
    ) -> None:
        """Give the context the backend's workflow store (the runtime does, per claim; a test
        of a handler outside a runtime may too), and the job's ``determinism`` (D7)."""
        # D11: pytest --ship-record-histories sees the run's steps through this store.
        self._workflow_parts = (recorded_store(self._run, store), backend, clock)
        self._determinism = determinism
        self._backend = backend

    @property
    def backend(self) -> JobBackend:
        """The backend that claimed this run: a handler enqueues follow-up runs on it."""
        if self._backend is None:
            raise ConfigurationError(
                f"run {self._run.run_id!r}: this context has no backend bound.",
                fix="run the handler in a runtime (start_job_runtime), or call"
                " ctx.bind_backend(backend) in a test.",
            )
        return self._backend

    async def fenced_transaction(self, uow: UnitOfWorkLike, fn: Callable[[Any], Awaitable[T]]) -> T:
        """J13's fence without the completion, for a handler that commits its work in several
        transactions (a consumer's batches, C1): ``fn(repositories)`` inside ``uow.run``, whose
        first statement fences this run's claim (its row locked until the transaction ends, its
        token current, still running, no cancel requested). A claim no longer current raises
        :class:`~ship_sqla.errors.JobLeaseStaleError` and a committed cancel ends the run
        cancelled (K2), both with the whole transaction rolled back (J14): a stale holder
        commits nothing. No heartbeat is sent while the transaction is open (no claim can
        retake the locked run); they resume when it ends."""
        backend = self.backend
        run = self._run

        async def in_transaction(repositories: Any) -> T:  # noqa: ANN401 - the uow's own
            await take_fence(backend, run, self._cancellation)
            return await fn(repositories)

        try:
            return cast("T", await uow.run(in_transaction))
        finally:
            self._cancellation.fenced = False

    @property
    def workflow(self) -> Workflow:
        """This execution's :class:`~ship_sqla.kernel._workflows.Workflow` (made at first use)."""
        if self._transactional:
            from ship_sqla.kernel._transactional import (  # noqa: PLC0415 - rare path
                TransactionalHandlerMisuseError,
            )

            raise TransactionalHandlerMisuseError(
                f"job {self._run.job_id!r} run {self._run.run_id!r}: a transactional handler"
                " (declared with transaction=) made a workflow call. Its whole body is one"
                " transaction, so a step could not be stored apart from it, and a sleep or"
                " wait would hold the transaction open.",
                fix="drop transaction= and make the job a workflow whose last step is"
                " ctx.transaction(name, uow, fn, completes_run=True), or keep the handler"
                " transactional and make no workflow calls.",
            )
        if self._workflow is None:
            from ship_sqla.kernel._workflows import (  # noqa: PLC0415 - cycle: it imports us
                Workflow,
                WorkflowsNotConfiguredError,
            )

            if self._workflow_parts is None:
                raise WorkflowsNotConfiguredError(
                    f"run {self._run.run_id!r}: this context has no workflow store, so steps"
                    " cannot be stored.",
                    fix="run the handler in a runtime on a backend with workflow tables"
                    " (ship_job_steps_table, ship_job_events_table; the in-memory backend has"
                    " them), or call ctx.bind_workflows(...) in a test.",
                )
            store, backend, clock = self._workflow_parts
            self._workflow = Workflow(
                self._run,
                store,
                backend,
                clock,
                cancellation=self._cancellation,
                determinism=self._determinism,
            )
        return self._workflow

    async def step(
        self,
        name: str,
        fn: Callable[[], Awaitable[T]],
        *,
        result: type[Any] | PayloadCodec[Any] | None = None,
        retry: StepRetry | None = None,
    ) -> T:
        """D1: run ``fn()`` once per run, its result stored and replayed (see
        :meth:`Workflow.step <ship_sqla.kernel._workflows.Workflow.step>`)."""
        return await self.workflow.step(name, fn, result=result, retry=retry)

    async def transaction(
        self,
        name: str,
        uow: UnitOfWorkLike,
        fn: Callable[[Any], Awaitable[T]],
        *,
        result: type[Any] | PayloadCodec[Any] | None = None,
        completes_run: bool = False,
    ) -> T:
        """D2: ``fn(repositories)`` in ``uow``, its result stored in the same transaction;
        ``completes_run=True`` (J13): the run's claim fenced first and its completion committed
        in that transaction too (the workflow's last call)."""
        return await self.workflow.transaction(
            name, uow, fn, result=result, completes_run=completes_run
        )

    def _enter_transactional(self) -> None:
        """Mark this context a transactional handler's (J13): workflow calls are refused."""
        self._transactional = True

    @property
    def completed_in_transaction(self) -> tuple[Settlement, SettleOutcome] | None:
        """The completion a workflow's ``ctx.transaction(..., completes_run=True)`` committed
        (J13), or None."""
        return None if self._workflow is None else self._workflow.completed_run

    @property
    def completion_sent(self) -> tuple[Settlement, SettleOutcome] | None:
        """The completion a workflow's completes_run transaction sent, committed or not (its
        COMMIT's answer may have been lost: the runtime then reads the run's row), or None."""
        return None if self._workflow is None else self._workflow.completion_sent

    async def patched(self, patch_id: str) -> bool:
        """D8: True on the new path of patch ``patch_id``, False for a run that passed this
        position before the patch existed (see :meth:`Workflow.patched
        <ship_sqla.kernel._workflows.Workflow.patched>`)."""
        return await self.workflow.patched(patch_id)

    async def deprecate_patch(self, patch_id: str) -> None:
        """D8: the old branch of patch ``patch_id`` is gone; runs holding its marker replay
        on."""
        await self.workflow.deprecate_patch(patch_id)

    def workflow_returned(self, handler: object = None) -> None:
        """D7: the handler returned; a workflow whose history holds steps past its last call
        diverged (:class:`~ship_sqla.errors.WorkflowDivergedError`). Nothing when the handler
        made no workflow call."""
        if self._workflow is not None:
            self._workflow.returned(handler)

    async def sleep(self, name: str, duration: float | timedelta) -> None:
        """D3: suspend the run for ``duration`` without holding a slot, lease or attempt."""
        await self.workflow.sleep(name, duration)

    async def sleep_until(self, name: str, when: datetime) -> None:
        """D3: suspend the run until ``when``."""
        await self.workflow.sleep_until(name, when)

    async def wait_for_event(
        self,
        name: str,
        event: str,
        *,
        key: str | None = None,
        timeout: float | timedelta | None = None,  # noqa: ASYNC109 - durable, the database's clock
    ) -> WorkflowEvent | None:
        """D4: the first ``event`` (with ``key``) committed after the wait began, or None at
        the timeout (the database's clock)."""
        return await self.workflow.wait_for_event(name, event, key=key, timeout=timeout)

    async def expect_event(
        self,
        name: str,
        event: str,
        *,
        key: str | None = None,
        timeout: float | timedelta | None = None,  # noqa: ASYNC109 - durable, the database's clock
    ) -> EventWait:
        """D4: begin a wait now, before the step that makes the event happen; ``await
        handle.wait()`` later returns any event committed since."""
        return await self.workflow.expect_event(name, event, key=key, timeout=timeout)

    async def spawn(self, name: str, job: JobDefinition[Any], payloads: Sequence[Any]) -> list[str]:
        """D5: enqueue child runs once; their ids."""
        return await self.workflow.spawn(name, job, payloads)

    async def wait_for_children(self, name: str) -> list[ChildOutcome]:
        """D5: suspend until every child run is terminal; how each ended."""
        return await self.workflow.wait_for_children(name)

    @classmethod
    def standalone(
        cls,
        run: ClaimedRun,
        *,
        worker_id: str = "test",
        resources: R | _NoResources = NO_RESOURCES,
    ) -> JobContext[R]:
        """A context outside any runtime, to unit-test a handler (with the ``resources`` it
        reads, e.g. a fake); cancel via ``cancellation``."""
        return cls(run, Cancellation(), worker_id=worker_id, resources=resources)

    @property
    def resources(self) -> R:
        """What the runtime's ``lifespan`` yielded, entered once before the worker's first
        claim and exited after its drain (``start_job_runtime(..., lifespan=...)``,
        ``JobRegistry(..., lifespan=...)``, ``ship-sqla worker --lifespan``)."""
        resources = self._resources
        if isinstance(resources, _NoResources):
            raise ResourcesNotConfiguredError(
                f"run {self._run.run_id!r} of job {self._run.job_id!r} read ctx.resources, but"
                " its runtime was started without a lifespan.",
                fix="give the runtime a lifespan that yields the resources:"
                " start_job_runtime(..., lifespan=app_lifespan), JobRegistry(...,"
                " lifespan=app_lifespan), or `ship-sqla worker APP:REGISTRY --lifespan"
                " APP:LIFESPAN` (an async context manager factory, e.g. an"
                " @asynccontextmanager function); in a test, JobContext.standalone(run,"
                " resources=...).",
            )
        return resources

    @property
    def run(self) -> ClaimedRun:
        return self._run

    @property
    def run_id(self) -> str:
        return self._run.run_id

    @property
    def job_id(self) -> str:
        return self._run.job_id

    @property
    def tenant(self) -> str | None:
        """The tenant the run was enqueued for (F2), None for none. The handler runs in it: a
        ``uow.run`` it opens without a tenant, and every run it enqueues, default to it."""
        return self._run.tenant

    @property
    def attempt(self) -> int:
        """1 on the first run; a JOB_LOCK_HELD release or a drain cancellation does not count."""
        return self._run.attempt

    @property
    def max_attempts(self) -> int:
        return self._run.max_attempts

    @property
    def snoozes(self) -> int:
        """How many times the run snoozed before this attempt (:class:`~ship_sqla.errors.Snooze`,
        at most ``retry.max_snoozes``; K4)."""
        return self._run.snoozes

    @property
    def is_final_attempt(self) -> bool:
        return self._run.attempt >= self._run.max_attempts

    @property
    def token(self) -> int:
        return self._run.token

    @property
    def key(self) -> str | None:
        return self._run.key

    @property
    def created_at(self) -> datetime:
        return self._run.created_at

    @property
    def cancellation(self) -> Cancellation:
        return self._cancellation

    @property
    def cancelled(self) -> bool:
        return self._cancellation.reason is not None

    @property
    def cancel_reason(self) -> CancelReason | None:
        return self._cancellation.reason

    @property
    def draining(self) -> bool:
        """True once the runtime began to drain (J12), before its deadline cancels anything: a
        handler that loops (a consumer, C2) finishes the unit in hand and returns."""
        return self._cancellation.draining

    async def wait_cancelled(self) -> None:
        """Return once the run is cancelled (see :class:`Cancellation`)."""
        await self._cancellation.wait()

    def __repr__(self) -> str:
        return (
            f"JobContext(job_id={self.job_id!r}, run_id={self.run_id!r},"
            f" attempt={self.attempt}/{self.max_attempts}, token={self.token})"
        )
