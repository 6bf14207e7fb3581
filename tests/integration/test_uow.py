"""The unit of work on real PostgreSQL: U1-U5, isolation, misuse errors."""

from __future__ import annotations

import asyncio
import contextlib

import anyio
import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.orm import DeclarativeBase, Mapped

from ship_sqla import TransactionScope, create_unit_of_work, current_scope
from ship_sqla._scope import joined
from ship_sqla.errors import (
    ConfigurationError,
    RollbackOnlyError,
    ScopeClosedError,
    ScopeConcurrencyError,
    TenantViolationError,
)

metadata = MetaData()
notes = Table(
    "uow_notes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("body", String, nullable=False),
)


class Base(DeclarativeBase):
    pass


class Note(Base):
    __table__ = notes
    id: Mapped[int]
    body: Mapped[str]


class BoomError(Exception):
    pass


@pytest.fixture
async def conn(ship_connection: AsyncConnection) -> AsyncConnection:
    await ship_connection.run_sync(metadata.create_all)
    return ship_connection


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as c:
        await c.run_sync(metadata.create_all)
    return ship_engine


def scope_only(scope: TransactionScope) -> TransactionScope:
    return scope


async def bodies(bind: AsyncConnection | AsyncEngine) -> list[str]:
    if isinstance(bind, AsyncConnection):
        return list((await bind.execute(select(notes.c.body).order_by(notes.c.id))).scalars())
    async with bind.connect() as c:
        return list((await c.execute(select(notes.c.body).order_by(notes.c.id))).scalars())


async def test_commit_on_return_rollback_on_raise(engine: AsyncEngine) -> None:
    """U1: Core and ORM writes in one run commit together, and roll back together on raise."""
    uow = create_unit_of_work(engine, repositories=scope_only)

    async def write(scope: TransactionScope) -> str:
        await scope.connection.execute(insert(notes).values(body="core"))
        session = scope.session()
        session.add(Note(body="orm"))
        return "done"

    assert await uow.run(write) == "done"
    assert await bodies(engine) == ["core", "orm"]

    async def write_then_fail(scope: TransactionScope) -> None:
        await scope.connection.execute(insert(notes).values(body="lost-core"))
        session = scope.session()
        session.add(Note(body="lost-orm"))
        await session.flush()
        raise BoomError

    with pytest.raises(BoomError):
        await uow.run(write_then_fail)
    assert await bodies(engine) == ["core", "orm"]


async def test_stores_join_explicit_and_ambient_scope(conn: AsyncConnection) -> None:
    """U2: a store joins the scope passed as scope= and the ambient one inside run."""
    uow = create_unit_of_work(conn, repositories=scope_only)

    async def handler(scope: TransactionScope) -> None:
        assert current_scope() is scope
        async with joined(conn) as tx:
            assert tx.scope is scope
            await tx.connection.execute(insert(notes).values(body="ambient"))
        async with joined(conn, scope) as tx:
            assert tx.scope is scope
            await tx.connection.execute(insert(notes).values(body="explicit"))
        raise BoomError

    with pytest.raises(BoomError):
        await uow.run(handler)
    assert await bodies(conn) == []
    assert current_scope() is None


async def test_store_outside_scope_uses_own_transaction(engine: AsyncEngine) -> None:
    """U2: outside any scope a store opens its own short transaction and commits it."""
    ran: list[str] = []
    async with joined(engine) as tx:
        assert tx.scope is None
        await tx.connection.execute(insert(notes).values(body="alone"))
        tx.after_commit(lambda: ran.append("after"))
        assert ran == []
    assert ran == ["after"]
    assert await bodies(engine) == ["alone"]


async def test_scope_used_after_run_is_refused(conn: AsyncConnection) -> None:
    """U2: a scope used after its run ended raises a clear error."""
    uow = create_unit_of_work(conn, repositories=scope_only)
    leaked: list[TransactionScope] = []

    async def handler(scope: TransactionScope) -> None:
        leaked.append(scope)

    await uow.run(handler)
    with pytest.raises(ScopeClosedError, match="already ended"):
        _ = leaked[0].connection
    with pytest.raises(ScopeClosedError):
        async with joined(conn, leaked[0]):
            pass


