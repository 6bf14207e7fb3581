"""S1 (issue 33 part 2): the CLI's bulk operator actions, against a real database (the
`ship-sqla` commands run in this process by click's runner; the confirmation on a terminal in
a `python -m ship_sqla` subprocess on a pseudo-terminal): `ship-sqla jobs cancel` with
several run ids or with --all and a filter, and `ship-sqla outbox redrive` with message ids or
--all and a filter. Each runs in bounded batches, is audited, prints how many it changed, and
asks for confirmation on a terminal unless --yes (off a terminal it asks nothing)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cli_runner import ship_sqla_in_process
from job_helpers import claim_request, default_job_backend
from sqlalchemy import MetaData, select

from ship_sqla import (
    create_outbox,
    create_outbox_operations,
    define_job,
    ship_audit_table,
    ship_outbox_table,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine


async def _noop(payload: dict[str, Any]) -> None:
    return None


MAIL = define_job("bulk.mail", _noop, payload=dict)
REPORT = define_job("bulk.report", _noop, payload=dict)
AUDIT = ship_audit_table(MetaData())


def allow(permission: str, operation: str) -> bool:
    return True


@pytest.fixture
async def backend(ship_engine: AsyncEngine) -> Any:
    """The job tables and the audit table (what `ship-sqla schema apply` creates)."""
    return await default_job_backend(ship_engine)


async def _states(backend: Any, run_ids: list[str]) -> list[str]:
    return [(await backend.admin.get_run(r)).state for r in run_ids]


async def _audited(engine: AsyncEngine) -> list[tuple[str, int]]:
    async with engine.connect() as connection:
        rows = await connection.execute(
            select(AUDIT.c.operation, AUDIT.c["count"]).order_by(AUDIT.c.id)
        )
        return [(row[0], row[1]) for row in rows]


async def test_s1_jobs_cancel_takes_several_ids_or_a_filter(
    ship_engine: AsyncEngine, ship_engine_url: str, backend: Any
) -> None:
    """S1: `jobs cancel A B` and `jobs cancel --id C --id D --json` cancel the runs named and
    print how many changed (a finished one is unchanged); `jobs cancel --all --job X --state
    waiting --older-than 0 --yes` cancels every waiting run of X created before now, and no
    run of another job; each is one audit entry with its count. A filter without --all, or
    ids with a filter, is exit 2 saying what to give."""
    url = ("--database-url", ship_engine_url)
    mail = [(await backend.enqueue(MAIL, {"n": n})).run_id for n in range(7)]
    report = (await backend.enqueue(REPORT, {})).run_id
    [running] = await backend.claim(claim_request(MAIL, worker="w", limit=1))
    assert running.run_id == mail[0]

    code, out, err = await ship_sqla_in_process("jobs", "cancel", mail[1], mail[2], *url)
    assert (code, err) == (0, ""), err
    assert out == "Cancel: 2 run(s) changed, 0 unchanged.\n"

    args = ("jobs", "cancel", "--id", mail[2], "--id", mail[3], "--json")
    code, out, err = await ship_sqla_in_process(*args, *url)
    assert (code, err) == (0, ""), err
    answer = json.loads(out)
    assert (answer["changed"], answer["unchanged"]) == ([mail[3]], [mail[2]])

    args = ("jobs", "cancel", "--all", "--job", MAIL.id, "--state", "waiting", "--older-than", "0")
    code, out, err = await ship_sqla_in_process(*args, "--yes", *url)
    assert (code, err) == (0, ""), err
    assert out == "Cancel: 3 run(s) changed, 0 unchanged.\n"
    assert await _states(backend, mail) == ["running"] + ["cancelled"] * 6
    assert await _states(backend, [report]) == ["waiting"]
    assert await _audited(ship_engine) == [
        ("jobs.cancel_many", 2),
        ("jobs.cancel_many", 1),
        ("jobs.cancel_matching", 3),
    ]

    for bad, says in (
        (("--job", MAIL.id), "give either --all"),
        ((mail[0], "--all"), "give either --all"),
        ((mail[0], mail[1], "--state", "waiting"), "--state filter --all"),
        (("--all", "--state", "dead"), "'dead' is not one of"),
    ):
        code, _, err = await ship_sqla_in_process("jobs", "cancel", *bad, *url)
        assert code == 2, (bad, err)
        assert says in err, (bad, err)


async def _dead_messages(engine: AsyncEngine, outbox_id: str, count: int) -> list[Any]:
    outbox = create_outbox(database=engine, max_attempts=1)
    for n in range(count):
        await outbox.enqueue(outbox_id, "t", {"n": n}, tenant="acme" if n % 2 else None)
    ids = []
    for message in await outbox.claim(outbox_id, count, lease=30):
        assert await outbox.fail(message, "boom") == "dead"
        ids.append(message.id)
    return ids


async def test_s1_outbox_redrive_takes_ids_or_a_filter(
    ship_engine: AsyncEngine, ship_engine_url: str, backend: Any
) -> None:
    """S1, O4: `outbox redrive ID ID` moves the dead messages named back to pending and says
    how many; `outbox redrive --all --outbox-id main --tenant acme --older-than 0 --yes
    --json` re-drives every dead message of that outbox and tenant, and no other; each is one
    audit entry (outbox.retry, outbox.retry_dead_matching) with its count. --all without
    --outbox-id is exit 2."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(ship_outbox_table(MetaData()).create)
    main = await _dead_messages(ship_engine, "main", 6)
    other = await _dead_messages(ship_engine, "other", 2)
    url = ("--database-url", ship_engine_url)

    ids = [str(main[0]), str(main[1])]
    code, out, err = await ship_sqla_in_process("outbox", "redrive", *ids, *url)
    assert (code, err) == (0, ""), err
    assert out == "Re-drove 2 of 2 message(s).\n"

    args = ("outbox", "redrive", "--all", "--outbox-id", "main", "--tenant", "acme")
    code, out, err = await ship_sqla_in_process(*args, "--older-than", "0", "--yes", "--json", *url)
    assert (code, err) == (0, ""), err
    answer = json.loads(out)
    assert sorted(answer["moved"]) == sorted(str(m) for m in main[2:] if main.index(m) % 2)
    assert answer["complete"] is True
    ops = create_outbox_operations(create_outbox(database=ship_engine), authorizer=allow)
    states = [(await ops.get(m)).state for m in main + other]
    assert states == ["pending", "pending", "dead", "pending", "dead", "pending", "dead", "dead"]
    assert await _audited(ship_engine) == [
        ("outbox.retry", 2),
        ("outbox.retry_dead_matching", 2),
    ]

    code, _, err = await ship_sqla_in_process("outbox", "redrive", "--all", *url)
    assert code == 2
    assert "--all needs --outbox-id" in err


