"""`ship-sqla workflows patches` (D8) as an operator drives it: `python -m ship_sqla` in a
subprocess against a real database."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from cli_runner import ship_sqla
from workflow_helpers import execute_once, workflow_backend

from ship_sqla import define_job
from ship_sqla.jobs import RetryPolicy
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncEngine

STOP = {"after_patch": True}


async def _patched(ctx: Any, payload: Any) -> None:
    async def one() -> int:
        return 1

    await ctx.step("a", one)
    if await ctx.patched("v2"):
        await ctx.step("new", one)
    if STOP["after_patch"]:
        raise RuntimeError("stop")


JOB = define_job("cli.patched", _patched, payload=dict, retry=RetryPolicy(attempts=5))


async def test_d8_workflows_patches_from_the_shell(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """D8: `workflows patches --job` prints per patch the live runs holding the marker and
    those created before the first marker (text and --json); a run that completes stops
    counting; no marker stored: it says so."""
    clock = FrozenClock()
    backend = await workflow_backend(ship_engine, listen=False, clock=clock)
    url = ("--database-url", ship_engine_url)
    await backend.enqueue(JOB, {})
    assert (await execute_once(backend, JOB, clock)).ended == "failed"

    code, out, err = await ship_sqla(
        "workflows", "patches", "--job", JOB.id, *url, "--json", cwd=tmp_path
    )
    assert (code, err) == (0, ""), err
    [report] = json.loads(out)["patches"]
    assert report["patch_id"] == "v2"
    assert report["holding"] == {"runs": 1, "read": 1, "complete": True}
    assert report["before_first"]["runs"] == 0
    assert (report["deprecatable"], report["deletable"]) == (True, False)

    code, out, err = await ship_sqla("workflows", "patches", "--job", JOB.id, *url, cwd=tmp_path)
    assert (code, err) == (0, ""), err
    assert "v2" in out
    assert "can be deprecated" in out

    STOP["after_patch"] = False
    try:
        assert (await execute_once(backend, JOB, clock)).ended == "completed"
    finally:
        STOP["after_patch"] = True
    code, out, err = await ship_sqla(
        "workflows", "patches", "--job", JOB.id, *url, "--json", cwd=tmp_path
    )
    [report] = json.loads(out)["patches"]
    assert report["holding"]["runs"] == 0
    assert report["deletable"] is True

    code, out, err = await ship_sqla(
        "workflows", "patches", "--job", "cli.other", *url, cwd=tmp_path
    )
    assert (code, out.strip()) == (0, "no patch markers stored for job 'cli.other'")
