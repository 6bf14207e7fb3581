"""The relay: claim -> publish -> settle, in a loop that never raises.

The relay never sees SQL: it calls the outbox's store port
(:class:`~ship_sqla.kernel._outbox.OutboxStore`: claim, heartbeat, settle). One batch is

1. ``claim`` up to ``batch_size`` messages for ``lease`` seconds (one statement of its own);
2. publish them one by one to the sink, in claim order. Each success becomes a delivered
   settlement, each sink error a failed one (retry with the outbox's backoff, or dead: the
   kernel's rule, :func:`~ship_sqla.kernel._outbox_records.message_failed`); the batch is
   settled in ONE ``settle`` call at its end (and before every heartbeat), and each sink error
   is then reported to ``on_error`` with what became of its message;
3. every third of the lease, settle what is published or failed and heartbeat the rest; a
   message whose claim turned stale is not published by this relay (its new holder will).

When a batch was full and the outbox is on an engine, the next one is claimed (on another
pooled connection) while this one's completion is in flight, so a relay working through a
backlog waits about one round trip per batch, not two. That claim starts only after the batch's
sink calls returned; a batch claimed ahead that will not be published (the relay stopped, or the
completion still failed when it did) is released.

Stopping is graceful: the message being published finishes, and in the batch's one settle
published ones are completed, failed ones failed and unpublished ones released (their attempt
given back), so another relay takes them at once instead of after a lease. Errors the loop
absorbs (poll and settle failures during a database outage, stale claims, publish failures) go
to ``on_error``; nothing is raised out of it.

Outages. A settle of the batch in hand (its settle, a heartbeat) that fails is retried in
place, after the error backoff, until it lands or the relay stops: the batch is never dropped
from memory and republished because the database went away for a moment. Retrying is safe at any
time because every settle is fenced on the lease token: once the message was retaken (its lease
lapsed and another relay claimed it) the retry changes nothing and is answered "stale", and a
completion that landed before its reply was lost answers "delivered" again. A failed claim is
retried by the loop. The error backoff is the loops' one
(:data:`~ship_sqla.kernel._plans.backoff.ERROR_BACKOFF`, shared with the job runtime): from
``min(poll_interval, 0.1)`` seconds doubling to 1 s, equal jitter, so the relay is back within
about a second of the server's return however long the outage lasted; message FAILURES keep the
outbox's own backoff (O4).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from ship_sqla._notify import (
    Listen,
    Listener,
    Recheck,
    Subscription,
    announced_key,
    check_listen,
    listener_for,
)
from ship_sqla._outbox._stats import OutboxStatsRecorder
from ship_sqla._outbox._store import ErrorHandler, Outbox, check_outbox_id, default_worker
from ship_sqla._outbox._types import (
    OutboxLeaseStaleError,
    OutboxMessage,
    OutboxOutcome,
    OutboxPublishError,
    OutboxSinkRejectedError,
)
from ship_sqla._schema_probe import Needed, require_tables
from ship_sqla.kernel._durations import (
    MAX_DRAIN_TIMEOUT,
    MAX_LEASE,
    MAX_POLL_INTERVAL,
    require_duration,
)
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._lifespan import enter_lifespan, require_lifespan
from ship_sqla.kernel._outbox_records import (
    message_delivered,
    message_failed,
    message_released,
)
from ship_sqla.kernel._plans.backoff import error_backoff
from ship_sqla.kernel._tracing import publish_span, traces_message
from ship_sqla.kernel._waiting import wait_event

if TYPE_CHECKING:
    from types import TracebackType

    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._outbox_records import OutboxSettlement
    from ship_sqla.kernel._ports import JobBackend
    from ship_sqla.kernel._stats import JobStatsStore

__all__ = ["OutboxRelay", "OutboxSink", "job_sink", "start_outbox_relay"]

T = TypeVar("T")

logger = logging.getLogger("ship_sqla")

OutboxSink = Callable[[OutboxMessage], Awaitable[None]]
"""Publishes one message; raising means "not published" (the message is failed and retried).

