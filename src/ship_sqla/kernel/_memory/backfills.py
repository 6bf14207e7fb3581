"""The in-memory backfill ledger (C4): the model the PostgreSQL ledger is checked against.

A checkpoint made inside an :class:`~ship_sqla.kernel.InMemoryUnitOfWork` is undone when that
unit of work rolls back, as the PostgreSQL row is: the page's writes and its checkpoint commit
together or not at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import attrs

from ship_sqla.kernel._backfills import BackfillRecord, encode_key
from ship_sqla.kernel._clock import SystemClock
from ship_sqla.kernel._memory.transactions import active_transaction

if TYPE_CHECKING:
    from ship_sqla.kernel._clock import Clock

__all__ = ["InMemoryBackfillLedger"]


class InMemoryBackfillLedger:
    """A :class:`~ship_sqla.kernel.BackfillLedger` in a dict, on ``clock``."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock if clock is not None else SystemClock()
        self._rows: dict[str, BackfillRecord] = {}

    @property
    def clock(self) -> Clock:
        return self._clock

    def _put(self, record: BackfillRecord) -> BackfillRecord:
        before = self._rows.get(record.id)
        self._rows[record.id] = record
        tx = active_transaction()
        if tx is not None:

            def undo() -> None:
                if self._rows.get(record.id) is record:
                    if before is None:
                        del self._rows[record.id]
                    else:
                        self._rows[record.id] = before

            tx.on_rollback(undo)
        return record

    def _new(self, backfill_id: str) -> BackfillRecord:
        now = self._clock.now()
        return BackfillRecord(
            id=backfill_id,
            state="pending",
            pages=0,
            rows=0,
            last_key=None,
            pace=None,
            stall_after=None,
            required_by=None,
            run_id=None,
            token=None,
            created_at=now,
            started_at=None,
            finished_at=None,
            updated_at=now,
        )

    @staticmethod
    def _declared(record: BackfillRecord, **fields: Any) -> BackfillRecord:  # noqa: ANN401
        given = {name: value for name, value in fields.items() if value is not None}
        return attrs.evolve(record, **given) if given else record

    async def request(
        self,
        backfill_id: str,
        *,
        pace: float | None = None,
        stall_after: float | None = None,
        required_by: str | None = None,
    ) -> BackfillRecord:
        record = self._rows.get(backfill_id) or self._new(backfill_id)
        if record.state in ("failed", "cancelled"):
            record = attrs.evolve(
                record,
                state="pending",
                finished_at=None,
                error=None,
                run_id=None,
                token=None,
                updated_at=self._clock.now(),
            )
        record = self._declared(record, pace=pace, stall_after=stall_after, required_by=required_by)
        return self._put(record)

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
        record = self._rows.get(backfill_id) or self._new(backfill_id)
        if record.state in ("completed", "cancelled"):
            return None
        now = self._clock.now()
        fresh = record.state != "running"
        record = attrs.evolve(
            record,
            state="running",
            run_id=run_id,
            token=token,
            pace=pace,
            stall_after=stall_after,
            required_by=required_by,
            started_at=record.started_at or now,
            finished_at=None,
            error=None,
            # A resumed pass keeps its last checkpoint's time (the pacer's next slot).
            updated_at=now if fresh and record.pages == 0 else record.updated_at,
        )
        return self._put(record)

    def _held(self, backfill_id: str, run_id: str, token: int) -> BackfillRecord | None:
        record = self._rows.get(backfill_id)
        if (
            record is None
            or record.state != "running"
            or record.run_id != run_id
            or record.token != token
        ):
            return None
        return record

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
        encode_key(last_key, f"backfill {backfill_id!r}")
        record = self._held(backfill_id, run_id, token)
        if record is None or record.pages != pages_before:
            return None
        return self._put(
            attrs.evolve(
                record,
                pages=record.pages + 1,
                rows=record.rows + rows,
                last_key=tuple(last_key),
                updated_at=self._clock.now(),
            )
        )

    async def finish(
        self,
        backfill_id: str,
        *,
        run_id: str,
        token: int,
        state: Literal["completed", "failed"],
        error: str | None = None,
    ) -> bool:
        record = self._held(backfill_id, run_id, token)
        if record is None:
            return False
        now = self._clock.now()
        self._put(attrs.evolve(record, state=state, finished_at=now, updated_at=now, error=error))
        return True

    async def cancel(self, backfill_id: str) -> BackfillRecord | None:
        record = self._rows.get(backfill_id)
        if record is None or not record.live:
            return record
        now = self._clock.now()
        return self._put(attrs.evolve(record, state="cancelled", finished_at=now, updated_at=now))

    async def get(self, backfill_id: str) -> BackfillRecord | None:
        return self._rows.get(backfill_id)

    async def list_backfills(self, *, limit: int) -> list[BackfillRecord]:
        return [self._rows[key] for key in sorted(self._rows)][:limit]
