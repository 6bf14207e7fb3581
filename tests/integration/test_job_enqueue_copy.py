"""A bulk of plain runs is stored by ``COPY ... FROM STDIN`` (``ENQUEUE_COPY_COLUMNS``): the
same rows as the INSERT would store, in the same transaction (J1, U1), announced as the INSERT
announces them (K1), with the same errors.

Each test compares the COPY with the INSERT on one backend: the INSERT is what the backend runs
while a ``before_cursor_execute`` listener watches the engine (:func:`watched`), or for a batch
COPY cannot store the same way."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import asyncpg
import pytest
from sqlalchemy import MetaData, text
from sqlalchemy.exc import DBAPIError, ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from statement_watch import watched

from ship_sqla import TransactionScope, create_unit_of_work, define_job
from ship_sqla import _direct as direct_module
from ship_sqla._direct import OWN_LISTENER, CopyIn, copy_text
from ship_sqla._jobs import (
    PostgresJobBackend,
    create_job_backend,
    ship_job_runs_table,
    ship_job_state_table,
)
from ship_sqla._jobs import _insert as insert_module
from ship_sqla._jobs._sql.enqueue import ENQUEUE_COPY_MIN_RUNS
from ship_sqla._scope import Joined
from ship_sqla._uow import _StatementWatch
from ship_sqla.jobs import EnqueueRequest
from ship_sqla.kernel._plans.prepare import PreparedRun
from ship_sqla.schema import tenant_policy_ddl
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    pass

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)
N = ENQUEUE_COPY_MIN_RUNS + 72


async def noop(ctx: Any, payload: Any) -> None:
    return None


JOB = define_job("copy.job", noop, payload=dict)
STORED = (
    "job_id, state, payload, key, dedupe_key, attempt, max_attempts, run_at, created_at,"
    " updated_at, finished_at, lease_expires_at, lease_token, claimed_by, last_error, history,"
    " priority, trace_context, snoozes, cancel_requested_at, tenant_id, parent_id, wait_for"
)
AWKWARD = ("plain", "tab\there", "new\nline", "back\\slash", "cr\rlf", "\\N", "naïve ☃", "")


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return ship_engine


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> list[CopyIn]:
    """The COPYs run (by either path: outside a unit of work or inside a transaction)."""
    seen: list[CopyIn] = []
    real = direct_module._copy_on

    async def spy(driver: Any, copy: CopyIn) -> None:
        seen.append(copy)
        await real(driver, copy)

    monkeypatch.setattr(direct_module, "_copy_on", spy)
    return seen


def backend_on(engine: AsyncEngine, clock: FrozenClock | None = None) -> PostgresJobBackend:
    return create_job_backend(database=engine, table=runs, state_table=state, clock=clock)


async def stored(engine: AsyncEngine, *, with_times: bool = True) -> list[tuple[Any, ...]]:
    """Every run's stored columns but its id and seq, in creation order; ``with_times=False``
    leaves out the times the server's clock gave (``run_at``, ``created_at``, ``updated_at``)."""
    columns = STORED if with_times else STORED.replace("run_at, created_at, updated_at, ", "")
    async with engine.connect() as connection:
        found = await connection.execute(text(f"SELECT {columns} FROM ship_job_runs ORDER BY seq"))
        return [tuple(row) for row in found]