A sink may be called again for a message it already published (at-least-once delivery): make it
idempotent, e.g. by deduplicating on ``message.id``.
"""


class OutboxRelay:
    """Moves one logical outbox's messages to a sink. Start one with :func:`start_outbox_relay`.

    A started relay is an async context manager that stops gracefully on exit
    (``async with await start_outbox_relay(...) as relay:``), or is stopped with
    ``await relay.stop()``. Built directly (same arguments as :func:`start_outbox_relay`, checked
    the same way) a relay is not started: await :meth:`run` in a task group and call
    :meth:`stop` from elsewhere, or drive single batches with :meth:`run_once` (tests); a relay
    runs once. Give the outbox an ``AsyncEngine``: the relay's statements run on their own
    connections, concurrently with the application's.
    """

    def __init__(
        self,
        outbox: Outbox,
        outbox_id: str,
        sink: OutboxSink,
        *,
        batch_size: int = 100,
        lease: float = 30.0,
        poll_interval: float = 1.0,
        ordered: bool = False,
        drain_timeout: float | None = None,
        on_error: ErrorHandler | None = None,
        clock: Clock | None = None,
        worker: str | None = None,
        listen: Listen = True,
        stats: JobStatsStore | None = None,
    ) -> None:
        check_outbox_id(outbox_id)
        if batch_size < 1:
            raise ConfigurationError(
                f"batch_size must be at least 1, got {batch_size}.", fix="pass batch_size >= 1."
            )
        self._outbox = outbox
        self._outbox_id = outbox_id
        self._sink = sink
        self._batch_size = batch_size
        self._lease = require_duration(lease, "lease", maximum=MAX_LEASE)
        self._poll_interval = require_duration(
            poll_interval, "poll_interval", maximum=MAX_POLL_INTERVAL
        )
        self._drain_timeout = _check_drain_timeout(drain_timeout)
        self._ordered = ordered
        self._on_error = on_error
        self._clock = clock or outbox.clock
        self.worker = worker or default_worker()
        self._stopping = False
        self._stop_requested = asyncio.Event()
        self._running = False
        self._task: asyncio.Task[None] | None = None
        self._done = asyncio.Event()
        self._wakeup = outbox.subscribe(outbox_id)
        self._error_backoff = error_backoff(self._poll_interval)
        # K1: a relay of its own listens while its loop runs; other processes' enqueues wake it.
        self._listener: Listener | None = listener_for(
            outbox.database,
            check_listen(listen, "start_outbox_relay"),
            name=f"outbox relay {outbox_id}",
            report_error=self._report,
        )
        self._subscription: Subscription | None = None
        self._recheck = Recheck(self._wakeup.set, self._clock)
        self.delivered = 0
        """Messages this relay has completed (a counter for tests and health checks)."""
        self._stats = (
            None
            if stats is None
            else OutboxStatsRecorder(
                stats,
                outbox.admin,
                outbox_id,
                delivered=lambda: self.delivered,
                clock=self._clock,
                report=self._report,
            )
        )

    @property
    def outbox_id(self) -> str:
        return self._outbox_id

    @property
    def listener(self) -> Listener | None:
        """This relay's listener (K1), or None: ``listen=False`` or an outbox on an
        ``AsyncConnection``. It holds its connection while the relay's loop runs."""
        return self._listener

    @property
    def ordered(self) -> bool:
        return self._ordered

    @property
    def running(self) -> bool:
        """True from the moment the relay is started (or :meth:`run` is entered) until its loop
        has ended."""
        return self._running or (self._task is not None and not self._task.done())

    @property
    def drain_timeout(self) -> float | None:
        """How long :meth:`stop` lets a busy sink finish by default (None: as long as it takes)."""
        return self._drain_timeout

    # -- lifecycle -----------------------------------------------------------------------------

    def _start(self) -> None:
        """Run the loop in a background task of the running event loop."""
        if self._task is not None or self._running or self._stopping:
            raise ConfigurationError(
                "this outbox relay is already running, or was stopped.",
                fix="start each relay once; start a new relay to restart or for throughput.",
            )
        self._task = asyncio.get_running_loop().create_task(
            self._loop(), name=f"ship_sqla outbox relay {self._outbox_id}"
        )

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Stop gracefully: finish the message in flight, complete, release the rest.

        ``drain_timeout`` (seconds, on the wall clock; default the relay's, and None for no
        bound) bounds how long a busy sink may go on: it is then cancelled and its message left
        to its lease. Tolerates a relay that was never started.
        """
        timeout = self._drain_timeout if drain_timeout is None else drain_timeout
        timeout = _check_drain_timeout(timeout)
        self._stopping = True
        self._stop_requested.set()
        self._wakeup.set()
        task, self._task = self._task, None
        if task is not None:
            if timeout is None:
                await asyncio.shield(task)
            else:
                done, _ = await asyncio.wait({task}, timeout=timeout)
                if not done:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        elif self._running:
            await self._done.wait()
        self._outbox.unsubscribe(self._outbox_id, self._wakeup)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    def wake(self) -> None:
        """Make the loop poll now instead of after ``poll_interval``."""
        self._wakeup.set()

    # -- the loop --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Loop until :meth:`stop`, in the caller's task (a relay not started by
        :func:`start_outbox_relay`). Never raises (except cancellation).

        While a full batch is being completed, the next batch is already being claimed on
        another connection (see :meth:`_step`), so a busy relay waits for one round trip per
        batch instead of two.
        """
        if self.running:
            raise ConfigurationError(
                "this outbox relay is already running.", fix="run each relay once."
            )
        await self._loop()

    async def _loop(self) -> None:
        """The relay's loop, with its history recorder beside it when given ``stats=``
        (:mod:`._stats`: stopped, after one last flush, when the loop ends)."""
        recorder = self._stats
        if recorder is None:
            await self._relay_loop()
            return
        flushing = asyncio.create_task(recorder.run(), name=f"outbox stats {self._outbox_id}")
        try:
            await self._relay_loop()
        finally:
            recorder.close()
            await flushing

    async def flush_stats(self) -> None:
        """Write the outbox's trend now (a relay given ``stats=``; else nothing): what
        :meth:`run_once` delivered, for a caller that drives batches itself (``--burst``)."""
        if self._stats is not None:
            await self._stats.flush()

    async def _relay_loop(self) -> None:
        self._running = True
        self._done = asyncio.Event()
        failures = 0
        ahead: _Claim | None = None
        if self._listener is not None:
            self._subscription = self._listener.subscribe(
                self._outbox.wake_channel, self._announced, on_gap=self._wakeup.set
            )
        try:
            while not self._stopping:
                # _step owns the claim made ahead from here on: a failed step must not retry
                # a claim whose messages it already took (or whose statement failed).
                current, ahead = ahead, None
                try:
                    handled, ahead = await self._step(current)
                except Exception as exc:  # noqa: BLE001 - the loop reports and survives everything
                    failures += 1
                    self._report(exc)
                    await self._idle(self._error_backoff.delay(failures))
                    continue
                failures = 0
                if handled < self._batch_size:
                    await self._idle(self._poll_interval)
        finally:
            try:
                if ahead is not None:
                    await self._give_back(ahead)
            finally:
                try:
                    await self._stop_listening()
                finally:
                    self._running = False
                    self._done.set()

    def _announced(self, payload: str) -> None:
        """K1: a committed enqueue in another process (or another ``Outbox``) announced an
        outbox id: for ours, poll now, and again at the rechecks (for senders of earlier
        versions, which silenced enqueues for a window). Our own outbox's announcements are
        ignored: its commits woke us already."""
        if announced_key(payload, self._outbox.sender) == self._outbox_id:
            self._wakeup.set()
            self._recheck.arm()

    async def _stop_listening(self) -> None:
        subscription, self._subscription = self._subscription, None
        await self._recheck.close()
        if subscription is not None:
            await subscription.close()

    async def _idle(self, seconds: float) -> None:
        if not self._stopping:
            await self._wakeup.wait(seconds, self._clock)

    async def run_once(self) -> int:
        """Claim and publish one batch; returns how many messages were claimed.

        Database errors propagate (the loop reports them and backs off); sink errors do not.
        """
        claimed_at = self._clock.monotonic()
        messages = await self._claim()
        if messages:
            settled, remaining = await self._publish(messages, claimed_at)
            try:
                await self._flush(settled, remaining)
            finally:
                self._gave_up(settled)  # empty once the settle landed
        return len(messages)

    async def _step(self, ahead: _Claim | None) -> tuple[int, _Claim | None]:
        """One batch of the loop: returns how many messages it claimed, and the next batch's
        claim when it started one.

        The next claim starts only after this batch's sink calls returned and only when this
        batch was full (a backlog remains), and it runs while this batch is completed: so
        no message is completed before it was published, and its lease starts just before
        it is published. In ordered mode it cannot take a later message of a key in this
        batch: that key's message is still claimed (or already delivered) in its snapshot.
        """
        if ahead is None:
            claimed_at = self._clock.monotonic()
            messages = await self._claim()
        else:
            claimed_at = ahead.claimed_at
            try:
                # Shielded: a hard stop arriving now must not cancel the claim mid-statement,
                # so its messages can be handed back instead of waiting out their lease.
                messages = await asyncio.shield(ahead.task)  # a failed claim raises here
            except asyncio.CancelledError:
                await self._give_back(ahead)
                raise
        if not messages:
            return 0, None
        settled, remaining = await self._publish(messages, claimed_at)
        following: _Claim | None = None
        if (
            len(messages) == self._batch_size
            and not remaining
            and not self._stopping
            and self._outbox.connections.concurrent
        ):
            following = _Claim(self._clock.monotonic(), asyncio.ensure_future(self._claim()))
        try:
            await self._flush(settled, remaining)
        except BaseException:
            self._gave_up(settled)
            if following is not None:
                await self._give_back(following)
            raise
        return len(messages), following

    async def _claim(self) -> list[OutboxMessage]:
        return await self._outbox.claim(
            self._outbox_id,
            self._batch_size,
            self._lease,
            worker=self.worker,
            ordered=self._ordered,
            on_error=self._report,
        )

    async def _give_back(self, ahead: _Claim) -> None:
        """Release a batch claimed ahead that will not be published (stop, or a failure)."""
        try:
            messages = await ahead.task
            await self._flush([], messages, retry=False)
        except Exception as exc:  # noqa: BLE001 - reported; unreleased rows wait out their lease
            self._report(exc)

    async def _publish(
        self, messages: list[OutboxMessage], claimed_at: float
    ) -> tuple[list[_Settled], list[OutboxMessage]]:
        """Publish in claim order until done or stopping: returns (published or failed, not yet
        settled; not published). Leases are heartbeaten every third of the lease, counted from
        ``claimed_at`` (a monotonic time taken before the claim), after what is settled so far
        is settled."""
        settled: list[_Settled] = []
        remaining = list(messages)
        beaten_at = claimed_at
        try:
            while remaining and not self._stopping:
                if self._clock.monotonic() - beaten_at >= self._lease / 3:
                    await self._flush(settled)
                    remaining = await self._heartbeat(remaining)
                    beaten_at = self._clock.monotonic()
                    continue
                message = remaining.pop(0)
                try:
                    await self._publish_one(message)
                except Exception as exc:  # noqa: BLE001 - a sink error fails the message only
                    failed = message_failed(message, exc, self._outbox.backoff)
                    settled.append(_Settled(message, failed, exc))
                else:
                    settled.append(_Settled(message, message_delivered(message)))
        except BaseException:
            # Cancelled (hard stop), or a settle failed once the relay was stopping: one last
            # attempt to hand back what we hold, then re-raise. The message that was in the sink
            # is unknown-published and is left to its lease.
            await self._settle_on_the_way_out(settled, remaining)
            raise
        return settled, remaining

    async def _publish_one(self, message: OutboxMessage) -> None:
        """The sink call, inside a span whose parent is the trace context the message's headers
        carry (K7), so what the sink does is traced under the producer's span; no span's
        machinery at all without a context or an SDK."""
        if not traces_message(message.headers):
            await self._sink(message)
            return
        with publish_span(
            message.headers,
            outbox_id=message.outbox_id,
            topic=message.topic,
            message_id=str(message.id),
            attempt=message.attempt,
        ):
            await self._sink(message)

    async def _settle_on_the_way_out(
        self, settled: list[_Settled], remaining: list[OutboxMessage]
    ) -> None:
        """Settle and release once, without retrying (the relay is leaving); what fails is
        reported and left to its lease: published messages are then delivered again."""
        try:
            await self._flush(settled, remaining, retry=False)
        except Exception as exc:  # noqa: BLE001 - reported; the rows wait out their lease
            self._report(exc)
            self._gave_up(settled)

    async def _retrying(self, settle: Callable[[], Awaitable[T]], *, retry: bool = True) -> T:
        """Run a settle of the batch in hand until it lands.

        Only the loop retries (``run_once`` lets errors through), never once stopping, and never
        a refused input (ConfigurationError: retrying cannot fix it). Each failure is reported;
        the next attempt waits the error backoff, or less if the relay is stopped meanwhile (then
        it makes one last attempt). Retrying is safe because every settle is fenced on the claim
        token (O3): a message retaken meanwhile is answered "stale" and left unchanged.
        """
        failures = 0
        while True:
            try:
                return await settle()
            except ConfigurationError:
                raise
            except Exception as exc:
                if not retry or self._stopping or not self._running:
                    raise
                failures += 1
                self._report(exc)
                await wait_event(
                    self._stop_requested, self._clock, self._error_backoff.delay(failures)
                )

    async def _flush(
        self,
        settled: list[_Settled],
        unpublished: Sequence[OutboxMessage] = (),
        *,
        retry: bool = True,
    ) -> None:
        """Settle the batch in hand in ONE fenced call (the port's ``settle``): every published
        message delivered, every failed one retrying or dead (the kernel's rule), every
        ``unpublished`` one released; retried in place while it fails (see :meth:`_retrying`).
        ``settled`` is emptied once the settle landed; kept when it raised, for the caller's
        last attempt (:meth:`_settle_on_the_way_out`) or :meth:`_gave_up`."""
        batch = list(settled)
        batch.extend(_Settled(m, message_released(m)) for m in unpublished)
        if not batch:
            return
        outcomes: list[OutboxOutcome | None] = list(
            await self._retrying(
                lambda: self._outbox.settle([item.settlement for item in batch]), retry=retry
            )
        )
        settled.clear()
        self._answered(batch, outcomes)

    def _gave_up(self, settled: list[_Settled]) -> None:
        """The batch's settle failed for good: its publish failures are reported without an
        outcome (the messages wait out their lease, and are delivered again)."""
        self._answered(settled, [None] * len(settled))
        settled.clear()

    def _answered(self, batch: list[_Settled], outcomes: list[OutboxOutcome | None]) -> None:
        """Every answer of one settle, read here: a publish failure reported with what became of
        its message (None: the settle failed too), a stale completion or release reported,
        deliveries counted."""
        completed = 0
        for item, outcome in zip(batch, outcomes, strict=True):
            if item.cause is not None:
                error = OutboxPublishError(
                    item.message, outcome, f"{type(item.cause).__name__}: {item.cause}"
                )
                error.__cause__ = item.cause
                self._report(error)
            elif outcome == "stale":
                operation = "complete" if item.settlement.settled_as == "delivered" else "release"
                self._report(OutboxLeaseStaleError(item.message.id, operation))
            elif outcome == "delivered":
                completed += 1
        self.delivered += completed
        if self._ordered and completed:
            # Each completion may unblock the next message of its key: let every local
            # relay (this one included) claim again now rather than after a poll interval.
            self._outbox.notify(self._outbox_id)

    async def _heartbeat(self, remaining: list[OutboxMessage]) -> list[OutboxMessage]:
        held = await self._retrying(lambda: self._outbox.heartbeat(remaining, self._lease))
        kept: list[OutboxMessage] = []
        for message, still_held in zip(remaining, held, strict=True):
            if still_held:
                kept.append(message)
            else:
                self._report(OutboxLeaseStaleError(message.id, "heartbeat"))
        return kept

    def _report(self, error: BaseException) -> None:
        if self._on_error is None:
            self._outbox.report_error(error)
            return
        try:
            self._on_error(error)
        except Exception:
            logger.exception("ship_sqla outbox relay: on_error raised while handling %r", error)


