"""Consumers (SPEC §15, C1-C3): an external stream read per key, built on jobs, not a second
engine.

:func:`define_consumer` declares two jobs:

- the **per-key job** (id: the consumer's id), one run per key: payload ``{"key": key}``,
  deduplicated by the key while a run of it is not terminal (J1), single runner per key
  fleet-wide (J4: a busy key waits, its attempt unspent, J7), no timeout. Its handler is
  the batch loop below;
- the **supervisor** (id: ``<id>.supervisor``), on a UTC cron schedule every ``rearm`` minutes
  (whole minutes dividing an hour, J9), which asks ``keys(ctx)`` and enqueues one run per key:
  a key whose run is live is deduplicated, a key whose run ended starts again. Nothing else
  may enqueue a run of the per-key job (:class:`ConsumerRunEnqueueError`): its payload codec
  refuses to encode outside the supervisor.

The batch loop of one run (C1): the key's cursor is loaded (``cursor.load(key, repositories)``,
in a transaction of its own), ``open(ctx, key, cursor)`` yields items, and up to ``batch`` of
them at a time are handed to ``handle(ctx, key, items, repositories)`` inside
``transaction.run``; the transaction's first statement is the J13 fence of the run's claim
(:meth:`~ship_sqla.kernel.JobContext.fenced_transaction`: a stale holder commits nothing,
J14) and its last the ``cursor.save(key, next, repositories)`` of the cursor ``handle``
returned. So a batch's effects and its cursor commit together or not at all, one transaction
per batch (a run-long transaction would hold the MVCC horizon for the run's life). A failed
batch rolls back whole and the run's attempt fails (K4): its next attempt reloads the committed
cursor, so only that batch is delivered again (at least once per item). The run completes when
the stream ends, and stops after the batch in hand when the runtime drains
(``ctx.draining``, J12); a drain's deadline cancels the batch in hand, which rolls back whole.

C3: inside each batch's transaction, after ``handle``, the key's lag (``lag(ctx, key,
cursor)``, the application's ``total - done``, when declared) and the batch's time are recorded
on the run (:meth:`~ship_sqla.kernel.FencedRuns.record_progress`, fenced on the claim's token:
``RunRecord.progress``, ``ship-sqla jobs show``, the dashboard's run and Consumers pages), so
they commit with the batch. After the commit they are kept for this process
(:meth:`Consumer.progress`), recorded as metrics (:mod:`ship_sqla.kernel._consumer_metrics`)
and logged (``ship_sqla.consumers``, DEBUG).
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import AsyncIterable, AsyncIterator
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar, runtime_checkable

import attrs

from ship_sqla.kernel._backend_base import MAX_ENQUEUE_BATCH
from ship_sqla.kernel._consumer_metrics import consumer_metrics
from ship_sqla.kernel._durations import MAX_LEASE, require_duration
from ship_sqla.kernel._errors import ConfigurationError, UsageError
from ship_sqla.kernel._jobs import (
    Concurrency,
    IdempotencyPolicy,
    JobDefinition,
    RetryPolicy,
    Schedule,
    define_job,
    is_job_id,
    require_unit_of_work,
)
from ship_sqla.kernel._keys import require_key
from ship_sqla.kernel._ports import EnqueueRequest, JobLeaseStaleError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping

    from ship_sqla.kernel._job_context import JobContext
    from ship_sqla.kernel._workflows import UnitOfWorkLike

__all__ = [
    "DEFAULT_CONSUMER_BATCH",
    "MAX_CONSUMER_BATCH",
    "Consumer",
    "ConsumerCursor",
    "ConsumerCursorError",
    "ConsumerDeclarationError",
    "ConsumerProgress",
    "ConsumerRunEnqueueError",
    "define_consumer",
    "progress_summary",
    "run_progress",
]

logger = logging.getLogger("ship_sqla.consumers")

C = TypeVar("C")
Item = TypeVar("Item")

DEFAULT_CONSUMER_BATCH: Final = 100
"""Items per batch (one transaction) unless a consumer declares ``batch``."""
MAX_CONSUMER_BATCH: Final = 10_000
"""The most items one batch may hold: a batch is one transaction, and its items are in memory."""
DEFAULT_REARM_MINUTES: Final = 1
"""How often the supervisor re-arms every key unless a consumer declares ``rearm``."""
_REARM_CHOICES: Final = (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60)
_SUPERVISOR_SUFFIX: Final = ".supervisor"

# The consumer whose supervisor is enqueueing right now (this task only): the per-key job's
# codec encodes a payload for nobody else.
_arming: ContextVar[str | None] = ContextVar("ship_sqla_consumer_arming", default=None)


class ConsumerDeclarationError(ConfigurationError):
    """A consumer declaration cannot work (C1, C2): a timeout, no cursor seam, a batch out of
    bounds, a rearm that is not whole minutes dividing an hour, a missing function; or one of
    its functions answered something it cannot use (``keys`` or ``lag``)."""

    code = "SHIP_SQLA_CONSUMER_INVALID"


class ConsumerRunEnqueueError(UsageError, RuntimeError):
    """A run of a consumer's per-key job was enqueued by hand (C2): only its supervisor starts
    them, one per key, so that a key never has two runs and its cursor one writer."""

    code = "SHIP_SQLA_CONSUMER_ENQUEUE_REFUSED"


class ConsumerCursorError(UsageError, ValueError):
    """A consumer's ``handle`` returned no cursor, or one before the batch's starting cursor
    (C1: a cursor never moves backwards). The batch rolled back whole."""

    code = "SHIP_SQLA_CONSUMER_CURSOR"


@runtime_checkable
class ConsumerCursor(Protocol[C]):
    """Where a consumer's cursors live: the application's own storage (a row per key), read
    and written through the consumer's unit of work. ``save`` runs inside the batch's
    transaction, so a batch and the cursor past it commit together (C1)."""

    async def load(self, key: str, repositories: Any) -> C | None:  # noqa: ANN401 - the uow's
        """Where ``key`` stopped; None before its first committed batch."""
        ...

    async def save(self, key: str, cursor: C, repositories: Any) -> None:  # noqa: ANN401
        """Store ``cursor`` as ``key``'s position, in the active transaction."""
        ...


