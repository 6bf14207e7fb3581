"""The replayer (SPEC §13, D11): a run's history against a job's handler, with no effect.

The handler runs as a worker would run it, on the runtime's own
:class:`~ship_sqla.kernel._workflows.Workflow`, so every call is judged by the one divergence
rule (D7, :mod:`ship_sqla.kernel._evolution`); only its storage is the history:

- a call at a position the history holds replays its stored result (its function, unit of
  work, enqueue, publish or sleep never runs);
- the first call at or past the history's frontier (the first position it does not hold), a
  wait the history holds as not over, or any write stops the replay: **clean** up to there;
- a divergence (another step at a position, a return while stored steps remain, a stored result
  the codec no longer decodes) stops it with the D7 :class:`~ship_sqla.kernel._evolution.
  Divergence`;
- the job's backend is not there: plain code between steps that reaches ``ctx.backend`` stops
  the replay as a failure (an effect a replay cannot make), and so does any other exception
  raised before the frontier; raised after every stored step replayed (a dead run's history),
  it is past the frontier, not judged: clean.

Plain code between steps still runs: a replay cannot see I/O there (the determinism contract).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Literal, NoReturn, cast

import attrs

from ship_sqla.kernel._clock import SystemClock
from ship_sqla.kernel._errors import UsageError
from ship_sqla.kernel._evolution import Divergence, WorkflowDivergedError
from ship_sqla.kernel._history import History, read_history
from ship_sqla.kernel._job_context import NO_RESOURCES, Cancellation, JobContext
from ship_sqla.kernel._ports import ClaimedRun
from ship_sqla.kernel._registry import JobRegistry
from ship_sqla.kernel._workflows import NEVER, Workflow, WorkflowSuspended

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from pathlib import Path

    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._ports import ClaimedRun as Claimed
    from ship_sqla.kernel._ports import JobBackend
    from ship_sqla.kernel._workflows import (
        ChildOutcome,
        NewStep,
        StepKind,
        StepRecord,
        WorkflowEvent,
    )

__all__ = ["ReplayFailedError", "ReplayResult", "Replayer"]

ReplayStop = Literal[
    "frontier", "suspended", "returned", "raised", "no-steps", "diverged", "failed"
]
"""Where a replay stopped: at the history's ``frontier``; at a wait the history holds as not
over (``suspended``); the handler ``returned`` having replayed every stored step, or ``raised``
after it (a dead run's history: clean); the history holds ``no-steps`` (nothing to replay, the
handler is not run); ``diverged`` (D7); ``failed`` (the handler raised, or reached for an
effect, before the frontier)."""

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_REPLAY_LEASE: Final = 3600.0


class ReplayFailedError(UsageError, AssertionError):
    """A replayed history did not replay clean (D11): it diverged (the D7 message: run,
    position, what was recorded, what the code asked for, ``file:line``) or the handler failed
    before the history's frontier. Raised by :meth:`ReplayResult.raise_if_not_clean`, so a
    pytest test fails with the message."""

    code = "SHIP_SQLA_REPLAY_FAILED"


@attrs.frozen
class ReplayResult:
    """What a replay found (D11): ``clean`` up to ``replayed`` positions (of the history's
    ``frontier``), or the first ``divergence`` (D7), or the handler's ``failure``."""

    run_id: str
    job_id: str
    frontier: int
    replayed: int
    stopped: ReplayStop
    divergence: Divergence | None = None
    failure: str | None = None
    origin: str | None = None
    """The file the history came from, when it came from one."""
    raised: str | None = None
    """What the handler raised past the frontier (``stopped == "raised"``): not judged."""

    @property
    def clean(self) -> bool:
        return self.divergence is None and self.failure is None

    def describe(self) -> str:
        """One line: clean (and where it stopped), or the divergence or failure."""
        where = f" ({self.origin})" if self.origin else ""
        if self.divergence is not None:
            return f"DIVERGED{where}: {self.divergence.describe()}"
        if self.failure is not None:
            return (
                f"FAILED{where}: job {self.job_id!r} run {self.run_id!r} at position"
                f" {self.replayed}: {self.failure}"
            )
        return (
            f"clean{where}: job {self.job_id!r} run {self.run_id!r} replayed"
            f" {self.replayed} of {self.frontier} stored step(s) ({self.stopped})."
        )

    def raise_if_not_clean(self) -> None:
        """Raise :class:`ReplayFailedError` with :meth:`describe` unless the replay is clean."""
        if not self.clean:
            raise ReplayFailedError(
                self.describe(),
                fix="keep the calls a run in flight has passed as they were (guard a change with"
                " ctx.patched, or give the job a new version; docs/workflows-evolution.md), or,"
                " when the change is meant, record the histories again.",
            )