class _Settled:
    """A message of the batch in hand and how it settles; ``cause``: the sink's error when it
    failed (reported with the settle's answer)."""

    __slots__ = ("cause", "message", "settlement")

    def __init__(
        self,
        message: OutboxMessage,
        settlement: OutboxSettlement,
        cause: Exception | None = None,
    ) -> None:
        self.message = message
        self.settlement = settlement
        self.cause = cause


class _Claim:
    """A claim started ahead of time: its task, and a monotonic time taken before it began."""

    __slots__ = ("claimed_at", "task")

    def __init__(self, claimed_at: float, task: asyncio.Future[list[OutboxMessage]]) -> None:
        self.claimed_at = claimed_at
        self.task = task


def _check_drain_timeout(value: float | None) -> float | None:
    if value is None:
        return None
    return require_duration(value, "drain_timeout", maximum=MAX_DRAIN_TIMEOUT, allow_zero=True)


async def start_outbox_relay(
    outbox: Outbox,
    outbox_id: str,
    sink: OutboxSink | None = None,
    *,
    batch_size: int = 100,
    lease: float = 30.0,
    poll_interval: float = 1.0,
    ordered: bool = False,
    drain_timeout: float | None = None,
    on_error: ErrorHandler | None = None,
    clock: Clock | None = None,
    worker: str | None = None,
    listen: Listen = True,
    lifespan: SinkLifespan | None = None,
    stats: JobStatsStore | None = None,
) -> OutboxRelay:
    """Start a relay publishing ``outbox_id``'s messages to ``sink``; returns it running.
    The outbox table is checked at the start (:class:`~ship_sqla.errors.MissingTablesError`);
    ``lifespan`` (instead of ``sink``) opens the sink's resources and yields the sink: see
    :func:`_start_relay`.

    The relay lives on the running event loop until ``await relay.stop()``; it is also an async
    context manager that stops on exit (``async with await start_outbox_relay(...) as relay:``),
    as :func:`~ship_sqla.start_job_runtime`'s runtime is. Every argument is checked
    before it starts.

    Polls every ``poll_interval`` seconds when idle; a local enqueue (through the same
    :class:`Outbox`) wakes it as soon as its transaction commits, and so does an enqueue
    committed in any other process (K1, push wake: every enqueue of a due message announces it
    in its own transaction, at most once per outbox id per 250 ms per process; the relay holds
    one dedicated LISTEN connection, from the engine's URL, while it runs). ``listen=False``
    turns the listener off (behind a transaction-mode pooler such as PgBouncer, which accepts
    LISTEN and delivers nothing: the listener would never prove itself live); a
    ``postgresql://`` URL listens through that server instead. Polling stays the fallback: a
    lost notification or listener delays a message by at most ``poll_interval``. Delivery is
    at-least-once.
    ``drain_timeout`` (seconds; None: no bound) is how long :meth:`OutboxRelay.stop` lets a busy
    sink finish by default. ``stats`` (the job history store, :func:`~ship_sqla.create_job_stats`)
    records the outbox's trend for the dashboard's outbox page every 15 s: the messages
    delivered and the sampled pending backlog (:mod:`ship_sqla._outbox._stats`; nothing per
    message).

    ``ordered=True`` — per-key ordering. Guarantee: a message with ordering key K is handed out
    only when no other message of K that is earlier by ``(created_at, id)`` is pending or claimed
    (skip rows whose key has ANY earlier undelivered row; dead rows do not block). Consequences,
    for messages of K whose enqueues committed in ``(created_at, id)`` order (one producer per key
    at a time, or several enqueues in one transaction):

    - delivery (completion) order per key equals enqueue order, across any number of relays
      and processes on the database;
    - at most one message per key is claimed at a time, as long as each holder settles within
      its lease (a lapsed lease lets another relay retake the same message: at-least-once);
    - a failed message blocks its key until it is delivered or dead (retries keep the order);
      a dead message stops blocking, so later messages go on without it. Retrying it puts it
      back at its original position; messages of K already claimed are not recalled.

    Enqueues of one key that commit out of ``created_at`` order (concurrent producers) may be
    delivered in commit order and may overlap. Messages without a key are not ordered. A key
    with a long backlog costs the claim one ``<table>_ordering_idx`` probe per row it skips.
    """
    options: dict[str, Any] = {
        "batch_size": batch_size,
        "lease": lease,
        "poll_interval": poll_interval,
        "ordered": ordered,
        "drain_timeout": drain_timeout,
        "on_error": on_error,
        "clock": clock,
        "worker": worker,
        "listen": listen,
        "stats": stats,
    }
    return await _start_relay(outbox, outbox_id, sink, lifespan, options)


