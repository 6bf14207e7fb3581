"""J17 on PostgreSQL: the run history's partitions, created by ``schema apply``, kept by the
maintenance (days ahead created, expired days dropped per state class, the parent analyzed),
every DDL under a 1 s ``lock_timeout`` that a concurrent settle never waits longer for; the
DEFAULT partition's strays reported and moved out; the schema check ignores partitions.

Time is a :class:`FrozenClock` set days ahead of the wall clock (the partitions ``schema
apply`` makes are the wall clock's days); a long reader is a second connection holding a lock,
and the tests wait on conditions (a lock request seen waiting in ``pg_locks``), never sleep.
The "settle" here is the row J16's settle writes, inserted into the parent the way it does."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import MetaData, text
from sqlalchemy.exc import DBAPIError

from ship_sqla import create_job_backend, define_job, ship_job_history_table
from ship_sqla._schema_apply import apply_ship_schema, ship_tables_metadata
from ship_sqla.jobs import Concurrency, EnqueueRequest
from ship_sqla.kernel import completed
from ship_sqla.kernel._early_rebuild import EarlyRebuild
from ship_sqla.kernel._history_partitions import day_suffix
from ship_sqla.kernel._metrics import JobMetrics
from ship_sqla.kernel._ports import ClaimRequest
from ship_sqla.kernel._runtime.depth import DepthSampler
from ship_sqla.kernel._runtime.wiring import Plumbing
from ship_sqla.schema import check_schema
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

WALL = datetime.now(UTC)
TODAY = WALL.date()

INSERT_FINISHED = text(
    "INSERT INTO ship_job_history (id, seq, job_id, state, attempt, max_attempts, run_at,"
    " created_at, finished_at) VALUES (:id, 1, 'j17', :state, 1, 3, :at, :at, :at)"
)


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    report = await apply_ship_schema(ship_engine, ship_tables_metadata(components=["jobs"]))
    assert report.ok, report.check
    return ship_engine


def _backend(engine: AsyncEngine, clock: FrozenClock, **kwargs: Any) -> Any:
    return create_job_backend(database=engine, clock=clock, listen=False, **kwargs)


async def _partitions(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as connection:
        rows = await connection.execute(
            text(
                "SELECT c.relname FROM pg_class c WHERE c.relispartition"
                " AND c.relkind IN ('r', 'p') AND c.relname LIKE 'ship\\_job\\_history\\_%'"
            )
        )
        return {row[0] for row in rows}


def _day(cls: str, day: Any) -> str:
    return "ship_job_history" + day_suffix(cls, day)  # type: ignore[arg-type]


async def test_j17_schema_apply_makes_classes_defaults_and_days_and_the_check_ignores_them(
    engine: AsyncEngine,
) -> None:
    """J17: schema apply creates the partitioned parent with, per state class, its class
    partition, its DEFAULT partition and today's plus three days ahead; the schema check
    (extra tables looked for) reports none of them."""
    names = await _partitions(engine)
    for cls in ("completed", "dead", "ended"):
        assert f"ship_job_history_{cls}" in names
        assert f"ship_job_history_{cls}_default" in names
        for ahead in range(4):
            assert _day(cls, TODAY + timedelta(days=ahead)) in names
    report = await check_schema(engine, ship_tables_metadata(components=["jobs"]))
    assert report.ok, report


OLD_BROWSE_INDEX = (
    "CREATE INDEX ship_job_history_browse_idx ON ship_job_history (job_id, state, created_at, id)"
)
"""The history's browse index as an older release created it: full (completed runs in it)."""

BROWSE_INDEX_RECIPE = (
    "DROP INDEX ship_job_history_browse_idx",
    (
        "CREATE INDEX ship_job_history_browse_idx ON ship_job_history"
        " (job_id, state, created_at, id) WHERE state <> 'completed'"
    ),
)
"""The migration recipe of CHANGELOG.md and docs/howto/history.md, word for word."""


