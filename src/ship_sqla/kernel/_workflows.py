"""Durable workflows (SPEC §13, D1-D6): a handler whose named steps are stored, so a run that is
retried, retaken after a crash, or resumed after a sleep or a wait replays its completed steps
from storage and continues from the first step not done.

A handler reaches them through its context (``ctx.step``, ``ctx.transaction``, ``ctx.sleep``,
``ctx.wait_for_event``, ``ctx.spawn``, ``ctx.wait_for_children``), which hands the run to a
:class:`Workflow`: this module's rules, the same on every backend. A backend stores steps and
events through the :class:`WorkflowStore` port and settles a :class:`~ship_sqla.kernel._ports.
Suspend` (a sleep or a wait: the run back to waiting, its attempt unspent, D3).

The determinism contract: a run replays its handler from the top on every claim, so the
sequence of step names (and kinds) a handler reaches must not depend on anything but the
payload and the results of earlier steps. A stored step whose kind differs from the one the
handler now asks for at that name is :class:`WorkflowChangedError` (terminal: the run is
dead-lettered at once, so an operator re-runs it from a step after fixing the deploy).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import math
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeVar, cast, runtime_checkable

import attrs

from ship_sqla.kernel._clock import require_aware
from ship_sqla.kernel._durations import require_duration
from ship_sqla.kernel._errors import ConfigurationError, RefusedError, UsageError
from ship_sqla.kernel._evolution import (
    PATCH_KIND,
    PATCH_PREFIX,
    PatchAnswer,
    PatchFigure,
    StepCall,
    WorkflowChangedError,
    WorkflowDivergedError,
    caller_location,
    check_return,
    decode_recorded,
    divergence_of,
    function_location,
    patch_answer,
    patch_step_name,
)
from ship_sqla.kernel._jobs import JobDefinition, codec_for, is_job_id
from ship_sqla.kernel._json_text import encode_compact_json, unstorable_json, unstorable_text
from ship_sqla.kernel._keys import MAX_KEY_CHARS
from ship_sqla.kernel._plans.prepare import prepare_runs
from ship_sqla.kernel._ports import (
    TERMINAL_STATES,
    EnqueueRequest,
    JobLeaseStaleError,
    Suspend,
)
from ship_sqla.kernel._serving import serving_of
from ship_sqla.kernel._settlement import completed
from ship_sqla.kernel._transactional import (
    TransactionalHandlerMisuseError,
    fenced_completion,
    take_fence,
)
from ship_sqla.kernel._workers import MAX_WORKERS_LISTED

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._job_context import Cancellation
    from ship_sqla.kernel._jobs import Determinism, PayloadCodec
    from ship_sqla.kernel._ports import ClaimedRun, JobBackend, RunRecord, RunState, SettleOutcome
    from ship_sqla.kernel._settlement import Settlement

__all__ = [
    "CHILDREN_DONE",
    "CHILDREN_RECHECK",
    "CHILDREN_WAIT",
    "NEVER",
    "ChildJobUnservedError",
    "ChildOutcome",
    "ChildRunsRefusedError",
    "EventWait",
    "NewStep",
    "StepKind",
    "StepNameReusedError",
    "StepRecord",
    "StepRetry",
    "UnitOfWorkLike",
    "Workflow",
    "WorkflowAdmin",
    "WorkflowChangedError",
    "WorkflowEvent",
    "WorkflowMisuseError",
    "WorkflowStore",
    "WorkflowSuspended",
    "Workflows",
    "WorkflowsNotConfiguredError",
    "check_event_key",
    "check_event_name",
    "child_run_id",
    "encode_event_payload",
    "event_wait_key",
    "unstorable_step",
]

T = TypeVar("T")

StepKind = Literal["step", "transaction", "sleep", "event", "spawn", "children", "patch"]
"""What a stored step is: a plain step (at least once, D1), a transactional one (exactly once,
D2), a durable sleep (D3), a wait for an event (D4), the enqueue of child runs or the wait for
them (D5), a patch marker (D8)."""
StepState = Literal["done", "waiting"]

NEVER: Final = datetime(9999, 1, 1, tzinfo=UTC)
"""The wake time of a wait without a timeout: it ends only by its event (D4)."""
CHILDREN_RECHECK: Final = 60.0
"""Seconds after which a parent waiting for its children is looked at again although no child
woke it: the fallback for a wake lost between a child's settle and its parent's wake (a crash
between the two statements). A child that ends normally wakes its parent at once."""
CHILDREN_WAIT: Final = "#children"
"""A run's ``wait_for`` while it waits for (or has spawned) child runs (D5); an event wait's is
:func:`event_wait_key` (never starts with ``#``: event names are job-id shaped)."""
CHILDREN_DONE: Final = "#children-done"
"""A run's ``wait_for`` once its last live child ended while it was still running (D5): its
suspend for its children then makes it due at once."""
MAX_STEP_NAME = 200
"""The longest step name (it is part of child run ids)."""
_STEP_RESULT_MAX_BYTES: Final = 16 * 1024 * 1024
_MAX_EVENT_KEY: Final = 512
_MAX_STEP_TRIES: Final = 100
_MAX_STEP_DELAY: Final = 3600.0
_MAX_STEP_FACTOR: Final = 10.0

logger = logging.getLogger("ship_sqla.jobs")


class StepNameReusedError(UsageError, ValueError):
    """A handler used one step name twice in one execution (D1): replays key stored results by
    name, so the second would replay the first's."""

    code = "SHIP_SQLA_STEP_NAME_REUSED"


class WorkflowMisuseError(UsageError, RuntimeError):
    """A workflow call that cannot work where it was made (a sleep inside a transactional step,
    a step outside a runtime's run)."""

    code = "SHIP_SQLA_WORKFLOW_MISUSE"


class ChildRunsRefusedError(RefusedError, RuntimeError):
    """A spawn's child runs were refused (the child job's ``queue_depth_limit``, J2): the attempt
    fails and the spawn runs again at the retry (the children accepted so far are deduplicated
    then, D5)."""

    code = "SHIP_SQLA_CHILD_RUNS_REFUSED"


class ChildJobUnservedError(RefusedError, RuntimeError):
    """A spawn's child job is declared by no live worker while the worker registry lists live
    ones (D5): its children would wait unseen, and the parent with them, so the attempt fails
    and the spawn runs again at the retry, once a worker declaring the job has started."""

    code = "SHIP_SQLA_CHILD_JOB_UNSERVED"


class WorkflowsNotConfiguredError(ConfigurationError):
    """The backend has no workflow store (its steps and events tables), so ``ctx.step`` and the
    other workflow calls cannot store anything."""

    code = "SHIP_SQLA_WORKFLOWS_NOT_CONFIGURED"


class WorkflowSuspended(BaseException):
    """Raised by ``ctx.sleep`` and the waits to unwind the handler: the run is suspended (D3).
    A ``BaseException`` so that a handler's ``except Exception`` does not swallow it; the
    executor turns it into its :class:`~ship_sqla.kernel._ports.Suspend`."""

    def __init__(self, settlement: Suspend) -> None:
        super().__init__(
            f"workflow run {settlement.run.run_id!r} suspended at step"
            f" {settlement.step.name!r} ({settlement.wait})"
        )
        self.settlement = settlement


def unstorable_step(step: NewStep) -> str | None:
    """What in ``step`` PostgreSQL could not store (a NUL or a lone surrogate in its name or
    event key; a wake time without an offset or out of range in UTC), else None: the rule the
    in-memory model applies where the database would refuse the suspension (J23)."""
    for what, text in (("step name", step.name), ("event key", step.event_key or "")):
        problem = unstorable_text(text)
        if problem is not None:
            return f"the {what} holds {problem}"
    when = step.wake_at
    if when is not None:
        try:
            require_aware(when, "the step's wake time")
        except ConfigurationError as error:
            return error.message
    return None


def check_event_name(name: object, what: str = "event name") -> str:
    """An event name is shaped like a job id (letters, digits, ``_ . : -``, at most 128)."""
    if not is_job_id(name):
        raise ConfigurationError(
            f"{what} {name!r} is not a valid event name.",
            fix="use 1-128 characters: letters, digits and _ . : - (starting with a letter or"
            " a digit), e.g. 'order.shipped'.",
        )
    return name  # type: ignore[return-value]


def check_event_key(key: object) -> str:
    if key is None:
        return ""
    if not isinstance(key, str) or len(key) > _MAX_EVENT_KEY or unstorable_text(key) is not None:
        raise ConfigurationError(
            f"event key {key!r} must be None or text of at most 512 characters without NUL"
            " characters or surrogate code points.",
            fix="pass the id the event is about, e.g. key=order_id.",
        )
    return key


def encode_event_payload(payload: object) -> str:
    """An event's payload as JSON text (D4), or a clear error naming what is not JSON."""
    return _encode(payload, "the event payload")


def event_wait_key(name: str, key: str) -> str:
    """What a run waiting for event ``name`` with ``key`` stores as its ``wait_for`` (and what a
    publish of that event wakes), and the name of the lock a wait and a publish share."""
    return f"{name}\x1f{key}"


@attrs.frozen
class StepRecord:
    """A stored step of a run, as a backend answers it (D1). ``result_json`` is the step's
    encoded result (JSON text; None while it waits); ``wake_at`` the sleep's wake time or the
    wait's timeout (None: none); ``due`` whether ``wake_at`` has passed by the store's clock
    (the database's on PostgreSQL, D4) when the step was read."""

    run_id: str
    name: str
    seq: int
    kind: StepKind
    state: StepState
    result_json: str | None
    wake_at: datetime | None
    created_at: datetime
    finished_at: datetime | None
    event_name: str | None = None
    event_key: str | None = None
    due: bool = False

    @property
    def result(self) -> Any:  # noqa: ANN401 - JSON
        return None if self.result_json is None else json.loads(self.result_json)


@attrs.frozen
class NewStep:
    """A step to store: done with its ``result_json``, or waiting (a sleep until ``wake_at``, or
    ``wake_after`` seconds from the store's clock; an event wait on ``event_name``/``event_key``
    with its timeout the same way; a wait for children)."""

    name: str
    seq: int
    kind: StepKind
    state: StepState
    result_json: str | None = None
    wake_at: datetime | None = None
    wake_after: float | None = None
    event_name: str | None = None
    event_key: str | None = None

    @classmethod
    def of(cls, record: StepRecord) -> NewStep:
        """A stored waiting step, to suspend on again (the store keeps what it stored)."""
        return cls(
            record.name,
            record.seq,
            record.kind,
            record.state,
            wake_at=record.wake_at,
            event_name=record.event_name,
            event_key=record.event_key,
        )


@attrs.frozen
class WorkflowEvent:
    """An event a wait matched (D4): its ``name``, ``key`` (``""`` for none), JSON ``payload``
    and the id the store gave it."""

    name: str
    key: str
    payload: Any
    event_id: int


@attrs.frozen
class ChildOutcome:
    """How a child run ended, as its parent sees it after ``wait_for_children`` (D5)."""

    run_id: str
    job_id: str
    state: RunState
    last_error: str | None

    @property
    def succeeded(self) -> bool:
        return self.state == "completed"


@attrs.frozen
class StepRetry:
    """A plain step's own retries: up to ``attempts`` tries in this attempt, ``delay`` seconds
    before the second, multiplied by ``factor`` each time up to ``max_delay``. The step's last
    failure fails the attempt (the job's retry policy decides what follows)."""

    attempts: int = attrs.field(default=3)
    delay: float = 1.0
    factor: float = 2.0
    max_delay: float = 60.0

    def __attrs_post_init__(self) -> None:
        attempts: object = self.attempts
        numbers: tuple[object, ...] = (self.delay, self.factor, self.max_delay)
        ok = (
            isinstance(attempts, int)
            and not isinstance(attempts, bool)
            and 1 <= attempts <= _MAX_STEP_TRIES
            and all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                for v in numbers
            )
            and 0 <= self.delay <= _MAX_STEP_DELAY
            and 1 <= self.factor <= _MAX_STEP_FACTOR
            and 0 <= self.max_delay <= _MAX_STEP_DELAY
        )
        if not ok:
            raise ConfigurationError(
                f"StepRetry{(self.attempts, self.delay, self.factor, self.max_delay)} is out of"
                " bounds.",
                fix="attempts 1..100, delay and max_delay 0..3600 s, factor 1..10.",
            )

    def delay_before(self, try_number: int) -> float:
        """Seconds to wait before try ``try_number`` (2 for the first retry)."""
        return float(min(self.max_delay, self.delay * self.factor ** (try_number - 2)))