def _on_a_terminal(args: list[str], answer: bytes) -> tuple[int, str, str]:
    """`python -m ship_sqla ARGS` with stdin a terminal (a pseudo-terminal) on which the
    operator has typed ``answer``; blocking."""
    leader, follower = pty.openpty()
    try:
        os.write(leader, answer)
        environment = {k: v for k, v in os.environ.items() if not k.startswith("SHIP_SQLA_")}
        done = subprocess.run(
            [sys.executable, "-m", "ship_sqla", *args],
            stdin=follower,
            capture_output=True,
            env=environment,
            timeout=120,
            check=False,
        )
    finally:
        os.close(follower)
        os.close(leader)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_s1_bulk_verbs_ask_for_confirmation_on_a_terminal_unless_yes(
    ship_engine: AsyncEngine, ship_engine_url: str, backend: Any
) -> None:
    """S1: on a terminal, `jobs cancel A B` asks "Cancel 2 run(s)? [y/N]" on stderr: "n" exits
    1 with nothing changed, "y" cancels both; `outbox redrive --all` asks too; --yes asks
    nothing (empty stderr)."""
    url = ["--database-url", ship_engine_url]
    runs = [(await backend.enqueue(MAIL, {"n": n})).run_id for n in range(4)]

    def run(args: list[str], answer: bytes) -> tuple[int, str, str]:
        return _on_a_terminal(args + url, answer)

    code, out, err = await anyio.to_thread.run_sync(run, ["jobs", "cancel", *runs[:2]], b"n\n")
    assert code == 1, (out, err)
    assert "Cancel 2 run(s)? [y/N]" in err
    assert "not confirmed: nothing was changed" in err
    assert await _states(backend, runs) == ["waiting"] * 4

    code, out, err = await anyio.to_thread.run_sync(run, ["jobs", "cancel", *runs[:2]], b"y\n")
    assert code == 0, err
    assert err == "Cancel 2 run(s)? [y/N]: "
    assert out == "Cancel: 2 run(s) changed, 0 unchanged.\n"

    args = ["jobs", "cancel", "--all", "--job", MAIL.id, "--yes"]
    code, out, err = await anyio.to_thread.run_sync(run, args, b"")
    assert (code, err) == (0, ""), err
    assert out == "Cancel: 2 run(s) changed, 0 unchanged.\n"
    assert await _states(backend, runs) == ["cancelled"] * 4

    async with ship_engine.begin() as connection:
        await connection.run_sync(ship_outbox_table(MetaData()).create)
    dead = await _dead_messages(ship_engine, "main", 2)
    args = ["outbox", "redrive", "--all", "--outbox-id", "main"]
    code, out, err = await anyio.to_thread.run_sync(run, args, b"y\n")
    assert code == 0, err
    assert err == "Re-drive every dead message of main? [y/N]: "
    assert out == "Re-drove 2 dead message(s).\n"
    ops = create_outbox_operations(create_outbox(database=ship_engine), authorizer=allow)
    assert [(await ops.get(m)).state for m in dead] == ["pending", "pending"]