async def test_j18_an_older_full_browse_index_is_reported_and_the_recipe_makes_it_partial(
    engine: AsyncEngine,
) -> None:
    """J18, T3: an older release's full ``<history>_browse_idx`` (completed runs in it, ~100 B
    each) is reported by the schema check as an index predicate difference, and nothing else;
    the migration recipe (drop it, create it partial) leaves the check clean, and every
    partition, those created after it too, has the partial index."""
    metadata = ship_tables_metadata(components=["jobs"])
    async with engine.begin() as connection:
        await connection.exec_driver_sql("DROP INDEX ship_job_history_browse_idx")
        await connection.exec_driver_sql(OLD_BROWSE_INDEX)
    report = await check_schema(engine, metadata)
    assert [(d.kind, d.name) for d in report.differences] == [
        ("index_predicate", "ship_job_history_browse_idx")
    ], report
    [difference] = report.differences
    assert difference.database is None
    assert difference.metadata == "state <> 'completed'::text"
    async with engine.begin() as connection:
        for statement in BROWSE_INDEX_RECIPE:
            await connection.exec_driver_sql(statement)
        await connection.exec_driver_sql(
            "CREATE TABLE ship_job_history_completed_29991231 PARTITION OF"
            " ship_job_history_completed FOR VALUES FROM ('2999-12-31') TO ('3000-01-01')"
        )
    report = await check_schema(engine, metadata)
    assert report.ok, report
    async with engine.connect() as connection:
        predicates = (
            (
                await connection.execute(
                    text(
                        "SELECT DISTINCT pg_get_expr(x.indpred, x.indrelid) FROM pg_index x"
                        " JOIN pg_class c ON c.oid = x.indrelid"
                        " WHERE c.relname LIKE 'ship\\_job\\_history%'"
                        " AND pg_get_indexdef(x.indexrelid)"
                        "     LIKE '%(job_id, state, created_at, id)%'"
                    )
                )
            )
            .scalars()
            .all()
        )
    assert predicates == ["(state <> 'completed'::text)"]


async def test_j17_maintenance_creates_days_ahead_drops_expired_ones_and_analyzes(
    engine: AsyncEngine,
) -> None:
    """J17: with the clock 10 days on, a pass creates each class's missing days (today to 3
    ahead), drops the days past each class's retention (completed 1 day: every old day; dead
    30 days: none; cancelled/discarded 7 days: the old ones), and with them their rows (no
    DELETE), analyzes the parent; a second pass has nothing to do. J22: partitions ahead."""
    async with engine.begin() as connection:
        await connection.execute(INSERT_FINISHED, {"id": "old", "state": "completed", "at": WALL})
    clock = FrozenClock(WALL + timedelta(days=10))
    backend = _backend(engine, clock)
    done = await backend.maintain_history()
    later = (WALL + timedelta(days=10)).date()
    assert done.deferred == ()
    assert done.analyzed
    for cls in ("completed", "dead", "ended"):
        for ahead in range(4):
            assert _day(cls, later + timedelta(days=ahead)) in done.created
    assert _day("completed", TODAY) in done.dropped
    assert _day("ended", TODAY) in done.dropped
    assert not any("_dead_" in name for name in done.dropped)
    assert done.partitions_ahead == 3
    assert done.strays == 0
    names = await _partitions(engine)
    assert _day("completed", TODAY) not in names
    assert _day("dead", TODAY) in names
    async with engine.connect() as connection:
        left = await connection.scalar(text("SELECT count(*) FROM ship_job_history"))
    assert left == 0
    again = await backend.maintain_history()
    assert (again.created, again.dropped, again.analyzed) == ((), (), False)
    health = await backend.storage_health()
    assert health.partitions_ahead == 3
    assert health.history_strays == 0