@runtime_checkable
class UnitOfWorkLike(Protocol):
    """What ``ctx.transaction`` runs its step in: :class:`ship_sqla.UnitOfWork` (or any object
    whose ``run(handler)`` runs ``handler(repositories)`` in one transaction that the workflow
    store's writes join)."""

    async def run(self, handler: Callable[[Any], Awaitable[Any]]) -> Any: ...  # noqa: ANN401


@runtime_checkable
class WorkflowStore(Protocol):
    """Storage of steps and events (D1-D5). Every write is fenced on the run's claim token: a
    holder that lost its claim stores nothing (and is answered False)."""

    async def load_steps(self, run_id: str) -> list[StepRecord]:
        """The run's stored steps in ``seq`` order, ``due`` judged by the store's clock."""
        ...

    async def save_step(self, run: ClaimedRun, step: NewStep, *, scope: Any = None) -> bool:  # noqa: ANN401
        """Store ``step`` as done (a new one, or a waiting one ending) while ``run``'s token is
        current; joins the active (or given) unit of work, so a transactional step's result
        commits with its writes (D2). False (nothing stored): the token is not current, or the
        step is done already (another holder stored it)."""
        ...

    async def begin_wait(self, run: ClaimedRun, step: NewStep) -> StepRecord | None:
        """Store the event wait ``step`` as waiting, beginning now (its snapshot, D4; its
        timeout from the store's clock), while ``run``'s token is current, without suspending
        the run (:meth:`Workflow.expect_event`); the stored step (the one already stored, on a
        replay), or None: the token is not current."""
        ...

    async def match_event(self, run_id: str, step: StepRecord) -> WorkflowEvent | None:
        """The first event of the wait step's name and key committed after the wait began
        (D4: by the publishing transaction, not a timestamp), or None."""
        ...

    async def adopt_children(self, parent: ClaimedRun, child_ids: Sequence[str]) -> None:
        """Make the runs ``child_ids`` children of ``parent`` (those not adopted yet), so their
        end wakes it (D5)."""
        ...

    async def children(self, run_id: str) -> list[ChildOutcome]:
        """Every child of the run, in creation order."""
        ...

    async def publish_event(
        self,
        name: str,
        key: str,
        payload_json: str,
        *,
        scope: Any = None,  # noqa: ANN401
    ) -> int:
        """Store an event in the active (or given) unit of work and wake the runs waiting for
        it (D4: they are woken when it commits; a rollback matches nothing); its id."""
        ...