@attrs.frozen
class ConsumerProgress:
    """One key's last committed batch, as this process saw it (C3). ``lag`` is the
    consumer's ``lag(ctx, key, cursor)`` after it (None when none is declared);
    ``batches`` and ``items`` count what this process committed for the key."""

    key: str
    cursor: Any
    lag: int | None
    last_batch_at: datetime
    batches: int
    items: int


class _KeyPayload:
    """The per-key job's codec: ``{"key": str}``, encoded only for its supervisor (C2)."""

    def __init__(self, consumer_id: str) -> None:
        self._consumer_id = consumer_id

    def encode(self, value: Any) -> Any:  # noqa: ANN401 - the codec protocol's
        if _arming.get() != self._consumer_id:
            raise ConsumerRunEnqueueError(
                f"consumer {self._consumer_id!r}: its runs are started by its supervisor"
                f" ({self._consumer_id}{_SUPERVISOR_SUFFIX!s}), one per key; an enqueue by"
                " hand is refused, so a key never has two runs and its cursor one writer.",
                fix="add the key to what the consumer's keys() returns: the supervisor starts"
                " it at its next tick (every rearm minutes).",
            )
        return self.decode(value)

    def decode(self, data: Any) -> Any:  # noqa: ANN401 - the codec protocol's
        if not isinstance(data, dict) or set(data) != {"key"}:
            raise ConsumerRunEnqueueError(
                f"consumer {self._consumer_id!r}: a run's payload is {{'key': str}}, got {data!r}.",
                fix="let the supervisor enqueue the consumer's runs.",
            )
        require_key(data["key"], f"consumer {self._consumer_id!r}'s key")
        return data