async def test_j17_a_declared_retention_keeps_days_longer(engine: AsyncEngine) -> None:
    """J17: each class keeps the longest of the history table's declared retention and the
    registered jobs' (here completed runs 30 days): nothing completed is dropped at 10 days."""
    from ship_sqla.jobs import Retention  # noqa: PLC0415

    history = ship_job_history_table(MetaData(), retention=Retention(completed=timedelta(days=30)))
    backend = _backend(engine, FrozenClock(WALL + timedelta(days=10)), history_table=history)
    done = await backend.maintain_history()
    assert not any("_completed_" in name for name in done.dropped)
    job_kept = _backend(engine, FrozenClock(WALL + timedelta(days=10)))
    done = await job_kept.maintain_history([Retention(cancelled=timedelta(days=60))])
    assert not any("_ended_" in name for name in done.dropped)
    assert any("_completed_" in name for name in done.dropped)


async def _lock_waiters(engine: AsyncEngine) -> int:
    async with engine.connect() as connection:
        return int(
            await connection.scalar(
                text(
                    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
                    " WHERE NOT l.granted AND c.relname = 'ship_job_history_completed'"
                )
            )
        )


async def test_j17_ddl_behind_a_long_reader_gives_up_after_1s_and_a_settle_waits_no_longer(
    engine: AsyncEngine,
) -> None:
    """J17: while a long reader holds the completed class partition (ACCESS SHARE, as any read
    of history does), the pass's DDL on that class waits at most lock_timeout (1 s) and is
    deferred, not failed; a settle into that class queued behind the waiting DDL lands within
    that second; the other classes are maintained; once the reader ends, the next pass does
    the deferred work."""
    clock = FrozenClock(WALL + timedelta(days=2))
    backend = _backend(engine, clock)
    async with engine.connect() as reader:
        await reader.execute(text("LOCK TABLE ship_job_history_completed IN ACCESS SHARE MODE"))
        maintaining = asyncio.ensure_future(backend.maintain_history())
        while await _lock_waiters(engine) == 0:  # the DDL's lock request is queued
            assert not maintaining.done(), maintaining
        started = time.monotonic()
        async with engine.begin() as settle:
            await settle.execute(INSERT_FINISHED, {"id": "s1", "state": "completed", "at": WALL})
        waited = time.monotonic() - started
        done = await maintaining
        await reader.rollback()
    assert waited < 1.5, waited
    assert _day("completed", TODAY) in done.deferred
    assert _day("completed", TODAY) not in done.dropped
    assert _day("dead", (WALL + timedelta(days=2)).date() + timedelta(days=3)) in done.created
    after = await backend.maintain_history()
    assert after.deferred == ()
    assert _day("completed", TODAY) in after.dropped


async def test_j17_strays_in_the_default_partition_are_reported_then_moved_out(
    engine: AsyncEngine,
) -> None:
    """J17, J22: a run finished on a day with no partition (maintenance stopped) lands in its
    class's DEFAULT partition: the storage health counts it and alarms; a pass whose clock
    reaches that day creates the day, moving the run out of the DEFAULT into it."""
    far = WALL + timedelta(days=20)
    async with engine.begin() as connection:
        await connection.execute(INSERT_FINISHED, {"id": "stray", "state": "dead", "at": far})
    backend = _backend(engine, FrozenClock(WALL))
    health = await backend.storage_health()
    assert health.history_strays == 1
    assert "history_strays" in {alarm.kind for alarm in health.alarms()}
    moved = await _backend(engine, FrozenClock(far)).maintain_history()
    assert _day("dead", far.date()) in moved.created
    assert moved.strays == 0
    async with engine.connect() as connection:
        where = await connection.scalar(
            text("SELECT tableoid::regclass::text FROM ship_job_history WHERE id = 'stray'")
        )
    assert where == _day("dead", far.date())


async def test_j17_a_backend_whose_history_table_is_absent_maintains_nothing(
    ship_engine: AsyncEngine,
) -> None:
    """J17: a backend's default history table not in the database: a pass does nothing (the
    sampler reports no error every interval), and the health reads no partitions."""
    backend = _backend(ship_engine, FrozenClock(WALL))
    done = await backend.maintain_history()
    assert done.created == ()
    assert done.partitions_ahead is None


