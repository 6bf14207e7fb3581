"""S1, S2, issue 36 items 4-5 at the command line (the ``ship-sqla`` commands run in this
process by click's runner, against a real database): ``jobs find --filter`` pages runs
matching any filter; ``jobs retry-matching`` / ``cancel-matching`` / ``discard-matching``
preview (count and token), act in transactions, and write one audit entry; a bad filter is
exit 2 naming the field and the fix."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from cli_runner import ship_sqla_in_process
from job_helpers import claim_request, default_job_backend
from sqlalchemy import MetaData, select

from ship_sqla import define_job, ship_audit_table
from ship_sqla.kernel import failed

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine


async def _noop(payload: dict[str, Any]) -> None:
    return None


MAIL = define_job("clifind.mail", _noop, payload=dict)
AUDIT = ship_audit_table(MetaData())


@pytest.fixture
async def backend(ship_engine: AsyncEngine) -> Any:
    return await default_job_backend(ship_engine)


async def _dead(backend: Any, count: int) -> list[str]:
    for n in range(count):
        await backend.enqueue(MAIL, {"order": {"id": n % 2}})
    claimed = await backend.claim(claim_request(MAIL, worker="w", limit=count))
    for n, run in enumerate(claimed):
        await backend.settle([failed(run, f"smtp {n % 2}", retry_at=None)])
    return [run.run_id for run in claimed]


async def test_jobs_find_pages_matching_runs_and_refuses_a_bad_filter(
    ship_engine_url: str, backend: Any
) -> None:
    """S2, issue 36 item 4: `jobs find --filter ... --json` lists the matching runs with the
    scan count; a bad filter is exit 2 naming the field and the fix."""
    dead = await _dead(backend, 6)
    url = ("--database-url", ship_engine_url)
    code, out, err = await ship_sqla_in_process(
        "jobs", "find", *url, "--filter", "error=SMTP 1", "--filter", "payload=order.id=1",
        "--json",
    )  # fmt: skip
    assert code == 0, err
    body = json.loads(out)
    assert {run["run_id"] for run in body["runs"]} == {dead[1], dead[3], dead[5]}
    assert body["stopped"] is False
    code, _out, err = await ship_sqla_in_process(
        "jobs", "find", *url, "--filter", "from=last tuesday"
    )
    assert code == 2
    assert "from" in err
    assert "ISO 8601" in err


async def test_retry_matching_previews_confirms_and_audits(
    ship_engine: AsyncEngine, ship_engine_url: str, backend: Any
) -> None:
    """S1, issue 36 item 5: `--preview` prints the count and a token and changes nothing;
    `--token` acts on that preview; `--yes` previews and acts at once; each action is one audit
    entry with its count; a token of another filter is refused (exit 1), nothing changed."""
    dead = await _dead(backend, 6)
    url = ("--database-url", ship_engine_url)
    one = ("--filter", "payload=order.id=1")
    code, _out, err = await ship_sqla_in_process("jobs", "retry-matching", *url, *one, "--preview")
    assert code == 0, err
    assert "3 run(s) match" in err
    token = err.split("token ")[1].split()[0]
    assert [(await backend.admin.get_run(r)).state for r in dead] == ["dead"] * 6
    other = ("--filter", "payload=order.id=0")
    code, _out, err = await ship_sqla_in_process(
        "jobs", "retry-matching", *url, *other, "--token", token
    )
    assert code == 1
    assert "SHIP_SQLA_BULK_TOKEN_INVALID" in err
    code, out, err = await ship_sqla_in_process(
        "jobs", "retry-matching", *url, *one, "--token", token, "--json"
    )
    assert code == 0, err
    assert json.loads(out) == {"changed": 3, "unchanged": 0, "complete": True}
    code, out, err = await ship_sqla_in_process("jobs", "discard-matching", *url, *other, "--yes")
    assert code == 0, err
    assert "3 run(s) changed" in out
    states = [(await backend.admin.get_run(r)).state for r in dead]
    assert states == ["discarded", "waiting"] * 3
    async with ship_engine.connect() as connection:
        rows = await connection.execute(
            select(AUDIT.c.operation, AUDIT.c["count"]).order_by(AUDIT.c.id)
        )
        assert [tuple(row) for row in rows] == [
            ("jobs.retry_filtered", 3),
            ("jobs.discard_filtered", 3),
        ]
