"""Workflow evolution (SPEC §13, D7-D8): the rule that checks each workflow call of an execution
against the step its run stored at the same position, and the typed error a divergence is.

Pure: no storage, no clock. The runtime's :class:`~ship_sqla.kernel._workflows.Workflow`, the
in-memory model and the replayer (D11) all judge a call by :func:`check_call`, a handler's return
by :func:`check_return` and a stored result by :func:`decode_recorded`, so the three agree on what
a divergence is, where, and how it reads.

A run's history is its stored steps in position order. Each workflow call of one execution
takes the next position (0, 1, ...). At that position:

- nothing stored: the call is new (the run had not come this far), it runs and is stored there;
- a step of the same name and kind stored: the call replays it;
- anything else is a divergence (:class:`Divergence`), and so is a handler that returns while
  stored steps remain past its last call, or a stored result its ``result=`` codec no longer
  decodes.

D8's patch markers are steps of kind ``patch`` named ``patch:<id>`` (:func:`patch_step_name`);
:func:`patch_answer` is DBOS's position rule for ``ctx.patched``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import attrs

from ship_sqla.kernel._errors import ShipError
from ship_sqla.kernel._outcomes import TerminalError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from datetime import datetime
    from types import FrameType

__all__ = [
    "MAX_PATCHES_LISTED",
    "MAX_PATCH_READ",
    "PATCH_KIND",
    "PATCH_PREFIX",
    "Divergence",
    "DivergenceReason",
    "PatchAnswer",
    "PatchFigure",
    "PatchReport",
    "StepCall",
    "WorkflowChangedError",
    "WorkflowDivergedError",
    "caller_location",
    "check_call",
    "check_return",
    "decode_recorded",
    "divergence_of",
    "function_location",
    "patch_answer",
    "patch_step_name",
]

T = TypeVar("T")

DivergenceReason = Literal["changed", "returned", "codec"]
"""Why a run diverged (D7): ``changed``, another step (name or kind) is stored at the position
the call took; ``returned``, the handler returned while stored steps remain; ``codec``, the
stored result at the position no longer decodes with the step's ``result=``."""

PATCH_KIND: Final = "patch"
"""The kind of a D8 patch marker step."""
PATCH_PREFIX: Final = "patch:"
"""A patch marker step's name is this prefix and the patch id."""

MAX_PATCH_READ: Final = 100_000
"""The most live runs of a job one patch figure reads (D8): past it the figure is a lower bound
(:attr:`PatchFigure.complete` False)."""
MAX_PATCHES_LISTED: Final = 100
"""The most patch ids one report lists (D8)."""

_PACKAGE_DIR: Final = str(Path(__file__).resolve().parents[1])


@attrs.frozen
class StepCall:
    """One step as a history holds it or a handler asks for it: its ``name`` and ``kind``
    (step, transaction, sleep, event, spawn, children, patch)."""

    name: str
    kind: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name!r}"


