"""`ship-sqla jobs cancel | pause | resume | paused` against a real database (K2, K3), run in
this process by click's runner (`jobs --help` in a `python -m ship_sqla` subprocess). Exit
codes: 0 ok (a cancel of a finished run included: it says nothing changed), 1 failed or
refused, 2 bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest
from cli_runner import ship_sqla_in_process
from job_helpers import claim_request, default_job_backend

from ship_sqla import define_job
from ship_sqla._jobs import (
    PostgresJobBackend,
)
from ship_sqla.kernel import completed

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncEngine


async def _noop(ctx: Any, payload: Any) -> None:
    return None


JOB = define_job("cli.control", _noop, payload=dict)


@pytest.fixture
async def backend(ship_engine: AsyncEngine) -> PostgresJobBackend:
    return await default_job_backend(ship_engine)  # type: ignore[no-any-return]


async def test_k2_jobs_cancel_from_the_shell(
    backend: PostgresJobBackend, ship_engine_url: str
) -> None:
    """K2: `jobs cancel RUN_ID` cancels a waiting run at once, records the request of a running
    one (``--json``: its outcome), says a finished run was left as it was (exit 0), and exits 1
    for an unknown run; `jobs show` prints the request, `jobs stats` counts cancelled runs."""
    url = ("--database-url", ship_engine_url)
    running = await backend.enqueue(JOB, {"n": 1})
    [claimed] = await backend.claim(claim_request(JOB, worker="w"))
    waiting = await backend.enqueue(JOB, {"n": 2})
    assert claimed.run_id == running.run_id
    assert waiting.run_id is not None
    assert running.run_id is not None

    code, out, err = await ship_sqla_in_process("jobs", "cancel", waiting.run_id, *url)
    assert (code, err) == (0, ""), err
    assert f"run {waiting.run_id} (cli.control) is cancelled" in out

    code, out, err = await ship_sqla_in_process("jobs", "cancel", running.run_id, *url, "--json")
    assert (code, err) == (0, ""), err
    answer = json.loads(out)
    assert (answer["outcome"], answer["changed"]) == ("requested", True)
    assert answer["run"]["state"] == "running"
    assert answer["run"]["cancel_requested_at"] is not None

    code, out, _ = await ship_sqla_in_process("jobs", "show", running.run_id, *url)
    assert code == 0
    assert "cancel_requested: " in out
    assert "cancel_requested: -" not in out

    assert await backend.settle([completed(claimed)]) == ["completed"]
    code, out, err = await ship_sqla_in_process("jobs", "cancel", running.run_id, *url)
    assert (code, err) == (0, ""), err
    assert "had already finished (completed): nothing changed" in out

    code, _, err = await ship_sqla_in_process("jobs", "cancel", "no-such-run", *url)
    assert code == 1
    assert "no such run" in err

    code, out, _ = await ship_sqla_in_process("jobs", "stats", *url, "--json")
    assert code == 0
    [stats] = json.loads(out)["jobs"]
    assert (stats["cancelled"], stats["completed"]) == (1, 1)


async def test_k3_jobs_pause_resume_paused_from_the_shell(
    backend: PostgresJobBackend, ship_engine_url: str
) -> None:
    """K3: `jobs pause JOB_ID` pauses a job for every worker (a claim takes nothing; pausing
    again says so), `jobs paused` lists it, `jobs resume` makes its runs claimable again;
    a bad job id exits 2 before anything runs."""
    url = ("--database-url", ship_engine_url)
    await backend.enqueue(JOB, {})

    code, out, err = await ship_sqla_in_process("jobs", "pause", JOB.id, *url)
    assert (code, err) == (0, ""), err
    assert f"job {JOB.id} is paused" in out
    code, out, _ = await ship_sqla_in_process("jobs", "pause", JOB.id, *url)
    assert code == 0
    assert "paused already: nothing changed" in out
    assert await backend.claim(claim_request(JOB, worker="w")) == []

    code, out, _ = await ship_sqla_in_process("jobs", "paused", *url, "--json")
    assert code == 0
    assert [p["job_id"] for p in json.loads(out)["paused"]] == [JOB.id]
    code, out, _ = await ship_sqla_in_process("jobs", "paused", *url)
    assert out.splitlines()[0].split() == ["JOB", "PAUSED_AT"]

    code, out, err = await ship_sqla_in_process("jobs", "resume", JOB.id, *url)
    assert (code, err) == (0, ""), err
    assert f"job {JOB.id} is resumed" in out
    assert len(await backend.claim(claim_request(JOB, worker="w"))) == 1
    code, out, _ = await ship_sqla_in_process("jobs", "resume", JOB.id, *url)
    assert code == 0
    assert "was not paused: nothing changed" in out
    code, out, _ = await ship_sqla_in_process("jobs", "paused", *url)
    assert "no paused jobs." in out

    code, _, err = await ship_sqla_in_process("jobs", "pause", "not a job id", *url)
    assert code == 2
    assert "is not a job id" in err


async def test_k3_s1_jobs_pause_says_when_the_database_does_not_know_the_job_issue_25(
    backend: PostgresJobBackend, ship_engine_url: str
) -> None:
    """K3, S1, issue 25 (D7): `jobs pause` of a job id the database has no trace of pauses it
    (ahead of its deploy) but warns on stderr that the job is not known and how to undo a
    typo; `--json` says ``"known": false``. A job with a run is known: no warning."""
    url = ("--database-url", ship_engine_url)
    code, out, err = await ship_sqla_in_process("jobs", "pause", "no.such.job", *url)
    assert code == 0, err
    assert "job no.such.job is paused" in out
    assert "not known to this database yet" in err
    assert "ship-sqla jobs resume no.such.job" in err
    code, out, err = await ship_sqla_in_process("jobs", "resume", "no.such.job", *url)
    assert (code, err) == (0, ""), err

    code, out, err = await ship_sqla_in_process("jobs", "pause", "no.such.job", *url, "--json")
    assert code == 0
    assert json.loads(out) == {
        "job_id": "no.such.job",
        "outcome": "paused",
        "changed": True,
        "known": False,
    }
    assert "not known" in err

    await backend.enqueue(JOB, {})
    code, out, err = await ship_sqla_in_process("jobs", "pause", JOB.id, *url, "--json")
    assert (code, err) == (0, ""), err
    assert json.loads(out) == {
        "job_id": JOB.id,
        "outcome": "paused",
        "changed": True,
        "known": True,
    }


def test_the_control_commands_are_in_the_help(tmp_path: Path) -> None:
    """K2, K3: `jobs --help` lists cancel, pause, resume and paused."""
    jobs = subprocess.run(
        [sys.executable, "-m", "ship_sqla", "jobs", "--help"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert jobs.returncode == 0
    for command in ("cancel", "pause", "resume", "paused"):
        assert f"  {command} " in jobs.stdout