class Consumer(Generic[Item, C]):
    """A declared consumer (:func:`define_consumer`): its per-key :attr:`job` and its
    :attr:`supervisor`; register both (``JobRegistry([*consumer.jobs])``). Iterating it
    yields the two as well."""

    __slots__ = (
        "_cursor",
        "_handle",
        "_keys",
        "_lag",
        "_open",
        "_progress",
        "_transaction",
        "batch",
        "id",
        "job",
        "rearm",
        "supervisor",
    )

    def __init__(
        self,
        consumer_id: str,
        *,
        keys: Callable[[JobContext[Any]], Awaitable[Iterable[str]]],
        open: Callable[[JobContext[Any], str, C | None], AsyncIterable[Item]],  # noqa: A002
        handle: Callable[[JobContext[Any], str, list[Item], Any], Awaitable[C]],
        cursor: ConsumerCursor[C],
        transaction: UnitOfWorkLike,
        batch: int,
        rearm: int,
        lag: Callable[[JobContext[Any], str, C], Awaitable[int]] | None,
        lease: float,
        retry: RetryPolicy | None,
    ) -> None:
        self.id = consumer_id
        self.batch = batch
        self.rearm = rearm
        self._keys = keys
        self._open = open
        self._handle = handle
        self._cursor = cursor
        self._transaction = transaction
        self._lag = lag
        self._progress: dict[str, ConsumerProgress] = {}
        self.job: JobDefinition[dict[str, str]] = define_job(
            consumer_id,
            self._consume,
            payload=_KeyPayload(consumer_id),
            # One live run per key: the supervisor's re-arm of a running key is deduplicated.
            idempotency=IdempotencyPolicy(key=_key_of),
            # The backstop the dedupe alone cannot be: two runs of one key never run at once.
            concurrency=Concurrency(single_runner=True, key=_key_of, lease=lease),
            retry=retry,
        )
        self.supervisor: JobDefinition[dict[str, Any]] = define_job(
            consumer_id + _SUPERVISOR_SUFFIX,
            self._arm,
            payload=dict,
            schedule=Schedule(cron=_rearm_cron(rearm), timezone="UTC"),
            concurrency=Concurrency(single_runner=True),
        )

    @property
    def jobs(self) -> tuple[JobDefinition[Any], JobDefinition[Any]]:
        """The per-key job and the supervisor, to register together."""
        return (self.job, self.supervisor)

    def __iter__(self) -> Iterator[JobDefinition[Any]]:
        return iter(self.jobs)

    def progress(self, key: str) -> ConsumerProgress | None:
        """C3: ``key``'s last batch committed by this process, or None."""
        return self._progress.get(key)

    def __repr__(self) -> str:
        return f"Consumer(id={self.id!r}, batch={self.batch}, rearm={self.rearm}m)"

    # --- the supervisor (C2) ------------------------------------------------------------------

    async def _arm(self, ctx: JobContext[Any], _payload: dict[str, Any]) -> None:
        """Ask ``keys(ctx)`` and enqueue one run per key (a live one is deduplicated)."""
        listed = await self._keys(ctx)
        if isinstance(listed, str) or not hasattr(listed, "__iter__"):
            raise ConsumerDeclarationError(
                f"consumer {self.id!r}: keys() returned {listed!r}, not a list of keys.",
                fix="return the keys to consume, e.g. ['orders'] or one per partition.",
            )
        keys = list(
            dict.fromkeys(require_key(key, f"consumer {self.id!r}'s key") for key in listed)
        )
        backend = ctx.backend
        started = 0
        token = _arming.set(self.id)
        try:
            for first in range(0, len(keys), MAX_ENQUEUE_BATCH):
                chunk = keys[first : first + MAX_ENQUEUE_BATCH]
                results = await backend.enqueue_many(
                    self.job, [EnqueueRequest({"key": key}) for key in chunk]
                )
                started += sum(
                    1 for result in results if result.accepted and not result.deduplicated
                )
        finally:
            _arming.reset(token)
        logger.debug("consumer %s armed %d keys, %d started", self.id, len(keys), started)

    # --- one key's run (C1, C3) ---------------------------------------------------------------

    async def _consume(self, ctx: JobContext[Any], payload: dict[str, str]) -> None:
        """The batch loop (the module docstring): until the stream ends or the runtime drains."""
        key = payload["key"]
        seam = self._cursor

        async def load(repositories: Any) -> C | None:  # noqa: ANN401 - the uow's
            return await seam.load(key, repositories)

        position: C | None = await self._transaction.run(load)
        # Renewed before the first batch too: the claim may be older than a third of its lease
        # by now (the lock's wait, the cursor's load, the stream's first read).
        renewed = -math.inf
        stream = _iterator(self._open(ctx, key, position), self.id)
        batches = items = 0
        try:
            ended = False
            while not ended and not ctx.draining:
                taken: list[Item] = []
                # A drain that begins while items are taken commits the batch in hand.
                while len(taken) < self.batch and not ctx.draining:
                    try:
                        taken.append(await anext(stream))
                    except StopAsyncIteration:
                        ended = True
                        break
                if not taken:
                    break
                renewed = await _renew_lease(ctx, renewed)
                position, lag, at = await self._commit(
                    ctx, key, taken, position, done=(batches, items)
                )
                batches += 1
                items += len(taken)
                self._report(key, position, len(taken), lag, at)
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()
        logger.info(
            "consumer %s key %r: %d batches, %d items, %s",
            self.id,
            key,
            batches,
            items,
            "drained" if ctx.draining else "stream ended",
        )

    async def _commit(
        self,
        ctx: JobContext[Any],
        key: str,
        items: list[Item],
        before: C | None,
        *,
        done: tuple[int, int],
    ) -> tuple[C, int | None, datetime]:
        """C1: ``handle`` and the cursor past its batch, in one fenced transaction (J13); C3:
        the key's lag after it and the batch's time, recorded on the run in that transaction
        too (:meth:`~ship_sqla.kernel.FencedRuns.record_progress`). ``done``: the batches and
        items this run committed before this one."""

        async def apply(repositories: Any) -> tuple[C, int | None, datetime]:  # noqa: ANN401
            after = await self._handle(ctx, key, items, repositories)
            self._check_cursor(key, before, after)
            lag = await self._lag_after(ctx, key, after)
            at = ctx.backend.clock.now()
            progress = run_progress(
                lag=lag,
                at=at,
                batch_items=len(items),
                batches=done[0] + 1,
                items=done[1] + len(items),
            )
            if not await ctx.backend.record_progress(ctx.run, progress):
                raise JobLeaseStaleError(
                    f"consumer {self.id!r} key {key!r}: run {ctx.run.run_id!r} (claim token"
                    f" {ctx.run.token}) is no longer held; the batch was rolled back.",
                    fix="nothing to undo: the run's current holder goes on from the committed"
                    " cursor.",
                )
            await self._cursor.save(key, after, repositories)
            return after, lag, at

        return await ctx.fenced_transaction(self._transaction, apply)

    def _check_cursor(self, key: str, before: C | None, after: C | None) -> None:
        """C1: a cursor is never None after a batch, nor before where it started (when the two
        are ordered values: numbers, text, times, tuples)."""
        if after is None:
            raise ConsumerCursorError(
                f"consumer {self.id!r} key {key!r}: handle() returned None instead of the cursor"
                " past its batch; the batch was rolled back.",
                fix="return the cursor after the batch's last item (e.g. its offset or id).",
            )
        if before is None:
            return
        try:
            backwards = bool(after < before)  # type: ignore[operator]
        except TypeError:  # not ordered values: the fence keeps one writer, equality is enough
            return
        if backwards:
            raise ConsumerCursorError(
                f"consumer {self.id!r} key {key!r}: handle() returned cursor {after!r}, before"
                f" the batch's start {before!r}; a cursor never moves backwards, and the batch"
                " was rolled back.",
                fix="return the cursor after the batch's last item, never an earlier one.",
            )

    async def _lag_after(self, ctx: JobContext[Any], key: str, position: C) -> int | None:
        """C3: ``lag(ctx, key, cursor)`` past the batch (None when none is declared)."""
        if self._lag is None:
            return None
        answered: object = await self._lag(ctx, key, position)
        if not isinstance(answered, int) or isinstance(answered, bool):
            raise ConsumerDeclarationError(
                f"consumer {self.id!r} key {key!r}: lag() returned {answered!r}, not an int;"
                " the batch was rolled back.",
                fix="return total - done as an int, in the stream's own unit.",
            )
        return answered

    def _report(self, key: str, position: C, count: int, lag: int | None, at: datetime) -> None:
        """C3: the key's lag and last batch time, after its commit: kept for this process,
        recorded as metrics and logged (the run's row has them already)."""
        earlier = self._progress.get(key)
        self._progress[key] = ConsumerProgress(
            key=key,
            cursor=position,
            lag=lag,
            last_batch_at=at,
            batches=(earlier.batches if earlier else 0) + 1,
            items=(earlier.items if earlier else 0) + count,
        )
        consumer_metrics().record_batch(self.id, key, count, at.timestamp(), lag)
        logger.debug("consumer %s key %r: batch of %d committed, lag %s", self.id, key, count, lag)