@attrs.frozen
class Divergence:
    """Where and how a run's handler left its history (D7): the first divergence of an
    execution. ``recorded`` is what the history holds at ``position`` (None: nothing, the
    history ends before it); ``requested`` what the code asked for there (None: the handler
    returned); ``location`` the handler's ``file:line`` of that call (or of its definition, for
    a return); ``remaining`` how many stored steps the handler left unreplayed (``returned``);
    ``detail`` the codec's error (``codec``)."""

    run_id: str
    job_id: str
    position: int
    reason: DivergenceReason
    recorded: StepCall | None
    requested: StepCall | None
    location: str | None = None
    remaining: int = 0
    detail: str = ""

    def describe(self) -> str:
        """The divergence in one sentence, as the error, the log and the replayer say it."""
        where = f" (at {self.location})" if self.location else ""
        head = f"job {self.job_id!r} run {self.run_id!r} diverged from its history at position"
        head = f"{head} {self.position}"
        if self.reason == "returned":
            return (
                f"{head}: the handler returned{where} while the history holds"
                f" {self.remaining} more step(s), the first {self.recorded}."
            )
        if self.reason == "codec":
            return (
                f"{head}: the stored result of {self.recorded} no longer decodes with the"
                f" step's result= codec{where}: {self.detail}"
            )
        asked = f"the code asked for {self.requested}{where}"
        return f"{head}: the history recorded {self.recorded}, {asked}."

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form (for a parked run's history entry, an export, a replay report)."""
        return {
            "run_id": self.run_id,
            "job_id": self.job_id,
            "position": self.position,
            "reason": self.reason,
            "recorded": None if self.recorded is None else attrs.asdict(self.recorded),
            "requested": None if self.requested is None else attrs.asdict(self.requested),
            "location": self.location,
            "remaining": self.remaining,
            "detail": self.detail,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Divergence:
        """The divergence :meth:`to_json` wrote."""

        def call(value: Any) -> StepCall | None:  # noqa: ANN401 - JSON
            return None if value is None else StepCall(value["name"], value["kind"])

        return cls(
            run_id=data["run_id"],
            job_id=data["job_id"],
            position=int(data["position"]),
            reason=data["reason"],
            recorded=call(data.get("recorded")),
            requested=call(data.get("requested")),
            location=data.get("location"),
            remaining=int(data.get("remaining", 0)),
            detail=data.get("detail", ""),
        )


class WorkflowChangedError(TerminalError):
    """The step stored under a name is of another kind than the handler now asks for: the code
    changed under a run in flight (the determinism contract, docs/workflows.md). Terminal: the
    run is dead-lettered now; re-run it from that step once the deploy is right."""

    code = "SHIP_SQLA_WORKFLOW_CHANGED"

    def __init__(self, message: str) -> None:
        ShipError.__init__(
            self,
            message,
            fix="keep step names and kinds stable for runs in flight (add new steps with new"
            " names); then `ship-sqla jobs rerun RUN_ID --from-step NAME` re-runs the run from"
            " the changed step.",
        )


class WorkflowDivergedError(WorkflowChangedError):
    """A workflow run's handler diverged from the run's history (D7): another step at a
    position, a return while stored steps remain, or a stored result its codec no longer
    decodes. ``divergence`` says where (run, position, recorded, requested, ``file:line``).
    Terminal: the run is dead-lettered now (docs/workflows-evolution.md)."""

    code = "SHIP_SQLA_WORKFLOW_DIVERGED"

    def __init__(self, divergence: Divergence) -> None:
        ShipError.__init__(
            self,
            divergence.describe(),
            fix="keep the calls a run in flight has passed as they were: guard a change with"
            " `if await ctx.patched('id'):` (docs/workflows-evolution.md), or deploy the old"
            " code back; then `ship-sqla jobs rerun RUN_ID --from-step NAME` re-runs the run"
            " from the changed step.",
        )
        self.divergence = divergence


def divergence_of(
    *,
    run_id: str,
    job_id: str,
    position: int,
    recorded: StepCall | None,
    requested: StepCall,
    location: str | None = None,
) -> Divergence | None:
    """D7: the call ``requested`` at ``position`` against what the history holds there
    (``recorded``; None: nothing): None when it replays (same name and kind) or is new, else
    the divergence."""
    if recorded is None or recorded == requested:
        return None
    return Divergence(run_id, job_id, position, "changed", recorded, requested, location)


def check_call(
    *,
    run_id: str,
    job_id: str,
    position: int,
    recorded: StepCall | None,
    requested: StepCall,
    location: str | None = None,
) -> None:
    """:func:`divergence_of`, raising :class:`WorkflowDivergedError` on a divergence."""
    found = divergence_of(
        run_id=run_id,
        job_id=job_id,
        position=position,
        recorded=recorded,
        requested=requested,
        location=location,
    )
    if found is not None:
        raise WorkflowDivergedError(found)


def check_return(
    *,
    run_id: str,
    job_id: str,
    position: int,
    remaining: Sequence[StepCall],
    location: str | None = None,
) -> None:
    """D7: a handler that returned after taking positions ``0..position-1`` while the history
    holds ``remaining`` steps at ``position`` and beyond (in position order) diverged."""
    if remaining:
        raise WorkflowDivergedError(
            Divergence(
                run_id,
                job_id,
                position,
                "returned",
                remaining[0],
                None,
                location,
                remaining=len(remaining),
            )
        )


def decode_recorded(
    decode: Callable[[Any], T],
    value: Any,  # noqa: ANN401 - the stored JSON
    *,
    run_id: str,
    job_id: str,
    position: int,
    recorded: StepCall,
    location: str | None = None,
) -> T:
    """D7: the stored result ``value`` decoded by the step's codec, or a ``codec`` divergence
    when the codec (changed since the step was stored) refuses it."""
    try:
        return decode(value)
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}"
        raise WorkflowDivergedError(
            Divergence(
                run_id, job_id, position, "codec", recorded, recorded, location, detail=detail
            )
        ) from exc


PatchAnswer = Literal["marker", "new", "old"]
"""D8 at a ``ctx.patched`` call's position: ``marker``, its marker is stored there (True, the
position consumed); ``new``, nothing is stored there (store the marker: True); ``old``, another
step is stored there, so the run passed it before the patch existed (False, no position
consumed)."""


def patch_step_name(patch_id: str) -> str:
    """The name of patch ``patch_id``'s marker step."""
    return f"{PATCH_PREFIX}{patch_id}"


def patch_answer(recorded: StepCall | None, patch_id: str) -> PatchAnswer:
    """D8 (DBOS's rule, by position): what ``ctx.patched(patch_id)`` answers against the step
    the history holds at its position."""
    if recorded is None:
        return "new"
    if recorded == StepCall(patch_step_name(patch_id), PATCH_KIND):
        return "marker"
    return "old"


@attrs.frozen
class PatchFigure:
    """One of a patch's figures (D8): ``runs`` live runs of the job matched, among the ``read``
    live runs read; ``complete`` False when the read stopped at its bound (the job has more live
    runs), so ``runs`` is a lower bound."""

    runs: int
    read: int
    complete: bool

    def __str__(self) -> str:
        return str(self.runs) if self.complete else f"{self.runs}+ (first {self.read} live runs)"


@attrs.frozen
class PatchReport:
    """D8, what operators need to retire patch ``patch_id`` of job ``job_id``:

    - ``holding``: live runs holding its marker; the ``ctx.patched`` call can be deleted when
      this is 0 (a run holding it would diverge at the marker's position);
    - ``first_marker_at``: when the job's first marker of it was stored (None: none yet);
    - ``before_first``: live runs created before that first marker and not holding it; they
      may still take the old path, so the patch can be deprecated (``ctx.deprecate_patch``)
      when this is 0. Conservative: a run that never reaches the patch still counts.
    """

    job_id: str
    patch_id: str
    first_marker_at: datetime | None
    holding: PatchFigure
    before_first: PatchFigure

    @property
    def deletable(self) -> bool:
        return self.holding.complete and self.holding.runs == 0

    @property
    def deprecatable(self) -> bool:
        return (
            self.first_marker_at is not None
            and self.before_first.complete
            and self.before_first.runs == 0
        )


def caller_location() -> str | None:
    """The ``file:line`` of the innermost frame outside ship_sqla: the handler's workflow call
    (a coroutine's awaiters are on the stack while it runs)."""
    frame = sys._getframe(1)  # noqa: SLF001 - the cheapest way to the caller's frame
    current: FrameType | None = frame
    while current is not None:
        filename = current.f_code.co_filename
        if not filename.startswith(_PACKAGE_DIR):
            return f"{filename}:{current.f_lineno}"
        current = current.f_back
    return None


def function_location(fn: object) -> str | None:
    """The ``file:line`` where ``fn`` (a handler) is defined, or None when it has no code."""
    target = getattr(fn, "func", fn)  # a functools.partial
    code = getattr(getattr(target, "__wrapped__", target), "__code__", None)
    if code is None:
        code = getattr(getattr(target, "__call__", None), "__code__", None)  # noqa: B004
    if code is None:
        return None
    return f"{code.co_filename}:{code.co_firstlineno}"
