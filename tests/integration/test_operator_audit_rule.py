"""S1's one audit rule (issue 33 part 3), on each surface: an operator action whose configured
audit cannot be written (the audit table is missing) changes nothing and says which table is
missing and how to create it, whether it comes from Python, the CLI or the dashboard. Before,
the CLI's ``jobs cancel`` and ``jobs pause`` swallowed the missing table and changed state
unaudited, with exit 0 and no word: an error that went nowhere (J11 asks the opposite of the
loop: every error goes somewhere). ``audit=None`` in Python and ``--no-audit`` at the shell
are the documented opt-outs."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from cli_runner import ship_sqla
from dashboard_support import actor, authorizer, csrf_of
from sqlalchemy import MetaData

from ship_sqla import (
    create_audit_log,
    create_dashboard,
    create_job_backend,
    create_job_operations,
    create_outbox,
    create_outbox_operations,
    define_job,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_workers_table,
    ship_outbox_table,
)
from ship_sqla.errors import AuditUnavailableError, ConfigurationError

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncEngine


async def _noop(payload: dict[str, Any]) -> None:
    return None


JOB = define_job("audit.rule", _noop, payload=dict)


def allow(permission: str, operation: str) -> bool:
    return True


@pytest.fixture
async def no_audit_table(ship_engine: AsyncEngine) -> Any:
    """The job and outbox tables under their default names, and no audit table."""
    metadata = MetaData()
    for factory in (
        ship_job_runs_table,
        ship_job_history_table,  # J16: the default shape create_job_backend() reads
        ship_job_state_table,
        ship_job_workers_table,
        ship_outbox_table,
    ):
        factory(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return create_job_backend(database=ship_engine, listen=False)


async def _dead_message(engine: AsyncEngine) -> uuid.UUID:
    outbox = create_outbox(database=engine, max_attempts=1)
    await outbox.enqueue("main", "t", {"n": 1})
    [message] = await outbox.claim("main", 1, lease=30)
    assert await outbox.fail(message, "boom") == "dead"
    return message.id


def _says_how_to_create_it(error: str) -> None:
    assert "ship_audit does not exist" in error
    assert "nothing was changed" in error
    assert "ship-sqla schema apply --only audit" in error
    assert "ship_audit_table(metadata" in error


async def test_s1_j11_python_operations_with_a_missing_audit_table_change_nothing(
    ship_engine: AsyncEngine, no_audit_table: Any
) -> None:
    """S1, J11: JobOperations and OutboxOperations given create_audit_log(...) on a database
    without its table refuse cancel, cancel_many, cancel_matching, pause and the outbox's
    re-drives with AuditUnavailableError naming the table and how to create it; the runs, the
    job and the message are unchanged. The same operations with audit=None (the documented
    opt-out) act, unaudited."""
    backend = no_audit_table
    log = create_audit_log(database=ship_engine)
    ops = create_job_operations(backend, authorizer=allow, audit=log, actor="alice")
    run_id = (await backend.enqueue(JOB, {})).run_id
    calls = (
        ops.cancel(run_id),
        ops.cancel_many([run_id]),
        ops.cancel_matching(job_id=JOB.id),
        ops.pause(JOB.id),
    )
    for call in calls:
        with pytest.raises(AuditUnavailableError) as refused:
            await call
        _says_how_to_create_it(str(refused.value))
    assert (await backend.admin.get_run(run_id)).state == "waiting"
    assert await backend.admin.paused(limit=10) == []

    message_id = await _dead_message(ship_engine)
    outbox_ops = create_outbox_operations(
        create_outbox(database=ship_engine), authorizer=allow, audit=log
    )
    for outbox_call in (
        outbox_ops.retry([message_id]),
        outbox_ops.retry_dead_matching("main"),
    ):
        with pytest.raises(AuditUnavailableError):
            await outbox_call
    assert (await outbox_ops.get(message_id)).state == "dead"

    unaudited = create_job_operations(backend, authorizer=allow)
    assert (await unaudited.cancel(run_id)).outcome == "cancelled"


async def test_s1_j11_cli_cancel_pause_and_redrive_refuse_without_the_audit_table(
    ship_engine: AsyncEngine, ship_engine_url: str, no_audit_table: Any, tmp_path: Path
) -> None:
    """S1, J11: on a database without the audit table, `ship-sqla jobs cancel RUN`, `jobs
    pause JOB` and `outbox redrive ID` exit 1 naming the missing table and how to create it,
    and change nothing (they used to change state unaudited with exit 0); with --no-audit, the
    explicit opt-out, they act (exit 0, empty stderr)."""
    backend = no_audit_table
    run_id = (await backend.enqueue(JOB, {})).run_id
    message_id = await _dead_message(ship_engine)
    url = ("--database-url", ship_engine_url)
    for args in (
        ("jobs", "cancel", run_id),
        ("jobs", "pause", JOB.id),
        ("outbox", "redrive", str(message_id), "--yes"),
    ):
        code, out, err = await ship_sqla(*args, *url, cwd=tmp_path)
        assert code == 1, (args, out, err)
        assert "SHIP_SQLA_AUDIT_UNAVAILABLE" in err
        _says_how_to_create_it(err)
    assert (await backend.admin.get_run(run_id)).state == "waiting"
    assert await backend.admin.paused(limit=10) == []
    outbox_ops = create_outbox_operations(create_outbox(database=ship_engine), authorizer=allow)
    assert (await outbox_ops.get(message_id)).state == "dead"

    code, out, err = await ship_sqla("jobs", "cancel", run_id, *url, "--no-audit", cwd=tmp_path)
    assert (code, err) == (0, ""), err
    assert "is cancelled" in out
    code, out, err = await ship_sqla("jobs", "pause", JOB.id, *url, "--no-audit", cwd=tmp_path)
    assert (code, err) == (0, ""), err
    assert [p.job_id for p in await backend.admin.paused(limit=10)] == [JOB.id]


async def test_s1_j11_dashboard_actions_refuse_without_the_audit_table(
    ship_engine: AsyncEngine, no_audit_table: Any
) -> None:
    """S1, J11: a dashboard whose audit log's table is missing answers a manager's cancel and
    pause with the refusal (the redirect's ``failed`` names the table and how to create it),
    and the run and the job are unchanged. A dashboard given no audit= at all is refused at
    construction: audit=None is the explicit opt-out."""
    backend = no_audit_table
    run_id = (await backend.enqueue(JOB, {})).run_id
    dashboard = create_dashboard(
        backend,
        authorizer=authorizer,
        actor=actor,
        audit=create_audit_log(database=ship_engine),
        definitions=[JOB],
    )
    admin = {"x-user": "admin"}
    transport = httpx.ASGITransport(app=dashboard)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        page = await client.get(f"/runs/{run_id}", headers=admin)
        token = csrf_of(page.text)
        for path in (f"/runs/{run_id}/cancel", f"/jobs/{JOB.id}/pause"):
            answer = await client.post(path, data={"csrf_token": token}, headers=admin)
            assert answer.status_code == 303, answer.text
            refused = httpx.URL(answer.headers["location"]).params["failed"]
            _says_how_to_create_it(refused)
    assert (await backend.admin.get_run(run_id)).state == "waiting"
    assert await backend.admin.paused(limit=10) == []

    with pytest.raises(ConfigurationError, match="create_dashboard needs audit="):
        create_dashboard(backend, authorizer=authorizer)
