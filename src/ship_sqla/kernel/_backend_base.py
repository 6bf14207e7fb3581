"""What every job backend shares, written once above the storage seam: the options (validated
here), the ``JobBackend`` properties and ``report_error`` over them, the local wake (J3), the
enqueue front and the settle front.

- ``enqueue`` / ``enqueue_many`` bound the batch (:data:`MAX_ENQUEUE_BATCH`), prepare every
  request (:func:`~ship_sqla.kernel._plans.prepare.prepare_runs`: validation, encoding, dedupe
  key, single-runner key, ``max_attempts`` and run ids) and hand the prepared runs to the
  store's :meth:`~ship_sqla.kernel.RunStore.insert`. Bad input raises before the store sees
  anything, so nothing of the call is written.
- ``settle`` checks it was handed settlements (:mod:`ship_sqla.kernel._settlement` built and
  checked them), lets the store apply the batch fenced on each token (J5), and wakes the local
  loop when a run it put back is due now (J3).

A backend subclasses :class:`JobBackendBase`, calls :meth:`~JobBackendBase._set_options` first
thing in ``__init__`` and implements only storage: ``insert``, ``claim``, ``heartbeat``,
``_settle_if_tokens_current``, the schedule store and its ``admin`` (:class:`RunAdmin`).

A backend holds what its storage decides (the clock, ``queue_depth_limit``, ``on_error``) and
names its ``default_lock_provider``; how a worker runs on it (``poll_interval``,
``max_in_flight``, ``meter_provider``, ``lock_provider``) is :func:`start_job_runtime`'s (J3)."""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Final

from ship_sqla.kernel._clock import Clock, SystemClock
from ship_sqla.kernel._errors import BoundExceededError, ConfigurationError
from ship_sqla.kernel._on_error import deliver_error
from ship_sqla.kernel._plans.prepare import prepare_runs
from ship_sqla.kernel._ports import EnqueueRequest, Suspend
from ship_sqla.kernel._settlement import Settlement
from ship_sqla.kernel._tenancy import ambient_tenant
from ship_sqla.kernel._tracing import current_trace_context_json
from ship_sqla.kernel._waiting import LocalWake

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from datetime import datetime

    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._on_error import ErrorHandler
    from ship_sqla.kernel._plans.prepare import PreparedRun
    from ship_sqla.kernel._ports import (
        ClaimBatch,
        ClaimedRun,
        ClaimRequest,
        EnqueueResult,
        FenceAnswer,
        HeartbeatBatch,
        LockProvider,
        SettleOutcome,
    )
    from ship_sqla.kernel._settlement import SettleRequest
    from ship_sqla.kernel._workflows import WorkflowStore

__all__ = ["MAX_ENQUEUE_BATCH", "MAX_PROGRESS_CHARS", "JobBackendBase"]

logger = logging.getLogger("ship_sqla.jobs")

MAX_ENQUEUE_BATCH: Final = 10_000
"""Requests per ``enqueue_many``: one statement's arrays on PostgreSQL, bounded (R1) on every
backend alike."""
MAX_PROGRESS_CHARS: Final = 4_096
"""The longest JSON text a run's progress (C3) may be: rewritten at every batch, read by every
page that shows the run."""