@runtime_checkable
class WorkflowAdmin(Protocol):
    """The operator side of workflows (D6), gated by :class:`~ship_sqla.jobs.JobOperations`."""

    async def list_steps(self, run_id: str) -> list[StepRecord]: ...

    async def rerun_from_step(self, run_id: str, step: str) -> RunRecord | None:
        """Drop step ``step`` of a dead or waiting run and every step started after it, and
        make the run due now (a dead one with one more attempt); None when the run is not dead
        or waiting or has no such step (nothing changed)."""
        ...

    async def delete_events(self, *, older_than: timedelta, limit: int) -> int:
        """Delete at most ``limit`` events published longer than ``older_than`` ago."""
        ...

    async def patch_ids(self, *, limit: int) -> list[str]:
        """D8: the ids of the patches whose markers any run stored, at most ``limit``, in id
        order (one index probe each)."""
        ...

    async def patch_holding(self, job_id: str, patch_id: str, *, read: int) -> PatchFigure:
        """D8: live runs of ``job_id`` holding patch ``patch_id``'s marker, among at most
        ``read`` live runs of the job."""
        ...

    async def patch_lacking(
        self, job_id: str, patch_id: str, *, read: int
    ) -> tuple[datetime | None, PatchFigure]:
        """D8: when the job's first marker of the patch was stored (None: none), and the live
        runs of ``job_id`` created before it that do not hold the marker, among at most
        ``read`` live runs of the job (none counted without a first marker)."""
        ...