def progress_summary(progress: Mapping[str, Any] | None) -> str:
    """C3: a consumer run's last batch, in one line: its lag (the application's unit), when it
    committed, and the run's batches and items; ``-`` for a run that records none."""
    if progress is None:
        return "-"
    lag = progress.get("lag")
    parts = [
        f"lag {'-' if lag is None else lag}",
        f"last batch {progress.get('last_batch_at', '-')}",
    ]
    if "batches" in progress or "items" in progress:
        parts.append(f"{progress.get('batches', '-')} batches, {progress.get('items', '-')} items")
    return ", ".join(parts)


def run_progress(
    *, lag: int | None, at: datetime, batch_items: int, batches: int, items: int
) -> dict[str, Any]:
    """C3: what a consumer's batch records on its run (:attr:`RunRecord.progress
    <ship_sqla.kernel.RunRecord.progress>`): the lag, the batch's time (ISO-8601), its items,
    and this run's batches and items so far. The cursor is not recorded: it is the
    application's value, of any size, and may carry a vendor's token."""
    return {
        "lag": lag,
        "last_batch_at": at.isoformat(),
        "batch_items": batch_items,
        "batches": batches,
        "items": items,
    }


async def _renew_lease(ctx: JobContext[Any], renewed: float) -> float:
    """Heartbeat the run before a batch unless it was renewed within a third of its lease: the
    batch's transaction holds the run's row (no heartbeat goes out meanwhile), so it starts
    with a whole lease and the runtime's next heartbeat after it finds the lease alive. A lease
    already gone (another worker may hold the run) ends the run: JobLeaseStaleError."""
    backend = ctx.backend
    run = ctx.run
    now = backend.clock.monotonic()
    if now - renewed < run.lease / 3:
        return renewed
    [alive] = await backend.heartbeat([run])
    if not alive:
        raise JobLeaseStaleError(
            f"job {run.job_id!r} run {run.run_id!r} (claim token {run.token}): its lease lapsed"
            " or another worker took the run before the next batch; nothing more is consumed.",
            fix="nothing to undo: every batch committed so far is kept, and the run's current"
            " holder goes on from the committed cursor.",
        )
    return now


