"""The jobs' operator surface (J8, S1): ONE permission gate over a backend's administration port.

:class:`JobOperations` wraps a backend's ``admin`` (:class:`~ship_sqla.kernel.RunAdmin`: the
in-memory backend's or the PostgreSQL one's alike). Every operation first asks the application's
``authorizer(permission, operation)`` through the one gate of every operator surface
(:func:`ship_sqla.kernel._authorize.authorize`): a state-changing operation asks
``"ship.jobs:manage"``; a read asks ``"ship.jobs:manage"`` and, refused, ``"ship.jobs:read"``
(manage implies read, so an authorizer written before the read permission keeps working).
Anything but ``True`` raises :class:`~ship_sqla.errors.PermissionDeniedError` before the store
is asked anything, so a refusal changes nothing. Every state-changing operation that ran is
written to the audit sink, when one is given (S1: who, what, when, how many;
:mod:`ship_sqla.kernel._audit`), and one whose sink cannot be written (its table is missing)
changes nothing (S1's one audit rule: ``_audit_ready`` before the first change; ``audit=None``
writes nothing, on purpose). Inputs are checked next, also before any statement. The
rules of the operations live here, once: the page bound, the signed cursors
(:mod:`ship_sqla.kernel._cursor`) and the kernel :class:`~ship_sqla.Page`, the
refusals and their reasons, cleanup's walk over each job's retention in bounded batches, and
the bulk operations' walks. The stores only store.
"""

from __future__ import annotations

import reprlib
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeAlias
from urllib.parse import urlencode

import attrs

from ship_sqla.kernel._audit import (
    AUDIT_SCAN,
    MAX_AUDIT_PAGE,
    AuditEntry,
    AuditFilter,
    AuditLog,
    AuditPage,
    AuditSink,
    require_audit_writable,
    search_audit,
)
from ship_sqla.kernel._authorize import (
    Authorizer,
    authorize,
    authorize_read,
    check_authorizer,
    granted,
)
from ship_sqla.kernel._browse import (
    MAX_BROWSE_JOBS,
    MAX_CONSUMER_KEYS,
    MAX_THROUGHPUT_BUCKETS,
    MAX_THROUGHPUT_CAP,
    DeadError,
    DeadErrorReader,
    RunBrowser,
    RunQuery,
    position_cursor_values,
    position_from_cursor_values,
    position_of,
    run_order,
)
from ship_sqla.kernel._cursor import (
    KeysetPosition,
    decode_cursor,
    encode_cursor,
    query_fingerprint,
    resolve_secret,
)
from ship_sqla.kernel._errors import (
    BoundExceededError,
    ConfigurationError,
    InvalidCursorError,
    OutageError,
    RefusedError,
    ShipError,
)
from ship_sqla.kernel._evolution import MAX_PATCH_READ, MAX_PATCHES_LISTED, PatchReport
from ship_sqla.kernel._health import UNKNOWN_HEALTH, StorageHealth, StorageHealthSource
from ship_sqla.kernel._history import history_of
from ship_sqla.kernel._jobs import MAX_HANDLER_VERSION, is_job_id, require_int_within
from ship_sqla.kernel._keys import require_key
from ship_sqla.kernel._page import Page
from ship_sqla.kernel._parking import DIVERGED, MAX_PARKED_PAGE, ParkedRuns
from ship_sqla.kernel._partition_waits import (
    DEFAULT_PARTITION_WAIT_CAP,
    MAX_WAIT_PARTITIONS,
    PartitionLimits,
)
from ship_sqla.kernel._plans.scheduled_runs import scheduled_payload
from ship_sqla.kernel._ports import (
    FINISHED_STATES,
    RUN_STATES,
    TERMINAL_STATES,
    DeadQuery,
    JobBackend,
)
from ship_sqla.kernel._replay import Replayer
from ship_sqla.kernel._search import (
    BULK_STATES,
    DEFAULT_SCAN,
    MAX_BULK_BATCH,
    BulkAction,
    BulkOutcome,
    BulkPreview,
    BulkProgress,
    RunFilter,
    SearchPage,
    act_matching,
    check_bulk_token,
    check_bulk_total,
    preview_matching,
    search_runs,
)
from ship_sqla.kernel._tenancy import check_tenant
from ship_sqla.kernel._versions import MAX_VERSION_ROWS, VersionCount, VersionCountSource
from ship_sqla.kernel._workers import MAX_WORKERS_LISTED

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from ship_sqla.kernel._browse import ConsumerKeyProgress, ScheduleState, ThroughputBucket
    from ship_sqla.kernel._history import History, Redactor
    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._partition_waits import PartitionWait
    from ship_sqla.kernel._ports import (
        EnqueueResult,
        JobDemand,
        JobFailures,
        PausedJob,
        RunAdmin,
        RunRecord,
        RunState,
        StateCount,
    )
    from ship_sqla.kernel._workers import WorkerRecord, WorkerRegistry
    from ship_sqla.kernel._workflows import StepRecord, WorkflowAdmin

__all__ = [
    "LIVE_STATES",
    "MANAGE_PERMISSION",
    "MAX_BULK_IDS",
    "MAX_CLEANUP_BATCH",
    "MAX_PAGE_LIMIT",
    "MAX_PAUSED_JOBS",
    "MAX_STATE_GROUPS",
    "READ_PERMISSION",
    "AdministeredBackend",
    "AuditWriteError",
    "BulkResult",
    "CancelResult",
    "JobOperationRefusedError",
    "JobOperations",
    "LiveState",
    "PauseResult",
    "create_job_operations",
]

MANAGE_PERMISSION: Final = "ship.jobs:manage"
"""The permission every state-changing job operator operation asks the authorizer for (J8)."""
READ_PERMISSION: Final = "ship.jobs:read"
"""The permission a read asks for when ``ship.jobs:manage`` is refused (S2: a read-only
operator sees everything and can change nothing)."""
MAX_BULK_IDS: Final = 500
"""Run ids per ``retry_many`` / ``discard_many`` / ``cancel_many`` call."""
MAX_BULK_BATCHES: Final = 1000
"""Batches per ``*_dead_matching`` call."""
MAX_AUDIT_IDS: Final = 100
"""Run ids an audit entry of a bulk operation lists (the count is always exact)."""
MAX_PAGE_LIMIT: Final = 500
"""Runs per ``list_dead`` page (R1): a larger ``limit`` is refused, never silently cut."""
MAX_DEAD_ERRORS: Final = 2001
"""Dead runs one ``newest_dead_errors`` read answers at most (the error groups' bound, 2,000,
and one more to say whether older ones were left unread)."""
MAX_CLEANUP_BATCH: Final = 10_000
"""Runs per cleanup DELETE: one short transaction each."""
MAX_STATE_GROUPS: Final = 10_000
"""(job, state) groups per ``state_counts`` call."""
MAX_PAUSED_JOBS: Final = 10_000
"""Paused jobs per ``paused`` call."""
MAX_DEMAND_JOBS: Final = 1000
"""Jobs per ``demand`` call (named, or found: every job with waiting or running runs)."""
DEFAULT_DEMAND_CAP: Final = 10_000
MAX_DEMAND_CAP: Final = 1_000_000
"""The most runs ``demand`` counts per job and kind (due, delayed, running): its cost."""


BatchTransaction: TypeAlias = "Callable[[Callable[[], Awaitable[None]]], Awaitable[None]]"
"""Runs one batch of a bulk action by filter in one transaction: ``await transaction(work)``
(e.g. ``lambda work: uow.run(lambda _: work())``)."""


@attrs.frozen
class BulkResult:
    """What a bulk operation did: the runs it ``changed`` and those it left ``unchanged`` (not
    in a state the operation takes, unknown, or held by J1), in the order handled; ``complete``
    is False when a ``*_dead_matching`` call stopped at ``max_batches`` with more runs matching
    (call again)."""

    changed: tuple[str, ...]
    unchanged: tuple[str, ...] = ()
    complete: bool = True


@attrs.frozen
class CancelResult:
    """What :meth:`JobOperations.cancel` did (K2), with the run as it is after:

    - ``"cancelled"``: the run was waiting; it is ``cancelled`` now and never runs;
    - ``"requested"``: the run is running; the request is recorded (``cancel_requested_at``)
      and its holder cancels the handler, at once where it hears the notification, else at its
      next heartbeat; the run then ends ``cancelled`` (or ``completed``, if its handler
      finished first), never ``dead`` or ``waiting``;
    - ``"finished"``: the run had ended already (``record.state`` says how: completed, dead,
      discarded or cancelled); nothing changed.

    Cancelling again is harmless: a cancelled run answers ``"finished"``, a running one
    ``"requested"`` (its holder is told again; the first request's time is kept)."""

    outcome: Literal["cancelled", "requested", "finished"]
    record: RunRecord

    @property
    def changed(self) -> bool:
        """False when the run had already finished (nothing changed)."""
        return self.outcome != "finished"