async def clear(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.execute(text("DELETE FROM ship_job_runs"))


def requests(count: int = N, **options: Any) -> list[EnqueueRequest]:
    return [
        EnqueueRequest({"n": i, "text": AWKWARD[i % len(AWKWARD)]}, priority=i % 21 - 10, **options)
        for i in range(count)
    ]


def awkward_runs(count: int = N) -> list[PreparedRun]:
    """Prepared runs whose every text column holds what COPY's text format must escape."""
    return [
        PreparedRun(
            run_id=f"awkward-{i:04d}",
            durable_id=False,
            payload_json='{"s":"a\\\\b\\tc\\n"}',
            dedupe_key=None,
            key=None if i % 3 == 0 else AWKWARD[i % len(AWKWARD)],
            run_at=None,
            max_attempts=i % 7 + 1,
            priority=i % 21 - 10,
            trace_context=None if i % 2 else '{"traceparent":"00-\\\\t-01"}',
            tenant="tenant\twith\\odd\nbits",
        )
        for i in range(count)
    ]


async def test_a_bulk_outside_a_unit_of_work_is_one_copy_storing_what_the_insert_stores(
    engine: AsyncEngine, copies: list[CopyIn]
) -> None:
    """J1: enqueue_many of a bulk of plain runs outside any unit of work is one COPY, and the
    rows are the INSERT's, column for column (on a frozen clock: the same times; on the
    server's clock, every run due at the statement's now(), for both)."""
    for clock in (FrozenClock(), None):
        await backend_on(engine, clock).enqueue_many(JOB, requests())
        assert len(copies) == 1
        by_copy = await stored(engine, with_times=clock is not None)
        assert len(by_copy) == N
        await clear(engine)
        with watched(engine) as seen:
            await backend_on(engine, clock).enqueue_many(JOB, requests())
        assert len(copies) == 1, "a watched engine takes the INSERT"
        assert any("INSERT INTO ship_job_runs" in statement for statement in seen)
        assert await stored(engine, with_times=clock is not None) == by_copy
        await clear(engine)
        copies.clear()


async def test_a_bulk_of_several_chunks_is_one_copy_of_whole_lines_in_request_order(
    engine: AsyncEngine, copies: list[CopyIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """J1: a bulk's COPY text is sent chunk by chunk (the server stores one while the next is
    made): still one COPY, every chunk whole lines, every run stored once, in request order,
    as the INSERT stores them."""
    monkeypatch.setattr(insert_module, "_COPY_CHUNK_RUNS", 50)
    backend = backend_on(engine, FrozenClock())
    results = await backend.enqueue_many(JOB, requests())
    [copy] = copies
    chunks = list(copy.chunks())
    assert len(chunks) == -(-N // 50)
    assert all(chunk.endswith(b"\n") for chunk in chunks)
    assert sum(chunk.count(b"\n") for chunk in chunks) == N
    async with engine.connect() as connection:
        ids = (await connection.execute(text("SELECT id FROM ship_job_runs ORDER BY seq"))).all()
    assert [row.id for row in ids] == [result.run_id for result in results]
    by_copy = await stored(engine)
    await clear(engine)
    with watched(engine):
        await backend_on(engine, FrozenClock()).enqueue_many(JOB, requests())
    assert await stored(engine) == by_copy


async def test_copy_escapes_every_text_column_as_the_insert_stores_it(
    engine: AsyncEngine, copies: list[CopyIn]
) -> None:
    """COPY's text format: tabs, newlines, carriage returns, backslashes, a literal ``\\N`` and
    non-ASCII text in ids, keys, payloads, trace contexts and the tenant arrive as the INSERT
    stores them (an empty key stays an empty string, not NULL)."""
    backend = backend_on(engine, FrozenClock())
    inserter = backend._inserter
    async with engine.begin() as connection:
        await inserter.insert_on(Joined(connection, None), JOB.id, awkward_runs()[:10])  # begins it
        await inserter.insert_on(Joined(connection, None), JOB.id, awkward_runs()[10:])
    assert len(copies) == 1
    by_copy = await stored(engine)
    async with engine.connect() as connection:
        ids = (await connection.execute(text("SELECT id FROM ship_job_runs ORDER BY seq"))).all()
    await clear(engine)
    with watched(engine):
        async with engine.begin() as connection:
            await inserter.insert_on(Joined(connection, None), JOB.id, awkward_runs()[:10])
            await inserter.insert_on(Joined(connection, None), JOB.id, awkward_runs()[10:])
    assert len(copies) == 1
    assert await stored(engine) == by_copy
    assert [row.id for row in ids] == [run.run_id for run in awkward_runs()]
    assert by_copy[1][3] == AWKWARD[1]
    assert by_copy[7][3] == ""
    assert copy_text("a\\b\tc\nd\re") == "a\\\\b\\tc\\nd\\re"


async def test_due_times_copy_for_all_or_none_and_mixed_ones_take_the_insert(
    engine: AsyncEngine, copies: list[CopyIn]
) -> None:
    """On the server's clock COPY defaults ``run_at`` for every row or none: a bulk where each
    run has a due time is a COPY carrying them; one where only some do is the INSERT (its
    ``coalesce(run_at, now())``); a batch under ENQUEUE_COPY_MIN_RUNS is the INSERT."""
    backend = backend_on(engine)
    later = FrozenClock().now() + timedelta(days=400)
    await backend.enqueue_many(JOB, requests(run_at=later))
    assert len(copies) == 1
    assert "run_at" in copies[0].columns
    async with engine.connect() as connection:
        due = await connection.scalar(
            text("SELECT count(*) FROM ship_job_runs WHERE run_at = :t"), {"t": later}
        )
    assert due == N
    mixed = requests()
    mixed[0] = EnqueueRequest({"n": -1}, run_at=later)
    await backend.enqueue_many(JOB, mixed)
    await backend.enqueue_many(JOB, requests(ENQUEUE_COPY_MIN_RUNS - 1))
    assert len(copies) == 1
    async with engine.connect() as connection:
        total = await connection.scalar(text("SELECT count(*) FROM ship_job_runs"))
    assert total == 2 * N + ENQUEUE_COPY_MIN_RUNS - 1


async def test_u1_a_copy_inside_a_unit_of_work_commits_and_rolls_back_with_it(
    engine: AsyncEngine, copies: list[CopyIn]
) -> None:
    """U1: inside uow.run the COPY is a statement of the run's transaction, after the run's
    first statement (SQLAlchemy begins the driver's transaction lazily; before it, the INSERT
    serves): a rollback takes the runs with it, a commit stores them with the unit of work's
    tenant (F2)."""
    backend = backend_on(engine)
    uow = create_unit_of_work(engine, repositories=lambda scope: scope)

    class BoomError(Exception):
        pass

    async def enqueue_then_fail(scope: TransactionScope) -> None:
        await scope.connection.execute(text("SELECT 1"))
        await backend.enqueue_many(JOB, requests())
        raise BoomError

    with pytest.raises(BoomError):
        await uow.run(enqueue_then_fail)
    assert len(copies) == 1
    assert await stored(engine) == []

    async def enqueue(scope: TransactionScope) -> None:
        await scope.connection.execute(text("SELECT 1"))
        await backend.enqueue_many(JOB, requests())

    await uow.run(enqueue, tenant="acme")
    assert len(copies) == 2
    rows = await stored(engine)
    assert len(rows) == N
    assert {row[-3] for row in rows} == {"acme"}

    async def enqueue_first(scope: TransactionScope) -> None:
        await backend.enqueue_many(JOB, requests())  # the run's first statement: the INSERT

    await uow.run(enqueue_first)
    assert len(copies) == 2
    assert len(await stored(engine)) == 2 * N
    assert getattr(_StatementWatch, OWN_LISTENER) is True


async def test_k1_a_copied_bulk_is_announced_once_committed(
    engine: AsyncEngine, ship_engine_url: str
) -> None:
    """K1: a due bulk stored by COPY outside a unit of work is announced on the wake channel in
    the COPY's transaction (one NOTIFY), so a listener hears it only with the rows there."""
    backend = backend_on(engine)
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(ship_engine_url.replace("postgresql+asyncpg", "postgresql"))
    try:
        await listener.add_listener(backend.wake_channel, lambda *args: heard.put_nowait(args[-1]))
        await backend.enqueue_many(JOB, requests())
        payload = await asyncio.wait_for(heard.get(), timeout=10)
        assert JOB.id in payload
        async with engine.connect() as connection:
            assert await connection.scalar(text("SELECT count(*) FROM ship_job_runs")) == N
    finally:
        await listener.close()


async def test_a_failed_copy_raises_what_the_insert_raises_and_stores_nothing(
    engine: AsyncEngine, copies: list[CopyIn]
) -> None:
    """A COPY the server refuses raises SQLAlchemy's translated error (here
    ``ProgrammingError``, the driver's error as ``orig``, the COPY named), outside and inside a
    unit of work, and leaves no row."""
    backend = backend_on(engine)
    async with engine.begin() as connection:
        await connection.execute(text("ALTER TABLE ship_job_runs RENAME COLUMN key TO key_gone"))
    try:
        with pytest.raises(ProgrammingError) as outside:
            await backend.enqueue_many(JOB, requests())
        assert "COPY" in str(outside.value)
        assert isinstance(outside.value.orig, Exception)
        uow = create_unit_of_work(engine, repositories=lambda scope: scope)

        async def enqueue(scope: TransactionScope) -> None:
            await scope.connection.execute(text("SELECT 1"))
            await backend.enqueue_many(JOB, requests())

        with pytest.raises(ProgrammingError, match="COPY"):
            await uow.run(enqueue)
        assert len(copies) == 2
    finally:
        async with engine.begin() as connection:
            await connection.execute(
                text("ALTER TABLE ship_job_runs RENAME COLUMN key_gone TO key")
            )
    assert await stored(engine) == []


async def test_a_store_on_a_connection_copies_in_its_savepoint(
    engine: AsyncEngine, copies: list[CopyIn]
) -> None:
    """A backend on an ``AsyncConnection`` (the test path) stores a bulk in its own SAVEPOINT
    on that connection: the COPY is part of the connection's transaction."""
    async with engine.connect() as connection:
        transaction = await connection.begin()
        await connection.execute(text("SELECT 1"))
        backend = create_job_backend(database=connection, table=runs, state_table=state)
        await backend.enqueue_many(JOB, requests())
        assert len(copies) == 1
        assert await connection.scalar(text("SELECT count(*) FROM ship_job_runs")) == N
        await transaction.rollback()
    assert await stored(engine) == []


async def test_a_runs_table_under_row_level_security_takes_the_insert(
    engine: AsyncEngine, copies: list[CopyIn]
) -> None:
    """COPY FROM refuses a table whose row-level security applies to the session (0A000): a
    backend asks once (ENQUEUE_COPY_ALLOWED) and such a runs table (tenant_policy_ddl applied
    to it) takes the INSERT; a backend that asked before the policy was turned on gets the
    refusal once (its unit of work fails, nothing is written) and inserts from then on."""
    role = f"ship_copy_rls_{uuid.uuid4().hex[:8]}"
    async with engine.begin() as connection:
        await connection.execute(text(f'CREATE ROLE "{role}" LOGIN'))
        await connection.execute(text(f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{role}"'))
        await connection.execute(text(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{role}"'))
    as_role = create_async_engine(engine.url.set(username=role))
    try:
        early = backend_on(as_role)
        await early.enqueue_many(JOB, requests())  # asks, and COPYs: no policy yet
        assert len(copies) == 1
        async with engine.begin() as connection:
            for statement in tenant_policy_ddl("ship_job_runs"):
                await connection.execute(text(statement))
        uow = create_unit_of_work(
            as_role, repositories=lambda scope: scope, row_level_security=True
        )

        async def enqueue(scope: TransactionScope, backend: PostgresJobBackend) -> None:
            await backend.enqueue_many(JOB, requests())

        with pytest.raises(DBAPIError, match="row-level security"):
            await uow.run(lambda scope: enqueue(scope, early), tenant="acme")
        await uow.run(lambda scope: enqueue(scope, early), tenant="acme")
        late = backend_on(as_role)
        await uow.run(lambda scope: enqueue(scope, late), tenant="acme")
        assert len(copies) == 2, "the refused COPY, then only INSERTs"
        async with engine.connect() as connection:
            tenants = await connection.execute(
                text("SELECT tenant_id, count(*) FROM ship_job_runs GROUP BY 1 ORDER BY 1")
            )
            assert [tuple(row) for row in tenants] == [("acme", 2 * N), (None, N)]
    finally:
        await as_role.dispose()
        async with engine.begin() as connection:
            await connection.execute(text("ALTER TABLE ship_job_runs DISABLE ROW LEVEL SECURITY"))
            await connection.execute(text(f'DROP OWNED BY "{role}"'))
            await connection.execute(text(f'DROP ROLE "{role}"'))