async def _start_relay(
    outbox: Outbox,
    outbox_id: str,
    sink: OutboxSink | None,
    lifespan: SinkLifespan | None,
    options: dict[str, Any],
) -> OutboxRelay:
    """The relay's start (issue 27 items 4 and 7): its table checked once by the one probe (a
    missing one refused with MissingTablesError naming it and the ``ship-sqla schema apply``
    command); then ``lifespan``, when given instead of ``sink``, entered before the first
    claim (a factory of an async context manager that opens the sink's resources, a broker
    connection or an HTTP client, and yields the sink; an error entering it refuses the start
    with LifespanFailedError) and exited after the drain, in :meth:`OutboxRelay.stop`."""
    if (sink is None) == (lifespan is None):
        raise ConfigurationError(
            "start_outbox_relay needs a sink, or a lifespan that yields one (not both).",
            fix="pass start_outbox_relay(outbox, outbox_id, sink) or"
            " start_outbox_relay(outbox, outbox_id, lifespan=opens_the_sink).",
        )
    if lifespan is not None:
        require_lifespan(lifespan, "start_outbox_relay")
    await require_tables(
        outbox.database, [Needed.table(outbox.table, "outbox")], surface="the outbox relay"
    )
    if sink is not None:
        relay = OutboxRelay(outbox, outbox_id, sink, **options)
    else:
        manager, opened = await enter_lifespan(cast("SinkLifespan", lifespan), "the outbox relay")
        try:
            relay = _LifespanRelay(manager, outbox, outbox_id, opened, **options)
        except BaseException:
            await manager.__aexit__(None, None, None)
            raise
    relay._start()  # noqa: SLF001 - the factory is the relay's own module
    return relay