INSERT_FINISHED_RUN = text(
    "INSERT INTO ship_job_runs (id, job_id, state, payload, max_attempts, attempt, created_at,"
    " updated_at, finished_at) VALUES (:id, 'j17', :state, '{\"n\": 1}', 3, 1, :at, :at, :at)"
)


async def _seed_old_runs(engine: AsyncEngine) -> None:
    """30 completed an hour ago, 10 dead 5 days ago, 10 completed 3 days ago (past the 1 day
    retention), and 2 waiting runs: an existing runs table from before the history."""
    rows = [
        *(
            {"id": f"c{i}", "state": "completed", "at": WALL - timedelta(hours=1)}
            for i in range(30)
        ),
        *({"id": f"d{i}", "state": "dead", "at": WALL - timedelta(days=5)} for i in range(10)),
        *({"id": f"o{i}", "state": "completed", "at": WALL - timedelta(days=3)} for i in range(10)),
    ]
    async with engine.begin() as connection:
        await connection.execute(INSERT_FINISHED_RUN, rows)
        await connection.execute(
            text(
                "INSERT INTO ship_job_runs (id, job_id, payload, max_attempts)"
                " VALUES ('w1', 'j17', '{}', 3), ('w2', 'j17', '{}', 3)"
            )
        )


async def _counts(engine: AsyncEngine) -> tuple[int, int, int]:
    async with engine.connect() as connection:
        live = await connection.scalar(text("SELECT count(*) FROM ship_job_runs"))
        kept = await connection.scalar(text("SELECT count(*) FROM ship_job_history"))
        payloads = await connection.scalar(
            text("SELECT count(*) FROM ship_job_history WHERE payload IS NOT NULL")
        )
    return int(live), int(kept), int(payloads)


async def test_j17_migrate_moves_finished_runs_in_batches_and_resumes(
    engine: AsyncEngine,
) -> None:
    """J16, J17 (issue 39 item 8): the migration moves an existing runs table's finished runs
    into history in one-statement batches; stopped after 3 batches (an interruption), the runs
    table holds exactly the runs not yet taken (each batch all or nothing), and running it
    again finishes: the live runs stay, runs past retention are deleted, not moved, a dead
    run keeps its payload, a completed one does not (J18); the finished-only indexes stay
    while the runs table declares them."""
    from ship_sqla._jobs._migrate import migrate_finished_runs  # noqa: PLC0415

    await _seed_old_runs(engine)
    backend = _backend(engine, FrozenClock(WALL))
    first = await migrate_finished_runs(backend, batch_size=7, max_batches=3)
    assert (first.batches, first.complete) == (3, False)
    assert first.moved + first.deleted == 21
    live, kept, _ = await _counts(engine)
    assert live == 52 - 21
    assert kept == first.moved
    rest = await migrate_finished_runs(backend, batch_size=7)
    assert rest.complete
    assert first.moved + rest.moved == 40
    assert first.deleted + rest.deleted == 10
    assert await _counts(engine) == (2, 40, 10)
    assert set(rest.kept) == {"ship_job_runs_finished_idx", "ship_job_runs_browse_idx"}
    assert rest.dropped == ()
    # J16: the dead runs' days were prepared: none went to the DEFAULT partition.
    assert (await backend.maintain_history()).strays == 0


async def test_j17_the_maintain_verb_migrates_and_maintains(engine: AsyncEngine) -> None:
    """J17: ``ship-sqla jobs maintain --migrate --json`` moves the finished runs and runs a
    maintenance pass (exit 0: nothing deferred, no strays)."""
    from click.testing import CliRunner  # noqa: PLC0415

    from ship_sqla._cli import cli  # noqa: PLC0415

    await _seed_old_runs(engine)
    url = engine.url.render_as_string(hide_password=False)
    args = ["jobs", "maintain", "--database-url", url, "--migrate", "--json"]
    result = await asyncio.to_thread(CliRunner().invoke, cli, args)
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["migration"]["complete"]
    assert answer["migration"]["moved"] == 40
    assert answer["maintenance"]["deferred"] == []
    assert await _counts(engine) == (2, 40, 10)