@attrs.frozen
class PauseResult:
    """What :meth:`JobOperations.pause` did (K3; issue 25):

    - ``outcome``: ``"paused"`` (this call paused the job) or ``"already-paused"`` (nothing
      changed);
    - ``known``: whether the database held any trace of the job before this call: a run of it in
      any state (until cleanup deletes it), its schedule, its pause, or the gate state of its
      capped or rate-limited claims or capped enqueues. A job not yet known is paused all the
      same, on purpose: pausing a job ahead of its deploy (or of its first enqueue) is how its
      runs are held from the start. But an id that is not known is also what a typo looks
      like, so the answer says so, the CLI warns, the dashboard says it, and the audit entry
      records it (``details["known"]``); resume the job if the id was wrong.

    ``bool(result)`` is ``changed``, what ``pause`` answered before it returned a result."""

    job_id: str
    outcome: Literal["paused", "already-paused"]
    known: bool

    @property
    def changed(self) -> bool:
        """True when this call paused the job; False when it was paused already."""
        return self.outcome == "paused"

    def __bool__(self) -> bool:
        return self.changed


class JobOperationRefusedError(RefusedError, RuntimeError):
    """An operator operation does not apply to the run in its current state; nothing changed."""

    code = "SHIP_SQLA_JOB_OPERATION_REFUSED"


class AdministeredBackend(Protocol):
    """What :func:`create_job_operations` gates: a backend's administration port, its worker
    registry and its workflows (every :class:`~ship_sqla.kernel.JobBackend` carries them)."""

    @property
    def admin(self) -> RunAdmin: ...

    @property
    def workers(self) -> WorkerRegistry: ...

    @property
    def workflows(self) -> WorkflowAdmin | None: ...


def _check_list_runs(
    state: RunState,
    *,
    job_id: str | None,
    tenant: str | None,
    limit: int,
    created: tuple[datetime | None, datetime | None],
    finished: tuple[datetime | None, datetime | None],
) -> None:
    """:meth:`JobOperations.list_runs`' arguments, checked before any read (S2)."""
    _require_within(
        "list_runs limit",
        limit,
        MAX_PAGE_LIMIT,
        fix=f"ask for at most {MAX_PAGE_LIMIT} and follow next_cursor for the rest.",
    )
    if state not in RUN_STATES:
        raise ConfigurationError(
            f"list_runs state {state!r} is not a run state.",
            fix=f"pass one of {', '.join(RUN_STATES)}.",
        )
    if job_id is not None:
        _require_job_id(job_id, "list_runs")
    check_tenant(tenant, operation="list_runs")
    names = ("created_from", "created_to", "finished_from", "finished_to")
    bounds: tuple[object, ...] = (*created, *finished)  # a caller's values, unchecked
    for name, value in zip(names, bounds, strict=True):
        if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
            raise ConfigurationError(
                f"list_runs {name} must be an aware datetime, got {value!r}.",
                fix="pass datetime(..., tzinfo=UTC).",
            )
    order = run_order(state)
    if order == "finished" and created != (None, None):
        raise ConfigurationError(
            "list_runs of completed runs takes no created_from / created_to: completed runs"
            " page newest finished first (J18), and a creation-time range could only be"
            " filtered (S2: every page read is bounded).",
            fix="pass finished_from / finished_to for completed runs.",
        )
    if order != "finished" and finished != (None, None):
        raise ConfigurationError(
            f"list_runs of {state} runs takes no finished_from / finished_to: only completed"
            " runs page in finish order.",
            fix="drop finished_from / finished_to"
            + (
                " (dead, discarded and cancelled runs take created_from / created_to)."
                if order == "created"
                else "."
            ),
        )
    if order not in ("created", "finished") and created != (None, None):
        raise ConfigurationError(
            f"list_runs of {state} runs takes no created_from / created_to: {state} runs"
            " page in "
            + ("claim order" if state == "waiting" else "lease expiry order")
            + ", and a creation-time range could only be filtered, reading past every other"
            f" {state} run (S2: every page read is bounded).",
            fix="drop created_from / created_to for waiting and running runs (filter by job"
            " or tenant instead); the range applies to the finished states: created_from /"
            " created_to to dead, discarded and cancelled, finished_from / finished_to to"
            " completed.",
        )


def _dead_page_query(job_id: str | None, tenant: str | None) -> str:
    scope = ("every job",) if job_id is None else ("job", job_id)
    tenancy = () if tenant is None else ("tenant", tenant)
    return query_fingerprint(("ship_sqla.jobs.list_dead", *scope, *tenancy))


