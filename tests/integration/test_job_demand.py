"""F5 demand from outside the application: `ship-sqla jobs demand` in a subprocess, and the ASGI
``DemandEndpoint`` an autoscaler polls, against a real database (the rules are the conformance
suite's, tests/conformance/test_job_demand_conformance.py)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from cli_runner import ship_sqla
from job_helpers import claim_request, default_job_backend

from ship_sqla import create_job_operations, define_job
from ship_sqla._jobs import (
    PostgresJobBackend,
)
from ship_sqla.asgi import DemandEndpoint
from ship_sqla.jobs import EnqueueRequest

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncEngine


async def _noop(ctx: Any, payload: Any) -> None:
    return None


MAIL = define_job("demand.cli.mail", _noop, payload=dict)
PDF = define_job("demand.cli.pdf", _noop, payload=dict)


@pytest.fixture
async def backend(ship_engine: AsyncEngine) -> PostgresJobBackend:
    backend: PostgresJobBackend = await default_job_backend(ship_engine)
    await backend.enqueue_many(MAIL, [EnqueueRequest({"n": n}) for n in range(3)])
    await backend.enqueue(MAIL, {"later": 1}, run_at=backend.clock.now() + timedelta(hours=1))
    assert len(await backend.claim(claim_request(MAIL, worker="w", limit=1))) == 1
    await backend.enqueue(PDF, {"n": 1})
    return backend


async def test_f5_jobs_demand_from_the_shell(
    backend: PostgresJobBackend, ship_engine_url: str, tmp_path: Path
) -> None:
    """F5: `jobs demand --json` reports every job with live runs; `--job` narrows it; `--cap`
    bounds the counts (the table marks a capped count `+`); a bad job id exits 2 naming it."""
    url = ("--database-url", ship_engine_url)
    code, out, err = await ship_sqla("jobs", "demand", *url, "--json", cwd=tmp_path)
    assert (code, err) == (0, ""), err
    document = json.loads(out)
    assert document["cap"] == 10_000
    assert [(j["job_id"], j["due"], j["delayed"], j["running"]) for j in document["jobs"]] == [
        (MAIL.id, 2, 1, 1),
        (PDF.id, 1, 0, 0),
    ]
    code, out, err = await ship_sqla(
        "jobs", "demand", "--job", PDF.id, "--job", "demand.cli.idle", *url, cwd=tmp_path
    )
    assert (code, err) == (0, ""), err
    assert "demand.cli.idle" in out
    assert MAIL.id not in out
    code, out, _ = await ship_sqla("jobs", "demand", "--cap", "1", *url, cwd=tmp_path)
    assert code == 0
    assert "1+" in out
    code, _, err = await ship_sqla("jobs", "demand", "--job", "not a job", *url, cwd=tmp_path)
    assert code == 2
    assert "not a job id" in err


async def test_f5_the_demand_endpoint_answers_an_autoscaler(backend: PostgresJobBackend) -> None:
    """F5: ``DemandEndpoint`` answers GET with the demand document (``?job=``, ``?cap=``), a
    problem document for bad input (400), another method (405) or a refused authorizer (403)."""
    allowed = DemandEndpoint(create_job_operations(backend, authorizer=lambda _p, _o: True))
    transport = httpx.ASGITransport(app=allowed)
    async with httpx.AsyncClient(transport=transport, base_url="http://ship") as client:
        response = await client.get("/")
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        jobs = {j["job_id"]: j for j in response.json()["jobs"]}
        assert (jobs[MAIL.id]["due"], jobs[MAIL.id]["running"]) == (2, 1)
        response = await client.get("/", params={"job": PDF.id, "cap": "1"})
        assert response.json() == {
            "jobs": [
                {
                    "job_id": PDF.id,
                    "due": 1,
                    "delayed": 0,
                    "running": 0,
                    "oldest_due_seconds": response.json()["jobs"][0]["oldest_due_seconds"],
                    "capped": True,
                }
            ],
            "cap": 1,
        }
        for params in ({"cap": "lots"}, {"cap": "0"}, {"job": "not a job"}):
            response = await client.get("/", params=params)
            assert response.status_code == 400, params
            assert response.headers["content-type"] == "application/problem+json"
        response = await client.post("/")
        assert (response.status_code, response.headers["allow"]) == (405, "GET, HEAD")
    refused = DemandEndpoint(create_job_operations(backend, authorizer=lambda _p, _o: False))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=refused), base_url="http://ship"
    ) as client:
        response = await client.get("/")
        assert response.status_code == 403
        assert response.json()["code"] == "SHIP_SQLA_PERMISSION_DENIED"
