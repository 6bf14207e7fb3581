"""Live runs only (J16) and slim history rows (J18), on every backend in that mode: the
in-memory model's live and history dicts, and PostgreSQL with a history table given.

Each read that spans both tables has a case that fails when it reads only one: the run is
first shown to be where the case says (``table_of``), then read back through the port.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from job_helpers import claim_request, record_of
from sqlalchemy import text

from ship_sqla import define_job
from ship_sqla.jobs import Concurrency, Retention, RetryPolicy
from ship_sqla.kernel import InMemoryJobBackend, completed, failed
from ship_sqla.kernel._browse import RunQuery
from ship_sqla.kernel._ports import DeadQuery


async def noop(ctx: Any, payload: Any) -> None:
    return None


def job_named(job_id: str, **options: Any) -> Any:
    return define_job(
        job_id,
        noop,
        payload=dict,
        concurrency=Concurrency(max=10, lease=30.0),
        retry=RetryPolicy(attempts=1),
        **options,
    )


async def table_of(backend: Any, run_id: str) -> str:
    """Where the run is stored: ``"live"`` (the runs table), ``"history"``, or ``"none"``."""
    if isinstance(backend, InMemoryJobBackend):
        if run_id in backend._runs:
            return "live"
        return "history" if run_id in backend._history else "none"
    found = []
    async with backend.database.connect() as connection:
        for where, table in (("live", backend.table), ("history", backend.history_table)):
            name = f'"{table.name}"'
            row = await connection.execute(
                text(f"SELECT 1 FROM {name} WHERE id = :id"), {"id": run_id}
            )
            if row.first() is not None:
                found.append(where)
    assert len(found) <= 1, f"J16: run {run_id!r} is in both tables"
    return found[0] if found else "none"


async def ended(backend: Any, job: Any, outcome: str = "completed", **enqueue: Any) -> str:
    """Enqueue one run of ``job``, claim it and end it ``completed`` or ``dead``."""
    await backend.require_support([job])
    result = await backend.enqueue(job, {"n": 1}, **enqueue)
    [claimed] = await backend.claim(claim_request(job, worker="w1"))
    settlement = completed(claimed) if outcome == "completed" else failed(claimed, "boom", None)
    [answer] = await backend.settle([settlement])
    assert answer == outcome
    assert result.run_id is not None
    return result.run_id


async def test_j16_an_ended_run_moves_to_history_and_get_run_reads_both(
    clock: Any, live_only_backend_factory: Any
) -> None:
    """J16: the statement that ends a run moves it out of the runs table into history (a run is
    in exactly one); get-run (``jobs show``) finds a finished run in history and a live one in
    the runs table. J18: the history row keeps the attempt's start and worker."""
    backend = live_only_backend_factory(clock)
    job = job_named("j16.get")
    done = await ended(backend, job)
    waiting = (await backend.enqueue(job, {"n": 2})).run_id
    assert await table_of(backend, done) == "history"
    assert await table_of(backend, waiting) == "live"
    record = await record_of(backend, done)
    assert (record.state, record.attempt, record.job_id) == ("completed", 1, "j16.get")
    assert record.finished_at is not None
    assert record.started_at == clock.now()
    assert record.worker == "w1"
    assert (await record_of(backend, waiting)).state == "waiting"


async def test_j16_j1_a_durable_id_that_ended_still_dedupes(
    clock: Any, live_only_backend_factory: Any
) -> None:
    """J16, J1: a durable id is that run, terminal or not: once it ended (in history), an
    enqueue of the same id is deduplicated, not run again (schedules rely on it, J9)."""
    backend = live_only_backend_factory(clock)
    job = job_named("j16.durable")
    run_id = await ended(backend, job, run_id="j16.durable/2026-12-06")
    again = await backend.enqueue(job, {}, run_id=run_id)
    assert (again.run_id, again.deduplicated) == (run_id, True)
    assert await table_of(backend, run_id) == "history"