def _key_of(payload: dict[str, str]) -> str:
    return payload["key"]


def _iterator(stream: object, consumer_id: str) -> AsyncIterator[Any]:
    if isinstance(stream, AsyncIterator):
        return stream
    if isinstance(stream, AsyncIterable):
        return aiter(stream)
    if inspect.iscoroutine(stream):
        stream.close()  # an `async def` that returns: never awaited, so never run
    raise ConsumerDeclarationError(
        f"consumer {consumer_id!r}: open() returned {type(stream).__name__}, not an async"
        " iterable of items.",
        fix="make open an async generator: async def open(ctx, key, cursor): ... yield item",
    )


def _rearm_cron(minutes: int) -> str:
    if minutes == 60:  # noqa: PLR2004 - an hour
        return "0 * * * *"
    return "* * * * *" if minutes == 1 else f"*/{minutes} * * * *"


def _rearm_minutes(consumer_id: str, rearm: object) -> int:
    seconds = rearm.total_seconds() if isinstance(rearm, timedelta) else None
    minutes = seconds / 60 if seconds is not None else rearm
    if (
        isinstance(minutes, bool)
        or not isinstance(minutes, int | float)
        or minutes not in _REARM_CHOICES
    ):
        raise ConsumerDeclarationError(
            f"consumer {consumer_id!r}: rearm={rearm!r}; the supervisor's UTC cron ticks in"
            f" whole minutes that divide an hour ({', '.join(map(str, _REARM_CHOICES))}).",
            fix=f"pass rearm={DEFAULT_REARM_MINUTES} (minutes) or timedelta(minutes=5).",
        )
    return int(minutes)


