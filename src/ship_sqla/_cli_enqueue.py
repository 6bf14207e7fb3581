"""``ship-sqla enqueue``: one run from the shell (the command is declared in ``_cli.py``; this
module holds what it runs).

A run stores, besides its payload, what its job's definition decides at enqueue time: the
attempt budget (``retry.attempts``), the default priority, the dedupe key of an idempotency
policy, the single-runner key (``Concurrency.key``) and the payload's validation by its codec.
So the command enqueues in one of two ways:

- ``--registry APP:REGISTRY``: through the application's own definition of the job, exactly as
  ``backend.enqueue`` in the application would (its codec validates the JSON payload);
- without it, the job need not be importable: a stand-in definition with the job id, the JSON
  payload as given, ``--max-attempts`` (default: ``RetryPolicy``'s, 5), ``--priority`` (default
  0), no dedupe key but ``--dedupe-key``, and the single-runner key ``--key`` when given. The
  worker runs the run with its real definition; only these enqueue-time values come from the
  stand-in, and the command prints them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from ship_sqla._jobs import create_job_backend
from ship_sqla.kernel._jobs import Concurrency, RetryPolicy, define_job
from ship_sqla.kernel._tenancy import tenant_ambient

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.engine import URL

    from ship_sqla._cli_jobs import JobTables
    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._ports import EnqueueResult

__all__ = ["DEFAULT_MAX_ATTEMPTS", "enqueue_run", "stand_in_job"]

DEFAULT_MAX_ATTEMPTS: Final = RetryPolicy().attempts


async def _never_run_here(_ctx: object, _payload: object) -> None:
    """The stand-in's handler: the CLI process enqueues only; a worker runs the real one."""
    msg = "the ship-sqla enqueue stand-in job is never executed"
    raise RuntimeError(msg)


def stand_in_job(job_id: str, *, max_attempts: int, key: str | None) -> JobDefinition[Any]:
    """The definition ``enqueue`` uses without ``--registry`` (see the module docstring); a bad
    job id raises ``ConfigurationError``."""
    concurrency = (
        Concurrency(single_runner=True, key=lambda _payload: key) if key is not None else None
    )
    return define_job(
        job_id,
        _never_run_here,
        concurrency=concurrency,
        retry=RetryPolicy(attempts=max_attempts),
    )


async def enqueue_run(
    url: URL,
    job: JobDefinition[Any],
    payload: object,
    *,
    tables: JobTables,
    run_at: datetime | None,
    dedupe_key: str | None,
    priority: int | None,
    tenant: str | None,
) -> EnqueueResult:
    """Enqueue one run of ``job`` at ``url`` (a committed enqueue wakes listening workers, K1),
    then dispose."""
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        backend = create_job_backend(database=engine, table=tables.runs, state_table=tables.state)
        with tenant_ambient(tenant):
            return await backend.enqueue(
                job, payload, run_at=run_at, dedupe_key=dedupe_key, priority=priority
            )
    finally:
        await engine.dispose()