async def test_j16_dead_letters_list_retry_moves_back_and_discard(
    clock: Any, live_only_backend_factory: Any
) -> None:
    """J16, J8: a dead run is listed from history (dead-letter pages); an operator's retry moves
    it back to the runs table, waiting with one more attempt; dead again, a discard leaves it
    in history, discarded. A waiting run discarded moves to history."""
    backend = live_only_backend_factory(clock)
    job = job_named("j16.dead")
    dead = await ended(backend, job, "dead")
    assert await table_of(backend, dead) == "history"
    listed = await backend.admin.list_dead(DeadQuery(job_id=job.id, limit=10))
    assert [r.run_id for r in listed] == [dead]
    assert listed[0].payload == {"n": 1}  # J18: a dead run keeps its payload (retry needs it)
    everyone = await backend.admin.list_dead(DeadQuery(limit=10))
    assert [r.run_id for r in everyone] == [dead]
    retried = await backend.admin.retry_dead(dead)
    assert retried is not None
    assert (retried.state, retried.max_attempts) == ("waiting", 2)
    assert await table_of(backend, dead) == "live"
    [claimed] = await backend.claim(claim_request(job, worker="w1"))
    assert claimed.payload == {"n": 1}
    assert await backend.settle([failed(claimed, "again", None)]) == ["dead"]
    assert await table_of(backend, dead) == "history"
    discarded = await backend.admin.discard(dead)
    assert discarded is not None
    assert discarded.state == "discarded"
    assert (await record_of(backend, dead)).state == "discarded"
    waiting = (await backend.enqueue(job, {"n": 3})).run_id
    assert (await backend.admin.discard(waiting)).state == "discarded"
    assert await table_of(backend, waiting) == "history"


async def test_j16_k2_cancel_of_a_waiting_run_moves_it_and_a_finished_one_is_refused(
    clock: Any, live_only_backend_factory: Any
) -> None:
    """J16, K2: cancelling a waiting run ends it cancelled in history; cancelling it again (it
    is finished) changes nothing; a running run's request stays on the live row."""
    backend = live_only_backend_factory(clock)
    job = job_named("j16.cancel")
    waiting = (await backend.enqueue(job, {"n": 1})).run_id
    record = await backend.admin.cancel(waiting)
    assert record is not None
    assert record.state == "cancelled"
    assert await table_of(backend, waiting) == "history"
    assert await backend.admin.cancel(waiting) is None
    assert (await record_of(backend, waiting)).payload == {"n": 1}
    running = (await backend.enqueue(job, {})).run_id
    [claimed] = await backend.claim(claim_request(job, worker="w1"))
    requested = await backend.admin.cancel(running)
    assert requested is not None
    assert (requested.state, requested.cancel_requested_at) == ("running", clock.now())
    assert await table_of(backend, running) == "live"
    assert await backend.settle([failed(claimed, "stopped", clock.now())]) == ["cancelled"]
    assert await table_of(backend, running) == "history"


async def test_j16_d5_children_are_read_from_both_tables(
    clock: Any, live_only_backend_factory: Any
) -> None:
    """J16, D5: a workflow run's children, one ended (history) and one waiting (live), are
    both its children, in spawn order, the ended one with its outcome."""
    backend = live_only_backend_factory(clock)
    parent_job, child_job = job_named("j16.parent"), job_named("j16.child")
    parent = (await backend.enqueue(parent_job, {})).run_id
    [held] = await backend.claim(claim_request(parent_job, worker="w1"))
    first = (await backend.enqueue(child_job, {})).run_id
    second = (await backend.enqueue(child_job, {})).run_id
    await backend.workflows.adopt_children(held, [first, second])
    [child] = await backend.claim(claim_request(child_job, worker="w1"))
    assert child.run_id == first
    assert await backend.settle([failed(child, "child failed", None)]) == ["dead"]
    assert await table_of(backend, first) == "history"
    outcomes = await backend.workflows.children(parent)
    assert [(c.run_id, c.state, c.last_error) for c in outcomes] == [
        (first, "dead", "child failed"),
        (second, "waiting", None),
    ]


async def test_j16_d5_a_child_that_ended_before_its_adoption_is_adopted(
    clock: Any, live_only_backend_factory: Any
) -> None:
    """J16, D5: a spawned child a fast worker ended before the parent adopted it is already in
    history; the adoption reaches it there, so it is one of the parent's children."""
    backend = live_only_backend_factory(clock)
    parent_job, child_job = job_named("j16.early.parent"), job_named("j16.early.child")
    await backend.enqueue(parent_job, {})
    [held] = await backend.claim(claim_request(parent_job, worker="w1"))
    early = (await backend.enqueue(child_job, {})).run_id
    [child] = await backend.claim(claim_request(child_job, worker="w2"))
    assert await backend.settle([completed(child)]) == ["completed"]
    assert await table_of(backend, early) == "history"
    await backend.workflows.adopt_children(held, [early])
    outcomes = await backend.workflows.children(held.run_id)
    assert [(c.run_id, c.state) for c in outcomes] == [(early, "completed")]