def _require_function(consumer_id: str, name: str, value: object, signature: str) -> None:
    if not callable(value):
        raise ConsumerDeclarationError(
            f"consumer {consumer_id!r}: {name} must be a function, got {value!r}.",
            fix=f"pass {name}={signature}.",
        )


def _check_declaration(
    id: str,  # noqa: A002 - the consumer's id
    *,
    timeout: object,
    cursor: object,
    functions: tuple[object, object, object, object],
    batch: object,
) -> None:
    """The refusals of :func:`define_consumer` (C2): a bad id, a timeout, no cursor seam, a
    missing function, a batch out of bounds."""
    if not is_job_id(id) or not is_job_id(id + _SUPERVISOR_SUFFIX):
        raise ConsumerDeclarationError(
            f"consumer id {id!r} is not valid: it is a job id, and so is {id}{_SUPERVISOR_SUFFIX}.",
            fix="use 1-117 characters: letters, digits and _ . : - (not starting with a symbol).",
        )
    if timeout is not None:
        raise ConsumerDeclarationError(
            f"consumer {id!r} declares timeout={timeout!r}: a timeout would cut a long-lived"
            " stream mid-batch on a schedule nobody chose; a consumer's run ends when its stream"
            " does, or when a drain stops it after its batch in hand.",
            fix="drop timeout=; bound a slow handle() inside it if it calls something slow.",
        )
    if not (callable(getattr(cursor, "load", None)) and callable(getattr(cursor, "save", None))):
        raise ConsumerDeclarationError(
            f"consumer {id!r} declares no cursor seam (got {cursor!r}): a restart would read the"
            " stream from the start, and no batch could commit its position.",
            fix="pass cursor= an object with async load(key, repositories) and async save(key,"
            " cursor, repositories) over a table of your own (one row per key).",
        )
    keys, open_, handle, lag = functions
    _require_function(id, "keys", keys, "async def keys(ctx): return ['orders']")
    _require_function(id, "open", open_, "async def open(ctx, key, cursor): ... yield item")
    _require_function(
        id, "handle", handle, "async def handle(ctx, key, items, repositories): return cursor"
    )
    if lag is not None:
        _require_function(id, "lag", lag, "async def lag(ctx, key, cursor): return total - done")
    size: object = batch
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_CONSUMER_BATCH:
        raise ConsumerDeclarationError(
            f"consumer {id!r}: batch={batch!r}; a batch is a whole number of items from 1 to"
            f" {MAX_CONSUMER_BATCH:,} (one transaction each).",
            fix=f"omit batch for the default ({DEFAULT_CONSUMER_BATCH}), or pass an int in range.",
        )


