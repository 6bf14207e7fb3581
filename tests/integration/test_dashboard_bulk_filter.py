"""Issue 36 item 5 (S1, S2): the dashboard's search page and its bulk actions by filter, over
a private PostgreSQL database through the ASGI application: "all matching" leads to a preview
with the count and a confirmation (CSRF, the manage permission, a token bound to the action,
the filter and the count), then the action in transactions of ``BulkPages.batch_size`` runs
with its progress page, and its one audit entry. No action without a confirmation: the dead
and runs pages' "all matching" are links to the preview."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest
from dashboard_support import MAIL, REPORT, actor, authorizer, dashboard_tables, dead_runs
from sqlalchemy import text
from starlette.applications import Starlette
from starlette.routing import Mount

from ship_sqla import create_audit_log, create_dashboard, create_job_backend
from ship_sqla._dashboard._bulk_page import BulkPages

ADMIN = {"x-user": "admin"}
VIEWER = {"x-user": "viewer"}


@pytest.fixture
async def setup(ship_engine: Any) -> Any:
    metadata, runs, state, workers, audit_table = dashboard_tables()
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(
        database=ship_engine, table=runs, state_table=state, workers_table=workers
    )
    dashboard = create_dashboard(
        backend,
        authorizer=authorizer,
        actor=actor,
        audit=create_audit_log(database=ship_engine, table=audit_table),
        definitions=[MAIL, REPORT],
    )
    pages = next(
        route.endpoint.__self__
        for route in dashboard.routes
        if isinstance(getattr(getattr(route, "endpoint", None), "__self__", None), BulkPages)
    )
    app = Starlette(routes=[Mount("/ops", app=dashboard)])
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app")
    async with client:
        yield backend, client, pages


async def _states(engine: Any, job: str) -> dict[str, int]:
    async with engine.connect() as connection:
        rows = await connection.execute(
            text("SELECT state, count(*) FROM ship_job_runs WHERE job_id = :j GROUP BY 1"),
            {"j": job},
        )
        return dict(rows.all())


async def _audit(engine: Any) -> list[Any]:
    async with engine.connect() as connection:
        rows = await connection.execute(
            text("SELECT operation, target, count, details FROM ship_audit ORDER BY id")
        )
        return list(rows.all())


def _confirm_form(html: str) -> dict[str, list[str]]:
    form = html[html.index('id="confirm-form"') :]
    form = form[: form.index("</form>")]
    fields: dict[str, list[str]] = {}
    for name, value in re.findall(r'name="([^"]+)" value="([^"]*)"', form):
        fields.setdefault(name, []).append(value.replace("&#43;", "+").replace("&amp;", "&"))
    return fields


async def test_s1_s2_search_then_preview_then_confirm_retries_exactly_what_matched(
    setup: Any, ship_engine: Any
) -> None:
    """S1, S2: the search page finds the dead runs of one job and offers "Retry all
    matching…" (a link: a GET changes nothing); the preview says how many and asks; the
    confirmation retries exactly those (not the other job's), in one transaction, answers with
    the result and the audit link, and the audit log has one entry with the filter, the count
    and the runs' links."""
    backend, client, _ = setup
    await dead_runs(backend, MAIL, 7)
    await dead_runs(backend, REPORT, 2)
    page = await client.get("/ops/search?job=dash.mail&state=dead", headers=ADMIN)
    assert page.status_code == 200
    assert page.text.count("/ops/runs/") >= 7
    link = re.search(r'id="bulk-retry" href="([^"]+)"', page.text)
    assert link is not None
    assert 'id="bulk-cancel"' not in page.text  # dead runs cannot be cancelled
    preview = await client.get(link.group(1).replace("&amp;", "&"), headers=ADMIN)
    assert preview.status_code == 200
    assert "Retry 7 runs" in preview.text
    assert await _states(ship_engine, MAIL.id) == {"dead": 7}  # the preview changed nothing
    fields = _confirm_form(preview.text)
    assert fields["job"] == ["dash.mail"]
    assert fields["state"] == ["dead"]
    answer = await client.post("/ops/bulk/retry", data=fields, headers=ADMIN)
    assert answer.status_code == 303, answer.text
    assert "/ops/bulk/tasks/" in answer.headers["location"]
    assert await _states(ship_engine, MAIL.id) == {"waiting": 7}
    assert await _states(ship_engine, REPORT.id) == {"dead": 2}
    result = await client.get(answer.headers["location"], headers=ADMIN)
    assert "Retry: 7 changed, 0 unchanged." in result.text
    assert 'href="/ops/audit"' in result.text
    assert "Refresh" not in result.headers
    [(operation, target, count, details)] = await _audit(ship_engine)
    assert (operation, count) == ("jobs.retry_filtered", 7)
    assert target == "runs matching job=dash.mail state=dead"
    assert details["filter"] == [["job", "dash.mail"], ["state", "dead"]]
    assert details["batches"] == 1
    assert details["links"]["search"] == "/search?job=dash.mail&state=dead"
    again = await client.post("/ops/bulk/retry", data=fields, headers=ADMIN)
    assert again.status_code == 303  # the same token again: nothing left to retry
    assert await _states(ship_engine, MAIL.id) == {"waiting": 7}


async def test_s1_a_large_set_goes_on_in_the_background_with_a_progress_page(
    setup: Any, ship_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36: a set larger than one transaction answers after its first committed batch
    with its progress page (reloaded by the browser while it runs: a ``Refresh`` header), and
    ends with every run changed, one transaction per batch and one audit entry."""
    backend, client, pages = setup
    monkeypatch.setattr(pages, "batch_size", 2)
    await dead_runs(backend, MAIL, 5)
    preview = await client.get("/ops/bulk/discard?job=dash.mail", headers=ADMIN)
    assert "Discard 5 runs" in preview.text
    answer = await client.post("/ops/bulk/discard", data=_confirm_form(preview.text), headers=ADMIN)
    assert answer.status_code == 303, answer.text
    location = answer.headers["location"]
    assert "/ops/bulk/tasks/" in location
    running = await client.get(location, headers=ADMIN)
    if 'data-ended="no"' in running.text:
        assert running.headers["refresh"] == "2"
        assert "<progress" in running.text
    await asyncio.gather(*pages._running)
    ended = await client.get(location, headers=ADMIN)
    assert 'data-ended="yes"' in ended.text
    assert "Discard: 5 changed, 0 unchanged." in ended.text
    assert "3 transactions committed" in ended.text
    assert "refresh" not in ended.headers
    twin = await client.get(location, headers={**ADMIN, "accept": "application/json"})
    assert twin.json()["data"]["changed"] == 5
    assert await _states(ship_engine, MAIL.id) == {"discarded": 5}
    [(operation, _, count, details)] = await _audit(ship_engine)
    assert (operation, count, details["batches"]) == ("jobs.discard_filtered", 5, 3)


async def test_s1_s2_no_bulk_action_without_its_confirmation_csrf_and_permission(
    setup: Any, ship_engine: Any
) -> None:
    """S1, S2: a confirmation without the session's CSRF token is refused (403); a viewer sees
    the count but no form, and a viewer's forged confirmation is refused (403); a token for
    another filter or action, or none, redirects back with the error; a bad filter value is a
    400 naming it; an unknown action a 404. Nothing changed, nothing audited."""
    backend, client, _ = setup
    await dead_runs(backend, MAIL, 3)
    preview = await client.get("/ops/bulk/retry?job=dash.mail", headers=ADMIN)
    fields = _confirm_form(preview.text)
    no_csrf = {k: v for k, v in fields.items() if k != "csrf_token"}
    assert (await client.post("/ops/bulk/retry", data=no_csrf, headers=ADMIN)).status_code == 403
    seen = await client.get("/ops/bulk/retry?job=dash.mail", headers=VIEWER)
    assert seen.status_code == 200
    assert "Retry 3 runs" in seen.text
    assert 'id="confirm-form"' not in seen.text
    # the session's valid CSRF token, posted by a user without the manage permission
    assert (await client.post("/ops/bulk/retry", data=fields, headers=VIEWER)).status_code == 403
    no_token = {**fields, "token": [""]}
    wider = {**fields, "job": [""]}
    for verb, form in (("discard", fields), ("retry", no_token), ("retry", wider)):
        answer = await client.post(f"/ops/bulk/{verb}", data=form, headers=ADMIN)
        assert answer.status_code == 303, answer.text
        assert answer.headers["location"].startswith("/ops/search?job=dash.mail")
        assert "SHIP_SQLA_BULK_TOKEN_INVALID" in answer.headers["location"]
    bad = await client.get("/ops/bulk/retry?tenant=%00", headers=ADMIN)
    assert bad.status_code == 400
    assert "SHIP_SQLA_RUN_FILTER_INVALID" in bad.text
    assert (await client.get("/ops/bulk/explode?job=dash.mail", headers=ADMIN)).status_code == 404
    assert await _states(ship_engine, MAIL.id) == {"dead": 3}
    assert await _audit(ship_engine) == []


async def test_s1_the_dead_and_runs_pages_all_matching_lead_to_the_preview(setup: Any) -> None:
    """Issue 36: "Retry / Discard all matching" on the dead letters and "Cancel all waiting
    runs" on the runs page are links to the preview with the page's filter, not actions; the
    search page keeps a bad filter value with its message, on the same page."""
    backend, client, _ = setup
    await dead_runs(backend, MAIL, 1)
    dead = await client.get("/ops/dead?job=dash.mail", headers=ADMIN)
    assert 'href="/ops/bulk/retry?state=dead&amp;job=dash.mail" id="retry-all"' in dead.text
    assert 'href="/ops/bulk/discard?state=dead&amp;job=dash.mail" id="discard-all"' in dead.text
    assert 'value="retry-all"' not in dead.text
    runs = await client.get("/ops/runs?state=waiting&job=dash.mail", headers=ADMIN)
    assert 'href="/ops/bulk/cancel?state=waiting&amp;job=dash.mail" id="cancel-all"' in runs.text
    kept = await client.get("/ops/search?job=dash.mail&from=yesterday", headers=ADMIN)
    assert kept.status_code == 200
    assert 'data-field="from"' in kept.text
    assert 'value="yesterday"' in kept.text
    assert 'value="dash.mail"' in kept.text


async def test_s2_issue_36_a_search_page_reads_past_at_most_500_runs(
    setup: Any, ship_engine: Any
) -> None:
    """S2, issue 36 (every page <= 100 ms at 1M runs): the search page reads at most 500 runs
    past those that do not match (the operations' default is 2,000), says "scanned 500,
    stopped" and offers the next page, which goes on from there."""
    _, client, _ = setup
    async with ship_engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO ship_job_runs (id, job_id, state, payload, max_attempts)"
                " SELECT 'scan' || g, 'dash.mail', 'waiting', '{}'::jsonb, 5"
                " FROM generate_series(1, 700) g"
            )
        )
    page = await client.get("/ops/search?job=dash.mail&error=no+such+text", headers=ADMIN)
    assert page.status_code == 200
    assert "scanned 500, stopped" in page.text
    following = re.search(r'href="(/ops/search\?[^"]*cursor=[^"]+)"', page.text)
    assert following is not None
    rest = await client.get(following.group(1).replace("&amp;", "&"), headers=ADMIN)
    assert rest.status_code == 200
    assert "scanned 500, stopped" not in rest.text  # the other 200 runs, then the end