class JobBackendBase(ABC):
    """Base of the job backends (see the module docstring): call :meth:`_set_options` first
    thing in ``__init__``."""

    _clock: Clock
    _default_lock_provider: LockProvider | None
    _queue_depth_limit: int | None
    _on_error: ErrorHandler | None
    _wakeup: LocalWake

    def _set_options(
        self,
        *,
        clock: Clock | None,
        queue_depth_limit: int | None,
        on_error: ErrorHandler | None,
        default_lock_provider: LockProvider | None = None,
    ) -> None:
        if queue_depth_limit is not None and queue_depth_limit < 1:
            raise ConfigurationError(
                f"queue_depth_limit must be at least 1, got {queue_depth_limit!r}.",
                fix="pass None for no limit.",
            )
        self._clock = clock if clock is not None else SystemClock()
        self._default_lock_provider = default_lock_provider
        self._queue_depth_limit = queue_depth_limit
        self._on_error = on_error
        self._wakeup = LocalWake()
        self._cancel_watchers: list[Callable[[str], None]] = []

    # --- options ----------------------------------------------------------------------------------

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def default_lock_provider(self) -> LockProvider | None:
        """J4: the lock provider a runtime on this backend takes its single-runner locks from
        when ``start_job_runtime`` is given none; None: this storage has none (the claim's
        exclusion is all there is)."""
        return self._default_lock_provider

    @property
    def queue_depth_limit(self) -> int | None:
        return self._queue_depth_limit

    def report_error(self, error: BaseException) -> None:
        """Pass ``error`` to ``on_error`` (or log it when none is set). Never raises (J11)."""
        deliver_error(self._on_error, error, source="job runtime", log=logger)

    # --- the local wake (J3) ----------------------------------------------------------------------

    def wake(self) -> None:
        """Wake this process's waiters now (a committed enqueue, retry or settle made a run due);
        with none waiting the wake is kept for the next wait."""
        self._wakeup.wake()

    async def wait_for_work(self, timeout: float) -> None:  # noqa: ASYNC109 - the poll interval
        """Return when a local enqueue/retry committed, or after ``timeout`` seconds (J3)."""
        await self._wakeup.wait(self._clock, timeout)

    def start_listening(self, job_ids: Sequence[str]) -> None:  # noqa: B027 - a no-op hook
        """K1 (:class:`~ship_sqla.kernel.WakeSource`): nothing to listen to here; a backend
        that other processes can announce to overrides this (the PostgreSQL one)."""

    async def stop_listening(self, job_ids: Sequence[str]) -> None:  # noqa: B027 - a no-op hook
        """Undo :meth:`start_listening` (nothing here)."""

    def room_freed(self, job_ids: Iterable[str]) -> None:  # noqa: B027 - a no-op hook
        """F1 (:class:`~ship_sqla.kernel.WakeSource`): nobody else to wake here (this process's
        own loop learns of freed slots from its completer); the PostgreSQL backend announces."""

    async def require_support(self, definitions: Iterable[JobDefinition[Any]]) -> None:  # noqa: B027 - a no-op hook
        """:meth:`~ship_sqla.kernel.JobBackend.require_support`: a store that can serve every
        job answers at once (the in-memory one); the PostgreSQL one checks its indexes."""

    # --- cancel requests (K2) -------------------------------------------------------------------

    def watch_cancel_requests(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(run_id)`` whenever this backend learns that an operator asked to
        cancel a running run (:class:`~ship_sqla.kernel.CancelRequestSource`); returns the
        unsubscribe (idempotent). A runtime watches while it runs."""
        self._cancel_watchers.append(callback)

        def unwatch() -> None:
            if callback in self._cancel_watchers:
                self._cancel_watchers.remove(callback)

        return unwatch

    def _cancel_requested(self, run_id: str) -> None:
        """Tell every watcher that ``run_id``'s cancel was requested (after the request
        committed). A watcher that raises is reported, never propagated (J11)."""
        for callback in tuple(self._cancel_watchers):
            try:
                callback(run_id)
            except Exception as exc:  # noqa: BLE001 - J11: one watcher never breaks another
                self.report_error(exc)

    # --- the enqueue front ------------------------------------------------------------------------

    async def enqueue(
        self,
        job: JobDefinition[Any],
        payload: Any,  # noqa: ANN401 - the job's typed payload
        *,
        dedupe_key: str | None = None,
        run_at: datetime | None = None,
        run_id: str | None = None,
        priority: int | None = None,
        scope: Any = None,  # noqa: ANN401 - a TransactionScope; Any keeps the kernel ORM-free
        partition_key: str | None = None,
    ) -> EnqueueResult:
        """Enqueue one run (J1, J2; ``priority``: K6, None for the job's; ``partition_key``:
        F8/F9, for a job whose limits are per key); see :meth:`enqueue_many`."""
        request = EnqueueRequest(
            payload,
            dedupe_key=dedupe_key,
            run_at=run_at,
            run_id=run_id,
            priority=priority,
            partition_key=partition_key,
        )
        prepared = prepare_runs(
            job, (request,), trace_context=current_trace_context_json(), tenant=ambient_tenant()
        )
        [result] = await self.insert(job, prepared, scope=scope)
        return result

    async def enqueue_many(
        self,
        job: JobDefinition[Any],
        requests: Sequence[EnqueueRequest],
        *,
        scope: Any = None,  # noqa: ANN401 - a TransactionScope; Any keeps the kernel ORM-free
    ) -> list[EnqueueResult]:
        """Enqueue many runs of one job, results in request order. At most
        :data:`MAX_ENQUEUE_BATCH` requests; every one is prepared before the store sees any, so
        one bad request writes nothing. Every run stores the W3C trace context current here, if
        any (K7), the parent of its runs' spans."""
        if len(requests) > MAX_ENQUEUE_BATCH:
            raise BoundExceededError(
                f"enqueue_many got {len(requests)} requests; at most {MAX_ENQUEUE_BATCH} go in"
                " one call.",
                fix=f"split the requests into batches of at most {MAX_ENQUEUE_BATCH}.",
            )
        if not requests:
            return []
        prepared = prepare_runs(
            job, requests, trace_context=current_trace_context_json(), tenant=ambient_tenant()
        )
        return await self.insert(job, prepared, scope=scope)

    # --- workflow events (D4) ---------------------------------------------------------------------

    @property
    def workflows(self) -> WorkflowStore | None:
        """The backend's workflow store (SPEC §13); None: it has none."""
        return None

    async def publish_event(
        self,
        name: str,
        payload: Any = None,  # noqa: ANN401 - JSON
        *,
        key: str | None = None,
        scope: Any = None,  # noqa: ANN401 - a TransactionScope; Any keeps the kernel ORM-free
    ) -> int:
        """D4: publish event ``name`` (``key``: what it is about, e.g. an order id) with a JSON
        ``payload``, inside the active (or given) unit of work: the workflow runs waiting for
        it whose waits began before it committed receive it, once it commits (a rollback
        publishes nothing). The event's id."""
        from ship_sqla.kernel._workflows import (  # noqa: PLC0415 - cycle: it imports the ports
            WorkflowsNotConfiguredError,
            check_event_key,
            check_event_name,
            encode_event_payload,
        )

        store = self.workflows
        if store is None:
            raise WorkflowsNotConfiguredError(
                f"{type(self).__name__} has no workflow store: events cannot be published.",
                fix="create the backend with its steps and events tables (create_job_backend"
                " does by default; create them with Alembic or `ship-sqla schema sql`).",
            )
        event = check_event_name(name)
        event_key = check_event_key(key)
        return await store.publish_event(
            event, event_key, encode_event_payload(payload), scope=scope
        )

    # --- the settle front -------------------------------------------------------------------------

    async def settle(self, settlements: Sequence[SettleRequest]) -> list[SettleOutcome]:
        """Apply many settlements of any kinds, one outcome each, in order (J5: a stale token
        changes nothing and is answered ``"stale"``). A settlement repeated in one batch (same
        run and token) applies once: its repeats answer ``"stale"``, as they would one by one."""
        if not settlements:
            return []
        for settlement in settlements:
            if not isinstance(settlement, Settlement | Suspend):
                raise ConfigurationError(
                    f"settle() was given {settlement!r}, which is not a settlement.",
                    fix="build settlements with ship_sqla.kernel's completed(), failed(),"
                    " released(), snoozed() or cancelled().",
                )
        outcomes = await self._settle_if_tokens_current(settlements)
        if len(outcomes) != len(settlements):  # pragma: no cover - a store's bug, said plainly
            raise RuntimeError(
                f"{type(self).__name__} answered {len(outcomes)} outcomes for"
                f" {len(settlements)} settlements"
            )
        if _made_due(settlements, outcomes, self._clock.now()):
            self.wake()
        return outcomes

    # --- the fenced transaction of a transactional handler (J13, J14) -----------------------------

    async def fence(self, run: ClaimedRun) -> FenceAnswer:
        """:meth:`~ship_sqla.kernel.FencedRuns.fence`: lock ``run``'s row in the active unit of
        work and say whether its claim is current."""
        return await self._fence(run)

    async def settle_within(self, settlement: Settlement) -> SettleOutcome:
        """:meth:`~ship_sqla.kernel.FencedRuns.settle_within`: ``settlement`` applied in the
        active unit of work, by the store's one settle (J5 fenced), committed with it."""
        if not isinstance(settlement, Settlement):
            raise ConfigurationError(
                f"settle_within() was given {settlement!r}, which is not a settlement.",
                fix="build it with ship_sqla.kernel's completed() (or another constructor).",
            )
        return await self._settle_joined(settlement)

    async def record_progress(self, run: ClaimedRun, progress: Mapping[str, Any]) -> bool:
        """:meth:`~ship_sqla.kernel.FencedRuns.record_progress`: ``progress`` stored as
        ``run``'s in the active unit of work, fenced on its claim's token (C3, J5)."""
        try:
            encoded = json.dumps(dict(progress), allow_nan=False, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"run {run.run_id!r}: its progress {progress!r} is not a JSON object ({exc}).",
                fix="record a mapping of JSON values (numbers, text, None).",
            ) from exc
        if len(encoded) > MAX_PROGRESS_CHARS:
            raise ConfigurationError(
                f"run {run.run_id!r}: its progress is {len(encoded):,} characters of JSON, over"
                f" {MAX_PROGRESS_CHARS:,}; it is rewritten at every batch.",
                fix="record counts and times only (lag, last_batch_at, batches, items).",
            )
        return await self._record_progress(run, encoded)

    # --- storage: what each backend implements ---------------------------------------------------

    @abstractmethod
    async def _record_progress(self, run: ClaimedRun, progress_json: str) -> bool:
        """See :meth:`record_progress`: ``progress_json`` checked JSON object text."""

    @abstractmethod
    async def _fence(self, run: ClaimedRun) -> FenceAnswer:
        """See :meth:`fence`."""

    @abstractmethod
    async def _settle_joined(self, settlement: Settlement) -> SettleOutcome:
        """See :meth:`settle_within`."""

    @abstractmethod
    async def claim_state(self, run: ClaimedRun) -> str | None:
        """See :meth:`ship_sqla.kernel.FencedRuns.claim_state`."""

    @abstractmethod
    async def insert(
        self,
        job: JobDefinition[Any],
        runs: Sequence[PreparedRun],
        *,
        scope: Any = None,  # noqa: ANN401 - a TransactionScope; Any keeps the kernel ORM-free
    ) -> list[EnqueueResult]:
        """See :meth:`ship_sqla.kernel.RunStore.insert`."""

    @abstractmethod
    async def claim(self, request: ClaimRequest) -> ClaimBatch:
        """See :meth:`ship_sqla.kernel.RunStore.claim`."""

    @abstractmethod
    async def heartbeat(self, runs: Sequence[ClaimedRun]) -> HeartbeatBatch:
        """See :meth:`ship_sqla.kernel.RunStore.heartbeat`."""

    @abstractmethod
    async def _settle_if_tokens_current(
        self, settlements: Sequence[SettleRequest]
    ) -> list[SettleOutcome]:
        """Apply ``settlements`` where each token is current (J5); one outcome per settlement,
        in order."""


def _made_due(
    settlements: Sequence[SettleRequest], outcomes: Sequence[SettleOutcome], now: datetime
) -> bool:
    """A settlement put a run back to waiting due at ``now``: the local loop is worth waking."""
    for settlement, outcome in zip(settlements, outcomes, strict=True):
        if outcome == "suspended":
            return True  # D3: the store may have made it due at once (its event came)
        if isinstance(settlement, Settlement) and settlement.makes_due(outcome, now):
            return True
    return False