class _Frontier(BaseException):
    """The replay reached what the history does not hold: stop, clean."""

    def __init__(self, position: int) -> None:
        super().__init__(position)
        self.position = position


class _EffectRefused(BaseException):
    """Plain code of the handler reached for the backend during a replay."""


class _HistoryStore:
    """A :class:`~ship_sqla.kernel._workflows.WorkflowStore` answering from a history: reads
    answer what it holds, any write is the frontier (nothing is ever stored)."""

    def __init__(self, history: History) -> None:
        self._steps = [step.record(history.run_id) for step in history.steps]
        self._frontier = history.frontier

    def _stop(self, step: NewStep | None = None) -> NoReturn:
        raise _Frontier(self._frontier if step is None else step.seq)

    async def load_steps(self, run_id: str) -> list[StepRecord]:  # noqa: ARG002 - one run
        return list(self._steps)

    async def save_step(self, run: Claimed, step: NewStep, *, scope: Any = None) -> bool:  # noqa: ARG002, ANN401
        self._stop(step)

    async def begin_wait(self, run: Claimed, step: NewStep) -> StepRecord | None:  # noqa: ARG002
        self._stop(step)

    async def match_event(self, run_id: str, step: StepRecord) -> WorkflowEvent | None:  # noqa: ARG002
        return None  # a wait the history holds as not over stays so: the run suspends there

    async def adopt_children(self, parent: Claimed, child_ids: Sequence[str]) -> None:  # noqa: ARG002
        self._stop()

    async def children(self, run_id: str) -> list[ChildOutcome]:  # noqa: ARG002
        self._stop()

    async def publish_event(
        self,
        name: str,  # noqa: ARG002
        key: str,  # noqa: ARG002
        payload_json: str,  # noqa: ARG002
        *,
        scope: Any = None,  # noqa: ARG002, ANN401
    ) -> int:
        self._stop()


class _NoBackend:
    """The job backend of a replay: none. Whatever the handler's plain code asks of it is an
    effect a replay cannot make."""

    def __getattr__(self, name: str) -> NoReturn:
        raise _EffectRefused(name)


