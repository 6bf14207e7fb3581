"""The operator surface of backfills (C4, C5): status, the deploy gate, start and cancel.

Backfills run as jobs, so their operations ask the jobs' permissions: a read asks
``ship.jobs:manage`` then ``ship.jobs:read``; ``start`` and ``cancel`` change state and ask
``ship.jobs:manage``, S1's audit rule first, and write one audit entry
(``backfills.start``, ``backfills.cancel``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Literal

import attrs

from ship_sqla.kernel._audit import AuditEntry, AuditSink, require_audit_writable
from ship_sqla.kernel._authorize import Authorizer, authorize, authorize_read, check_authorizer
from ship_sqla.kernel._backfills import (
    Backfill,
    BackfillLedger,
    BackfillRecord,
    backfill_dedupe_key,
    backfill_job_stand_in,
)
from ship_sqla.kernel._errors import ConfigurationError, RefusedError
from ship_sqla.kernel._jobs import is_job_id
from ship_sqla.kernel._operations import MANAGE_PERMISSION, READ_PERMISSION

if TYPE_CHECKING:
    from datetime import datetime

    from ship_sqla.kernel._ports import JobBackend

__all__ = [
    "MAX_BACKFILLS_LISTED",
    "BackfillBlocker",
    "BackfillCancel",
    "BackfillOperations",
    "BackfillRefusedError",
    "BackfillStart",
    "create_backfill_operations",
]

MAX_BACKFILLS_LISTED: Final = 1_000
"""The most ledger rows one status or verify reads (a deploy has a handful)."""


class BackfillRefusedError(RefusedError, RuntimeError):
    """An operator named a backfill the ledger does not hold (cancel), or a start's run was
    refused (its job's queue is full)."""

    code = "SHIP_SQLA_BACKFILL_REFUSED"


@attrs.frozen
class BackfillStart:
    """What a start did: ``enqueued`` (a run was added), ``running`` (a live run holds the
    backfill already: nothing added), ``completed`` (it is done: nothing added)."""

    outcome: Literal["enqueued", "running", "completed"]
    record: BackfillRecord


@attrs.frozen
class BackfillCancel:
    """What a cancel did: ``changed`` (a live backfill is now cancelled) or not (it had
    finished already: ``record`` says how)."""

    changed: bool
    record: BackfillRecord


@attrs.frozen
class BackfillBlocker:
    """C5: a backfill that holds the deploy, and why (``pending``, ``running``, ``stalled``,
    ``failed``, ``cancelled``, or ``unknown``: named but never started)."""

    backfill_id: str
    reason: str
    record: BackfillRecord | None


class BackfillOperations:
    """Backfill status, the deploy gate, start and cancel. Build with
    :func:`create_backfill_operations`."""

    def __init__(
        self,
        ledger: BackfillLedger,
        backend: JobBackend,
        *,
        authorizer: Authorizer,
        audit: AuditSink | None = None,
        actor: str = "unnamed",
    ) -> None:
        self._ledger = ledger
        self._backend = backend
        self._authorizer = check_authorizer(authorizer)
        self._audit = audit
        self._actor = actor

    async def _authorize(self, operation: str) -> None:
        await authorize(self._authorizer, MANAGE_PERMISSION, f"backfills.{operation}")

    async def _authorize_read(self, operation: str) -> None:
        await authorize_read(
            self._authorizer, MANAGE_PERMISSION, READ_PERMISSION, f"backfills.{operation}"
        )

    async def _audit_ready(self) -> None:
        """S1's audit rule: a configured audit that cannot be written changes nothing."""
        await require_audit_writable(self._audit)

    async def _record(self, operation: str, target: str, details: dict[str, Any]) -> None:
        if self._audit is not None:
            entry = AuditEntry(self._actor, f"backfills.{operation}", target, 1, details)
            await self._audit.record(entry)

    def now(self) -> datetime:
        return self._ledger.clock.now()

    async def list_backfills(self, *, limit: int = MAX_BACKFILLS_LISTED) -> list[BackfillRecord]:
        """C4: the ledger, by id (progress; ``record.status(now)`` says stalled)."""
        await self._authorize_read("list_backfills")
        return await self._ledger.list_backfills(limit=min(limit, MAX_BACKFILLS_LISTED))

    async def get(self, backfill_id: str) -> BackfillRecord | None:
        await self._authorize_read("get")
        return await self._ledger.get(_checked_id(backfill_id))

    async def verify(
        self, *, backfill_ids: tuple[str, ...] = (), required_by: str | None = None
    ) -> list[BackfillBlocker]:
        """C5: the backfills that hold a deploy: every ledger row with ``required_by`` (only
        those of that migration when ``required_by`` is given) that is not completed, and every
        id of ``backfill_ids`` that is not completed (or not in the ledger at all). Empty: the
        deploy may go on."""
        await self._authorize_read("verify")
        for backfill_id in backfill_ids:
            _checked_id(backfill_id)
        now = self.now()
        records = await self._ledger.list_backfills(limit=MAX_BACKFILLS_LISTED)
        by_id = {r.id: r for r in records}
        blockers = [
            BackfillBlocker(r.id, r.status(now), r)
            for r in records
            if r.blocks_deploy() and required_by in (None, r.required_by)
        ]
        named = {b.backfill_id for b in blockers}
        for backfill_id in backfill_ids:
            record = by_id.get(backfill_id)
            if backfill_id in named or (record is not None and record.state == "completed"):
                continue
            reason = "unknown" if record is None else record.status(now)
            blockers.append(BackfillBlocker(backfill_id, reason, record))
            named.add(backfill_id)
        return blockers

    async def start(self, backfill: Backfill | str) -> BackfillStart:
        """Start (or resume) a backfill: its ledger row ``pending`` (a failed or cancelled one
        resumes from its last key), and one run enqueued unless one is live already (its dedupe
        key, J1) or the backfill is completed. Idempotent. Given the :class:`Backfill`, its
        declared pace, stalled threshold and ``required_by`` are recorded at once (a bare id,
        as at the shell, records them when its run begins)."""
        await self._authorize("start")
        declared: dict[str, Any] = {}
        if isinstance(backfill, Backfill):
            backfill_id, job = backfill.id, backfill.job
            declared = {
                "pace": backfill.pace,
                "stall_after": backfill.stall_after,
                "required_by": backfill.required_by,
            }
        else:
            backfill_id = _checked_id(backfill)
            job = backfill_job_stand_in(backfill_id)
        await self._audit_ready()
        record = await self._ledger.request(backfill_id, **declared)
        if record.state == "completed":
            return BackfillStart("completed", record)
        result = await self._backend.enqueue(job, {}, dedupe_key=backfill_dedupe_key(backfill_id))
        if not result.accepted:
            raise BackfillRefusedError(
                f"start of backfill {backfill_id!r}: its job's queue is full ({result.rejected});"
                " no run was added (the ledger row says pending).",
                fix="start it again once the queue drains (ship-sqla jobs stats).",
            )
        outcome: Literal["enqueued", "running"] = "running" if result.deduplicated else "enqueued"
        await self._record("start", backfill_id, {"outcome": outcome, "run_id": result.run_id})
        return BackfillStart(outcome, record)

    async def cancel(self, backfill_id: str) -> BackfillCancel:
        """Cancel a live backfill: its ledger row ``cancelled`` (its holder's next checkpoint is
        refused, so at most the page in hand is lost, rolled back with ``transaction=``), and
        its holder run cancelled (K2: the pacer's wait ends at once). A finished backfill is
        returned unchanged (``changed`` False); an unknown one is refused
        (:class:`BackfillRefusedError`)."""
        await self._authorize("cancel")
        _checked_id(backfill_id)
        await self._audit_ready()
        before = await self._ledger.get(backfill_id)
        record = await self._ledger.cancel(backfill_id)
        if record is None:
            raise BackfillRefusedError(
                f"cancel of backfill {backfill_id!r}: the ledger has no such backfill.",
                fix="name one `ship-sqla backfill status` lists.",
            )
        changed = before is not None and before.live and record.state == "cancelled"
        if changed:
            assert before is not None  # noqa: S101 - changed says so
            if before.run_id is not None:
                await self._backend.admin.cancel(before.run_id)
            await self._record("cancel", backfill_id, {"from": before.state})
        return BackfillCancel(changed, record)


def _checked_id(backfill_id: object) -> str:
    if not is_job_id(backfill_id):
        raise ConfigurationError(
            f"{backfill_id!r} is not a backfill id (ids are job ids).",
            fix="name one `ship-sqla backfill status` lists.",
        )
    assert isinstance(backfill_id, str)  # noqa: S101 - is_job_id checked it
    return backfill_id


def create_backfill_operations(
    ledger: BackfillLedger,
    backend: JobBackend,
    *,
    authorizer: Authorizer,
    audit: AuditSink | None = None,
    actor: str = "unnamed",
) -> BackfillOperations:
    """Operator operations on ``ledger``'s backfills, whose runs live in ``backend`` (C4, C5):
    permissions as :func:`~ship_sqla.jobs.create_job_operations`'s (``ship.jobs:manage`` to
    start or cancel, ``ship.jobs:read`` to read), one audit entry per change in ``audit``."""
    if audit is not None and not isinstance(audit, AuditSink):
        raise ConfigurationError(
            f"audit must be an AuditSink (an async record(entry)), got {type(audit).__name__}.",
            fix="pass create_audit_log(...) or InMemoryAuditLog(), or omit it.",
        )
    return BackfillOperations(ledger, backend, authorizer=authorizer, audit=audit, actor=actor)