BLOAT_RUNS = text(
    "INSERT INTO ship_job_runs (id, job_id, payload, max_attempts)"
    " SELECT 'b' || g, 'j17-' || (g % 7), '{}', 3 FROM generate_series(1, 80000) g"
)


async def _bloat_runs_indexes(engine: AsyncEngine) -> None:
    """80,000 runs inserted then deleted and vacuumed: an empty runs table whose primary key
    and due index keep the pages they split into (J16's table after a burst)."""
    async with engine.begin() as connection:
        await connection.execute(BLOAT_RUNS)
        await connection.execute(text("DELETE FROM ship_job_runs"))
    async with engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        await connection.execute(text("VACUUM ship_job_runs"))


async def _runs_indexes(engine: AsyncEngine) -> dict[str, tuple[int, bool]]:
    async with engine.connect() as connection:
        rows = await connection.execute(
            text(
                "SELECT i.relname, pg_relation_size(i.oid), x.indisvalid FROM pg_index x"
                " JOIN pg_class i ON i.oid = x.indexrelid"
                " WHERE x.indrelid = 'ship_job_runs'::regclass"
            )
        )
        return {row[0]: (int(row[1]), bool(row[2])) for row in rows}


async def _snapshot_waiters(engine: AsyncEngine) -> int:
    """Sessions of this database waiting on another transaction's end (a concurrent
    rebuild waiting out the lockers of its table)."""
    async with engine.connect() as connection:
        return int(
            await connection.scalar(
                text(
                    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                    " WHERE NOT l.granted AND l.locktype IN ('virtualxid', 'transactionid')"
                    " AND a.datname = current_database()"
                )
            )
        )


async def test_j17_a_pass_rebuilds_the_runs_tables_bloated_indexes_and_leaves_small_ones(
    engine: AsyncEngine,
) -> None:
    """J16, J17: after 80,000 runs came and went, the runs table's primary key is past the
    rebuild floor (1 MiB) with no live run: the pass rebuilds it concurrently (smaller, valid,
    no `_ccnew` copy left) and reports it; the lease index, never written, is left alone; a
    second pass rebuilds nothing."""
    await _bloat_runs_indexes(engine)
    before = await _runs_indexes(engine)
    assert before["ship_job_runs_pkey"][0] > 1 << 20, before
    done = await _backend(engine, FrozenClock(WALL)).maintain_history()
    assert "ship_job_runs_pkey" in done.rebuilt
    assert "ship_job_runs_lease_idx" not in done.rebuilt
    assert (done.deferred, done.leftovers_dropped, done.invalid) == ((), (), ())
    assert done.rebuild_skipped is None
    after = await _runs_indexes(engine)
    assert set(after) == set(before)
    assert after["ship_job_runs_pkey"][0] < before["ship_job_runs_pkey"][0] // 4, after
    assert all(valid for _, valid in after.values())
    again = await _backend(engine, FrozenClock(WALL)).maintain_history()
    assert again.rebuilt == ()
    assert done.to_dict()["rebuilt"] == list(done.rebuilt)