class _ReplayWorkflow(Workflow):
    """The runtime's workflow, stopped at the first call the history does not hold, before
    anything of that call runs. Every check (D7's rule) is the runtime's own."""

    __slots__ = ("replayed",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401
        super().__init__(*args, **kwargs)
        self.replayed = 0

    def _take(self, name: str, kind: StepKind) -> tuple[int, StepRecord | None]:
        seq, stored = super()._take(name, kind)
        if stored is None:
            raise _Frontier(seq)
        self.replayed = seq + 1
        return seq, stored


def _at_version(job: JobDefinition[Any], version: int | None) -> JobDefinition[Any] | None:
    """The definition that executes a run of handler ``version`` (D9: pinned versions, where
    the job definition keeps them), or None when it keeps no such version."""
    at_version = getattr(job, "at_version", None)  # D9's JobDefinition.at_version
    if not callable(at_version):
        return job
    found: JobDefinition[Any] | None = at_version(version)
    return found


def _claim(history: History) -> ClaimedRun:
    return ClaimedRun(
        run_id=history.run_id,
        job_id=history.job_id,
        payload=history.payload,
        attempt=history.attempt,
        max_attempts=max(history.attempt, 1),
        token=0,
        key=None,
        lease_expires_at=NEVER,
        created_at=history.created_at or _EPOCH,
        lease=_REPLAY_LEASE,
        tenant=history.tenant,
    )


class Replayer:
    """Replays workflow histories (D11) against the handlers of ``registry`` (a
    :class:`~ship_sqla.jobs.JobRegistry` or job definitions) without running any effect: see
    :mod:`ship_sqla.kernel._replay`. ``resources``: what the handlers read as
    ``ctx.resources`` (a fake is enough: no step function runs)."""

    def __init__(
        self,
        registry: JobRegistry | Iterable[JobDefinition[Any]],
        *,
        resources: object = NO_RESOURCES,
    ) -> None:
        self._registry = registry if isinstance(registry, JobRegistry) else JobRegistry(registry)
        self._resources = resources

    async def replay(self, history: History, *, origin: str | None = None) -> ReplayResult:
        """Replay ``history`` to its first divergence, failure or frontier."""
        job = _at_version(self._registry.get(history.job_id), history.version)
        result = attrs.evolve(
            _EMPTY,
            run_id=history.run_id,
            job_id=history.job_id,
            frontier=history.frontier,
            origin=origin,
        )
        if not history.steps:
            return result
        if job is None:
            return attrs.evolve(
                result,
                stopped="failed",
                failure=f"the registry keeps no handler of version {history.version} (D9):"
                " a worker of this build would hand the run back.",
            )
        if job.transaction is not None:
            return attrs.evolve(
                result,
                stopped="failed",
                failure="the job is transactional (transaction=): it makes no workflow calls,"
                " so a history with steps is not its own.",
            )
        try:
            payload = job.decode(history.payload)
        except Exception as exc:  # noqa: BLE001 - any codec failure is the finding
            failure = f"the stored payload no longer decodes: {type(exc).__name__}: {exc}"
            return attrs.evolve(result, stopped="failed", failure=failure)
        return await self._run(job, payload, history, result)

    async def _run(
        self,
        job: JobDefinition[Any],
        payload: Any,  # noqa: ANN401 - the job's own payload type
        history: History,
        result: ReplayResult,
    ) -> ReplayResult:
        run = _claim(history)
        cancellation = Cancellation()
        ctx: JobContext[Any] = JobContext(
            run, cancellation, worker_id="replayer", resources=self._resources
        )
        store, clock = _HistoryStore(history), SystemClock()
        backend = cast("JobBackend", _NoBackend())
        ctx.bind_backend(backend)  # not bind_workflows: a recorder must not see replays
        workflow = _ReplayWorkflow(run, store, backend, clock, cancellation=cancellation)
        ctx._workflow = workflow  # noqa: SLF001 - the replay's own workflow
        try:
            await job.handler(ctx, payload)
            workflow.returned(job.handler)
        except _Frontier as stop:
            return attrs.evolve(result, replayed=stop.position, stopped="frontier")
        except WorkflowSuspended:
            return attrs.evolve(result, replayed=workflow.replayed, stopped="suspended")
        except WorkflowDivergedError as exc:
            divergence = exc.divergence
            return attrs.evolve(
                result, replayed=divergence.position, stopped="diverged", divergence=divergence
            )
        except _EffectRefused as exc:
            return _raised(
                result,
                workflow.replayed,
                f"the handler's code between steps used ctx.backend.{exc.args[0]}: an effect a"
                " replay cannot make (move it into a step).",
            )
        except Exception as exc:  # noqa: BLE001 - the handler's failure is the finding
            failure = f"the handler raised {type(exc).__name__}: {exc}"
            return _raised(result, workflow.replayed, failure)
        return attrs.evolve(result, replayed=workflow.replayed, stopped="returned")

    async def replay_file(self, path: str | Path) -> ReplayResult:
        """Read the history file at ``path`` and replay it."""
        return await self.replay(read_history(path), origin=str(path))


def _raised(result: ReplayResult, replayed: int, what: str) -> ReplayResult:
    """The handler raised after replaying ``replayed`` positions: a failure before the frontier
    (the recorded run went on there); past it, clean (``raised``: a run that failed there, a
    dead one, stored nothing after it either, and what is past the frontier is not judged)."""
    if replayed >= result.frontier:
        return attrs.evolve(result, replayed=replayed, stopped="raised", raised=what)
    return attrs.evolve(result, replayed=replayed, stopped="failed", failure=what)


_EMPTY: Final = ReplayResult(run_id="", job_id="", frontier=0, replayed=0, stopped="no-steps")
