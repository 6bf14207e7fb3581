"""Recording the histories of the runs a test session executes (D11): ``pytest
--ship-record-histories DIR``.

While installed, every run's context is bound to a :class:`RecordingStore` around its workflow
store (:mod:`ship_sqla.kernel._recording`): the steps an execution loaded are the run's history
so far, and each step it stored is added to it. At the session's end each run that stored a
step is written to ``DIR`` in the history file format, so CI can replay them against another
build (the rollback check). A transactional step is recorded when its result is stored in its
transaction; a run whose last attempt rolled that transaction back keeps it in the file (rare in
a test; record again after fixing the test).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from ship_sqla.kernel._history import history_of_claim, write_history
from ship_sqla.kernel._recording import install_store_wrapper
from ship_sqla.kernel._workflows import StepRecord

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from ship_sqla.kernel._history import History
    from ship_sqla.kernel._ports import ClaimedRun
    from ship_sqla.kernel._workflows import (
        ChildOutcome,
        NewStep,
        WorkflowEvent,
        WorkflowStore,
    )

__all__ = ["HistoryRecorder", "RecordingStore"]


@attrs.define
class _Recorded:
    run: ClaimedRun
    steps: dict[int, StepRecord] = attrs.Factory(dict)


class HistoryRecorder:
    """The runs' histories seen so far, by store and run."""

    def __init__(self) -> None:
        self._runs: dict[tuple[int, str], _Recorded] = {}

    def install(self) -> None:
        install_store_wrapper(lambda run, store: RecordingStore(self, run, store))

    @staticmethod
    def uninstall() -> None:
        install_store_wrapper(None)

    def _entry(self, store: WorkflowStore, run: ClaimedRun) -> _Recorded:
        key = (id(store), run.run_id)
        entry = self._runs.get(key)
        if entry is None:
            entry = self._runs[key] = _Recorded(run)
        entry.run = run
        return entry

    def loaded(self, store: WorkflowStore, run: ClaimedRun, steps: Sequence[StepRecord]) -> None:
        self._entry(store, run).steps = {step.seq: step for step in steps}

    def stored(self, store: WorkflowStore, run: ClaimedRun, step: StepRecord) -> None:
        steps = self._entry(store, run).steps
        known = steps.get(step.seq)
        if known is not None and known.name == step.name:
            # A wait ending: what it waited for stays (the store's done step names no event).
            step = attrs.evolve(
                step,
                wake_at=known.wake_at,
                event_name=known.event_name,
                event_key=known.event_key,
            )
        steps[step.seq] = step

    def write(self, directory: Path) -> list[Path]:
        """Write every run that stored a step; the files (two runs of one id in different test
        databases get ``-2``, ``-3``... files)."""
        written: list[Path] = []
        seen: dict[Path, int] = {}
        for entry in self._runs.values():
            if not entry.steps:
                continue
            history = _timeless(history_of_claim(entry.run, entry.steps.values()))
            path = write_history(directory, history)
            count = seen[path] = seen.get(path, 0) + 1
            if count > 1:
                renamed = path.with_name(f"{path.stem}-{count}{path.suffix}")
                path.replace(renamed)
                path = renamed
            written.append(path)
        return written


def _timeless(history: History) -> History:
    """A recorded history without the times of its run and steps (they change at every
    recording and a replay never reads them): a corpus recorded again diffs by what changed."""
    steps = tuple(
        attrs.evolve(
            s,
            created_at=None,
            finished_at=None,
            wake_at=s.wake_at if s.status == "waiting" else None,
        )
        for s in history.steps
    )
    return attrs.evolve(history, created_at=None, steps=steps)


def _done(step: NewStep, created: Any) -> StepRecord:  # noqa: ANN401 - a datetime
    return StepRecord(
        run_id="",
        name=step.name,
        seq=step.seq,
        kind=step.kind,
        state=step.state,
        result_json=step.result_json,
        wake_at=step.wake_at,
        created_at=created,
        finished_at=created if step.state == "done" else None,
        event_name=step.event_name,
        event_key=step.event_key,
    )


class RecordingStore:
    """A :class:`~ship_sqla.kernel._workflows.WorkflowStore` that tells the recorder what one
    run's execution loaded and stored, and does everything through the store it wraps."""

    def __init__(self, recorder: HistoryRecorder, run: ClaimedRun, inner: WorkflowStore) -> None:
        self._recorder = recorder
        self._run = run
        self._inner = inner

    async def load_steps(self, run_id: str) -> list[StepRecord]:
        steps = await self._inner.load_steps(run_id)
        if run_id == self._run.run_id:
            self._recorder.loaded(self._inner, self._run, steps)
        return steps

    async def save_step(self, run: ClaimedRun, step: NewStep, *, scope: Any = None) -> bool:  # noqa: ANN401
        saved = await self._inner.save_step(run, step, scope=scope)
        if saved:
            self._recorder.stored(self._inner, run, _done(step, run.created_at))
        return saved

    async def begin_wait(self, run: ClaimedRun, step: NewStep) -> StepRecord | None:
        stored = await self._inner.begin_wait(run, step)
        if stored is not None:
            self._recorder.stored(self._inner, run, stored)
        return stored

    async def match_event(self, run_id: str, step: StepRecord) -> WorkflowEvent | None:
        return await self._inner.match_event(run_id, step)

    async def adopt_children(self, parent: ClaimedRun, child_ids: Sequence[str]) -> None:
        await self._inner.adopt_children(parent, child_ids)

    async def children(self, run_id: str) -> list[ChildOutcome]:
        return await self._inner.children(run_id)

    async def publish_event(
        self,
        name: str,
        key: str,
        payload_json: str,
        *,
        scope: Any = None,  # noqa: ANN401
    ) -> int:
        return await self._inner.publish_event(name, key, payload_json, scope=scope)

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401 - the wrapped store's other members
        return getattr(self._inner, name)