SinkLifespan = Callable[[], AbstractAsyncContextManager[OutboxSink]]
"""``lifespan() -> async context manager`` whose value is the relay's sink."""


class _LifespanRelay(OutboxRelay):
    """A relay whose sink came from a lifespan: :meth:`stop` exits it once, after the drain,
    whatever the drain met."""

    def __init__(
        self,
        lifespan: AbstractAsyncContextManager[OutboxSink],
        *args: Any,  # noqa: ANN401 - OutboxRelay's own
        **kwargs: Any,  # noqa: ANN401
    ) -> None:
        super().__init__(*args, **kwargs)
        self._lifespan: AbstractAsyncContextManager[OutboxSink] | None = lifespan

    async def stop(self, drain_timeout: float | None = None) -> None:
        try:
            await super().stop(drain_timeout)
        finally:
            lifespan, self._lifespan = self._lifespan, None
            if lifespan is not None:
                await lifespan.__aexit__(None, None, None)


def job_sink(
    backend: JobBackend,
    job: JobDefinition[Any],
    *,
    payload: Callable[[OutboxMessage], Any] | None = None,
) -> OutboxSink:
    """A sink that enqueues ``job`` on ``backend`` for every message.

    The job's payload is ``payload(message)`` (default ``message.payload``), validated by the
    backend with the job's codec. The message id is the ``dedupe_key`` and names the durable
    ``run_id`` (``<job id>/outbox-<message id>``), so a redelivered message (a lease that lapsed
    after the enqueue, a completion lost to an outage) does not enqueue a second run: the
    backend answers "deduplicated" while the run exists. A queue-full rejection raises
    :class:`OutboxSinkRejectedError`, so the message is retried with backoff (back-pressure).
    """
    to_payload = payload or (lambda message: message.payload)

    async def sink(message: OutboxMessage) -> None:
        result = await backend.enqueue(
            job,
            to_payload(message),
            dedupe_key=str(message.id),
            run_id=f"{job.id}/outbox-{message.id}",
        )
        if not result.accepted:
            raise OutboxSinkRejectedError(
                f"job {job.id!r} rejected outbox message {message.id}: {result.rejected}.",
                fix="let the job backend drain (the message is retried with backoff), or raise"
                " the job's queue depth limit.",
            )

    return sink