async def test_scope_used_from_child_task_is_refused(conn: AsyncConnection) -> None:
    """U2: a concurrent child task cannot use the run's scope, explicitly or ambiently."""
    uow = create_unit_of_work(conn, repositories=scope_only)

    async def handler(scope: TransactionScope) -> None:
        async def child() -> None:
            _ = scope.connection

        async def ambient_child() -> None:
            current_scope()

        for fn in (child, ambient_child):
            with pytest.raises(ScopeConcurrencyError, match="other than the one"):
                await asyncio.create_task(fn())

    await uow.run(handler)


async def test_after_commit_runs_only_after_commit(engine: AsyncEngine) -> None:
    """U4: after_commit callbacks run after a commit, never after a rollback."""
    uow = create_unit_of_work(engine, repositories=scope_only)
    events: list[str] = []

    async def ok(scope: TransactionScope) -> None:
        async def note() -> None:
            events.append("committed")

        scope.after_commit(note)
        assert events == []

    await uow.run(ok)
    assert events == ["committed"]

    async def fails(scope: TransactionScope) -> None:
        scope.after_commit(lambda: events.append("never"))
        raise BoomError

    with pytest.raises(BoomError):
        await uow.run(fails)
    assert events == ["committed"]


async def test_failing_after_commit_callback_is_logged_not_raised(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """U4: a failing callback does not mask the commit; it is logged and the rest still run."""
    uow = create_unit_of_work(engine, repositories=scope_only)
    events: list[str] = []

    def bad() -> None:
        raise BoomError

    async def handler(scope: TransactionScope) -> None:
        await scope.connection.execute(insert(notes).values(body="kept"))
        scope.after_commit(bad)
        scope.after_commit(lambda: events.append("second"))

    await uow.run(handler)
    assert events == ["second"]
    assert await bodies(engine) == ["kept"]
    assert "after_commit callback failed" in caplog.text


async def test_nested_run_joins_outer_transaction(engine: AsyncEngine) -> None:
    """U5: a nested run joins the outer transaction; after_commit waits for the outer commit."""
    uow = create_unit_of_work(engine, repositories=scope_only)
    events: list[str] = []

    async def inner(scope: TransactionScope) -> None:
        await scope.connection.execute(insert(notes).values(body="inner"))
        scope.after_commit(lambda: events.append("inner-after"))

    async def outer(scope: TransactionScope) -> None:
        await uow.run(inner)
        assert events == []
        assert scope.connection is current_scope().connection  # type: ignore[union-attr]
        raise BoomError

    with pytest.raises(BoomError):
        await uow.run(outer)
    assert await bodies(engine) == []
    assert events == []


async def test_nested_run_with_savepoint_rolls_back_alone(engine: AsyncEngine) -> None:
    """U5: savepoint=True isolates the nested run's failure from the outer work."""
    uow = create_unit_of_work(engine, repositories=scope_only)

    async def inner(scope: TransactionScope) -> None:
        await scope.connection.execute(insert(notes).values(body="inner"))
        raise BoomError

    async def outer(scope: TransactionScope) -> None:
        await scope.connection.execute(insert(notes).values(body="outer"))
        with pytest.raises(BoomError):
            await uow.run(inner, savepoint=True)

    await uow.run(outer)
    assert await bodies(engine) == ["outer"]


async def test_nested_run_on_other_database_is_refused(
    engine: AsyncEngine, conn: AsyncConnection
) -> None:
    """U5: a nested run never silently opens a second connection on another database."""
    outer_uow = create_unit_of_work(engine, repositories=scope_only)
    other_uow = create_unit_of_work(conn, repositories=scope_only)

    async def inner(scope: TransactionScope) -> None:
        pass

    async def outer(scope: TransactionScope) -> None:
        await other_uow.run(inner)

    with pytest.raises(ConfigurationError, match="different database"):
        await outer_uow.run(outer)


async def test_serialization_failures_rerun_the_handler(engine: AsyncEngine) -> None:
    """U3: two conflicting SERIALIZABLE runs both finally commit; one handler ran once, the other
    was re-run (twice, or more when its re-run met the other's commit again on a loaded
    machine)."""
    async with engine.begin() as c:
        await c.execute(insert(notes).values(body="0"))
    uow = create_unit_of_work(engine, repositories=scope_only, isolation_level="SERIALIZABLE")
    both_read = anyio.Event()
    readers = 0
    calls = {"a": 0, "b": 0}

    def handler(name: str):
        async def run(scope: TransactionScope) -> None:
            nonlocal readers
            calls[name] += 1
            total = sum(
                int(b) for b in (await scope.connection.execute(select(notes.c.body))).scalars()
            )
            if calls[name] == 1:
                readers += 1
                if readers == 2:
                    both_read.set()
                with anyio.fail_after(10):
                    await both_read.wait()
            await scope.connection.execute(insert(notes).values(body=str(total + 1)))

        return run

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(uow.run, handler("a"))
            tg.start_soon(uow.run, handler("b"))
    fewest, most = sorted(calls.values())
    assert (fewest, most >= 2) == (1, True), calls
    assert sorted(await bodies(engine)) == ["0", "1", "2"]


async def test_serialization_failure_reraised_after_bound(engine: AsyncEngine) -> None:
    """U3: re-runs are bounded; past max_attempts the driver error is re-raised unchanged."""
    uow = create_unit_of_work(engine, repositories=scope_only, max_attempts=2)
    calls = 0

    async def always_conflicts(scope: TransactionScope) -> None:
        nonlocal calls
        calls += 1
        await scope.connection.execute(
            text("DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$")
        )

    with pytest.raises(DBAPIError):
        await uow.run(always_conflicts)
    assert calls == 2


async def test_isolation_level_per_uow_and_per_run(engine: AsyncEngine) -> None:
    """Isolation level is configurable per unit of work and per run."""
    uow = create_unit_of_work(engine, repositories=scope_only, isolation_level="REPEATABLE READ")

    async def level(scope: TransactionScope) -> str:
        return str((await scope.connection.execute(text("show transaction_isolation"))).scalar())

    assert await uow.run(level) == "repeatable read"
    assert await uow.run(level, isolation_level="SERIALIZABLE") == "serializable"
    with pytest.raises(ConfigurationError, match="AUTOCOMMIT"):
        create_unit_of_work(engine, repositories=scope_only, isolation_level="AUTOCOMMIT")
    with pytest.raises(ConfigurationError, match="not one PostgreSQL knows"):
        await uow.run(level, isolation_level="SNAPSHOT")  # type: ignore[arg-type]


async def test_row_level_security_sets_tenant(conn: AsyncConnection) -> None:
    """The optional RLS layer sets ship.tenant_id transaction-locally at the start of a run."""
    uow = create_unit_of_work(conn, repositories=scope_only, row_level_security=True)

    async def setting(scope: TransactionScope) -> str:
        return str(
            (
                await scope.connection.execute(text("select current_setting('ship.tenant_id')"))
            ).scalar()
        )

    assert await uow.run(setting, tenant="acme") == "acme"


def test_misconfiguration_is_explained() -> None:
    """Misuse gets an error that says what was wrong and what to do (a URL is not misuse: it
    builds the engine, issue 27 item 2)."""
    with pytest.raises(ConfigurationError, match="AsyncEngine or AsyncConnection"):
        create_unit_of_work(42, repositories=scope_only)  # type: ignore[arg-type]


async def test_nested_run_inherits_the_outer_tenant(conn: AsyncConnection) -> None:
    """U5, R2: a nested run without tenant= keeps the outer run's tenant; naming the same tenant
    is fine, naming another is refused (it would share acme's transaction), and an untenanted
    outer run may narrow to a tenant."""
    uow = create_unit_of_work(conn, repositories=scope_only)

    async def tenant_of(scope: TransactionScope) -> str | None:
        return scope.tenant

    async def outer(scope: TransactionScope) -> tuple[str | None, str | None]:
        return await uow.run(tenant_of), await uow.run(tenant_of, tenant="acme")

    assert await uow.run(outer, tenant="acme") == ("acme", "acme")

    async def widening(scope: TransactionScope) -> str | None:
        return await uow.run(tenant_of, tenant="other")

    with pytest.raises(TenantViolationError, match=r"nested uow\.run named tenant 'other'"):
        await uow.run(widening, tenant="acme")

    async def narrowing(scope: TransactionScope) -> str | None:
        return await uow.run(tenant_of, tenant="acme")

    assert await uow.run(narrowing) == "acme"


async def test_swallowed_nested_failure_rolls_back_the_outer_run(engine: AsyncEngine) -> None:
    """U5: a joined nested run that raised can never be committed, even if the outer handler
    swallows its exception: the outer run rolls back and says why."""
    uow = create_unit_of_work(engine, repositories=scope_only)

    async def inner(scope: TransactionScope) -> None:
        await scope.connection.execute(insert(notes).values(body="half-done"))
        raise BoomError

    async def outer(scope: TransactionScope) -> None:
        await scope.connection.execute(insert(notes).values(body="outer"))
        with contextlib.suppress(BoomError):
            await uow.run(inner)

    with pytest.raises(RollbackOnlyError, match="rolled back") as caught:
        await uow.run(outer)
    assert isinstance(caught.value.__cause__, BoomError)
    assert await bodies(engine) == []


# -- U4 with savepoints (Django's on_commit semantics) ----------------------------------------


async def test_after_commit_of_a_rolled_back_savepoint_is_discarded(engine: AsyncEngine) -> None:
    """U4/U5: callbacks registered inside a savepoint run whose savepoint rolled back never
    run; the outer run's own callbacks still run after its commit."""
    uow = create_unit_of_work(engine, repositories=scope_only)
    events: list[str] = []

    async def inner(scope: TransactionScope) -> None:
        scope.after_commit(lambda: events.append("rolled-back savepoint"))
        raise BoomError

    async def outer(scope: TransactionScope) -> None:
        scope.after_commit(lambda: events.append("outer"))
        with pytest.raises(BoomError):
            await uow.run(inner, savepoint=True)
        scope.after_commit(lambda: events.append("outer, later"))

    await uow.run(outer)
    assert events == ["outer", "outer, later"]


async def test_after_commit_of_a_released_savepoint_waits_for_the_outermost_commit(
    engine: AsyncEngine,
) -> None:
    """U4/U5: callbacks of a released savepoint run after the outermost commit, in
    registration order, and never if the outer run then rolls back."""
    uow = create_unit_of_work(engine, repositories=scope_only)
    events: list[str] = []

    async def inner(scope: TransactionScope) -> None:
        scope.after_commit(lambda: events.append("released savepoint"))

    async def outer(scope: TransactionScope) -> None:
        scope.after_commit(lambda: events.append("outer, first"))
        await uow.run(inner, savepoint=True)
        assert events == [], "nothing runs at the savepoint's release"
        scope.after_commit(lambda: events.append("outer, last"))

    await uow.run(outer)
    assert events == ["outer, first", "released savepoint", "outer, last"]

    events.clear()

    async def outer_fails(scope: TransactionScope) -> None:
        await uow.run(inner, savepoint=True)
        raise BoomError

    with pytest.raises(BoomError):
        await uow.run(outer_fails)
    assert events == []


async def test_savepoints_in_savepoints_keep_each_boundary(engine: AsyncEngine) -> None:
    """U4/U5: savepoints nest: a released inner savepoint's callbacks go with its enclosing
    savepoint (discarded when that one rolls back); a rolled-back inner one's are discarded
    while the enclosing savepoint's survive; a joined run (no savepoint) inside a savepoint
    belongs to that savepoint."""
    uow = create_unit_of_work(engine, repositories=scope_only)
    events: list[str] = []

    def note(name: str) -> None:
        events.append(name)

    async def innermost_released(scope: TransactionScope) -> None:
        scope.after_commit(lambda: note("inner released, in a rolled-back savepoint"))

    async def joined_run(scope: TransactionScope) -> None:
        scope.after_commit(lambda: note("joined run, in a rolled-back savepoint"))

    async def middle_rolls_back(scope: TransactionScope) -> None:
        await uow.run(innermost_released, savepoint=True)
        await uow.run(joined_run)
        raise BoomError

    async def innermost_rolls_back(scope: TransactionScope) -> None:
        scope.after_commit(lambda: note("inner rolled back"))
        raise BoomError

    async def middle_released(scope: TransactionScope) -> None:
        scope.after_commit(lambda: note("middle released"))
        with pytest.raises(BoomError):
            await uow.run(innermost_rolls_back, savepoint=True)
        await uow.run(innermost_released_kept, savepoint=True)

    async def innermost_released_kept(scope: TransactionScope) -> None:
        scope.after_commit(lambda: note("inner released, in a released savepoint"))

    async def outer(scope: TransactionScope) -> None:
        with pytest.raises(BoomError):
            await uow.run(middle_rolls_back, savepoint=True)
        await uow.run(middle_released, savepoint=True)

    await uow.run(outer)
    assert events == ["middle released", "inner released, in a released savepoint"]


async def test_store_after_commit_inside_a_savepoint_run_follows_the_savepoint(
    engine: AsyncEngine,
) -> None:
    """U4/U2: a store's joined(...).after_commit registered inside a savepoint run (ambient
    or scope= explicit) is discarded with a rolled-back savepoint and runs after the outermost
    commit when the savepoint was released; its writes follow the savepoint too."""
    uow = create_unit_of_work(engine, repositories=scope_only)
    events: list[str] = []

    async def store_call(name: str, scope: TransactionScope | None) -> None:
        async with joined(engine, scope) as tx:
            await tx.connection.execute(insert(notes).values(body=name))
            tx.after_commit(lambda: events.append(name))

    async def rolled_back(scope: TransactionScope) -> None:
        await store_call("ambient, rolled back", None)
        await store_call("explicit, rolled back", scope)
        raise BoomError

    async def released(scope: TransactionScope) -> None:
        await store_call("ambient, released", None)
        await store_call("explicit, released", scope)

    async def outer(scope: TransactionScope) -> None:
        with pytest.raises(BoomError):
            await uow.run(rolled_back, savepoint=True)
        await uow.run(released, savepoint=True)
        assert events == []

    await uow.run(outer)
    assert events == ["ambient, released", "explicit, released"]
    assert await bodies(engine) == ["ambient, released", "explicit, released"]


async def test_joined_nested_run_after_commit_still_waits_for_the_outer_commit(
    engine: AsyncEngine,
) -> None:
    """U4/U5: a nested run without savepoint=True keeps today's behaviour: its callbacks run
    after the outer commit, with the outer run's, in registration order."""
    uow = create_unit_of_work(engine, repositories=scope_only)
    events: list[str] = []

    async def inner(scope: TransactionScope) -> None:
        scope.after_commit(lambda: events.append("joined"))

    async def outer(scope: TransactionScope) -> None:
        scope.after_commit(lambda: events.append("outer"))
        await uow.run(inner)
        assert events == []

    await uow.run(outer)
    assert events == ["outer", "joined"]


async def test_orm_changes_of_a_rolled_back_savepoint_are_never_flushed(
    engine: AsyncEngine,
) -> None:
    """U5/U1: an ORM session opened inside a savepoint run is flushed before its savepoint is
    released and discarded when it rolls back: the outer commit never writes the rolled-back
    run's pending objects."""
    uow = create_unit_of_work(engine, repositories=scope_only)

    async def rolled_back(scope: TransactionScope) -> None:
        scope.session().add(Note(body="pending in a rolled-back savepoint"))
        raise BoomError

    async def released(scope: TransactionScope) -> None:
        scope.session().add(Note(body="pending in a released savepoint"))

    async def outer(scope: TransactionScope) -> None:
        with pytest.raises(BoomError):
            await uow.run(rolled_back, savepoint=True)
        await uow.run(released, savepoint=True)

    await uow.run(outer)
    assert await bodies(engine) == ["pending in a released savepoint"]