async def test_j17_an_interrupted_rebuild_is_deferred_and_its_invalid_copy_dropped_first(
    engine: AsyncEngine,
) -> None:
    """J17: a rebuild that must wait for an open settle transaction (ROW EXCLUSIVE on the runs
    table) gives up after the 1 s lock_timeout and is deferred, leaving PostgreSQL's INVALID
    `_ccnew` copy; meanwhile another settle is not made to wait. The next pass drops the copy
    (DROP INDEX CONCURRENTLY) and rebuilds nothing; the one after rebuilds."""
    await _bloat_runs_indexes(engine)
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO ship_job_runs (id, job_id, payload, max_attempts)"
                " VALUES ('open', 'j17', '{}', 3), ('other', 'j17', '{}', 3)"
            )
        )
    backend = _backend(engine, FrozenClock(WALL))
    async with engine.connect() as settle:
        await settle.execute(text("UPDATE ship_job_runs SET attempt = 1 WHERE id = 'open'"))
        maintaining = asyncio.ensure_future(backend.maintain_history())
        while await _snapshot_waiters(engine) == 0:  # the rebuild waits for the open settle
            assert not maintaining.done(), maintaining
        started = time.monotonic()
        async with engine.begin() as other:
            await other.execute(text("UPDATE ship_job_runs SET attempt = 1 WHERE id = 'other'"))
        waited = time.monotonic() - started
        done = await maintaining
        await settle.rollback()
    assert waited < 0.5, waited
    assert "rebuild ship_job_runs_pkey" in done.deferred
    assert "ship_job_runs_pkey" not in done.rebuilt
    left = await _runs_indexes(engine)
    assert left["ship_job_runs_pkey_ccnew"][1] is False, left
    cleaned = await backend.maintain_history()
    assert "ship_job_runs_pkey_ccnew" in cleaned.leftovers_dropped
    assert cleaned.rebuilt == ()
    assert cleaned.rebuild_skipped is not None
    assert not any("_ccnew" in name for name in await _runs_indexes(engine))
    rebuilt = await backend.maintain_history()
    assert "ship_job_runs_pkey" in rebuilt.rebuilt
    assert rebuilt.deferred == ()


async def test_j17_an_invalid_index_not_a_rebuilds_is_reported_and_left(
    engine: AsyncEngine,
) -> None:
    """J17, J22: an INVALID index of the operator's (a failed CREATE INDEX CONCURRENTLY) is
    reported by the pass and by the maintain verb's exit status, never dropped; the bloated
    indexes are still rebuilt."""
    await _bloat_runs_indexes(engine)
    async with engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        await connection.execute(
            text(
                "INSERT INTO ship_job_runs (id, job_id, payload, max_attempts)"
                " VALUES ('x1', 'twice', '{}', 3), ('x2', 'twice', '{}', 3)"
            )
        )
        with pytest.raises(DBAPIError, match="could not create unique index"):
            await connection.execute(
                text(
                    "CREATE UNIQUE INDEX CONCURRENTLY ship_job_runs_mine ON ship_job_runs (job_id)"
                )
            )
    done = await _backend(engine, FrozenClock(WALL)).maintain_history()
    assert done.invalid == ("ship_job_runs_mine",)
    assert done.leftovers_dropped == ()
    assert "ship_job_runs_pkey" in done.rebuilt
    assert (await _runs_indexes(engine))["ship_job_runs_mine"][1] is False
    from click.testing import CliRunner  # noqa: PLC0415

    from ship_sqla._cli import cli  # noqa: PLC0415
    from ship_sqla._cli.jobs.maintain import MAINTAIN_ATTENTION_EXIT  # noqa: PLC0415

    url = engine.url.render_as_string(hide_password=False)
    args = ["jobs", "maintain", "--database-url", url]
    result = await asyncio.to_thread(CliRunner().invoke, cli, args)
    assert result.exit_code == MAINTAIN_ATTENTION_EXIT, result.output
    assert "index ship_job_runs_mine is INVALID" in result.output


async def test_j17_no_rebuild_while_another_session_holds_an_old_snapshot(
    engine: AsyncEngine,
) -> None:
    """J17, J22: while another session holds a snapshot older than the lock timeout (1 s),
    the pass rebuilds nothing and says why (a rebuild would wait for that snapshot, give up and
    leave an INVALID copy); once it ends, the next pass rebuilds."""
    await _bloat_runs_indexes(engine)
    backend = _backend(engine, FrozenClock(WALL))
    async with engine.connect() as holder:
        await holder.execution_options(isolation_level="REPEATABLE READ")
        await holder.execute(text("SELECT count(*) FROM ship_job_state"))
        pid = await holder.scalar(text("SELECT pg_backend_pid()"))
        age = text(
            "SELECT extract(epoch FROM clock_timestamp() - xact_start) FROM pg_stat_activity"
            " WHERE pid = :pid"
        )
        async with engine.connect() as watcher:
            while float(await watcher.scalar(age, {"pid": pid})) <= 1.2:  # the snapshot ages
                await watcher.rollback()
        held = await backend.maintain_history()
        await holder.rollback()
    assert held.rebuilt == ()
    assert held.rebuild_skipped is not None
    assert "snapshot held" in held.rebuild_skipped
    assert held.deferred == ()
    after = await backend.maintain_history()
    assert "ship_job_runs_pkey" in after.rebuilt


