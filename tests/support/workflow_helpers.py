"""Driving workflow runs one execution at a time, without a runtime: claim a run, run its handler
with a context bound to the backend's workflow store, settle what it ended with (as the
executor does: returned -> completed, a sleep or a wait -> its Suspend, raised -> failed). Used by
the workflow conformance suite and the workflow state machine."""

from __future__ import annotations

from typing import Any

import attrs
from job_helpers import claim_request

from ship_sqla import JobContext
from ship_sqla.kernel import completed, failed
from ship_sqla.kernel._ports import ClaimedRun
from ship_sqla.kernel._workflows import WorkflowSuspended


@attrs.define
class Execution:
    """What one execution did: the claimed run (None: nothing was due), how its handler ended
    (``"completed"``, ``"suspended"``, ``"failed"``), the settle's answer and any error."""

    run: ClaimedRun | None
    ended: str | None = None
    outcome: str | None = None
    error: BaseException | None = None


class FakeUnitOfWork:
    """A unit of work for the in-memory backend: runs the handler with no repositories (there are
    no transactions in memory), counting its runs; ``fail_after`` makes it raise after the
    handler returned, as a failed commit would, so nothing counts as committed."""

    def __init__(self) -> None:
        self.runs = 0
        self.committed = 0
        self.fail_next_commit = False

    async def run(self, handler: Any) -> Any:
        self.runs += 1
        result = await handler(None)
        if self.fail_next_commit:
            self.fail_next_commit = False
            raise RuntimeError("commit failed")
        self.committed += 1
        return result


async def execute_once(
    backend: Any,
    job: Any,
    clock: Any,
    *,
    worker: str = "W",
    settle: bool = True,
    run: ClaimedRun | None = None,
) -> Execution:
    """Claim one due run of ``job`` (or use ``run``), run its handler once, and (unless
    ``settle`` is False) settle how it ended."""
    if run is None:
        claimed = await backend.claim(claim_request(job, worker=worker))
        if not claimed:
            return Execution(None)
        [run] = claimed
    ctx = JobContext.standalone(run, worker_id=worker)
    ctx.bind_workflows(backend.workflows, backend, clock, determinism=job.determinism)
    execution = Execution(run)
    try:
        await job.handler(ctx, job.decode(run.payload))
        ctx.workflow_returned(job.handler)
    except WorkflowSuspended as suspended:
        execution.ended = "suspended"
        settlement: Any = suspended.settlement
    except Exception as exc:
        execution.ended = "failed"
        execution.error = exc
        settlement = failed(run, repr(exc), clock.now())
    else:
        execution.ended = "completed"
        settlement = completed(run)
    if settle:
        [execution.outcome] = await backend.settle([settlement])
    return execution


async def workflow_backend(engine: Any, **options: Any) -> Any:
    """The job tables a workflow needs (runs, history, state, steps, events: what ``ship-sqla
    schema apply`` creates, J16's default shape, the steps without a key to the runs) and the
    audit table (S1: the CLI's operator verbs write to it) under their default names on
    ``engine`` (created if absent), and a PostgreSQL backend on them with ``options``."""
    from sqlalchemy import MetaData  # noqa: PLC0415 - the in-memory tests import this module too

    from ship_sqla._audit import ship_audit_table  # noqa: PLC0415
    from ship_sqla._jobs import (  # noqa: PLC0415
        create_job_backend,
        ship_job_events_table,
        ship_job_history_table,
        ship_job_runs_table,
        ship_job_state_table,
        ship_job_steps_table,
    )

    metadata = MetaData()
    for table in (
        ship_job_runs_table,
        ship_job_history_table,  # J16: the default shape (declared before the steps: no FK)
        ship_job_state_table,
        ship_job_steps_table,
        ship_job_events_table,
        ship_audit_table,
    ):
        table(metadata)
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return create_job_backend(database=engine, **options)
