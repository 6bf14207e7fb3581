"""Safe to show (issue 36 item 7) on PostgreSQL: the dashboard's ``redact=`` hook over payloads
and error text on every page and JSON twin that shows them (a run's page, the runs and dead
pages), and ``ship.jobs:payloads`` beside read and manage: without it payloads are hidden with
a note. A hook that raises hides the value (fail closed)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pytest
from dashboard_support import MAIL, actor, authorizer, dashboard_tables, dead_runs

from ship_sqla import create_dashboard, create_job_backend
from ship_sqla._dashboard._redact import HIDDEN
from ship_sqla.errors import ConfigurationError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

ADMIN = {"x-user": "admin"}
VIEWER = {"x-user": "viewer"}
JSON = {"accept": "application/json"}


def redact(field: str, value: Any, job_id: str) -> Any:
    """The application's hook: the payload's ``i`` masked, errors' "boom" replaced."""
    assert job_id == MAIL.id
    if field == "payload":
        return {**value, "i": "***"}
    if field == "error":
        return value.replace("boom", "[redacted]")
    return value


@pytest.fixture
async def backend(ship_engine: AsyncEngine) -> Any:
    metadata, runs, state, workers, _audit = dashboard_tables()
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return create_job_backend(
        database=ship_engine, table=runs, state_table=state, workers_table=workers
    )


def _client(backend: Any, hook: Any) -> httpx.AsyncClient:
    app = create_dashboard(backend, authorizer=authorizer, actor=actor, audit=None, redact=hook)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app")


async def test_the_redact_hook_applies_to_every_page_and_json_twin_showing_payload_or_error(
    backend: Any,
) -> None:
    """Issue 36 item 7: the run page, the runs and dead pages and their JSON twins show what
    ``redact`` returns for the payload and the error text (the last error and each attempt's),
    never the value it was given."""
    [run_id] = await dead_runs(backend, MAIL, 1)
    client = _client(backend, redact)
    for path in (f"/runs/{run_id}", "/runs?state=dead", "/dead"):
        page = await client.get(path, headers=ADMIN)
        assert page.status_code == 200, (path, page.text)
        assert "boom" not in page.text, path
        assert "[redacted]" in page.text, path
        twin = await client.get(path, headers={**ADMIN, **JSON})
        assert "boom" not in twin.text, path
        assert '"i": "***"' in twin.text.replace('"i":"***"', '"i": "***"'), path
    run = (await client.get(f"/runs/{run_id}", headers={**ADMIN, **JSON})).json()["data"]["run"]
    assert run["payload"] == {"i": "***"}
    assert run["history"][0]["error"].startswith("[redacted]")


async def test_the_redact_hook_applies_to_the_error_groups(backend: Any) -> None:
    """Issue 36 items 6-7: the error groups (``/errors?job=``, the job page's top errors) read
    a job's dead runs' errors in one narrow read (``newest_dead_errors``); the text they group
    and show is what ``redact`` returns, never the value it was given."""
    await dead_runs(backend, MAIL, 2)
    client = _client(backend, redact)
    for path in (f"/errors?job={MAIL.id}", f"/jobs/{MAIL.id}", "/errors"):
        for headers in (ADMIN, {**ADMIN, **JSON}):
            page = await client.get(path, headers=headers)
            assert page.status_code == 200, (path, page.text)
            assert "boom" not in page.text, path
            assert "[redacted]" in page.text, path


async def test_without_the_payloads_permission_payloads_are_hidden_with_a_note(
    backend: Any,
) -> None:
    """Issue 36 item 7: a user the authorizer does not grant ``ship.jobs:payloads`` (here the
    read-only viewer) sees the note in place of every payload, in the HTML and the JSON twins;
    error text stays (through the hook)."""
    [run_id] = await dead_runs(backend, MAIL, 1)
    client = _client(backend, None)
    page = await client.get(f"/runs/{run_id}", headers=VIEWER)
    assert page.status_code == 200
    assert 'id="payload-hidden"' in page.text
    assert "ship.jobs:payloads" in page.text
    assert "boom" in page.text
    for path in (f"/runs/{run_id}", "/runs?state=dead", "/dead"):
        twin = (await client.get(path, headers={**VIEWER, **JSON})).json()["data"]
        runs = [twin["run"]] if "run" in twin else twin["runs"]
        assert [r["payload"] for r in runs] == [HIDDEN], path
    admin = (await client.get(f"/runs/{run_id}", headers={**ADMIN, **JSON})).json()
    assert admin["data"]["run"]["payload"] == {"i": 0}


async def test_a_redact_hook_that_raises_hides_the_value(backend: Any) -> None:
    """Fail closed: a hook that raises never shows what it was meant to hide; the page says
    which exception, and answers 200."""
    [run_id] = await dead_runs(backend, MAIL, 1)

    def broken(field: str, value: Any, job_id: str) -> Any:
        raise KeyError(field)

    client = _client(backend, broken)
    page = await client.get(f"/runs/{run_id}", headers=ADMIN)
    assert page.status_code == 200
    assert "boom" not in page.text
    assert "the redact hook raised KeyError" in page.text


async def test_a_redact_that_is_not_callable_is_refused_at_build_time(backend: Any) -> None:
    """S1-style configuration check: ``redact`` must be callable (or None)."""
    with pytest.raises(ConfigurationError, match="redact must be callable"):
        create_dashboard(backend, authorizer=authorizer, audit=None, redact="yes")