async def _noop(ctx: object, payload: object) -> None:
    del ctx, payload


EARLY_JOB = define_job("j17.early", _noop, payload=dict, concurrency=Concurrency(max=100_000))
EARLY_WORKER = "web-1:4242:e4r1y"


async def _settle_runs(backend: Any, runs: int) -> int:
    """``runs`` runs enqueued, claimed and completed through the backend's ports (J16: each
    settle moves its run into history), 1,000 at a time; the count completed."""
    request = ClaimRequest(
        job_id=EARLY_JOB.id, worker=EARLY_WORKER, limit=1000, max_running=None, lease=300.0
    )
    completed_runs = 0
    for _ in range(0, runs, 1000):
        await backend.enqueue_many(EARLY_JOB, [EnqueueRequest(payload={})] * 1000)
        claimed = await backend.claim(request)
        outcomes = await backend.settle([completed(run) for run in claimed])
        completed_runs += sum(1 for outcome in outcomes if outcome == "completed")
    return completed_runs


async def test_j17_j22_the_sampler_rebuilds_the_runs_indexes_at_the_first_sample_after_a_release(
    engine: AsyncEngine,
) -> None:
    """J17, J22, J16 (issue 39): while another session holds a REPEATABLE READ snapshot,
    24,000 runs settle and the runs table's primary key bloats past the rebuild rule; the
    fleet sampler's step (its health read: the holder seen) rebuilds nothing while it is held.
    At the first step after the release (the sampler's clock 30 s after its first pass, far
    from the 10-minute pass) it runs the rebuild step alone: the primary key is rebuilt, a
    fraction of its size, valid; no run is lost (all in history, none left in the table)."""
    clock = FrozenClock(WALL)
    backend = _backend(engine, clock)
    await backend.require_support([EARLY_JOB])
    errors: list[BaseException] = []
    shared = Plumbing(clock, errors.append, lambda _n: 0.1)
    early = EarlyRebuild(clock, hold_age=1.0)  # the default's 30 s, shortened for the test
    sampler = DepthSampler(backend, JobMetrics(), [EARLY_JOB.id], shared, early_rebuild=early)
    await sampler.step()  # the first maintenance pass: nothing bloated yet
    async with engine.connect() as holder:
        await holder.execution_options(isolation_level="REPEATABLE READ")
        await holder.execute(text("SELECT count(*) FROM ship_job_state"))
        pid = await holder.scalar(text("SELECT pg_backend_pid()"))
        assert await _settle_runs(backend, 24_000) == 24_000
        age = text(
            "SELECT extract(epoch FROM clock_timestamp() - xact_start) FROM pg_stat_activity"
            " WHERE pid = :pid"
        )
        async with engine.connect() as watcher:
            while float(await watcher.scalar(age, {"pid": pid})) <= 1.2:  # the snapshot ages
                await watcher.rollback()
        clock.advance(15)
        await sampler.step()
        assert sampler.early_rebuilds == []
        assert early.hold_seen
        held = await _runs_indexes(engine)
        await holder.rollback()
    assert held["ship_job_runs_pkey"][0] > 1 << 20, held
    clock.advance(15)
    await sampler.step()
    assert errors == []
    [(reason, done)] = sampler.early_rebuilds
    assert reason == "released"
    assert "ship_job_runs_pkey" in done.rebuilt, done
    assert done.deferred == ()
    after = await _runs_indexes(engine)
    assert after["ship_job_runs_pkey"][0] < held["ship_job_runs_pkey"][0] // 4, after
    assert all(valid for _, valid in after.values())
    assert not early.hold_seen
    live, kept, _ = await _counts(engine)
    assert (live, kept) == (0, 24_000)