def define_consumer(
    id: str,  # noqa: A002 - a job's id, as define_job names it
    *,
    keys: Callable[[JobContext[Any]], Awaitable[Iterable[str]]],
    open: Callable[[JobContext[Any], str, C | None], AsyncIterable[Item]],  # noqa: A002 - C1
    handle: Callable[[JobContext[Any], str, list[Item], Any], Awaitable[C]],
    cursor: ConsumerCursor[C],
    transaction: UnitOfWorkLike,
    batch: int = DEFAULT_CONSUMER_BATCH,
    rearm: int | timedelta = DEFAULT_REARM_MINUTES,
    lag: Callable[[JobContext[Any], str, C], Awaitable[int]] | None = None,
    lease: float | timedelta = 30.0,
    retry: RetryPolicy | None = None,
    timeout: object = None,
) -> Consumer[Item, C]:
    """Declare a consumer (SPEC §15 C1-C3): an external stream read per key, at least once per
    item, its cursor committed with each batch. Register ``consumer.jobs``.

    - ``keys(ctx)``: the keys to consume (a broker's partitions, a vendor's accounts, one
      table: ``["orders"]``), asked by the supervisor every ``rearm`` minutes.
    - ``open(ctx, key, cursor)``: the stream's items from ``cursor`` (None: from the start), an
      async iterable; when it ends, the run completes (the supervisor starts it again).
    - ``handle(ctx, key, items, repositories)``: one batch, inside ``transaction.run``,
      returning the cursor past it; idempotent per item (a rolled-back batch is delivered
      again).
    - ``cursor``: a :class:`ConsumerCursor` (``load(key, repositories)``, ``save(key, cursor,
      repositories)``), the application's storage; ``save`` runs in the batch's transaction.
    - ``transaction``: the unit of work of every batch (and of the cursor's load).
    - ``batch``: items per transaction at most, 1 to 10,000 (default 100).
    - ``rearm``: minutes between the supervisor's ticks, dividing an hour (default 1), UTC.
    - ``lag(ctx, key, cursor)``: optional, how far behind the key is (``total - done``) past
      each batch's cursor, asked inside the batch's transaction and recorded on the run with
      it (C3: ``RunRecord.progress``); keep it a cheap read.
    - ``lease``: the per-key run's lease (renewed before each batch and heartbeated between
      them; a batch's transaction holds the run's row, so no claim retakes it meanwhile, and
      one batch must take less than the lease); ``retry``: its retry policy.

    Refused here (:class:`ConsumerDeclarationError`): a ``timeout`` (a consumer runs until its
    stream ends or a drain stops it), no cursor seam, a batch out of bounds, a rearm that is
    not whole minutes dividing an hour, a missing function.
    """
    _check_declaration(
        id, timeout=timeout, cursor=cursor, functions=(keys, open, handle, lag), batch=batch
    )
    require_unit_of_work(f"consumer {id!r}", transaction, ConsumerDeclarationError)
    minutes = _rearm_minutes(id, rearm)
    seconds = lease.total_seconds() if isinstance(lease, timedelta) else lease
    require_duration(seconds, f"consumer {id!r}: lease", maximum=MAX_LEASE)
    return Consumer(
        id,
        keys=keys,
        open=open,
        handle=handle,
        cursor=cursor,
        transaction=transaction,
        batch=batch,
        rearm=minutes,
        lag=lag,
        lease=float(seconds),
        retry=retry,
    )
