"""`ship-sqla jobs show | rerun | events-purge` on workflow runs, as an operator drives them
(D6), against a real database (the commands run in this process by click's runner)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from cli_runner import ship_sqla_in_process
from workflow_helpers import execute_once, workflow_backend

from ship_sqla import define_job
from ship_sqla._jobs import (
    create_job_backend,
)
from ship_sqla.jobs import RetryPolicy
from ship_sqla.kernel._plans.claim_floor import DEFAULT_FLOOR_SWEEP
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

FAIL = {"c": True}


async def _three_steps(ctx: Any, payload: Any) -> None:
    for name in ("a", "b", "c"):

        async def body(name: str = name) -> str:
            if name == "c" and FAIL["c"]:
                raise RuntimeError("c failed")
            return name.upper()

        await ctx.step(name, body)
    await ctx.wait_for_event("shipped", "order.shipped", key="o1", timeout=60)


JOB = define_job("cli.workflow", _three_steps, payload=dict, retry=RetryPolicy(attempts=1))


async def test_d6_jobs_show_rerun_and_events_purge_from_the_shell(
    ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """D6: `jobs show` lists a workflow run's stored steps (text and --json); `jobs rerun RUN_ID
    --from-step b` drops b and every later step and makes the dead run due again (exit 0); a
    rerun of a run that is not dead or waiting is refused (exit 1); `jobs events-purge` applies
    the events' retention."""
    clock = FrozenClock()
    backend = await workflow_backend(ship_engine, listen=False, clock=clock)
    url = ("--database-url", ship_engine_url)
    result = await backend.enqueue(JOB, {})
    assert result.run_id is not None
    assert (await execute_once(backend, JOB, clock)).outcome == "dead"

    code, out, err = await ship_sqla_in_process("jobs", "show", result.run_id, *url)
    assert (code, err) == (0, ""), err
    assert "steps (2):" in out
    assert "0. a (step): done at" in out
    assert "1. b (step): done at" in out

    code, out, err = await ship_sqla_in_process("jobs", "show", result.run_id, *url, "--json")
    assert (code, err) == (0, ""), err
    shown = json.loads(out)
    assert [(s["name"], s["result"]) for s in shown["steps"]] == [("a", "A"), ("b", "B")]

    args = ("jobs", "rerun", result.run_id, "--from-step", "b", *url)
    code, out, err = await ship_sqla_in_process(*args)
    assert (code, err) == (0, ""), err
    assert f"run {result.run_id} (cli.workflow) is due again from step 'b'" in out
    steps = await backend.workflows.list_steps(result.run_id)
    assert [s.name for s in steps] == ["a"]

    FAIL["c"] = False
    # J19: the rerun (the command's own backend, the database's clock: years before this
    # FrozenClock's) made the run due below this backend's claim floor; its next full walk, a
    # sweep later, takes it (the K6 relaxation's bound).
    clock.advance(DEFAULT_FLOOR_SWEEP + 1)
    assert (await execute_once(backend, JOB, clock)).outcome == "suspended"
    code, out, err = await ship_sqla_in_process("jobs", "show", result.run_id, *url)
    assert "waits_for:        event order.shipped [o1]" in out
    assert "3. shipped (event): waiting for order.shipped [o1] until" in out

    # Published on the database's clock (the FrozenClock is in 2030), so the purge finds it old.
    on_db_clock = create_job_backend(database=ship_engine, listen=False)
    await on_db_clock.publish_event("order.shipped", {"n": 1}, key="o1")
    assert (await execute_once(backend, JOB, clock)).ended == "completed"
    code, _, err = await ship_sqla_in_process(*args)
    assert code == 1
    assert "it is 'completed'" in err

    code, out, err = await ship_sqla_in_process(
        "jobs", "events-purge", "--older-than", "0", *url, "--json"
    )
    assert (code, err) == (0, ""), err
    assert json.loads(out) == {"deleted": 1}