@runtime_checkable
class Workflows(WorkflowStore, WorkflowAdmin, Protocol):
    """A job backend's ``workflows`` (:attr:`~ship_sqla.kernel.JobBackend.workflows`): the store
    the runtime binds to each run's context and the operator side, one object (both backends'
    are)."""


def _encode(value: object, what: str) -> str:
    try:
        encoded = encode_compact_json(value)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"{what} is not JSON: {exc}.",
            fix="return JSON-able values (dict, list, str, numbers, bool, None), or declare"
            " result= with a type or codec that encodes it.",
        ) from exc
    unstorable = unstorable_json(value, encoded, root="value")
    if unstorable is not None:
        raise ConfigurationError(
            f"{what} holds {unstorable}: PostgreSQL's jsonb cannot store it.",
            fix=unstorable.fix,
        )
    if len(encoded) > _STEP_RESULT_MAX_BYTES:
        raise ConfigurationError(
            f"{what} is over 16 MiB of JSON.",
            fix="store large data elsewhere and return its reference.",
        )
    return encoded


MAX_WORKFLOW_WAIT: Final = 366 * 86400 * 100.0
"""The longest sleep or wait timeout, in seconds: about a hundred years."""


def _seconds(duration: float | timedelta, what: str) -> float:
    """``duration`` (seconds or a timedelta) checked by the kernel's one duration rule."""
    value: object = duration.total_seconds() if isinstance(duration, timedelta) else duration
    return require_duration(value, what, maximum=MAX_WORKFLOW_WAIT, allow_zero=True)


def _require_callable(fn: object, what: str) -> None:
    """J23: a workflow call's function is checked before any statement runs."""
    if not callable(fn):
        raise WorkflowMisuseError(
            f"{what} must be callable, got {type(fn).__name__} {fn!r}.",
            fix="pass an async function (or a lambda returning a coroutine), not its result"
            " or its name.",
        )


async def _awaited(value: Any, what: str) -> Any:  # noqa: ANN401 - the step's own value
    """Await what a step's function returned; a plain function's value is a typed error (its
    call already happened: nothing is stored for the step, and it runs again at the retry)."""
    if not inspect.isawaitable(value):
        raise WorkflowMisuseError(
            f"{what} returned {type(value).__name__}, not an awaitable: it is a plain function."
            " Nothing was stored for the step.",
            fix="make it an async function (async def), or wrap a blocking call:"
            " lambda: asyncio.to_thread(blocking_fn).",
        )
    return await value


def _spawn_arguments(name: str, job: object, payloads: object) -> Sequence[Any]:
    """J23: ``spawn``'s job and payloads checked before any statement (a job id, a generator, a
    string or None is a typed error naming the fix)."""
    if not isinstance(job, JobDefinition):
        raise WorkflowMisuseError(
            f"spawn {name!r} needs a job definition, got {type(job).__name__} {job!r}.",
            fix="pass the JobDefinition that define_job returned (registry.get(job_id) if you"
            " have its id).",
        )
    if isinstance(payloads, str | bytes) or not isinstance(payloads, list | tuple):
        raise WorkflowMisuseError(
            f"spawn {name!r} needs a list of payloads, got {type(payloads).__name__}.",
            fix="pass a list (one payload per child run); materialise a generator with"
            " list(...) first, so a replay spawns the same children.",
        )
    # Each child's payload by the enqueue's own rules (codec, JSON, NUL, size), before anything.
    prepare_runs(job, [EnqueueRequest(payload) for payload in payloads])
    return payloads


_Call = TypeVar("_Call", bound="Callable[..., Awaitable[Any]]")