class JobOperations:
    """J8 operator operations over one backend's runs, each gated by ``ship.jobs:manage``. Build
    with :func:`create_job_operations`."""

    def __init__(
        self,
        admin: RunAdmin,
        *,
        authorizer: Authorizer,
        cursor_secret: bytes | str | None = None,
        workers: WorkerRegistry | None = None,
        workflows: WorkflowAdmin | None = None,
        audit: AuditSink | None = None,
        actor: str = "unnamed",
        health: StorageHealthSource | None = None,
        enqueuer: JobBackend | None = None,
    ) -> None:
        self._admin = admin
        self._enqueuer = enqueuer
        self._health = health
        self._authorizer = check_authorizer(authorizer)
        self._secret = resolve_secret(cursor_secret)
        self._workers = workers
        self._workflows = workflows
        if audit is not None and not isinstance(audit, AuditSink):
            raise ConfigurationError(
                f"audit must be an AuditSink (an async record(entry)), got {type(audit).__name__}.",
                fix="pass create_audit_log(...) or InMemoryAuditLog(), or omit it.",
            )
        self._audit = audit
        self._actor = _checked_actor(actor)

    def acting_as(self, actor: str, *, authorizer: Authorizer | None = None) -> JobOperations:
        """The same operations for another caller: ``actor`` is who the audit log names,
        ``authorizer`` (default: this one's) decides what that caller may do. Cheap: the
        dashboard builds one per request."""
        return JobOperations(
            self._admin,
            authorizer=self._authorizer if authorizer is None else authorizer,
            cursor_secret=self._secret,
            workers=self._workers,
            workflows=self._workflows,
            audit=self._audit,
            actor=actor,
            health=self._health,
            enqueuer=self._enqueuer,
        )

    @property
    def actor(self) -> str:
        """Who this surface's audit entries name."""
        return self._actor

    @property
    def audited(self) -> bool:
        """Whether state-changing operations are written to an audit sink (S1)."""
        return self._audit is not None

    async def _audit_ready(self) -> None:
        """S1's one audit rule, asked by every state-changing operation after its input checks
        and before its first change: a configured audit that cannot be written (its table is
        missing) raises :class:`~ship_sqla.errors.AuditUnavailableError` and nothing changes.
        Without an audit (``audit=None``) nothing is checked, and nothing written."""
        await require_audit_writable(self._audit)

    async def _record(
        self, operation: str, target: str, count: int, details: dict[str, Any] | None = None
    ) -> None:
        """S1: one entry per state-changing operation that ran (joins the caller's unit of work
        where the sink can). A sink failure is raised, never swallowed: the change it would
        have described may have committed already, and the error says so."""
        if self._audit is None:
            return
        entry = AuditEntry(self._actor, f"jobs.{operation}", target, count, details or {})
        try:
            await self._audit.record(entry)
        except ShipError:
            raise
        except Exception as exc:
            raise AuditWriteError(
                f"jobs.{operation} of {target!r} by {self._actor!r} ran ({count} changed) but"
                f" its audit entry could not be written: {type(exc).__name__}: {exc}",
                fix="check the audit table (ship_audit_table) exists and is writable; run"
                " operator operations inside a unit of work to make the change and its entry"
                " atomic.",
            ) from exc

    def _workflow_admin(self) -> WorkflowAdmin:
        if self._workflows is None:
            raise ConfigurationError(
                "this job backend keeps no workflow steps (SPEC §13).",
                fix="use create_job_backend(...) or InMemoryJobBackend(...): both have a"
                " workflow store.",
            )
        return self._workflows

    async def list_steps(self, run_id: str) -> list[StepRecord]:
        """D6: a workflow run's stored steps, in handler order (empty for a run that stored
        none)."""
        await self._authorize_read("list_steps")
        require_key(run_id, "run id")
        return await self._workflow_admin().list_steps(run_id)

    async def export_history(
        self, run_id: str, *, redact: Redactor | None = None
    ) -> History | None:
        """D11: one run's history (its record and stored steps) in the replayable file format
        (:func:`~ship_sqla.kernel._history.write_history` writes it), every payload and result
        passed through ``redact`` first; None when there is no such run. A read (S2)."""
        await self._authorize_read("export_history")
        _require_run_id(run_id, "export_history")
        record = await self._admin.get_run(run_id)
        if record is None:
            return None
        return history_of(record, await self._workflow_admin().list_steps(run_id), redact=redact)

    async def export_histories(
        self,
        *,
        state: RunState,
        job_id: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        redact: Redactor | None = None,
    ) -> Page[History]:
        """D11: the histories of one page of :meth:`list_runs` (``state``, ``job_id``, at most
        ``limit``, keyset-paged by ``cursor``): bounded, one steps read per run. A read (S2)."""
        await self._authorize_read("export_histories")
        page = await self.list_runs(state=state, job_id=job_id, limit=limit, cursor=cursor)
        admin = self._workflow_admin()
        histories = [
            history_of(record, await admin.list_steps(record.run_id), redact=redact)
            for record in page.items
        ]
        return Page(tuple(histories), page.next_cursor)

    async def patches(
        self,
        job_id: str,
        patch_ids: Iterable[str] | None = None,
        *,
        read: int = MAX_PATCH_READ,
    ) -> list[PatchReport]:
        """D8: per patch of job ``job_id`` (the ones named, else every patch id stored, at most
        ``MAX_PATCHES_LISTED``, those this job never marked and no live run holds left out), the
        live runs holding its marker and those created before its first marker: each figure
        one bounded statement reading at most ``read`` live runs of the job."""
        await self._authorize_read("patches")
        if not is_job_id(job_id):
            raise ConfigurationError(f"job id {job_id!r} is not valid.", fix="name a job id.")
        _require_within("patches read", read, MAX_PATCH_READ, fix="read fewer live runs.")
        workflows = self._workflow_admin()
        named = patch_ids is not None
        ids = list(patch_ids or ())
        for patch_id in ids:
            if not is_job_id(patch_id):
                raise ConfigurationError(
                    f"patch id {patch_id!r} is not valid.",
                    fix="name a patch id as ctx.patched got it (letters, digits and _ . : -).",
                )
        if not named:
            ids = await workflows.patch_ids(limit=MAX_PATCHES_LISTED)
        reports = []
        for patch_id in ids[:MAX_PATCHES_LISTED]:
            holding = await workflows.patch_holding(job_id, patch_id, read=read)
            first, lacking = await workflows.patch_lacking(job_id, patch_id, read=read)
            if named or first is not None or holding.runs:
                reports.append(PatchReport(job_id, patch_id, first, holding, lacking))
        return reports

    async def delete_events(
        self, *, older_than: timedelta, batch_size: int = 1000, max_batches: int = 100
    ) -> int:
        """Workflow events' retention (D4): delete events published at least ``older_than``
        ago, in batches of at most ``batch_size`` (one bounded statement each), at most
        ``max_batches``; the number deleted (call again when it is ``batch_size *
        max_batches``). A wait matches only events committed after it began, so keep events at
        least as long as the longest wait's timeout plus the longest a woken run may wait to be
        claimed."""
        await self._authorize("delete_events")
        _require_within(
            "delete_events batch_size",
            batch_size,
            MAX_CLEANUP_BATCH,
            fix="use a smaller batch_size and more batches.",
        )
        _require_within(
            "delete_events max_batches",
            max_batches,
            MAX_CLEANUP_BATCH,
            fix="call again instead of asking for more batches.",
        )
        given: object = older_than
        if not isinstance(given, timedelta) or older_than < timedelta(0):
            raise ConfigurationError(
                f"older_than must be a timedelta of at least 0, got {older_than!r}.",
                fix="pass e.g. timedelta(days=7).",
            )
        admin = self._workflow_admin()
        await self._audit_ready()
        deleted = 0
        for _ in range(max_batches):
            batch = await admin.delete_events(older_than=older_than, limit=batch_size)
            deleted += batch
            if batch < batch_size:
                break
        await self._record(
            "delete_events", "events", deleted, {"older_than": older_than.total_seconds()}
        )
        return deleted

    async def rerun_from_step(self, run_id: str, step: str) -> RunRecord:
        """D6: drop step ``step`` of a dead (or waiting) workflow run and every step started
        after it, and make the run due now (a dead one with one more attempt): its handler
        replays the steps before ``step`` and runs ``step`` and the rest again. Refused for a
        run in another state (a running run must settle first) or without such a step."""
        await self._authorize("rerun_from_step")
        require_key(run_id, "run id")
        given: object = step
        if not isinstance(given, str) or not step:
            raise ConfigurationError(
                f"step {step!r} must be a step name.",
                fix="name a stored step (`ship-sqla jobs show RUN_ID` lists them).",
            )
        workflows = self._workflow_admin()
        await self._audit_ready()
        record = await workflows.rerun_from_step(run_id, step)
        if record is not None:
            await self._record("rerun_from_step", run_id, 1, {"step": step})
            return record
        current = await self._admin.get_run(run_id)
        if current is not None and current.state in ("dead", "waiting"):
            raise JobOperationRefusedError(
                f"rerun of run {run_id!r} from step {step!r}: the run has no such step, or a"
                f" newer live run of job {current.job_id!r} holds its dedupe key (J1).",
                fix="name a stored step (`ship-sqla jobs show RUN_ID` lists them).",
            )
        raise await self._refusal("rerun from a step", run_id, "dead or waiting")

    async def _authorize(self, operation: str) -> None:
        await authorize(self._authorizer, MANAGE_PERMISSION, operation)

    async def _authorize_read(self, operation: str) -> None:
        """A read: ``ship.jobs:manage`` (which implies read), else ``ship.jobs:read``."""
        await authorize_read(self._authorizer, MANAGE_PERMISSION, READ_PERMISSION, operation)

    async def can_manage(self) -> bool:
        """Whether this caller may change state (asks ``ship.jobs:manage`` for operation
        ``"dashboard"``): the dashboard shows action buttons only then. Every operation still
        asks for itself."""
        return await granted(self._authorizer, MANAGE_PERMISSION, "dashboard")

    async def list_dead(
        self,
        *,
        job_id: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        tenant: str | None = None,
    ) -> Page[RunRecord]:
        """Dead runs (of ``job_id``, or of every job; of ``tenant`` only, F2, when given),
        newest first, keyset-paged by ``(finished_at, run_id)``: at most ``limit`` (1..500) per
        page; pass ``next_cursor`` back for the next page (None: no more). A cursor is signed
        and valid only for the same ``job_id`` and ``tenant``. A tenant filter reads past the
        other tenants' dead runs of the job: keep dead letters few (retry, discard, cleanup)."""
        await self._authorize_read("list_dead")
        _require_within(
            "list_dead limit",
            limit,
            MAX_PAGE_LIMIT,
            fix=f"ask for at most {MAX_PAGE_LIMIT} and follow next_cursor for the rest.",
        )
        check_tenant(tenant, operation="list_dead")
        query = _dead_page_query(job_id, tenant)
        after = None if cursor is None else _position(cursor, self._secret, query)
        rows = await self._admin.list_dead(
            DeadQuery(limit=limit + 1, job_id=job_id, after=after, tenant=tenant)
        )
        items = tuple(rows[:limit])
        next_cursor = None
        if len(rows) > limit:
            last = items[-1]
            assert last.finished_at is not None  # noqa: S101 - dead runs are finished
            position = KeysetPosition(query, (last.finished_at, last.run_id))
            next_cursor = encode_cursor(position, self._secret)
        return Page(items, next_cursor)

    async def get_run(self, run_id: str) -> RunRecord | None:
        """One run with its history, or None."""
        await self._authorize_read("get_run")
        _require_run_id(run_id, "get_run")
        return await self._admin.get_run(run_id)

    async def retry(self, run_id: str) -> RunRecord:
        """A dead run waits again, due now, with exactly one more attempt
        (``max_attempts = attempt + 1``); the local loop is woken (J3). Refused unless the run
        is dead and no newer live run holds its dedupe key (J1)."""
        await self._authorize("retry")
        _require_run_id(run_id, "retry")
        await self._audit_ready()
        record = await self._admin.retry_dead(run_id)
        if record is None:
            raise await self._refusal("retry", run_id, "dead")
        await self._record("retry", run_id, 1)
        return record

    async def discard(self, run_id: str) -> RunRecord:
        """A waiting or dead run becomes discarded. Refused for running (and finished) runs."""
        await self._authorize("discard")
        _require_run_id(run_id, "discard")
        await self._audit_ready()
        record = await self._admin.discard(run_id)
        if record is None:
            raise await self._refusal("discard", run_id, "waiting or dead")
        await self._record("discard", run_id, 1)
        return record

    def _parked_runs(self) -> ParkedRuns:
        admin = self._admin
        if not isinstance(admin, ParkedRuns):
            raise ConfigurationError(
                f"this backend's run administration ({type(admin).__name__}) keeps no parked"
                " runs (D10).",
                fix="use create_job_backend(...) or InMemoryJobBackend.",
            )
        return admin

    async def list_parked(
        self,
        *,
        job_id: str | None = None,
        after: tuple[str, str] | None = None,
        limit: int = 100,
    ) -> list[RunRecord]:
        """D10: workflow runs parked on a divergence (of ``job_id``, or every job), at most
        ``limit`` (1..1,000) by (job id, run id), after the ``(job_id, run_id)`` of the last one
        of the previous page. Each one's last history entry (kind ``"diverged"``) says where
        it diverged. One statement (``<runs>_parked_idx``)."""
        await self._authorize_read("list_parked")
        _require_within("list_parked limit", limit, MAX_PARKED_PAGE, fix="page with after=.")
        if job_id is not None:
            _require_job_id(job_id, "list_parked")
        return await self._parked_runs().list_parked(job_id=job_id, after=after, limit=limit)

    async def unpark(self, run_id: str) -> RunRecord:
        """D10: a parked run is due now: it replays on the deployed code (and parks again if it
        still diverges). Refused unless the run is parked. To drop the diverging steps instead,
        ``rerun_from_step``; to end it, ``discard``."""
        await self._authorize("unpark")
        _require_run_id(run_id, "unpark")
        store = self._parked_runs()
        await self._audit_ready()
        record = await store.unpark(run_id)
        if record is None:
            raise await self._refusal("unpark", run_id, "parked (waiting on a divergence)")
        await self._record("unpark", run_id, 1)
        return record

    async def move_version(
        self, run_id: str, version: int, *, registry: Iterable[JobDefinition[Any]]
    ) -> RunRecord:
        """D10: move a parked run to handler ``version`` of ``registry`` (the code about to
        run it) and unpark it, only once its history replays cleanly on that version
        (:class:`~ship_sqla.testing.Replayer`, D11: no effect runs). Refused unless the run is
        parked, and when the replay diverges or fails (the refusal says where)."""
        await self._authorize("move_version")
        _require_run_id(run_id, "move_version")
        require_int_within(
            version, "move_version version", 1, MAX_HANDLER_VERSION, "pass a version from 1."
        )
        store = self._parked_runs()
        record = await self._admin.get_run(run_id)
        if record is None or record.wait_for != DIVERGED or record.state != "waiting":
            raise await self._refusal("move_version", run_id, "parked (waiting on a divergence)")
        steps = await self._workflow_admin().list_steps(run_id)
        result = await Replayer(registry).replay(history_of(record, steps, version=version))
        if not result.clean:
            raise JobOperationRefusedError(
                f"move of run {run_id!r} to version {version}: its history does not replay"
                f" cleanly on it: {result.describe()}",
                fix="pick the version whose handler made this history (ship-sqla workflows"
                " replay), or re-run the run from a step (rerun_from_step).",
            )
        await self._audit_ready()
        moved = await store.move_version(run_id, version)
        if moved is None:
            raise await self._refusal("move_version", run_id, "parked (waiting on a divergence)")
        await self._record("move_version", run_id, 1, {"version": version})
        return moved

    async def cleanup(
        self,
        definitions: Iterable[JobDefinition[Any]],
        *,
        batch_size: int = 1000,
        max_batches: int = 100,
    ) -> dict[str, int]:
        """Delete each job's completed / dead / discarded / cancelled runs older than its
        ``retention``: batches of at most ``batch_size`` runs, each one bounded statement, at
        most ``max_batches`` per job. Returns the number deleted per job id; call again when a job
        hit ``max_batches`` (its count is ``batch_size * max_batches``)."""
        await self._authorize("cleanup")
        _require_within(
            "cleanup batch_size",
            batch_size,
            MAX_CLEANUP_BATCH,
            fix="use a smaller batch_size and more batches.",
        )
        if max_batches < 1:
            raise ConfigurationError(f"cleanup max_batches must be at least 1, got {max_batches}.")
        await self._audit_ready()
        deleted: dict[str, int] = {}
        for job in definitions:
            keep = {
                "completed": job.retention.completed,
                "dead": job.retention.dead,
                "discarded": job.retention.discarded,
                "cancelled": job.retention.cancelled,
            }
            count = 0
            batches = 0
            for state in FINISHED_STATES:
                while batches < max_batches:
                    batches += 1
                    removed = await self._admin.delete_finished(
                        job.id, state, older_than=keep[state], limit=batch_size
                    )
                    count += removed
                    if removed < batch_size:
                        break
            deleted[job.id] = deleted.get(job.id, 0) + count
        await self._record("cleanup", ",".join(deleted) or "no jobs", sum(deleted.values()))
        return deleted

    async def storage_health(self) -> StorageHealth:
        """J22: the backend's storage health (tables' tuples, sizes and vacuum ages; the oldest
        held snapshot and its holder), judged by the backend's bounds:
        :data:`~ship_sqla.kernel._health.UNKNOWN_HEALTH` when the backend reads none (in
        memory). A few catalog reads, whatever the backlog."""
        await self._authorize_read("storage_health")
        if self._health is None:
            return UNKNOWN_HEALTH
        return await self._health.storage_health()

    async def state_counts(self, *, limit: int = 1000) -> list[StateCount]:
        """Runs per (job, state) with, for waiting runs, the age of the oldest due one: at most
        ``limit`` (1..10,000) groups ordered by job then state. Ask for one more group than you
        show to know whether any were left out. Not index-served: it aggregates the runs table
        (cleanup keeps it bounded by each job's retention)."""
        await self._authorize_read("state_counts")
        _require_within(
            "state_counts limit",
            limit,
            MAX_STATE_GROUPS,
            fix="clean up old runs (cleanup) so fewer (job, state) groups remain.",
        )
        return await self._admin.state_counts(limit=limit)

    async def partition_waits(
        self,
        jobs: Iterable[JobDefinition[Any]],
        *,
        max_partitions: int = 100,
        cap: int = DEFAULT_PARTITION_WAIT_CAP,
    ) -> list[PartitionWait]:
        """F8/F9 seen: per job of ``jobs`` whose limits are partitioned (the others are
        skipped), the partitions whose due runs wait on the rate limit or the cap, and until
        when (:class:`~ship_sqla.jobs.PartitionWait`): at most ``max_partitions`` partitions
        per job (tenant order, at most 1,000), due runs counted up to ``cap``. One bounded
        statement."""
        await self._authorize_read("partition_waits")
        _require_within(
            "partition_waits max_partitions",
            max_partitions,
            MAX_WAIT_PARTITIONS,
            fix="ask for at most 1,000 partitions per job.",
        )
        _require_within(
            "partition_waits cap",
            cap,
            MAX_DEMAND_CAP,
            fix="omit it (1,000), or pass how many due runs per partition are worth counting.",
        )
        limits = [found for job in jobs if (found := PartitionLimits.of(job)) is not None]
        if len(limits) > MAX_DEMAND_JOBS:
            raise BoundExceededError(
                f"partition_waits got {len(limits)} partitioned jobs; at most"
                f" {MAX_DEMAND_JOBS} per call.",
                fix="ask in batches of at most 1,000 jobs.",
            )
        return await self._admin.partition_waits(limits, max_partitions=max_partitions, cap=cap)

    async def version_counts(
        self, job_ids: Iterable[str] | None = None, *, limit: int = MAX_VERSION_ROWS
    ) -> list[VersionCount]:
        """D9: live (waiting, running) runs of versioned jobs per (job, handler version,
        state), of ``job_ids`` (None: every job), at most ``limit`` (1..10,000) groups, ordered
        by job, version and state. One statement (an index-only scan of the live versioned
        runs on PostgreSQL); the input of ``ship-sqla workflows versions``."""
        await self._authorize_read("version_counts")
        _require_within(
            "version_counts limit",
            limit,
            MAX_VERSION_ROWS,
            fix="name the jobs to count (job_ids=[...]).",
        )
        admin = self._admin
        if not isinstance(admin, VersionCountSource):
            raise ConfigurationError(
                f"this backend's run administration ({type(admin).__name__}) does not count"
                " runs per handler version (D9).",
                fix="use create_job_backend(...) or InMemoryJobBackend.",
            )
        wanted = None if job_ids is None else list(dict.fromkeys(job_ids))
        return await admin.version_counts(wanted, limit=limit)

    async def demand(
        self, job_ids: Iterable[str] | None = None, *, cap: int = DEFAULT_DEMAND_CAP
    ) -> list[JobDemand]:
        """F5, what an autoscaler (KEDA, a cron) scales on: per job, the due, delayed and running
        runs, each counted up to ``cap`` (default 10,000; at most 1,000,000: the query reads at
        most about ``cap`` index entries per kind and priority level, whatever the backlog), and
        the age of the oldest due run (exact). ``job_ids``: those jobs (at most 1,000, each
        answered, zeros when idle); None: every job with waiting or running runs (at most
        1,000, in job id byte order). One statement."""
        await self._authorize_read("demand")
        given: object = cap  # typed int, but a caller may pass anything
        if isinstance(given, bool) or not isinstance(given, int):
            raise BoundExceededError(
                f"demand cap must be an int, got {cap!r}.",
                fix="omit it (10,000), or pass how many runs per kind are worth counting.",
            )
        _require_within(
            "demand cap",
            cap,
            MAX_DEMAND_CAP,
            fix="omit it (10,000), or pass how many runs per kind are worth counting.",
        )
        wanted: list[str] | None = None
        if job_ids is not None:
            if isinstance(job_ids, str):
                raise ConfigurationError(
                    f"demand job_ids must be a list of job ids, got the string {job_ids!r}.",
                    fix=f"pass [{job_ids!r}].",
                )
            wanted = list(dict.fromkeys(job_ids))
            for job_id in wanted:
                _require_job_id(job_id, "demand")
            if len(wanted) > MAX_DEMAND_JOBS:
                raise BoundExceededError(
                    f"demand got {len(wanted)} job ids; at most {MAX_DEMAND_JOBS} per call.",
                    fix="ask in batches of at most 1,000 jobs.",
                )
        return await self._admin.demand(wanted, cap=cap, max_jobs=MAX_DEMAND_JOBS)

    async def newest_dead_errors(self, job_id: str, *, limit: int = 500) -> list[DeadError]:
        """The newest ``limit`` (1..:data:`MAX_DEAD_ERRORS`) dead runs of ``job_id``, newest
        created first (the runs pages' order): each one's id, job, last error and finish time,
        what the error groups read (issue 36 items 1 and 6). On PostgreSQL one bounded
        statement of those four columns (DEAD_ERRORS); elsewhere the runs pages."""
        await self._authorize_read("newest_dead_errors")
        _require_job_id(job_id, "newest_dead_errors")
        _require_within(
            "newest_dead_errors limit",
            limit,
            MAX_DEAD_ERRORS,
            fix=f"ask for at most {MAX_DEAD_ERRORS:,} dead runs.",
        )
        browser = self._browser()
        if isinstance(browser, DeadErrorReader):
            return await browser.newest_dead_errors(job_id, limit=limit)
        found: list[DeadError] = []
        after = None
        while len(found) < limit:
            ask = min(MAX_PAGE_LIMIT, limit - len(found))
            query = RunQuery(state="dead", limit=ask, job_id=job_id, after=after)
            rows = await browser.list_runs(query, max_jobs=MAX_BROWSE_JOBS)
            found.extend(
                DeadError(
                    r.record.run_id, r.record.job_id, r.record.last_error, r.record.finished_at
                )
                for r in rows
            )
            if len(rows) < ask:
                break
            after = position_of(rows[-1])
        return found

    async def dead_by_job(self, *, cap: int = DEFAULT_DEMAND_CAP) -> list[JobFailures]:
        """Every job with dead runs (at most 1,000, in job id byte order), each with its dead
        runs counted up to ``cap`` (default 10,000; at most 1,000,000) and the finish time of
        its newest dead run: the overview's failing jobs, whether or not anything of theirs
        waits or runs. One bounded statement (issue 36)."""
        await self._authorize_read("dead_by_job")
        given: object = cap
        if isinstance(given, bool) or not isinstance(given, int):
            raise BoundExceededError(
                f"dead_by_job cap must be an int, got {cap!r}.",
                fix="omit it (10,000), or pass how many dead runs per job are worth counting.",
            )
        _require_within(
            "dead_by_job cap",
            cap,
            MAX_DEMAND_CAP,
            fix="omit it (10,000), or pass how many dead runs per job are worth counting.",
        )
        return await self._admin.dead_by_job(cap=cap, max_jobs=MAX_DEMAND_JOBS)

    async def cancel(self, run_id: str) -> CancelResult:
        """Cancel a run (K2): a waiting one at once; a running one by recording the request,
        which its holder acts on. A run that has finished changes nothing and says so
        (:class:`CancelResult`); an unknown run is refused (``JobOperationRefusedError``). The
        statement is fenced on the live states: it can never rewrite a finished run."""
        await self._authorize("cancel")
        _require_run_id(run_id, "cancel")
        await self._audit_ready()
        result = await self._cancel_authorized(run_id)
        if result.changed:
            await self._record("cancel", run_id, 1, {"outcome": result.outcome})
        return result

    async def _cancel_authorized(self, run_id: str) -> CancelResult:
        # A second try covers an operator retry that revived a dead run between the two reads.
        for _ in range(2):
            record = await self._admin.cancel(run_id)
            if record is not None:
                outcome: Literal["cancelled", "requested"] = (
                    "cancelled" if record.state == "cancelled" else "requested"
                )
                return CancelResult(outcome, record)
            record = await self._admin.get_run(run_id)
            if record is None:
                raise JobOperationRefusedError(
                    f"cancel of run {run_id!r}: no such run.",
                    fix="pass the id of an existing run (ship-sqla jobs show RUN_ID).",
                )
            if record.state in TERMINAL_STATES:
                return CancelResult("finished", record)
        raise JobOperationRefusedError(
            f"cancel of run {run_id!r}: the run kept changing state while it was being"
            " cancelled (an operator retried it meanwhile); nothing was cancelled.",
            fix="cancel it again.",
        )

    async def pause(self, job_id: str) -> PauseResult:
        """Pause ``job_id`` (K3): once this returns, no claim that starts takes a run of it, in
        any process; running runs finish; enqueue and schedules still add runs (they wait).
        The :class:`PauseResult` says whether this call paused it (``changed``) and whether
        the database knew the job at all (``known``): a job with no run, schedule or other
        trace yet is paused too (ahead of its deploy), and the answer says it is not known."""
        await self._authorize("pause")
        _require_job_id(job_id, "pause")
        await self._audit_ready()
        known = await self._admin.job_known(job_id)
        paused = await self._admin.pause(job_id)
        # Paused already: its pause is a trace, whatever job_known saw just before.
        result = PauseResult(job_id, "paused" if paused else "already-paused", known or not paused)
        await self._record("pause", job_id, int(paused), {"known": result.known})
        return result

    async def resume(self, job_id: str) -> bool:
        """Resume ``job_id`` (K3): its runs are claimable at once and the workers are woken.
        True when it was paused, False when it was not (nothing changed)."""
        await self._authorize("resume")
        _require_job_id(job_id, "resume")
        await self._audit_ready()
        resumed = await self._admin.resume(job_id)
        await self._record("resume", job_id, int(resumed))
        return resumed

    async def run_now(self, job: JobDefinition[Any]) -> EnqueueResult:
        """Run a scheduled job now (issue 36): one run of ``job``, due at once, with the
        payload its schedule's ticks give (``None`` or ``{}``, J9), outside its schedule (the
        next occurrence is unchanged). An enqueue like any other: the job's idempotency policy
        and queue-depth limit apply, and the answer says so (deduplicated, or rejected)."""
        await self._authorize("run_now")
        if job.schedule is None:
            raise ConfigurationError(
                f"job {job.id!r} has no schedule: run now gives a run the payload a schedule's"
                " tick gives.",
                fix="enqueue the job with its payload instead (backend.enqueue or"
                " `ship-sqla enqueue`).",
            )
        if self._enqueuer is None:
            raise ConfigurationError(
                "these operations were built over a backend that cannot enqueue.",
                fix="build them with create_job_operations(backend) over a whole job backend.",
            )
        payload = scheduled_payload(job)
        await self._audit_ready()
        result = await self._enqueuer.enqueue(job, payload)
        details = {"run_id": result.run_id, "deduplicated": result.deduplicated}
        await self._record("run_now", job.id, int(result.accepted), details)
        return result

    async def paused(self, *, limit: int = 1000) -> list[PausedJob]:
        """The paused jobs with when each was paused, by job id, at most ``limit``
        (1..10,000)."""
        await self._authorize_read("paused")
        _require_within(
            "paused limit",
            limit,
            MAX_PAUSED_JOBS,
            fix=f"ask for at most {MAX_PAUSED_JOBS}; resume the jobs that need not stay paused.",
        )
        return await self._admin.paused(limit=limit)

    async def workers(self, *, limit: int = MAX_WORKERS_LISTED) -> list[WorkerRecord]:
        """F6: the worker registry, by worker id, at most ``limit`` (1..1,000) entries: each
        worker runtime's id, host, pid, start, last heartbeat, jobs, runs in flight, whether it
        is draining, and whether it is the fleet's queue sampler (F5). Entries of workers that
        died stay until they are pruned (not seen for ``WORKER_STALE_AFTER`` seconds). Refused
        (``ConfigurationError``) for a backend that keeps no registry."""
        await self._authorize_read("workers")
        _require_within(
            "workers limit",
            limit,
            MAX_WORKERS_LISTED,
            fix=f"ask for at most {MAX_WORKERS_LISTED} entries.",
        )
        if self._workers is None:
            raise ConfigurationError(
                "this job backend keeps no worker registry (F6).",
                fix="use create_job_backend(...) or InMemoryJobBackend(...), or give the backend a"
                " `workers` property implementing WorkerRegistry.",
            )
        return await self._workers.list_workers(limit=limit)

    # --- bulk operations (S1: one audited operation each) -------------------------------------

    async def retry_many(self, run_ids: Iterable[str]) -> BulkResult:
        """Retry each dead run of ``run_ids`` (at most 500; see :meth:`retry`), in one
        statement on PostgreSQL (the admin port's ``retry_dead_batch``); runs that are not dead
        (or whose dedupe key a newer live run, or an earlier id of the list, holds, J1) are
        left alone and listed as ``unchanged``."""
        await self._authorize("retry_many")
        ids = _bulk_ids(run_ids, "retry_many")
        return await self._bulk("retry_many", ids, self._admin.retry_dead_batch, target="ids")

    async def discard_many(self, run_ids: Iterable[str]) -> BulkResult:
        """Discard each waiting or dead run of ``run_ids`` (at most 500), in one statement on
        PostgreSQL (``discard_batch``)."""
        await self._authorize("discard_many")
        ids = _bulk_ids(run_ids, "discard_many")
        return await self._bulk("discard_many", ids, self._admin.discard_batch, target="ids")

    async def cancel_many(self, run_ids: Iterable[str]) -> BulkResult:
        """Cancel each run of ``run_ids`` (at most 500; see :meth:`cancel`), in one statement on
        PostgreSQL (``cancel_batch``; a row someone holds, J13, the single-run way after):
        finished or unknown runs are ``unchanged``."""
        await self._authorize("cancel_many")
        ids = _bulk_ids(run_ids, "cancel_many")
        return await self._bulk("cancel_many", ids, self._admin.cancel_batch, target="ids")

    async def retry_dead_matching(
        self,
        *,
        job_id: str | None = None,
        tenant: str | None = None,
        batch_size: int = 500,
        max_batches: int = 100,
    ) -> BulkResult:
        """Retry every dead run of ``job_id`` (None: every job) and ``tenant`` (None: any),
        newest first, in batches of ``batch_size`` (1..500) read by one bounded page each and
        changed by one statement each (``retry_dead_batch``), at most ``max_batches``;
        ``complete`` is False when runs may remain (call again). Runs that die while it walks,
        after it started, are not included."""
        await self._authorize("retry_dead_matching")
        return await self._dead_matching(
            "retry_dead_matching",
            self._admin.retry_dead_batch,
            job_id=job_id,
            tenant=tenant,
            batch_size=batch_size,
            max_batches=max_batches,
        )

    async def discard_dead_matching(
        self,
        *,
        job_id: str | None = None,
        tenant: str | None = None,
        batch_size: int = 500,
        max_batches: int = 100,
    ) -> BulkResult:
        """Discard every dead run matching the filter (see :meth:`retry_dead_matching`)."""
        await self._authorize("discard_dead_matching")
        return await self._dead_matching(
            "discard_dead_matching",
            self._admin.discard_batch,
            job_id=job_id,
            tenant=tenant,
            batch_size=batch_size,
            max_batches=max_batches,
        )

    async def cancel_matching(
        self,
        *,
        job_id: str | None = None,
        tenant: str | None = None,
        state: LiveState | None = None,
        created_before: datetime | None = None,
        batch_size: int = 500,
        max_batches: int = 100,
    ) -> BulkResult:
        """Cancel every live run (K2, see :meth:`cancel`) of ``job_id`` (None: every job),
        ``tenant`` (None: any) and ``state`` (``"waiting"``, ``"running"``; None: both, waiting
        first), created before ``created_before`` (an aware datetime; None: any), in the
        state's page order: batches of ``batch_size`` (1..500) runs read by one bounded page
        each, at most ``max_batches`` pages in all; ``complete`` is False when runs may remain
        (call again). A run that finished meanwhile is ``unchanged``. One audit entry (S1)."""
        await self._authorize("cancel_matching")
        operation = "cancel_matching"
        _require_bulk_filter(operation, job_id, tenant, batch_size, max_batches)
        if state is not None and state not in LIVE_STATES:
            raise ConfigurationError(
                f"{operation} state {state!r} is not a live state.",
                fix="pass 'waiting' or 'running', or None for both (a finished run cannot be"
                " cancelled).",
            )
        if created_before is not None and not _aware(created_before):
            raise ConfigurationError(
                f"{operation} created_before must be an aware datetime, got {created_before!r}.",
                fix="pass datetime(..., tzinfo=UTC).",
            )
        await self._audit_ready()
        walk = _LiveWalk(
            self._browser(),
            job_id=job_id,
            tenant=tenant,
            states=LIVE_STATES if state is None else (state,),
            created_before=created_before,
            batch_size=batch_size,
        )
        target = _live_target(job_id, tenant, state, created_before)
        try:
            for _ in range(max_batches):
                batch = await walk.next_batch()
                if batch is None:
                    break
                if batch:  # one statement for the page's runs (the admin port's batch)
                    _split(
                        batch, await self._admin.cancel_batch(batch), walk.changed, walk.unchanged
                    )
        except BaseException as exc:
            await self._record_bulk(operation, target, walk.changed, walk.unchanged, error=exc)
            raise
        await self._record_bulk(
            operation, target, walk.changed, walk.unchanged, complete=walk.complete
        )
        return BulkResult(tuple(walk.changed), tuple(walk.unchanged), walk.complete)

    async def _dead_matching(
        self,
        operation: str,
        change: Callable[[list[str]], Awaitable[list[str]]],
        *,
        job_id: str | None,
        tenant: str | None,
        batch_size: int,
        max_batches: int,
    ) -> BulkResult:
        _require_bulk_filter(operation, job_id, tenant, batch_size, max_batches)
        await self._audit_ready()
        changed: list[str] = []
        unchanged: list[str] = []
        after: tuple[datetime, str] | None = None
        complete = False
        target = _filter_target(job_id, tenant)
        try:
            for _ in range(max_batches):
                rows = await self._admin.list_dead(
                    DeadQuery(limit=batch_size, job_id=job_id, after=after, tenant=tenant)
                )
                if rows:  # one statement for the page's runs (the admin port's batch)
                    ids = [record.run_id for record in rows]
                    _split(ids, await change(ids), changed, unchanged)
                if len(rows) < batch_size:
                    complete = True
                    break
                last = rows[-1]
                assert last.finished_at is not None  # noqa: S101 - dead runs are finished
                after = (last.finished_at, last.run_id)
        except BaseException as exc:
            await self._record_bulk(operation, target, changed, unchanged, error=exc)
            raise
        await self._record_bulk(operation, target, changed, unchanged, complete=complete)
        return BulkResult(tuple(changed), tuple(unchanged), complete)

    async def _bulk(
        self,
        operation: str,
        ids: list[str],
        change: Callable[[list[str]], Awaitable[list[str]]],
        *,
        target: str,
    ) -> BulkResult:
        await self._audit_ready()
        changed: list[str] = []
        unchanged: list[str] = []
        try:
            _split(ids, await change(ids), changed, unchanged)
        except BaseException as exc:
            await self._record_bulk(operation, target, changed, unchanged, error=exc)
            raise
        await self._record_bulk(operation, target, changed, unchanged)
        return BulkResult(tuple(changed), tuple(unchanged))

    async def _record_bulk(
        self,
        operation: str,
        target: str,
        changed: list[str],
        unchanged: list[str],
        *,
        complete: bool = True,
        error: BaseException | None = None,
    ) -> None:
        details: dict[str, Any] = {
            "changed_ids": changed[:MAX_AUDIT_IDS],
            "unchanged": len(unchanged),
            "complete": complete,
        }
        if error is not None:
            details["error"] = f"{type(error).__name__}: {error}"[:500]
        await self._record(operation, target, len(changed), details)

    # --- find anything, act on what matches (issue 36; S1, S2) -------------------------------

    async def search_runs(
        self,
        run_filter: RunFilter,
        *,
        limit: int = 50,
        cursor: str | None = None,
        scan: int = DEFAULT_SCAN,
    ) -> SearchPage:
        """One page (``limit`` 20..200) of the runs matching ``run_filter``, reading at most
        ``scan`` index entries past runs that do not match (:mod:`ship_sqla.kernel._search`:
        each filter's bound; a page that stops there says "scanned N, stopped"). Keyset cursors
        for the next and previous pages, signed and valid for the same filter only."""
        await self._authorize_read("search_runs")
        _require_filter(run_filter)
        return await search_runs(
            self._browser(),
            self._admin.get_run,
            run_filter,
            secret=self._secret,
            limit=limit,
            cursor=cursor,
            scan=scan,
        )

    async def preview_matching(self, action: BulkAction, run_filter: RunFilter) -> BulkPreview:
        """How many runs ``action`` (``"retry"``, ``"cancel"``, ``"discard"``) would take from
        those matching ``run_filter`` (at most 100,000), and the confirmation token its
        ``*_filtered`` operation requires (bound to the action, the filter and the count; good
        for 15 minutes). A read: changes nothing."""
        await self._authorize_read("preview_matching")
        _require_filter(run_filter)
        if action not in BULK_STATES:
            raise ConfigurationError(
                f"preview_matching action {action!r} is not a bulk action.",
                fix="pass 'retry', 'cancel' or 'discard'.",
            )
        return await preview_matching(self._browser(), action, run_filter, secret=self._secret)

    async def retry_filtered(
        self,
        run_filter: RunFilter,
        *,
        token: str,
        batch_size: int = MAX_BULK_BATCH,
        transaction: BatchTransaction | None = None,
        progress: Callable[[BulkProgress], object] | None = None,
    ) -> BulkResult:
        """Retry the dead runs matching ``run_filter``: at most the count ``token`` (from
        :meth:`preview_matching`) confirmed, in batches of ``batch_size`` (1..1,000), each in
        one ``transaction`` when given (a unit of work's runner: a batch commits whole or not
        at all), ``progress`` told after each batch. One audit entry (S1) with the filter, the
        count and links."""
        await self._authorize("retry_filtered")
        bulk = _Filtered("retry_filtered", "retry", self._admin.retry_dead_batch, run_filter, token)
        return await self._filtered(bulk, batch_size, transaction, progress)

    async def cancel_filtered(
        self,
        run_filter: RunFilter,
        *,
        token: str,
        batch_size: int = MAX_BULK_BATCH,
        transaction: BatchTransaction | None = None,
        progress: Callable[[BulkProgress], object] | None = None,
    ) -> BulkResult:
        """Cancel (K2) the waiting and running runs matching ``run_filter`` (see
        :meth:`retry_filtered`)."""
        await self._authorize("cancel_filtered")
        bulk = _Filtered("cancel_filtered", "cancel", self._admin.cancel_batch, run_filter, token)
        return await self._filtered(bulk, batch_size, transaction, progress)

    async def discard_filtered(
        self,
        run_filter: RunFilter,
        *,
        token: str,
        batch_size: int = MAX_BULK_BATCH,
        transaction: BatchTransaction | None = None,
        progress: Callable[[BulkProgress], object] | None = None,
    ) -> BulkResult:
        """Discard the waiting and dead runs matching ``run_filter`` (see
        :meth:`retry_filtered`)."""
        await self._authorize("discard_filtered")
        bulk = _Filtered(
            "discard_filtered", "discard", self._admin.discard_batch, run_filter, token
        )
        return await self._filtered(bulk, batch_size, transaction, progress)

    async def _filtered(
        self,
        bulk: _Filtered,
        batch_size: int,
        transaction: BatchTransaction | None,
        progress: Callable[[BulkProgress], object] | None,
    ) -> BulkResult:
        _require_filter(bulk.run_filter)
        _require_within(
            f"{bulk.operation} batch_size", batch_size, MAX_BULK_BATCH, fix="use at most 1,000."
        )
        total = check_bulk_token(
            self._secret, bulk.action, bulk.run_filter, bulk.token, time.time()
        )
        check_bulk_total(bulk.operation, total)
        await self._audit_ready()
        outcome = BulkOutcome()
        try:
            await act_matching(
                self._browser(),
                bulk.change,
                bulk.action,
                bulk.run_filter,
                total=total,
                outcome=outcome,
                batch_size=batch_size,
                transaction=transaction,
                progress=progress,
            )
        except BaseException as exc:
            await self._record_filtered(bulk, total, outcome, error=exc)
            raise
        await self._record_filtered(bulk, total, outcome)
        return BulkResult(tuple(outcome.changed), tuple(outcome.unchanged), outcome.complete)

    async def _record_filtered(
        self,
        bulk: _Filtered,
        total: int,
        outcome: BulkOutcome,
        *,
        error: BaseException | None = None,
    ) -> None:
        fields = bulk.run_filter.as_fields()
        details: dict[str, Any] = {
            "filter": [list(pair) for pair in fields],
            "previewed": total,
            "changed_ids": outcome.changed[:MAX_AUDIT_IDS],
            "unchanged": len(outcome.unchanged),
            "batches": outcome.batches,
            "complete": outcome.complete,
            "links": {
                "search": "/search?" + urlencode(fields),
                "runs": [f"/runs/{run_id}" for run_id in outcome.changed[:MAX_AUDIT_IDS]],
            },
        }
        if error is not None:
            details["error"] = f"{type(error).__name__}: {error}"[:500]
        target = f"runs matching {bulk.run_filter.describe()}"
        await self._record(bulk.operation, target, len(outcome.changed), details)

    # --- the dashboard's reads (S2) ------------------------------------------------------------

    def _browser(self) -> RunBrowser:
        """The admin port's dashboard reads (every RunAdmin is a RunBrowser, S2)."""
        return self._admin

    async def list_runs(
        self,
        *,
        state: RunState,
        job_id: str | None = None,
        tenant: str | None = None,
        created_from: datetime | None = None,
        created_to: datetime | None = None,
        finished_from: datetime | None = None,
        finished_to: datetime | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page[RunRecord]:
        """Runs in ``state`` (of ``job_id``, ``tenant``), in the state's order, keyset-paged:
        at most ``limit`` (1..500) per page, bounded at any table size (:mod:`._browse`).

        - ``waiting``: claim order, highest priority first, then ``run_at``, then creation
          order (the order claims take them, K6);
        - ``running``: soonest ``lease_expires_at`` first (lapsed leases first), then run id;
        - ``completed``: newest finished first by ``(finished_at, run_id)`` (J18); only it
          takes a finish-time range, ``[finished_from, finished_to)``;
        - ``dead``, ``discarded``, ``cancelled``: newest first by ``(created_at, run_id)``;
          only these take a creation-time range, ``[created_from, created_to)``.

        A range the state's order cannot bound is refused with a
        :class:`~ship_sqla.errors.ConfigurationError`.

        Across every job, the page merges at most 200 jobs' runs (by job id). A cursor is signed
        and valid only for the same state and filter."""
        await self._authorize_read("list_runs")
        _check_list_runs(
            state,
            job_id=job_id,
            tenant=tenant,
            limit=limit,
            created=(created_from, created_to),
            finished=(finished_from, finished_to),
        )
        start, end = (
            (finished_from, finished_to)
            if run_order(state) == "finished"
            else (created_from, created_to)
        )
        query = query_fingerprint(
            (
                "ship_sqla.jobs.list_runs",
                state,
                job_id or "",
                tenant or "",
                "" if start is None else start.isoformat(),
                "" if end is None else end.isoformat(),
            )
        )
        after = (
            None
            if cursor is None
            else position_from_cursor_values(
                decode_cursor(cursor, secret=self._secret, query=query), state
            )
        )
        rows = await self._browser().list_runs(
            RunQuery(
                state=state,
                limit=limit + 1,
                job_id=job_id,
                tenant=tenant,
                time_from=start,
                time_to=end,
                after=after,
            ),
            max_jobs=MAX_BROWSE_JOBS,
        )
        items = tuple(row.record for row in rows[:limit])
        next_cursor = None
        if len(rows) > limit:
            position = KeysetPosition(query, position_cursor_values(position_of(rows[limit - 1])))
            next_cursor = encode_cursor(position, self._secret)
        return Page(items, next_cursor)

    async def throughput(
        self, *, bucket_seconds: int = 300, buckets: int = 24, cap: int = 10_000
    ) -> list[ThroughputBucket]:
        """Runs completed and dead per bucket of ``bucket_seconds`` (60..86,400) over the last
        ``buckets`` (1..120) buckets, oldest first, each job's count capped at ``cap``
        (1..100,000) per bucket (``capped`` says so)."""
        await self._authorize_read("throughput")
        if not 60 <= bucket_seconds <= 86_400:  # noqa: PLR2004 - the documented bounds
            raise BoundExceededError(
                f"throughput bucket_seconds must be 60..86400, got {bucket_seconds}.",
                fix="use minute to day buckets.",
            )
        _require_within(
            "throughput buckets", buckets, MAX_THROUGHPUT_BUCKETS, fix="ask for fewer buckets."
        )
        _require_within("throughput cap", cap, MAX_THROUGHPUT_CAP, fix="use a smaller cap.")
        return await self._browser().throughput(
            bucket_seconds=bucket_seconds, buckets=buckets, cap=cap, max_jobs=MAX_BROWSE_JOBS
        )

    async def schedules(self, *, limit: int = 1000) -> list[ScheduleState]:
        """The scheduled jobs' stored states (J9), by job id, at most ``limit`` (1..10,000)."""
        await self._authorize_read("schedules")
        _require_within("schedules limit", limit, MAX_PAUSED_JOBS, fix="ask for fewer.")
        return await self._browser().schedule_states(limit=limit)

    async def consumer_progress(
        self, *, limit: int = 200, after: tuple[str, str] | None = None
    ) -> list[ConsumerKeyProgress]:
        """C3: each consumer key's last committed batch (lag, time, counts) and the state of
        its run, by (consumer id, key), at most ``limit`` (1..1,000) keys after the pair
        ``after``; keys that never committed a batch are not listed."""
        await self._authorize_read("consumer_progress")
        _require_within(
            "consumer_progress limit",
            limit,
            MAX_CONSUMER_KEYS,
            fix=f"ask for at most {MAX_CONSUMER_KEYS} keys and pass after= for the rest.",
        )
        return await self._browser().consumer_progress(limit=limit, after=after)

    async def audit_entries(
        self, *, limit: int = 100, before: int | None = None
    ) -> list[AuditEntry]:
        """The audit log, newest first (S1): at most ``limit`` (1..500) entries older than entry
        ``before``. Refused (``ConfigurationError``) without a readable audit log."""
        await self._authorize_read("audit_entries")
        _require_within("audit_entries limit", limit, MAX_AUDIT_PAGE, fix="ask for fewer.")
        if not isinstance(self._audit, AuditLog):
            raise ConfigurationError(
                "these operations write to no readable audit log.",
                fix="pass audit=create_audit_log(...) (or InMemoryAuditLog()).",
            )
        return await self._audit.list_entries(limit=limit, before=before)

    async def search_audit(
        self,
        match: AuditFilter,
        *,
        limit: int = 50,
        before: int | None = None,
        scan: int = AUDIT_SCAN,
    ) -> AuditPage:
        """The audit log filtered by ``match`` (actor, operation, target text, time range),
        newest first: at most ``limit`` (1..500) entries older than entry ``before``, reading at
        most ``scan`` (1..50,000) entries through the log's own newest-first pages (S1, S2:
        bounded; the page says when the bound stopped it, :class:`AuditPage`)."""
        await self._authorize_read("search_audit")
        _require_within("search_audit limit", limit, MAX_AUDIT_PAGE, fix="ask for fewer.")
        _require_within("search_audit scan", scan, 10 * AUDIT_SCAN, fix="scan fewer entries.")
        if not isinstance(self._audit, AuditLog):
            raise ConfigurationError(
                "these operations write to no readable audit log.",
                fix="pass audit=create_audit_log(...) (or InMemoryAuditLog()).",
            )
        return await search_audit(self._audit, match, limit=limit, before=before, scan=scan)

    async def _refusal(self, operation: str, run_id: str, allowed: str) -> JobOperationRefusedError:
        record = await self._admin.get_run(run_id)
        if record is None:
            return JobOperationRefusedError(
                f"{operation} of run {run_id!r}: no such run.",
                fix="pass the id of an existing run (list_dead lists dead ones).",
            )
        if operation == "retry" and record.state == "dead":
            return JobOperationRefusedError(
                f"retry of run {run_id!r}: a newer waiting or running run of job"
                f" {record.job_id!r} holds its dedupe key {record.dedupe_key!r} (J1).",
                fix="let that run finish, or discard this one.",
            )
        return JobOperationRefusedError(
            f"{operation} of run {run_id!r}: it is {record.state!r}; {operation} takes only"
            f" {allowed} runs.",
            fix="list dead runs with list_dead; a running run must settle first.",
        )


@attrs.frozen
class _Filtered:
    """One bulk action by filter: its operation, action, the admin port's change, the filter
    and the confirmation token."""

    operation: str
    action: BulkAction
    change: Callable[[list[str]], Awaitable[list[str]]]
    run_filter: RunFilter
    token: str


def _split(ids: list[str], done: list[str], changed: list[str], unchanged: list[str]) -> None:
    """Append each of ``ids`` to ``changed`` when a batch operation answered it in ``done``,
    else to ``unchanged``."""
    taken = set(done)
    for run_id in ids:
        (changed if run_id in taken else unchanged).append(run_id)


def _require_filter(run_filter: object) -> None:
    if not isinstance(run_filter, RunFilter):
        raise ConfigurationError(
            f"expected a RunFilter, got {type(run_filter).__name__}.",
            fix="build one with RunFilter.parse([...]) or RunFilter.of(...).",
        )


LiveState = Literal["waiting", "running"]
"""A state :meth:`JobOperations.cancel_matching` walks."""
LIVE_STATES: Final[tuple[LiveState, ...]] = ("waiting", "running")


class _LiveWalk:
    """:meth:`JobOperations.cancel_matching`'s read side: pages of live runs, state after
    state, each page one bounded, index-served read (the runs page's own statement, S2), the
    runs created before ``created_before`` kept."""

    def __init__(
        self,
        browser: RunBrowser,
        *,
        job_id: str | None,
        tenant: str | None,
        states: tuple[LiveState, ...],
        created_before: datetime | None,
        batch_size: int,
    ) -> None:
        self._browser = browser
        self._job_id = job_id
        self._tenant = tenant
        self._states = list(states)
        self._created_before = created_before
        self._batch_size = batch_size
        self._after: Any = None
        self.changed: list[str] = []
        self.unchanged: list[str] = []

    @property
    def complete(self) -> bool:
        """Whether every state was read to its end."""
        return not self._states

    async def next_batch(self) -> list[str] | None:
        """The next page's matching run ids (maybe none), or None when every state is done."""
        if not self._states:
            return None
        query = RunQuery(
            state=self._states[0],
            limit=self._batch_size,
            job_id=self._job_id,
            tenant=self._tenant,
            after=self._after,
        )
        rows = await self._browser.list_runs(query, max_jobs=MAX_BROWSE_JOBS)
        if len(rows) < self._batch_size:
            self._states.pop(0)
            self._after = None
        else:
            self._after = position_of(rows[-1])
        cutoff = self._created_before
        return [
            row.record.run_id for row in rows if cutoff is None or row.record.created_at < cutoff
        ]


def _live_target(
    job_id: str | None, tenant: str | None, state: str | None, created_before: datetime | None
) -> str:
    parts = [f"job={job_id}" if job_id is not None else "every job"]
    if tenant is not None:
        parts.append(f"tenant={tenant}")
    if created_before is not None:
        parts.append(f"created before {created_before.isoformat()}")
    return f"{state or 'waiting and running'} runs of " + ", ".join(parts)


class AuditWriteError(OutageError, RuntimeError):
    """An operator operation ran but its audit entry could not be written (S1)."""

    code = "SHIP_SQLA_AUDIT_WRITE_FAILED"


def _checked_actor(actor: object) -> str:
    # Printable: the audit log stores the actor as text after the action ran, so a NUL (which
    # PostgreSQL text cannot store) would leave an action done and unaudited (S1).
    if (
        not isinstance(actor, str)
        or not actor
        or len(actor) > 200  # noqa: PLR2004
        or not actor.isprintable()
    ):
        raise ConfigurationError(
            f"actor must be non-empty printable text of at most 200 characters, got"
            f" {reprlib.repr(actor)}.",
            fix="name who acts, e.g. the user's login or 'cli:alice@host'.",
        )
    return actor


def _bulk_ids(run_ids: Iterable[str], operation: str) -> list[str]:
    if isinstance(run_ids, str):
        raise ConfigurationError(
            f"{operation} takes a list of run ids, got the string {run_ids!r}.",
            fix=f"pass [{run_ids!r}].",
        )
    ids = list(dict.fromkeys(run_ids))
    if not 1 <= len(ids) <= MAX_BULK_IDS:
        raise BoundExceededError(
            f"{operation} got {len(ids)} run ids; it takes 1..{MAX_BULK_IDS}.",
            fix="pass them in batches of at most 500, or use the *_dead_matching operations.",
        )
    for run_id in ids:
        _require_run_id(run_id, operation)
    return ids


def _filter_target(job_id: str | None, tenant: str | None) -> str:
    parts = [f"job={job_id}" if job_id is not None else "every job"]
    if tenant is not None:
        parts.append(f"tenant={tenant}")
    return "dead runs of " + ", ".join(parts)


def _require_within(name: str, value: int, maximum: int, *, fix: str) -> None:
    """The operator surface's bounds (R1): ``value`` from 1 to ``maximum``, else refused."""
    if not 1 <= value <= maximum:
        raise BoundExceededError(f"{name} must be 1..{maximum}, got {value}.", fix=fix)


def _require_bulk_filter(
    operation: str, job_id: str | None, tenant: str | None, batch_size: int, max_batches: int
) -> None:
    """A bulk-by-filter operation's common inputs, checked before anything is read (S1)."""
    _require_within(f"{operation} batch_size", batch_size, MAX_BULK_IDS, fix="use at most 500.")
    _require_within(
        f"{operation} max_batches",
        max_batches,
        MAX_BULK_BATCHES,
        fix="call again while the result is not complete.",
    )
    if job_id is not None:
        _require_job_id(job_id, operation)
    check_tenant(tenant, operation=operation)


def _require_run_id(run_id: object, operation: str) -> None:
    """A run id no run can have is refused before any statement (not text or empty:
    :class:`ConfigurationError`; a NUL, a surrogate, over 255 characters: :class:`InvalidKeyError`),
    in a bulk operation before the first run changes: one bad id never becomes a half-done batch
    of the others (issue 32)."""
    if not isinstance(run_id, str) or not run_id:
        raise ConfigurationError(
            f"{operation}: run id must be a non-empty string, got {run_id!r}.",
            fix="pass the run's id (EnqueueResult.run_id, RunRecord.run_id).",
        )
    require_key(run_id, f"{operation}: run id")


def _require_job_id(job_id: object, operation: str) -> None:
    if not is_job_id(job_id):
        raise ConfigurationError(
            f"{operation}: {job_id!r} is not a job id.",
            fix="pass the id given to define_job: 1-128 characters, letters, digits and"
            " _ . : - (not starting with a symbol).",
        )


def _position(cursor: str, secret: bytes, query: str) -> tuple[datetime, str]:
    """The ``(finished_at, run_id)`` after which the page of ``cursor`` starts."""
    values = decode_cursor(cursor, secret=secret, query=query)
    match values:
        case (datetime() as finished_at, str() as run_id) if finished_at.tzinfo is not None:
            return finished_at, run_id
    raise InvalidCursorError(  # signed by us: only a format change gets here
        "the list_dead cursor is signed but does not hold a (finished_at, run_id) position.",
        fix="restart paging from the first page (cursor=None).",
    )


def create_job_operations(
    backend: AdministeredBackend,
    *,
    authorizer: Authorizer,
    cursor_secret: bytes | str | None = None,
    audit: AuditSink | None = None,
    actor: str = "unnamed",
) -> JobOperations:
    """J8 operator operations on ``backend``'s runs (any job backend: its ``admin`` port).

    ``authorizer(permission, operation)`` (sync or async) is asked for ``"ship.jobs:manage"``
    before every state-changing operation and must return ``True``; anything else raises
    :class:`~ship_sqla.errors.PermissionDeniedError` and changes nothing. A read asks
    ``"ship.jobs:manage"`` and, when refused, ``"ship.jobs:read"``. ``audit`` (an
    :class:`~ship_sqla.operators.AuditSink`, e.g. :func:`ship_sqla.create_audit_log`) receives one
    entry per state-changing operation, naming ``actor`` (S1; :meth:`JobOperations.acting_as`
    gives the same operations another actor); a configured audit that cannot be written (its
    table is missing) refuses every state-changing operation before its first change with
    :class:`~ship_sqla.errors.AuditUnavailableError`, and ``audit=None`` (the default) writes
    no entry at all: the operations are unaudited, on purpose. ``cursor_secret``
    signs ``list_dead`` cursors (default: random per process, so cursors die with it; give every
    process that serves the same pages the same secret of at least 16 bytes). The backend's
    worker registry (``backend.workers``, F6) is listed by :meth:`JobOperations.workers`."""
    return JobOperations(
        backend.admin,
        authorizer=authorizer,
        cursor_secret=cursor_secret,
        workers=backend.workers,
        workflows=backend.workflows,
        audit=audit,
        actor=actor,
        health=backend if isinstance(backend, StorageHealthSource) else None,
        enqueuer=backend if isinstance(backend, JobBackend) else None,
    )


def _aware(value: object) -> bool:
    """Whether ``value`` is an aware datetime (typed one, but a caller may pass anything)."""
    return isinstance(value, datetime) and value.tzinfo is not None
