"""The in-memory workflow store (SPEC §13): steps and events of an
:class:`~ship_sqla.kernel.InMemoryJobBackend`, the model the PostgreSQL store is checked
against.

- D1 a step is stored once per (run, name), only while the run's claim token is current.
- D3 a :class:`~ship_sqla.kernel._ports.Suspend` puts the run back to waiting at its step's wake
  time without spending the attempt.
- D4 an event is "committed after the wait began" when its number is above the event counter the
  wait step recorded when it was stored (events commit at once here: there are no
  transactions in memory, so ``scope=`` is accepted and ignored, as ``insert`` does).
- D5 a child's end (any terminal state) wakes its parent once no child is live.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import attrs

from ship_sqla.kernel._evolution import PATCH_KIND, PATCH_PREFIX, PatchFigure, patch_step_name
from ship_sqla.kernel._memory.transactions import active_transaction
from ship_sqla.kernel._ports import TERMINAL_STATES
from ship_sqla.kernel._workflows import (
    CHILDREN_DONE,
    CHILDREN_RECHECK,
    CHILDREN_WAIT,
    ChildOutcome,
    StepRecord,
    WorkflowEvent,
    event_wait_key,
)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from ship_sqla.kernel._memory.jobs import InMemoryJobBackend, _Run
    from ship_sqla.kernel._ports import ClaimedRun, RunRecord, SettleOutcome, Suspend
    from ship_sqla.kernel._workflows import NewStep

__all__ = ["InMemoryWorkflowStore"]


@attrs.define
class _StoredEvent:
    event_id: int
    name: str
    key: str
    payload_json: str
    created_at: datetime


class InMemoryWorkflowStore:
    """:class:`~ship_sqla.kernel._workflows.WorkflowStore` and
    :class:`~ship_sqla.kernel._workflows.WorkflowAdmin` over one in-memory backend."""

    def __init__(self, backend: InMemoryJobBackend) -> None:
        self._backend = backend
        self._steps: dict[str, dict[str, StepRecord]] = {}
        # The event counter each waiting event step saw when it was stored (its "snapshot").
        self._began: dict[tuple[str, str], int] = {}
        self._events: list[_StoredEvent] = []
        self._last_event = 0

    def _now(self) -> datetime:
        return self._backend.clock.now()

    def _fresh(self, step: StepRecord) -> StepRecord:
        due = step.wake_at is not None and step.wake_at <= self._now()
        return attrs.evolve(step, due=due)

    # --- the port ---------------------------------------------------------------------------

    async def load_steps(self, run_id: str) -> list[StepRecord]:
        steps = self._steps.get(run_id, {})
        return [self._fresh(s) for s in sorted(steps.values(), key=lambda s: s.seq)]

    async def save_step(self, run: ClaimedRun, step: NewStep, *, scope: Any = None) -> bool:  # noqa: ANN401, ARG002 - the active InMemoryUnitOfWork's, if any
        if self._backend.current_run(run) is None:
            return False
        steps = self._steps.setdefault(run.run_id, {})
        stored = steps.get(step.name)
        if stored is not None and stored.state == "done":
            return False
        now = self._now()
        if stored is None:
            stored = StepRecord(
                run.run_id,
                step.name,
                step.seq,
                step.kind,
                "done",
                None,
                None,
                now,
                now,
                step.event_name,
                step.event_key,
            )
        before = steps.get(step.name)
        # A waiting step that ends keeps what it stored (position, wake time, event, start).
        steps[step.name] = done = attrs.evolve(
            stored, state="done", result_json=step.result_json, finished_at=now, due=False
        )
        tx = active_transaction()
        if tx is not None:
            # D2, J13: a transactional step's record rolls back with its transaction.
            def undo() -> None:
                if steps.get(step.name) is done:
                    if before is None:
                        del steps[step.name]
                    else:
                        steps[step.name] = before

            tx.on_rollback(undo)
        return True

    async def begin_wait(self, run: ClaimedRun, step: NewStep) -> StepRecord | None:
        held = self._backend.current_run(run)
        if held is None:
            return None
        steps = self._steps.setdefault(run.run_id, {})
        stored = steps.get(step.name)
        if stored is None:
            stored = self._store_waiting(held, step, self._now())
        return self._fresh(stored)

    def _store_waiting(self, run: _Run, step: NewStep, now: datetime) -> StepRecord:
        """A waiting step, stored now; an event wait begins here (its snapshot: the events
        published so far)."""
        wake_at = step.wake_at
        if wake_at is None and step.wake_after is not None:
            wake_at = now + timedelta(seconds=step.wake_after)
        stored = StepRecord(
            run.run_id,
            step.name,
            step.seq,
            step.kind,
            "waiting",
            None,
            wake_at,
            now,
            None,
            step.event_name,
            step.event_key,
        )
        self._steps.setdefault(run.run_id, {})[step.name] = stored
        if step.kind == "event":
            self._began[(run.run_id, step.name)] = self._last_event
        return stored

    async def match_event(self, run_id: str, step: StepRecord) -> WorkflowEvent | None:
        return self._first_match(run_id, step)

    def _first_match(self, run_id: str, step: StepRecord) -> WorkflowEvent | None:
        began = self._began.get((run_id, step.name))
        if began is None:
            return None
        for event in self._events:
            if event.event_id > began and (event.name, event.key) == (
                step.event_name,
                step.event_key,
            ):
                return WorkflowEvent(
                    event.name, event.key, json.loads(event.payload_json), event.event_id
                )
        return None

    async def adopt_children(self, parent: ClaimedRun, child_ids: Sequence[str]) -> None:
        runs = self._backend.stored_runs
        for child_id in child_ids:
            child = runs.get(child_id)
            if child is not None and child.parent_id is None and child_id != parent.run_id:
                child.parent_id = parent.run_id
        held = runs.get(parent.run_id)
        if held is not None:
            held.wait_for = CHILDREN_WAIT

    async def children(self, run_id: str) -> list[ChildOutcome]:
        return [
            ChildOutcome(r.run_id, r.job_id, r.state, r.last_error)
            for r in sorted(self._backend.stored_runs.values(), key=lambda r: r.seq)
            if r.parent_id == run_id
        ]

    async def publish_event(
        self,
        name: str,
        key: str,
        payload_json: str,
        *,
        scope: Any = None,  # noqa: ANN401, ARG002 - no transactions in memory
    ) -> int:
        self._last_event = event_id = self._last_event + 1
        self._events.append(_StoredEvent(event_id, name, key, payload_json, self._now()))
        wanted = event_wait_key(name, key)
        woke = False
        for run in self._backend.stored_runs.values():
            if run.wait_for == wanted and run.state == "waiting":
                run.wait_for = None
                self._backend.make_due(run)
                woke = True
        if woke:
            self._backend.wake()
        return event_id

    # --- what the backend's settle and finish call --------------------------------------------

    def suspend(self, run: _Run, settlement: Suspend, now: datetime) -> SettleOutcome:
        """D3: store the waiting step (unless stored) and put ``run`` back to waiting at the
        time the wait calls for; its attempt unspent."""
        step = settlement.step
        stored = self._steps.setdefault(run.run_id, {}).get(step.name)
        fresh = stored is None
        if stored is None:
            stored = self._store_waiting(run, step, now)
        run_at = stored.wake_at
        if settlement.wait == "sleep":
            run.wait_for = None
        elif settlement.wait == "event":
            assert stored.event_name is not None  # noqa: S101 - an event step names its event
            assert run_at is not None  # noqa: S101 - NEVER at most
            run.wait_for = event_wait_key(stored.event_name, stored.event_key or "")
            # A wait begun earlier (expect_event, or a replay) may have its event already.
            if run_at <= now or (not fresh and self._first_match(run.run_id, stored) is not None):
                run_at = now
        else:
            woken = run.wait_for == CHILDREN_DONE
            run.wait_for = CHILDREN_WAIT
            live = any(
                r.parent_id == run.run_id and r.state not in TERMINAL_STATES
                for r in self._backend.stored_runs.values()
            )
            run_at = now if woken or not live else now + timedelta(seconds=CHILDREN_RECHECK)
        assert run_at is not None  # noqa: S101 - every wait has a wake time (NEVER at most)
        run.attempt -= 1
        self._backend.to_waiting(run, run_at, now)
        return "suspended"

    def has_steps(self, run_id: str) -> bool:
        """Whether run ``run_id`` stored workflow steps (J18: its payload stays in history)."""
        return bool(self._steps.get(run_id))

    def ended(self, run: _Run) -> None:
        """D5: ``run`` became terminal: wake its parent once none of its children is live."""
        parent_id = run.parent_id
        if parent_id is None:
            return
        runs = self._backend.stored_runs
        parent = runs.get(parent_id)
        if parent is None or parent.wait_for != CHILDREN_WAIT:
            return
        if any(r.parent_id == parent_id and r.state not in TERMINAL_STATES for r in runs.values()):
            return
        parent.wait_for = CHILDREN_DONE
        if parent.state == "waiting":
            self._backend.make_due(parent)
            self._backend.wake()
        # still running: marked (its suspend sees the mark); as WAKE_PARENTS, its updated_at
        # stays its attempt's start (J18)

    # --- the admin side (D6) ------------------------------------------------------------------

    async def list_steps(self, run_id: str) -> list[StepRecord]:
        return await self.load_steps(run_id)

    async def rerun_from_step(self, run_id: str, step: str) -> RunRecord | None:
        run = self._backend.stored_runs.get(run_id)
        steps = self._steps.get(run_id, {})
        named = steps.get(step)
        if run is None or named is None or run.state not in ("dead", "waiting"):
            return None
        for name in [s.name for s in steps.values() if s.seq >= named.seq]:
            del steps[name]
            self._began.pop((run_id, name), None)
        # The wait it was suspended on is gone with its step (as RERUN_FROM_STEP clears it).
        run.wait_for = None
        self._backend.rerun(run)
        return run.record()

    # --- D8: the patch figures ------------------------------------------------------------------

    def _live(self, job_id: str, read: int) -> list[_Run]:
        """At most ``read`` live runs of the job: waiting ones, then running ones (the order of
        the PostgreSQL statements' indexes is not modelled: the figures agree under the bound)."""
        runs = sorted(self._backend.stored_runs.values(), key=lambda r: r.seq)
        live = [r for r in runs if r.job_id == job_id and r.state == "waiting"]
        live += [r for r in runs if r.job_id == job_id and r.state == "running"]
        return live[:read]

    def _marker(self, run_id: str, patch_id: str) -> StepRecord | None:
        step = self._steps.get(run_id, {}).get(patch_step_name(patch_id))
        return step if step is not None and step.kind == PATCH_KIND else None

    async def patch_ids(self, *, limit: int) -> list[str]:
        found = {
            step.name.removeprefix(PATCH_PREFIX)
            for steps in self._steps.values()
            for step in steps.values()
            if step.kind == PATCH_KIND
        }
        return sorted(found)[:limit]

    async def patch_holding(self, job_id: str, patch_id: str, *, read: int) -> PatchFigure:
        live = self._live(job_id, read)
        held = sum(1 for r in live if self._marker(r.run_id, patch_id) is not None)
        return PatchFigure(held, len(live), len(live) < read)

    async def patch_lacking(
        self, job_id: str, patch_id: str, *, read: int
    ) -> tuple[datetime | None, PatchFigure]:
        markers = [
            marker.created_at
            for run in self._backend.stored_runs.values()
            if run.job_id == job_id and (marker := self._marker(run.run_id, patch_id)) is not None
        ]
        first = min(markers, default=None)
        live = self._live(job_id, read)
        lacking = (
            0
            if first is None
            else sum(
                1 for r in live if r.created_at < first and self._marker(r.run_id, patch_id) is None
            )
        )
        return first, PatchFigure(lacking, len(live), len(live) < read)

    async def delete_events(self, *, older_than: timedelta, limit: int) -> int:
        cutoff = self._now() - older_than
        old = [e for e in self._events if e.created_at < cutoff][:limit]
        gone = {e.event_id for e in old}
        # Ids keep counting up: a wait's "began" counter stays meaningful.
        self._events = [e for e in self._events if e.event_id not in gone]
        return len(old)
