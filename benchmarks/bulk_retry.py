"""bulk_retry (issue 36 item 5): the time to retry 10,000 dead runs by filter, before and after
one statement per batch.

``python -m benchmarks.bulk_retry --url postgresql+asyncpg://postgres@127.0.0.1:5536/postgres``
(a private cluster: the figure is a time). Each round truncates the job tables, seeds ``--runs``
dead runs of one job (in history, J16: the default shape), previews ``retry`` for
``job=<job> state=dead`` and times ``JobOperations.retry_filtered`` with its token, batches of
1,000, each in a unit of work (what the dashboard and the CLI pass). Two paths, alternated
ABBA in the same sitting, medians and their ratio printed:

- ``per_run`` (before): the admin port's ``retry_dead_batch`` replaced by a loop of
  ``retry_dead`` (one statement per run): exactly what ``act_matching`` did before the batch
  statements;
- ``batch`` (after): the admin port's ``retry_dead_batch``, ONE statement per batch
  (``RETRY_DEAD_BATCH_BACK``).

The walk's reads (the runs pages' bounded statements) are the same in both.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ship_sqla import create_job_operations, create_unit_of_work, define_job
from ship_sqla._jobs import (
    create_job_backend,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
)
from ship_sqla.jobs import EnqueueRequest, RunFilter
from ship_sqla.kernel import ClaimRequest, failed

__all__ = ["main"]


async def _noop(_payload: dict[str, Any]) -> None:
    return None


JOB = define_job("bench.bulk_retry", _noop, payload=dict)


class _PerRun:
    """The admin port with ``retry_dead_batch`` as it was before: one ``retry_dead`` a run."""

    def __init__(self, admin: Any) -> None:  # noqa: ANN401 - any RunAdmin
        self._admin = admin

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401 - delegated
        return getattr(self._admin, name)

    async def retry_dead_batch(self, run_ids: list[str]) -> list[str]:
        return [r for r in run_ids if await self._admin.retry_dead(r) is not None]


class _Backend:
    def __init__(self, backend: Any, admin: Any) -> None:  # noqa: ANN401
        self._backend = backend
        self.admin = admin

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401 - delegated
        return getattr(self._backend, name)


async def _seed(engine: AsyncEngine, backend: Any, runs: int) -> None:  # noqa: ANN401
    async with engine.begin() as connection:
        await connection.execute(text("TRUNCATE ship_job_runs, ship_job_history"))
    for start in range(0, runs, 1000):
        size = min(1000, runs - start)
        await backend.enqueue_many(JOB, [EnqueueRequest({"n": start + n}) for n in range(size)])
    left = runs
    while left:
        claim = ClaimRequest(
            job_id=JOB.id, worker="bench", limit=min(left, 1000), max_running=None, lease=60.0
        )
        claimed = await backend.claim(claim)
        await backend.settle([failed(r, "boom", retry_at=None) for r in claimed])
        left -= len(claimed)
    async with engine.begin() as connection:
        await connection.execute(text("ANALYZE ship_job_runs"))
        await connection.execute(text("ANALYZE ship_job_history"))


async def _round(engine: AsyncEngine, backend: Any, path: str, runs: int) -> float:  # noqa: ANN401
    await _seed(engine, backend, runs)
    target = _Backend(backend, _PerRun(backend.admin)) if path == "per_run" else backend
    ops = create_job_operations(target, authorizer=lambda *_: True, actor="bench")
    flt = RunFilter.parse([f"job={JOB.id}", "state=dead"])
    preview = await ops.preview_matching("retry", flt)
    assert preview.count == runs, preview  # noqa: S101 - a benchmark's sanity check
    uow = create_unit_of_work(engine, repositories=lambda scope: scope)

    async def transaction(work: Any) -> None:  # noqa: ANN401
        async def handler(_scope: object) -> None:
            await work()

        await uow.run(handler)

    started = time.perf_counter()
    result = await ops.retry_filtered(flt, token=preview.token, transaction=transaction)
    elapsed = time.perf_counter() - started
    assert len(result.changed) == runs, len(result.changed)  # noqa: S101
    return elapsed


async def _main(url: str, runs: int, pairs: int) -> None:
    engine = create_async_engine(url, pool_size=4)
    metadata = MetaData()
    ship_job_runs_table(metadata)
    ship_job_history_table(metadata)
    ship_job_state_table(metadata)
    async with engine.begin() as connection:
        await connection.run_sync(metadata.drop_all)
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(database=engine, listen=False)
    times: dict[str, list[float]] = {"per_run": [], "batch": []}
    order = ["per_run", "batch", "batch", "per_run"] * ((pairs + 1) // 2)
    for path in order[: 2 * pairs]:
        seconds = await _round(engine, backend, path, runs)
        times[path].append(seconds)
        print(f"{path}: {seconds:.2f} s", flush=True)
    before, after = statistics.median(times["per_run"]), statistics.median(times["batch"])
    print(
        f"retry {runs:,} dead runs: per_run median {before:.2f} s, batch median {after:.2f} s,"
        f" ratio {before / after:.1f}x ({pairs} pairs)"
    )
    await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(_main(args.url, args.runs, args.pairs))


if __name__ == "__main__":
    main()