def _one_call(method: _Call) -> _Call:
    """D7: a public workflow call, one at a time per execution (:meth:`Workflow._enter`)."""

    @functools.wraps(method)
    async def call(self: Workflow, name: object, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        self._enter(name)
        try:
            return await method(self, name, *args, **kwargs)
        finally:
            self._active = None

    return cast("_Call", call)


def _check_step_name(name: object, kind: str) -> None:
    """A step name: text of 1-200 characters PostgreSQL can store; ``patch:`` names only D8's
    markers."""
    if (
        not isinstance(name, str)
        or not name
        or len(name) > MAX_STEP_NAME
        or unstorable_text(name) is not None
    ):
        raise ConfigurationError(
            f"step name {name!r} must be text of 1-{MAX_STEP_NAME} characters without NUL"
            " characters or surrogate code points.",
            fix="name each step after what it does, e.g. 'charge-card'.",
        )
    if kind != PATCH_KIND and name.startswith(PATCH_PREFIX):
        raise ConfigurationError(
            f"step name {name!r} begins with {PATCH_PREFIX!r}, which names patch markers (D8).",
            fix="name the step otherwise; for a patch, call ctx.patched(patch_id).",
        )


class Workflow:
    """One execution of a workflow run: the steps it stored, loaded at its first call, and the
    positions and names this execution took (D1, D7). Built by the run's context; one per
    claim."""

    __slots__ = (
        "_active",
        "_backend",
        "_by_name",
        "_by_seq",
        "_cancellation",
        "_clock",
        "_determinism",
        "_in_transaction",
        "_patches",
        "_run",
        "_seq",
        "_steps",
        "_store",
        "_used",
        "completed_run",
        "completion_sent",
    )

    def __init__(
        self,
        run: ClaimedRun,
        store: WorkflowStore,
        backend: JobBackend,
        clock: Clock,
        *,
        cancellation: Cancellation | None = None,
        determinism: Determinism = "strict",
    ) -> None:
        self._run = run
        self._store = store
        self._backend = backend
        self._clock = clock
        # The run's cancellation: its ``fenced`` flag stops heartbeats while a completing
        # transaction holds the run's row (J13).
        self._cancellation = cancellation
        self._determinism = determinism
        self._steps: list[StepRecord] | None = None
        self._by_seq: dict[int, StepRecord] = {}
        self._by_name: dict[str, StepRecord] = {}
        self._used: set[str] = set()
        self._patches: dict[str, bool] = {}
        self._seq = 0
        self._active: str | None = None
        self._in_transaction = False
        # J13: the completion a completes_run transaction committed, and the one it sent (which
        # may have committed when the COMMIT's answer was lost); no workflow call after either.
        self.completed_run: tuple[Settlement, SettleOutcome] | None = None
        self.completion_sent: tuple[Settlement, SettleOutcome] | None = None

    @property
    def position(self) -> int:
        """The position the next workflow call takes (D7)."""
        return self._seq

    def _enter(self, name: object) -> None:
        """J13, D7: a workflow call may begin here: not after the run's completing transaction,
        not inside a transactional step, and not while another call is in flight (D7: their
        positions would depend on how the event loop schedules them)."""
        if self.completion_sent is not None:
            raise TransactionalHandlerMisuseError(
                f"run {self._run.run_id!r}: step {name!r} was called after the transaction that"
                " completed the run (completes_run=True); the run is completed, so the step"
                " could never be stored.",
                fix="make the completes_run transaction the workflow's last call.",
            )
        if self._in_transaction:
            raise WorkflowMisuseError(
                f"step {name!r} was called inside a transactional step: a step's own storage"
                " would then commit (or roll back) with that transaction.",
                fix="call workflow steps from the handler, not from inside ctx.transaction.",
            )
        if self._active is not None:
            raise WorkflowMisuseError(
                f"run {self._run.run_id!r}: workflow call {name!r} began while {self._active!r}"
                " was still in flight (asyncio.gather or a task): each workflow call takes the"
                " next position of the run's history (D7), so two at once would store them in"
                " an order a replay cannot repeat.",
                fix="await workflow calls one after another; to run work concurrently, gather"
                " inside one step's function, or spawn child runs (ctx.spawn).",
            )
        self._active = str(name)

    async def _begin(self, name: str, kind: StepKind) -> tuple[int, StepRecord | None]:
        """Check ``name``, load the run's stored steps (at the first call), take the next
        position and answer the step stored there (D7)."""
        _check_step_name(name, kind)
        if name in self._used:
            raise StepNameReusedError(
                f"step name {name!r} was already used in this execution of run"
                f" {self._run.run_id!r}: a replay would return the first step's result.",
                fix="give every step of a handler its own name (in a loop, add the index:"
                " f'send-{i}').",
            )
        await self._loaded()
        return self._take(name, kind)

    async def _loaded(self) -> None:
        if self._steps is None:
            steps = await self._store.load_steps(self._run.run_id)
            self._steps = sorted(steps, key=lambda s: s.seq)
            self._by_seq = {s.seq: s for s in self._steps}
            self._by_name = {s.name: s for s in self._steps}

    def _take(self, name: str, kind: StepKind) -> tuple[int, StepRecord | None]:
        """D7: take the next position for ``name`` and answer the step stored there (None: the
        call is new), or raise the divergence (strict); by name under ``by-name``."""
        self._used.add(name)
        seq = self._seq
        self._seq += 1
        if self._determinism == "by-name":
            return seq, self._by_name_step(seq, name, kind)
        stored = self._by_seq.get(seq)
        requested = StepCall(name, kind)
        found = divergence_of(
            run_id=self._run.run_id,
            job_id=self._run.job_id,
            position=seq,
            recorded=None if stored is None else StepCall(stored.name, stored.kind),
            requested=requested,
        )
        if found is not None:
            raise WorkflowDivergedError(attrs.evolve(found, location=caller_location()))
        return seq, stored

    def _by_name_step(self, seq: int, name: str, kind: StepKind) -> StepRecord | None:
        """``by-name`` (the pre-D7 matching): the step stored under ``name`` wherever it is; a
        kind change is still a divergence, an out-of-order step a warning."""
        stored = self._by_name.get(name)
        if stored is None:
            return None
        if stored.kind != kind:
            found = divergence_of(
                run_id=self._run.run_id,
                job_id=self._run.job_id,
                position=seq,
                recorded=StepCall(stored.name, stored.kind),
                requested=StepCall(name, kind),
            )
            assert found is not None  # noqa: S101 - the kinds differ
            raise WorkflowDivergedError(attrs.evolve(found, location=caller_location()))
        if stored.seq != seq:
            logger.warning(
                "job %r run %r: workflow step %r replayed by name at position %d, stored at"
                " position %d (determinism='by-name'; %s)",
                self._run.job_id,
                self._run.run_id,
                name,
                seq,
                stored.seq,
                caller_location(),
                extra={"ship_sqla_event": "workflow.out_of_order"},
            )
        return stored

    def _decode(self, codec: PayloadCodec[Any], stored: StepRecord, seq: int) -> Any:  # noqa: ANN401
        """D7: a stored result decoded, or the ``codec`` divergence (the handler's line looked
        up only then)."""
        try:
            return decode_recorded(
                codec.decode,
                stored.result,
                run_id=self._run.run_id,
                job_id=self._run.job_id,
                position=seq,
                recorded=StepCall(stored.name, stored.kind),
            )
        except WorkflowDivergedError as error:
            located = attrs.evolve(error.divergence, location=caller_location())
            raise WorkflowDivergedError(located) from error.__cause__

    def _remaining(self, position: int) -> list[StepCall]:
        """The stored steps at ``position`` and beyond, in position order."""
        return [StepCall(s.name, s.kind) for s in self._steps or () if s.seq >= position]

    def _check_last(self, seq: int) -> None:
        """D7: a completes_run transaction at ``seq`` ends the handler: checked as a return
        before it commits, so a run whose history holds more steps is never completed."""
        remaining = self._remaining(seq + 1)
        if self._determinism == "strict" and remaining:
            check_return(
                run_id=self._run.run_id,
                job_id=self._run.job_id,
                position=seq + 1,
                remaining=remaining,
                location=caller_location(),
            )

    def returned(self, handler: object = None) -> None:
        """D7: the handler returned: a divergence when its history holds steps past its last
        call (strict only; not after a completes_run transaction, which checked before it
        committed). Only an execution that made a workflow call is checked: a handler that
        returns before its first call reads nothing."""
        if self._steps is None or self._determinism != "strict" or self.completion_sent:
            return
        check_return(
            run_id=self._run.run_id,
            job_id=self._run.job_id,
            position=self._seq,
            remaining=self._remaining(self._seq),
            location=function_location(handler),
        )

    @_one_call
    async def patched(self, patch_id: str) -> bool:
        """D8: True on the new path, False for a run that passed this position before the patch
        existed (DBOS's rule): its marker stored here, True; nothing stored here, the marker is
        stored, True; another step stored here, False (no position taken). One answer per id
        per execution: a later call returns it and takes no position."""
        patch_id = check_event_name(patch_id, "patch id")
        known = self._patches.get(patch_id)
        if known is not None:
            return known
        name = patch_step_name(patch_id)
        await self._loaded()
        answer = self._patch_answer(patch_id, name)
        if answer != "old":
            seq, _ = self._take(name, PATCH_KIND)
            if answer == "new":
                await self._save(NewStep(name, seq, PATCH_KIND, "done", "true"))
        self._patches[patch_id] = answer != "old"
        return answer != "old"

    def _patch_answer(self, patch_id: str, name: str) -> PatchAnswer:
        stored = self._by_seq.get(self._seq)
        if self._determinism == "by-name" and name in self._by_name:
            return "marker"
        return patch_answer(
            None if stored is None else StepCall(stored.name, stored.kind), patch_id
        )

    @_one_call
    async def deprecate_patch(self, patch_id: str) -> None:
        """D8: the patch's old branch is gone: a marker stored at this position is consumed (a
        run that took the new path replays on), and nothing is stored otherwise."""
        patch_id = check_event_name(patch_id, "patch id")
        if patch_id in self._patches:
            return
        name = patch_step_name(patch_id)
        await self._loaded()
        if self._patch_answer(patch_id, name) == "marker":
            self._take(name, PATCH_KIND)
        self._patches[patch_id] = True

    def _stale(self, what: str) -> JobLeaseStaleError:
        run = self._run
        return JobLeaseStaleError(
            f"job {run.job_id!r} run {run.run_id!r} (claim token {run.token}): {what} was not"
            " stored: the claim is no longer current (another worker may hold the run) or the"
            " step was stored by another holder. Nothing was stored.",
            fix="nothing to undo: the run's current holder replays the stored steps.",
        )

    async def _save(self, step: NewStep, *, scope: Any = None) -> None:  # noqa: ANN401
        if not await self._store.save_step(self._run, step, scope=scope):
            raise self._stale(f"step {step.name!r}")

    @_one_call
    async def step(
        self,
        name: str,
        fn: Callable[[], Awaitable[T]],
        *,
        result: type[Any] | PayloadCodec[Any] | None = None,
        retry: StepRetry | None = None,
    ) -> T:
        """D1: ``fn()`` once per run; its result stored (encoded by ``result``: a type or a
        codec, None for JSON as is) before this returns, and returned decoded on every replay
        (the first execution returns the decoded form too, so both see the same value)."""
        _require_callable(fn, f"step {name!r}'s fn")
        seq, stored = await self._begin(name, "step")
        codec = codec_for(result)
        if stored is not None:
            return self._decode(codec, stored, seq)  # type: ignore[no-any-return]
        tries = 1 if retry is None else retry.attempts
        for try_number in range(1, tries + 1):
            try:
                value = await _awaited(fn(), f"step {name!r}'s fn")
                break
            except Exception:
                if try_number >= tries:
                    raise
                assert retry is not None  # noqa: S101 - tries > 1 only with a retry
                await self._clock.sleep(retry.delay_before(try_number + 1))
        encoded = _encode(codec.encode(value), f"the result of step {name!r}")
        await self._save(NewStep(name, seq, "step", "done", encoded))
        return codec.decode(json.loads(encoded))  # type: ignore[no-any-return]

    @_one_call
    async def transaction(
        self,
        name: str,
        uow: UnitOfWorkLike,
        fn: Callable[[Any], Awaitable[T]],
        *,
        result: type[Any] | PayloadCodec[Any] | None = None,
        completes_run: bool = False,
    ) -> T:
        """D2: ``fn(repositories)`` inside ``uow.run`` (the run's tenant by default), the step's
        result stored in the same transaction: its writes, outbox messages and idempotency
        records happen exactly once however often the run is replayed. A holder that lost its
        claim meanwhile has its transaction rolled back (JobLeaseStaleError).

        ``completes_run=True`` (J13): the transaction begins with the claim's fence and ends
        with the run's completion, so the step, its writes and the completion commit together;
        the handler then returns (any later workflow call is refused)."""
        _require_callable(getattr(uow, "run", None), f"transaction {name!r}'s uow.run")
        _require_callable(fn, f"transaction {name!r}'s fn")
        seq, stored = await self._begin(name, "transaction")
        codec = codec_for(result)
        if stored is not None:
            return self._decode(codec, stored, seq)  # type: ignore[no-any-return]
        if completes_run:
            self._check_last(seq)
        run = self._run

        async def in_transaction(repositories: Any) -> str:  # noqa: ANN401
            self.completion_sent = None
            if completes_run:
                await self._fence()
            self._in_transaction = True
            try:
                value = await _awaited(fn(repositories), f"transaction {name!r}'s fn")
            finally:
                self._in_transaction = False
            encoded = _encode(codec.encode(value), f"the result of transactional step {name!r}")
            await self._save(NewStep(name, seq, "transaction", "done", encoded))
            if completes_run:
                settlement = completed(run)
                outcome = await fenced_completion(self._backend, run, settlement)
                self.completion_sent = (settlement, outcome)
            return encoded

        try:
            encoded = await uow.run(in_transaction)
        finally:
            # Once a completion was sent the run stays unheartbeated to the handler's end: it is
            # completed, or the runtime reads its row (the COMMIT's answer lost); a heartbeat
            # would only be refused and read as a lost lease.
            if self._cancellation is not None and self.completion_sent is None:
                self._cancellation.fenced = False
        self.completed_run = self.completion_sent
        return codec.decode(json.loads(encoded))  # type: ignore[no-any-return]

    async def _fence(self) -> None:
        """J13: the claim fenced as the transaction's first statement (its row locked to the
        end; no heartbeat meanwhile); a stale claim or a committed cancel rolls the transaction
        back."""
        await take_fence(self._backend, self._run, self._cancellation)

    @_one_call
    async def sleep(self, name: str, duration: float | timedelta) -> None:
        """D3: suspend the run for ``duration`` (its slot, lease and attempt released); it is
        claimed again once due. The wake time is stored at the first call, so a replay sleeps
        until the same instant."""
        seconds = _seconds(duration, "sleep duration")
        await self._sleep(name, NewStep(name, 0, "sleep", "waiting", wake_after=seconds))

    @_one_call
    async def sleep_until(self, name: str, when: datetime) -> None:
        """D3: suspend the run until ``when`` (timezone-aware, within range in UTC; J23)."""
        require_aware(when, "sleep_until's when")
        await self._sleep(name, NewStep(name, 0, "sleep", "waiting", wake_at=when))

    async def _sleep(self, name: str, new: NewStep) -> None:
        seq, stored = await self._begin(name, "sleep")
        if stored is not None:
            if stored.state == "done":
                return
            if stored.due:
                # Recorded done once, so operators see it slept (D6 lists it).
                await self._save(NewStep(name, stored.seq, "sleep", "done"))
                return
            raise WorkflowSuspended(Suspend(self._run, NewStep.of(stored), "sleep"))
        raise WorkflowSuspended(Suspend(self._run, attrs.evolve(new, seq=seq), "sleep"))

    @_one_call
    async def wait_for_event(
        self,
        name: str,
        event: str,
        *,
        key: str | None = None,
        timeout: float | timedelta | None = None,  # noqa: ASYNC109 - durable, the database's clock
    ) -> WorkflowEvent | None:
        """D4: suspend until an event ``event`` (with ``key``) commits after this wait began,
        and return it; or None once ``timeout`` passed (judged by the database's clock). The
        outcome is stored as the step's result. The wait begins when the run first suspends
        here; to begin it earlier (before a step that makes the event happen), use
        :meth:`expect_event`."""
        new = _event_step(name, event, key, timeout)
        seq, stored = await self._begin(name, "event")
        if stored is None:
            raise WorkflowSuspended(Suspend(self._run, attrs.evolve(new, seq=seq), "event"))
        return await self._await_event(stored)

    @_one_call
    async def expect_event(
        self,
        name: str,
        event: str,
        *,
        key: str | None = None,
        timeout: float | timedelta | None = None,  # noqa: ASYNC109 - durable, the database's clock
    ) -> EventWait:
        """D4: begin a wait for ``event`` (with ``key``) NOW, without suspending, so that an
        event committed from here on is its result, also one that comes before the handler
        reaches :meth:`EventWait.wait` (a webhook answering the request the next step sends).
        The timeout runs from now. Stored as step ``name``; ``await handle.wait()`` later."""
        new = _event_step(name, event, key, timeout)
        seq, stored = await self._begin(name, "event")
        if stored is None:
            stored = await self._store.begin_wait(self._run, attrs.evolve(new, seq=seq))
            if stored is None:
                raise self._stale(f"wait {name!r}")
        return EventWait(self, stored)

    async def _await_event(self, stored: StepRecord) -> WorkflowEvent | None:
        """A stored event wait: its stored outcome, or the matching event (stored), or the
        timeout (stored), or suspend again."""
        if stored.state == "done":
            return _event_of(stored.result)
        matched = await self._store.match_event(self._run.run_id, stored)
        if matched is not None:
            outcome: dict[str, Any] = {
                "event": {
                    "name": matched.name,
                    "key": matched.key,
                    "payload": matched.payload,
                    "id": matched.event_id,
                }
            }
        elif stored.due:
            outcome = {"timeout": True}
        else:
            raise WorkflowSuspended(Suspend(self._run, NewStep.of(stored), "event"))
        encoded = _encode(outcome, f"wait {stored.name!r}")
        await self._save(NewStep(stored.name, stored.seq, "event", "done", encoded))
        return matched

    @_one_call
    async def spawn(
        self,
        name: str,
        job: JobDefinition[Any],
        payloads: Sequence[Any],
    ) -> list[str]:
        """D5: enqueue one child run of ``job`` per payload, once however often this is
        replayed (their ids are ``<run id>/<step>/<i>``); the child run ids."""
        payloads = _spawn_arguments(name, job, payloads)
        seq, stored = await self._begin(name, "spawn")
        if stored is not None:
            return list(stored.result)
        await self._require_served(name, job)
        run_id = self._run.run_id
        ids = [child_run_id(run_id, name, i) for i in range(len(payloads))]
        results = await self._backend.enqueue_many(
            job,
            [EnqueueRequest(payload=p, run_id=i) for p, i in zip(payloads, ids, strict=True)],
        )
        refused = [i for i, r in zip(ids, results, strict=True) if not r.accepted]
        if refused:
            raise ChildRunsRefusedError(
                f"step {name!r} of run {run_id!r}: {len(refused)} child runs of job {job.id!r}"
                " were refused (queue full); the attempt fails and the spawn is retried.",
                fix="raise the backend's queue_depth_limit, or spawn fewer children at once.",
            )
        await self._store.adopt_children(self._run, ids)
        await self._save(NewStep(name, seq, "spawn", "done", _encode(ids, f"spawn {name!r}")))
        return ids

    async def _require_served(self, name: str, job: JobDefinition[Any]) -> None:
        """D5: a parent must never wait unseen: a spawn of a job that no live worker declares
        is refused while the worker registry lists live workers (F6). Without a registry
        (:meth:`WorkerRegistry.probe` says why) nothing is known, and the spawn goes ahead; the
        dashboard's backlog and ``jobs stats`` then show the job's live workers as none."""
        registry = self._backend.workers
        if await registry.probe() is not None:
            return
        records = await registry.list_workers(limit=MAX_WORKERS_LISTED)
        serving = serving_of(records, now=self._clock.now())
        if not serving.unserved(job.id):
            return
        closest = serving.closest(job.id)
        raise ChildJobUnservedError(
            f"step {name!r} of run {self._run.run_id!r} spawns job {job.id!r}, which none of the"
            f" {serving.live_workers} live worker(s) declares: its children would wait unseen"
            " (and this run with them). The attempt fails; the spawn runs again at the retry.",
            fix=f"start a worker whose registry defines {job.id!r}"
            + (f" (did you mean {closest!r}?)" if closest else "")
            + ", or spawn a job the workers run.",
        )

    @_one_call
    async def wait_for_children(self, name: str) -> list[ChildOutcome]:
        """D5: suspend until every child run of this run is terminal, then return how each
        ended (in creation order); stored as the step's result, so the continuation after it
        runs once per run, however many children there were."""
        seq, stored = await self._begin(name, "children")
        if stored is not None and stored.state == "done":
            return [ChildOutcome(**c) for c in stored.result]
        children = await self._store.children(self._run.run_id)
        if any(c.state not in TERMINAL_STATES for c in children):
            step = (
                NewStep.of(stored)
                if stored is not None
                else NewStep(name, seq, "children", "waiting")
            )
            raise WorkflowSuspended(Suspend(self._run, step, "children"))
        encoded = _encode([attrs.asdict(c) for c in children], f"wait {name!r}")
        await self._save(
            NewStep(name, seq if stored is None else stored.seq, "children", "done", encoded)
        )
        return children


def child_run_id(parent_id: str, step: str, index: int) -> str:
    """The durable id of child ``index`` spawned by ``step`` of run ``parent_id`` (D5: the same
    on every replay, so a replayed spawn enqueues nothing new): ``<parent>/<step>/<index>``, or,
    when that would pass the run id bound, a hash of the parent and step in its place."""
    plain = f"{parent_id}/{step}/{index}"
    if len(plain) <= MAX_KEY_CHARS:
        return plain
    digest = hashlib.sha256(f"{parent_id}\x1f{step}".encode()).hexdigest()[:40]
    return f"wf-{digest}/{index}"


def _event_step(
    name: str, event: str, key: str | None, timeout: float | timedelta | None
) -> NewStep:
    """A new event wait's step (its position set by the caller), its inputs checked."""
    event = check_event_name(event)
    event_key = check_event_key(key)
    wake_after = None if timeout is None else _seconds(timeout, "wait timeout")
    return NewStep(
        name,
        0,
        "event",
        "waiting",
        wake_at=NEVER if wake_after is None else None,
        wake_after=wake_after,
        event_name=event,
        event_key=event_key,
    )


class EventWait:
    """A wait :meth:`Workflow.expect_event` began (D4): :meth:`wait` suspends until its event
    (or its timeout), as :meth:`Workflow.wait_for_event` does."""

    __slots__ = ("_done", "_result", "_step", "_workflow")

    def __init__(self, workflow: Workflow, step: StepRecord) -> None:
        self._workflow = workflow
        self._step = step
        self._done = False
        self._result: WorkflowEvent | None = None

    @property
    def name(self) -> str:
        return self._step.name

    async def wait(self) -> WorkflowEvent | None:
        """The event committed since the wait began (stored), or None at its timeout; suspends
        the run until one of them. Answers the same on every call."""
        if not self._done:
            self._result = await self._workflow._await_event(self._step)  # noqa: SLF001
            self._done = True
        return self._result


def _event_of(result: Any) -> WorkflowEvent | None:  # noqa: ANN401 - a stored wait's JSON
    got = result.get("event") if isinstance(result, dict) else None
    if got is None:
        return None
    return WorkflowEvent(got["name"], got["key"], got["payload"], got["id"])
