"""S1: the PostgreSQL audit log: what JobOperations and OutboxOperations write for every
state-changing operation (who, what, when, how many), in the caller's unit of work, and the
CLI's bulk verbs, which refuse to act unaudited."""

from __future__ import annotations

import json

from cli_runner import ship_sqla
from dashboard_support import MAIL, REPORT, dead_runs
from sqlalchemy import MetaData, func, select

from ship_sqla import (
    create_audit_log,
    create_job_backend,
    create_job_operations,
    ship_audit_table,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_workers_table,
)

metadata = MetaData()
runs = ship_job_runs_table(metadata)
history = ship_job_history_table(metadata)  # J16: the default shape create_job_backend() reads
state = ship_job_state_table(metadata)
workers = ship_job_workers_table(metadata)
audit_table = ship_audit_table(metadata)


def allow(permission: str, operation: str) -> bool:
    return True


async def test_s1_every_state_changing_operation_is_audited_with_who_what_when_how_many(
    ship_connection, ship_clock
):
    """S1: retry, discard, pause, resume and a bulk retry each write one row naming the actor,
    the operation, the target and the count, at the injected clock's time; reads write
    nothing; the entries read back newest first."""
    await ship_connection.run_sync(metadata.create_all)
    backend = create_job_backend(
        database=ship_connection,
        table=runs,
        state_table=state,
        workers_table=workers,
        clock=ship_clock,
    )
    log = create_audit_log(database=ship_connection, table=audit_table, clock=ship_clock)
    ops = create_job_operations(backend, authorizer=allow, audit=log, actor="alice")
    a, b, c = await dead_runs(backend, MAIL, 3)
    await ops.list_dead()
    await ops.retry(a)
    await ops.discard(b)
    await ops.pause(REPORT.id)
    await ops.resume(REPORT.id)
    result = await ops.acting_as("bob").retry_many([c, "no-such-run"])
    assert result.changed == (c,)
    assert result.unchanged == ("no-such-run",)
    entries = await ops.audit_entries(limit=10)
    assert [(e.actor, e.operation, e.target, e.count) for e in entries] == [
        ("bob", "jobs.retry_many", "ids", 1),
        ("alice", "jobs.resume", REPORT.id, 1),
        ("alice", "jobs.pause", REPORT.id, 1),
        ("alice", "jobs.discard", b, 1),
        ("alice", "jobs.retry", a, 1),
    ]
    assert {e.at for e in entries} == {ship_clock.now()}
    assert entries[0].details["changed_ids"] == [c]
    older = await ops.audit_entries(limit=10, before=entries[1].entry_id)
    assert [e.operation for e in older] == ["jobs.pause", "jobs.discard", "jobs.retry"]


async def test_s1_cli_bulk_retry_is_audited_and_refused_without_the_audit_table(
    ship_engine, ship_engine_url, tmp_path
):
    """S1: ``ship-sqla jobs retry-dead --job X --all`` retries every dead run of X and writes
    one entry as cli:<user>@<host>; without the audit table it changes nothing and exits 1,
    unless --no-audit."""
    only_jobs = MetaData()
    for factory in (
        ship_job_runs_table,
        ship_job_history_table,  # J16: the default shape create_job_backend() reads
        ship_job_state_table,
        ship_job_workers_table,
    ):
        factory(only_jobs)
    async with ship_engine.begin() as connection:
        await connection.run_sync(only_jobs.create_all)
    backend = create_job_backend(database=ship_engine)
    mail = await dead_runs(backend, MAIL, 3)
    await dead_runs(backend, REPORT, 1)

    code, _, err = await ship_sqla(
        "jobs",
        "retry-dead",
        "--database-url",
        ship_engine_url,
        "--job",
        MAIL.id,
        "--all",
        cwd=tmp_path,
    )
    assert code == 1, err
    assert "ship_audit" in err
    assert [(await backend.admin.get_run(r)).state for r in mail] == ["dead"] * 3

    async with ship_engine.begin() as connection:
        await connection.run_sync(audit_table.create)
    code, out, err = await ship_sqla(
        "jobs",
        "retry-dead",
        "--database-url",
        ship_engine_url,
        "--job",
        MAIL.id,
        "--all",
        "--json",
        cwd=tmp_path,
    )
    assert code == 0, err
    assert len(json.loads(out)["changed"]) == 3
    assert [(await backend.admin.get_run(r)).state for r in mail] == ["waiting"] * 3
    async with ship_engine.connect() as connection:
        row = (
            await connection.execute(
                select(audit_table.c.actor, audit_table.c.operation, audit_table.c.count)
            )
        ).one()
        assert row.actor.startswith("cli:")
        assert row.operation == "jobs.retry_dead_matching"
        assert row[2] == 3
        dead = 0
        for table in (runs, history):  # J16: a dead run is in history
            counted = await connection.execute(
                select(func.count()).select_from(table).where(table.c.state == "dead")
            )
            dead += counted.scalar_one()
        assert dead == 1
    code, _, err = await ship_sqla(
        "jobs", "retry-dead", "--database-url", ship_engine_url, cwd=tmp_path
    )
    assert code == 2, err