async def test_j16_s2_browse_counts_throughput_and_known_read_history(
    clock: Any, live_only_backend_factory: Any
) -> None:
    """J16, S2: the dashboard's reads of finished runs read history: a page of completed runs
    (one job's, and every job's), the counts per state, the throughput chart; and a job whose
    only run ended is still known (issue 25)."""
    backend = live_only_backend_factory(clock)
    job = job_named("j16.browse")
    done = await ended(backend, job)
    live = (await backend.enqueue(job, {})).run_id
    for job_id in (job.id, None):
        page = await backend.admin.list_runs(
            RunQuery(state="completed", limit=10, job_id=job_id), max_jobs=10
        )
        assert [b.record.run_id for b in page] == [done]
    counts = {(c.job_id, c.state): c.runs for c in await backend.admin.state_counts(limit=10)}
    assert counts == {(job.id, "completed"): 1, (job.id, "waiting"): 1}
    clock.advance(1)
    buckets = await backend.admin.throughput(bucket_seconds=60, buckets=2, cap=100, max_jobs=10)
    assert sum(b.completed for b in buckets) == 1
    assert await backend.admin.job_known(job.id) is True
    assert live is not None


async def test_j18_slim_rows_keep_payloads_only_where_needed(
    clock: Any, live_only_backend_factory: Any
) -> None:
    """J18: a completed run's history row has no payload by default; a job with
    ``Retention(completed_payload=True)`` keeps it; a dead run always keeps it."""
    backend = live_only_backend_factory(clock)
    slim = await ended(backend, job_named("j18.slim"))
    assert (await record_of(backend, slim)).payload is None
    kept = await ended(backend, job_named("j18.kept", retention=Retention(completed_payload=True)))
    assert (await record_of(backend, kept)).payload == {"n": 1}
    dead = await ended(backend, job_named("j18.dead"), "dead")
    assert (await record_of(backend, dead)).payload == {"n": 1}


async def test_j18_zero_retention_deletes_a_completed_run_at_its_settle(
    clock: Any, live_only_backend_factory: Any
) -> None:
    """J18: ``Retention(completed=timedelta(0))`` deletes a completed run at its settle and
    writes no history row; its failures are still kept."""
    backend = live_only_backend_factory(clock)
    job = job_named("j18.ephemeral", retention=Retention(completed=timedelta(0)))
    gone = await ended(backend, job)
    assert await table_of(backend, gone) == "none"
    assert await backend.admin.get_run(gone) is None
    dead = await ended(backend, job, "dead")
    assert await table_of(backend, dead) == "history"


@pytest.mark.parametrize("outcome", ["completed", "dead"])
async def test_j16_j5_a_stale_holder_moves_nothing(
    clock: Any, live_only_backend_factory: Any, outcome: str
) -> None:
    """J16, J5: the move is fenced as the in-place settle was: a holder whose lease lapsed and
    whose run another claim retook ends nothing; the current holder's settle moves it."""
    backend = live_only_backend_factory(clock)
    job = define_job(
        "j16.fence",
        noop,
        payload=dict,
        concurrency=Concurrency(max=10, lease=30.0),
        retry=RetryPolicy(attempts=3),
    )
    run_id = (await backend.enqueue(job, {})).run_id
    [stale] = await backend.claim(claim_request(job, worker="w1"))
    clock.advance(31)
    [current] = await backend.claim(claim_request(job, worker="w2"))

    def settle(run: Any) -> Any:
        return completed(run) if outcome == "completed" else failed(run, "x", None)

    assert await backend.settle([settle(stale)]) == ["stale"]
    assert await table_of(backend, run_id) == "live"
    assert await backend.settle([settle(current)]) == [outcome]
    assert await table_of(backend, run_id) == "history"


async def test_j16_d9_f8_a_retried_dead_run_keeps_its_version_and_partition_key(
    clock: Any, live_only_backend_factory: Any
) -> None:
    """J16 with D9 and F8: a dead run of a versioned job with limits per key keeps, through
    history and back (an operator's retry), the handler version it was enqueued under and its
    partition key: the move writes both and the move back restores both."""
    backend = live_only_backend_factory(clock)
    job = define_job(
        "j16.versioned",
        noop,
        payload=dict,
        concurrency=Concurrency(max=10, lease=30.0, partition="key"),
        retry=RetryPolicy(attempts=1),
        version=2,
    )
    dead = await ended(backend, job, "dead", partition_key="acme")
    assert await table_of(backend, dead) == "history"
    assert (await record_of(backend, dead)).handler_version == 2
    retried = await backend.admin.retry_dead(dead)
    assert retried is not None
    assert await table_of(backend, dead) == "live"
    assert (await record_of(backend, dead)).handler_version == 2
    if not isinstance(backend, InMemoryJobBackend):
        async with backend.database.connect() as connection:
            stored = await connection.scalar(
                text(f'SELECT partition_key FROM "{backend.table.name}" WHERE id = :id'),
                {"id": dead},
            )
        assert stored == "acme"
