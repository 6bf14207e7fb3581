"""Paced backfills (SPEC §15, C4, C5): one pass over a source, in key order, a page at a time,
at a declared rate, each page's progress checkpointed durably, with a ledger an operator (and a
deploy) reads.

Built on jobs, not a second engine. A backfill is a job (:attr:`Backfill.job`) whose runs are
single-runner (one pass at a time, fleet-wide: J4), retried like any job (each attempt resumes
from the last checkpoint), cancelled like any run (K2). Its handler, :class:`_Pass`, walks the
source:

- C4 **one checkpoint per page.** The ledger row (:class:`BackfillLedger`, one per backfill) is
  the checkpoint: after ``handle`` returns, the page's last key, and the page and row counts,
  are written by a compare-and-set on the holder (run id, claim token) and the page count the
  page started from. With ``transaction=`` (a unit of work) the read, ``handle(ctx, rows,
  repositories)`` and the checkpoint are one transaction: each page's effect commits exactly
  once, and a holder that lost the backfill (a retaken lease, a cancel) has its page rolled
  back whole. Without it, ``handle(ctx, rows)`` runs and then the checkpoint commits: a crash
  between the two hands the page to the next attempt again (at least once). Either way a crash
  resumes after the last committed checkpoint, and every row is visited, in key order.

  Why the ledger row and not one workflow step per page: a step per page would store (and load
  at every replay) one row per page in the steps table, 100,000 of them for a 100,000-page pass
  (or a chain of runs to bound it); the one ledger row updated in place holds the same fact (the
  last key committed) at a constant cost, and is what the status, the stalled rule and the
  deploy gate read anyway.
- C4 **paced, fleet-wide, on the injected clock.** ``pace`` is pages per second, greater than
  zero (no unthrottled mode: a pass at full speed is a load test on the database that serves
  the application). A page starts ``1 / pace`` after the previous page started (start to
  start: the page's own work does not slow the rate below the declared one, unless a page
  takes longer than the interval); the first page of a resumed pass starts ``1 / pace`` after
  the last checkpoint, read from the ledger, so a pass resumed by another worker keeps the
  rate, and only one runner exists at a time (single-runner), so the rate holds across the
  fleet. The wait is the ledger's clock's ``sleep`` (a test's FrozenClock
  parks it until advanced), raced against the run's cancellation: a cancel (an operator's, a
  lost lease, a drain) ends the wait at once, never after sitting it out.
- C4 **the ledger**: state (pending, running, completed, cancelled, failed), pages, rows, the
  last key, started, finished, the last progress (``updated_at``) and the stalled rule
  (:meth:`BackfillRecord.stalled_since`: no checkpoint for ``stall_after`` seconds while
  pending or running).
- C5 **the deploy gate**: ``required_by`` ties a backfill to a migration (a revision label);
  :meth:`BackfillRecord.blocks_deploy` and ``ship-sqla backfill verify`` refuse while a required
  backfill is not completed (pending, running, stalled, and also failed or cancelled: none of
  them is done).
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, get_args, runtime_checkable

import attrs

from ship_sqla.kernel._durations import MAX_LEASE, require_duration
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._jobs import (
    Concurrency,
    JobDefinition,
    RetryPolicy,
    define_job,
    is_job_id,
    require_unit_of_work,
)
from ship_sqla.kernel._ports import JobLeaseStaleError

if TYPE_CHECKING:
    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._job_context import JobContext
    from ship_sqla.kernel._workflows import UnitOfWorkLike

__all__ = [
    "BACKFILL_RETRY",
    "BACKFILL_STATES",
    "DEFAULT_PAGE_SIZE",
    "LIVE_BACKFILL_STATES",
    "MAX_PACE",
    "MAX_PAGE_SIZE",
    "Backfill",
    "BackfillLedger",
    "BackfillPage",
    "BackfillRecord",
    "BackfillSource",
    "BackfillState",
    "backfill_dedupe_key",
    "backfill_job_stand_in",
    "define_backfill",
    "encode_key",
]

BackfillState = Literal["pending", "running", "completed", "cancelled", "failed"]
"""A backfill's state in its ledger row: ``pending`` (started, no run began yet), ``running``
(a run holds it), ``completed`` (the source ran out), ``cancelled`` (an operator's cancel),
``failed`` (its run died: every attempt failed; a start resumes it from its last key)."""
BACKFILL_STATES: Final[tuple[BackfillState, ...]] = get_args(BackfillState)
LIVE_BACKFILL_STATES: Final[tuple[BackfillState, ...]] = ("pending", "running")

DEFAULT_PAGE_SIZE: Final = 500
"""Rows per page unless ``page_size=`` says otherwise."""
MAX_PAGE_SIZE: Final = 100_000
MAX_PACE: Final = 1_000.0
"""The most pages per second a backfill may declare (above it the pacer's wait is below what
an event loop can time)."""
MIN_STALL_AFTER: Final = 300.0
"""The floor of the default stalled threshold: 5 minutes without a checkpoint."""
STALL_INTERVALS: Final = 10
"""The default stalled threshold in page intervals: no checkpoint for 10 times (1 / pace)."""
BACKFILL_RETRY: Final = RetryPolicy(attempts=25, base_delay=1.0, max_delay=600.0)
"""A backfill run's retries: each attempt resumes from the last checkpoint, so a pass survives
a long outage (25 attempts, backoff capped at 10 minutes) before its ledger says failed."""
MAX_KEY_BYTES: Final = 8 * 1024


@attrs.frozen
class BackfillPage:
    """One page of a source: ``rows`` in key order and ``last_key``, the key of the last row
    (a tuple of JSON values; None only when ``rows`` is empty: the source ran out)."""

    rows: Sequence[Any]
    last_key: tuple[Any, ...] | None


@runtime_checkable
class BackfillSource(Protocol):
    """What a backfill reads (the seam; the PostgreSQL default is
    :func:`~ship_sqla.backfills.selectable_source`): ``page(after, limit)`` returns at most
    ``limit`` rows whose keys come after ``after`` (None: from the first row), in key order.
    Keys must be unique and totally ordered, or a resume could skip or repeat rows."""

    async def page(self, after: tuple[Any, ...] | None, limit: int) -> BackfillPage: ...


@attrs.frozen
class BackfillRecord:
    """A backfill's ledger row (C4): its state, progress and holder."""

    id: str
    state: BackfillState
    pages: int
    rows: int
    last_key: tuple[Any, ...] | None
    pace: float | None
    """Pages per second, as last declared (None until a definition was seen)."""
    stall_after: float | None
    """Seconds without a checkpoint after which a live backfill is stalled (None: as above)."""
    required_by: str | None
    """The migration (revision label) that needs this backfill done (C5), or None."""
    run_id: str | None
    token: int | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    """The last progress: a run's begin or the last checkpoint (what the stalled rule reads)."""
    error: str | None = None

    @property
    def live(self) -> bool:
        return self.state in LIVE_BACKFILL_STATES

    def stalled_since(self, now: datetime) -> datetime | None:
        """C4: when a live backfill became stalled (no progress for ``stall_after`` seconds), or
        None when it is not stalled (finished, or progressing, or no threshold known yet)."""
        if not self.live or self.stall_after is None:
            return None
        since = self.updated_at + timedelta(seconds=self.stall_after)
        return since if since <= now else None

    def blocks_deploy(self) -> bool:
        """C5: a required backfill that is not completed holds the deploy."""
        return self.required_by is not None and self.state != "completed"

    def status(self, now: datetime) -> str:
        """The state an operator reads: the ledger's, or ``stalled`` for a stalled live one."""
        return "stalled" if self.stalled_since(now) is not None else self.state


@runtime_checkable
class BackfillLedger(Protocol):
    """The ledger port (C4): one row per backfill. Two implementations: the in-memory model
    (:class:`~ship_sqla.kernel.InMemoryBackfillLedger`) and PostgreSQL's
    (:func:`~ship_sqla.backfills.create_backfill_ledger`); both pass one conformance suite."""

    @property
    def clock(self) -> Clock:
        """The clock the ledger's times, and the pacer's waits, are read on."""
        ...

    async def request(
        self,
        backfill_id: str,
        *,
        pace: float | None = None,
        stall_after: float | None = None,
        required_by: str | None = None,
    ) -> BackfillRecord:
        """A start: the row inserted ``pending`` when absent; a ``failed`` or ``cancelled`` one
        back to ``pending`` (it resumes from its last key); a live or completed one unchanged.
        The given declared fields are stored (None keeps what is there)."""
        ...

    async def begin(
        self,
        backfill_id: str,
        *,
        run_id: str,
        token: int,
        pace: float,
        stall_after: float,
        required_by: str | None,
    ) -> BackfillRecord | None:
        """A run takes the backfill: ``running``, held by (``run_id``, ``token``), the row
        inserted when absent; None when it is ``completed`` or ``cancelled`` (nothing to do)."""
        ...

    async def checkpoint(
        self,
        backfill_id: str,
        *,
        run_id: str,
        token: int,
        pages_before: int,
        last_key: tuple[Any, ...],
        rows: int,
    ) -> BackfillRecord | None:
        """C4: one page done: ``pages + 1``, ``rows + rows``, ``last_key``, progress now; only
        while ``running``, held by (``run_id``, ``token``) at ``pages_before`` pages (else None:
        nothing written). Joins the ambient unit of work: it commits with the page's writes."""
        ...

    async def finish(
        self,
        backfill_id: str,
        *,
        run_id: str,
        token: int,
        state: Literal["completed", "failed"],
        error: str | None = None,
    ) -> bool:
        """The pass ended (the source ran out, or the run's last attempt failed); False when
        the holder is no longer current (nothing written)."""
        ...

    async def cancel(self, backfill_id: str) -> BackfillRecord | None:
        """An operator's cancel: a live backfill becomes ``cancelled`` (its holder's next
        checkpoint is refused); the row as it is after; None when there is no such row."""
        ...

    async def get(self, backfill_id: str) -> BackfillRecord | None: ...

    async def list_backfills(self, *, limit: int) -> list[BackfillRecord]:
        """At most ``limit`` rows, by id."""
        ...


def encode_key(key: tuple[Any, ...], what: str) -> str:
    """A key as the ledger stores it (a JSON array), refused when it is not JSON or too long."""
    try:
        text = json.dumps(list(key), separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"{what}: the key {key!r} is not JSON ({exc}); a backfill stores its last key.",
            fix="key the source on columns of JSON-able types (int, text, a UUID as text,"
            " a timestamp as ISO text).",
        ) from exc
    if len(text) > MAX_KEY_BYTES:
        raise ConfigurationError(
            f"{what}: the key is {len(text)} bytes of JSON, above {MAX_KEY_BYTES}.",
            fix="key the source on short columns (a primary key).",
        )
    return text


def backfill_dedupe_key(backfill_id: str) -> str:
    """The dedupe key of a backfill's runs: a second start while one run is live adds none
    (J1)."""
    return f"backfill:{backfill_id}"


DEFAULT_LEASE: Final = 30.0
"""A pass's lease (seconds) unless ``define_backfill(lease=)`` says otherwise: the job default."""


def backfill_job_stand_in(backfill_id: str) -> JobDefinition[dict[str, Any]]:
    """What a start enqueues without the application's definition (``ship-sqla backfill
    start``): the same job id, single-runner key and attempts as :attr:`Backfill.job`; the
    worker runs the run with the real definition."""

    async def _defined_by_the_application(_ctx: JobContext[Any], _payload: object) -> None:
        raise NotImplementedError  # pragma: no cover - never run: a stand-in only enqueues

    return _job(backfill_id, _defined_by_the_application)


def _job(
    backfill_id: str, handler: Callable[..., Awaitable[None]], lease: float = DEFAULT_LEASE
) -> JobDefinition[Any]:
    return define_job(
        backfill_id,
        handler,
        payload=dict,
        concurrency=Concurrency(single_runner=True, lease=lease),
        retry=BACKFILL_RETRY,
    )


BackfillHandler = Callable[..., Awaitable[None]]
"""``handle(ctx, rows)``, or ``handle(ctx, rows, repositories)`` with ``transaction=``."""


@attrs.frozen
class Backfill:
    """A declared backfill (build with :func:`define_backfill`). Run it by giving :attr:`job`
    to the worker runtime with the other jobs; start it with
    :meth:`BackfillOperations.start <ship_sqla.backfills.BackfillOperations.start>` or
    ``ship-sqla backfill start ID``."""

    id: str
    source: BackfillSource
    handle: BackfillHandler
    pace: float
    ledger: BackfillLedger
    page_size: int
    stall_after: float
    transaction: UnitOfWorkLike | None
    required_by: str | None
    lease: float = DEFAULT_LEASE
    """The pass's lease (seconds): how soon another worker resumes a pass whose worker died."""
    job: JobDefinition[dict[str, Any]] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        job = _job(self.id, _Pass(self), self.lease)
        object.__setattr__(self, "job", job)  # derived, frozen class

    @property
    def interval(self) -> float:
        """Seconds between two pages' starts: ``1 / pace``."""
        return 1.0 / self.pace


def _positive_number(value: object, name: str, maximum: float, fix: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= maximum
    ):
        raise ConfigurationError(
            f"{name} must be a number above 0 and at most {maximum:g}, got {value!r}.", fix=fix
        )
    return float(value)


def define_backfill(
    id: str,  # noqa: A002 - the job id it runs as
    *,
    source: BackfillSource,
    handle: BackfillHandler,
    pace: float,
    ledger: BackfillLedger,
    transaction: UnitOfWorkLike | None = None,
    required_by: str | None = None,
    page_size: int = DEFAULT_PAGE_SIZE,
    stall_after: float | timedelta | None = None,
    lease: float | timedelta = DEFAULT_LEASE,
) -> Backfill:
    """Declare a backfill (C4, C5): one pass over ``source`` in key order, ``page_size`` rows
    a page, ``pace`` pages per second (> 0, fleet-wide), each page handed to ``handle`` and
    checkpointed in ``ledger``.

    ``handle(ctx, rows)``; with ``transaction=`` (a unit of work) ``handle(ctx, rows,
    repositories)`` inside it, the page read and its checkpoint in the same transaction (each
    page's effect commits exactly once). ``required_by``: the migration (revision label) that
    needs it done (C5: ``ship-sqla backfill verify`` fails until it is completed).
    ``stall_after`` (seconds): no checkpoint for that long while live is stalled (default
    ``max(300, 10 / pace)``). ``lease`` (seconds, default 30): the pass's lease, so how soon
    another worker resumes a pass whose worker died (heartbeated every third of it).
    """
    _check_parts(id, source, handle)
    rate = _positive_number(
        pace,
        f"backfill {id!r}: pace (pages per second)",
        MAX_PACE,
        "declare how many pages per second the pass may read, e.g. pace=5; there is no"
        " unthrottled mode: a pass at full speed competes with the application's own load.",
    )
    _check_knobs(id, ledger, page_size, transaction, required_by)
    stall = _stall_after(id, stall_after, rate)
    seconds = lease.total_seconds() if isinstance(lease, timedelta) else lease
    lease_seconds = require_duration(seconds, f"backfill {id!r}: lease", maximum=MAX_LEASE)
    return Backfill(
        id=id,
        source=source,
        handle=handle,
        pace=rate,
        ledger=ledger,
        page_size=page_size,
        stall_after=stall,
        transaction=transaction,
        required_by=required_by,
        lease=lease_seconds,
    )


def _check_parts(backfill_id: str, source: object, handle: object) -> None:
    if not is_job_id(backfill_id):
        raise ConfigurationError(
            f"backfill id {backfill_id!r} is not valid (it is the id of the job that runs it).",
            fix="use 1-128 characters: letters, digits and _ . : - (not starting with a symbol).",
        )
    if not callable(getattr(source, "page", None)):
        raise ConfigurationError(
            f"backfill {backfill_id!r}: source= must have an async page(after, limit), got"
            f" {type(source).__name__}.",
            fix="pass selectable_source(engine, select(...), key=[table.c.id]) or your own"
            " BackfillSource.",
        )
    if not callable(handle):
        raise ConfigurationError(
            f"backfill {backfill_id!r}: handle= must be an async function, got"
            f" {type(handle).__name__}.",
            fix="async def handle(ctx, rows): ... (with transaction=: handle(ctx, rows, repos)).",
        )


def _check_knobs(
    backfill_id: str, ledger: object, page_size: object, transaction: object, required_by: object
) -> None:
    if not isinstance(ledger, BackfillLedger):
        raise ConfigurationError(
            f"backfill {backfill_id!r}: ledger= must be a BackfillLedger, got"
            f" {type(ledger).__name__}.",
            fix="pass create_backfill_ledger(database=engine) (or InMemoryBackfillLedger()).",
        )
    size = page_size if isinstance(page_size, int) and not isinstance(page_size, bool) else -1
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise ConfigurationError(
            f"backfill {backfill_id!r}: page_size must be an int from 1 to {MAX_PAGE_SIZE:,}.",
            fix=f"omit it for the default ({DEFAULT_PAGE_SIZE}).",
        )
    if transaction is not None:
        require_unit_of_work(f"backfill {backfill_id!r}", transaction)
    if required_by is not None and (not isinstance(required_by, str) or not required_by.strip()):
        raise ConfigurationError(
            f"backfill {backfill_id!r}: required_by must be a migration's label, got"
            f" {required_by!r}.",
            fix="pass the revision that needs the backfill done, e.g. required_by='0042', or"
            " omit it.",
        )


def _stall_after(backfill_id: str, stall_after: float | timedelta | None, rate: float) -> float:
    if stall_after is None:
        return max(MIN_STALL_AFTER, STALL_INTERVALS / rate)
    seconds = stall_after.total_seconds() if isinstance(stall_after, timedelta) else stall_after
    return _positive_number(
        seconds,
        f"backfill {backfill_id!r}: stall_after",
        365 * 86_400.0,
        "pass how many seconds without a checkpoint make the backfill stalled.",
    )


class _Pass:
    """The backfill job's handler: one pass from the ledger's last key (see the module doc)."""

    __slots__ = ("_backfill",)

    def __init__(self, backfill: Backfill) -> None:
        self._backfill = backfill

    async def __call__(self, ctx: JobContext[Any], payload: Mapping[str, Any]) -> None:  # noqa: ARG002 - a pass takes no input
        backfill = self._backfill
        ledger = backfill.ledger
        record = await ledger.begin(
            backfill.id,
            run_id=ctx.run_id,
            token=ctx.token,
            pace=backfill.pace,
            stall_after=backfill.stall_after,
            required_by=backfill.required_by,
        )
        if record is None:
            return  # completed or cancelled: this run has nothing to do
        try:
            await self._pages(ctx, record)
        except Exception as exc:
            if ctx.is_final_attempt and not isinstance(exc, JobLeaseStaleError):
                await ledger.finish(
                    backfill.id,
                    run_id=ctx.run_id,
                    token=ctx.token,
                    state="failed",
                    error=f"{type(exc).__name__}: {exc}"[:2000],
                )
            raise
        await ledger.finish(backfill.id, run_id=ctx.run_id, token=ctx.token, state="completed")

    async def _pages(self, ctx: JobContext[Any], record: BackfillRecord) -> None:
        backfill = self._backfill
        clock = backfill.ledger.clock
        # The first page of a resumed pass waits for the slot after the last checkpoint.
        last_at = record.updated_at if record.pages > 0 else None
        interval = timedelta(seconds=backfill.interval)
        while True:
            if last_at is not None:
                await _wait_for_slot(ctx, clock, last_at, backfill.interval)
            # Slots are start to start, each measured from the slot it was due at, not from the
            # wake-up (a little late every time: that lateness would add up, and the pass fall
            # below its pace); a page that ran past its slot starts the count again from now,
            # so the pass never bursts to catch up.
            now = clock.now()
            due = None if last_at is None else last_at + interval
            last_at = due if due is not None and now - due < interval else now
            state = _PageState(record)
            if backfill.transaction is None:
                await self._page(ctx, state, None)
            else:
                await backfill.transaction.run(functools.partial(self._page, ctx, state))
            if state.done or state.after is None:
                return
            record = state.after

    async def _page(self, ctx: JobContext[Any], state: _PageState, repositories: object) -> None:
        backfill = self._backfill
        record = state.before
        page = await backfill.source.page(record.last_key, backfill.page_size)
        if not page.rows:
            state.done = True
            return
        if page.last_key is None or len(page.rows) > backfill.page_size:
            raise ConfigurationError(
                f"backfill {backfill.id!r}: the source returned {len(page.rows)} rows (limit"
                f" {backfill.page_size}) and last_key {page.last_key!r}.",
                fix="return at most `limit` rows and the key of the last one.",
            )
        last_key = tuple(page.last_key)
        encode_key(last_key, f"backfill {backfill.id!r}")
        if repositories is None:
            await backfill.handle(ctx, page.rows)
        else:
            await backfill.handle(ctx, page.rows, repositories)
        after = await backfill.ledger.checkpoint(
            backfill.id,
            run_id=ctx.run_id,
            token=ctx.token,
            pages_before=record.pages,
            last_key=last_key,
            rows=len(page.rows),
        )
        if after is None:
            raise JobLeaseStaleError(
                f"backfill {backfill.id!r} run {ctx.run_id!r} (claim token {ctx.token}): the"
                f" checkpoint of page {record.pages + 1} was refused: the backfill was cancelled"
                " or another run holds it now. The page's transaction (if any) rolled back.",
                fix="nothing to undo: the backfill's current holder resumes from its last"
                " checkpoint (`ship-sqla backfill status`).",
            )
        state.after = after
        state.done = len(page.rows) < backfill.page_size


@attrs.define
class _PageState:
    before: BackfillRecord
    after: BackfillRecord | None = None
    done: bool = False


async def _wait_for_slot(
    ctx: JobContext[Any], clock: Clock, last_at: datetime, interval: float
) -> None:
    """C4: hold the pass until ``last_at + interval`` on ``clock``; the run's cancellation ends
    the wait at once (CancelledError), before it or during it."""
    if ctx.cancelled:
        raise asyncio.CancelledError
    delay = (last_at - clock.now()).total_seconds() + interval
    if delay <= 0:
        return
    sleeper = asyncio.ensure_future(clock.sleep(delay))
    cancelled = asyncio.ensure_future(ctx.wait_cancelled())
    try:
        await asyncio.wait((sleeper, cancelled), return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
        cancelled.cancel()
    if ctx.cancelled:
        raise asyncio.CancelledError
