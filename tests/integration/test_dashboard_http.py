"""The dashboard over HTTP without a browser (httpx's ASGI transport): permissions (S2: a
read-only user sees and can do nothing that changes state), CSRF (every state-changing request
checked), the audit log of its actions (S1), mounting under a prefix, bulk actions."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import httpx
import pytest
from dashboard_support import (
    CSP_PATTERN,
    MAIL,
    REPORT,
    actor,
    authorizer,
    csrf_of,
    dead_runs,
    missing_security_headers,
)
from starlette.applications import Starlette
from starlette.routing import Mount

from ship_sqla import create_dashboard
from ship_sqla._dashboard._static import IMMUTABLE, asset_name
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.operators import InMemoryAuditLog


def every_page(run_id: str) -> tuple[str, ...]:
    """Every page of the dashboard mounted at /ops (one run's page: ``run_id``'s)."""
    return (
        "/ops/",
        "/ops/runs?state=dead",
        f"/ops/runs/{run_id}",
        "/ops/dead",
        "/ops/schedules",
        "/ops/workers",
        "/ops/audit",
        "/ops/consumers",
        "/ops/outbox",
        "/ops/webhooks",
        "/ops/upkeep",
        "/ops/jobs/dash.mail",
        "/ops/errors",
        "/ops/bulk/retry?job=dash.mail&state=dead&error=boom",
    )


@pytest.fixture
def backend(ship_clock):
    return InMemoryJobBackend(clock=ship_clock)


@pytest.fixture
def audit(ship_clock):
    return InMemoryAuditLog(ship_clock)


@pytest.fixture
def client(backend, audit):
    dashboard = create_dashboard(
        backend, authorizer=authorizer, actor=actor, audit=audit, definitions=[MAIL, REPORT]
    )
    app = Starlette(routes=[Mount("/ops", app=dashboard)])
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app")


async def _state(backend: Any, run_id: str) -> str:
    record = await backend.admin.get_run(run_id)
    assert record is not None
    return str(record.state)


async def test_s2_read_only_user_sees_pages_without_any_action_and_cannot_post(
    client, backend, audit
):
    """S2: a user with ship.jobs:read only gets every page, with no POST form on any; a POST
    they forge with a valid CSRF token is refused (403) by the operator surface, the run is
    unchanged and nothing is audited."""
    [run_id] = await dead_runs(backend, MAIL, 1)
    viewer = {"x-user": "viewer"}
    for path in every_page(run_id):
        page = await client.get(path, headers=viewer)
        assert page.status_code == 200, (path, page.text)
        assert 'method="post"' not in page.text, path
    assert run_id in (await client.get("/ops/dead", headers=viewer)).text
    # A manager's page of the same session gives a valid token; the viewer posts with it.
    token = csrf_of((await client.get("/ops/dead", headers={"x-user": "admin"})).text)
    refused = await client.post(
        f"/ops/runs/{run_id}/retry", data={"csrf_token": token}, headers=viewer
    )
    assert refused.status_code == 403
    assert "ship.jobs:manage" in refused.text
    assert await _state(backend, run_id) == "dead"
    assert audit.entries == []


async def test_s2_user_without_read_permission_is_refused_every_page(client):
    """S2: no ship.jobs:read nor manage: every page answers 403 and shows nothing."""
    for path in ("/ops/", "/ops/runs", "/ops/dead"):
        page = await client.get(path, headers={"x-user": "nobody"})
        assert page.status_code == 403
        assert "ship.jobs:read" in page.text


async def test_s2_forged_posts_without_the_sessions_csrf_token_are_refused(client, backend, audit):
    """S2: a POST with no token, a made-up token, or another session's token is refused with
    403 before anything runs: the run stays dead, no audit entry."""
    [run_id] = await dead_runs(backend, MAIL, 1)
    admin = {"x-user": "admin"}
    token = csrf_of((await client.get("/ops/dead", headers=admin)).text)
    other = httpx.AsyncClient(transport=client._transport, base_url="http://app")
    other_token = csrf_of((await other.get("/ops/dead", headers=admin)).text)
    assert other_token != token
    for data in ({}, {"csrf_token": "0" * 64}, {"csrf_token": other_token}):
        forged = await client.post(f"/ops/runs/{run_id}/retry", data=data, headers=admin)
        assert forged.status_code == 403
        assert "CSRF" in forged.text
    # No session cookie at all (a cross-site form carries none: SameSite=Strict).
    bare = httpx.AsyncClient(transport=client._transport, base_url="http://app")
    forged = await bare.post(f"/ops/runs/{run_id}/retry", data={"csrf_token": token}, headers=admin)
    assert forged.status_code == 403
    assert await _state(backend, run_id) == "dead"
    assert audit.entries == []


async def test_s1_an_action_from_the_dashboard_changes_the_run_and_is_audited(
    client, backend, audit
):
    """S1: a manager's retry goes through JobOperations: the run waits again, the answer
    redirects back to the run's page with the outcome, and the audit log names who, what, the
    run and how many."""
    [run_id] = await dead_runs(backend, MAIL, 1)
    admin = {"x-user": "admin"}
    page = await client.get(f"/ops/runs/{run_id}", headers=admin)
    assert "Retry" in page.text
    assert "Traceback: line 1" in page.text
    done = await client.post(
        f"/ops/runs/{run_id}/retry",
        data={"csrf_token": csrf_of(page.text), "next": f"/ops/runs/{run_id}"},
        headers=admin,
    )
    assert done.status_code == 303
    assert done.headers["location"].startswith(f"/ops/runs/{run_id}?done=")
    assert await _state(backend, run_id) == "waiting"
    [entry] = audit.entries
    assert (entry.actor, entry.operation, entry.target, entry.count) == (
        "admin",
        "jobs.retry",
        run_id,
        1,
    )
    assert entry.at is not None
    shown = await client.get("/ops/audit", headers=admin)
    assert "jobs.retry" in shown.text


async def test_s1_bulk_retry_of_everything_matching_the_filter_is_one_audited_operation(
    client, backend, audit
):
    """S1, issue 36: "Retry all matching" on the dead letters of one job is a link to the
    preview (the count, a confirmation); confirmed, it retries every one of them (not the other
    job's) in bounded batches, and writes one entry with the filter and the count."""
    mail = await dead_runs(backend, MAIL, 7)
    report = await dead_runs(backend, REPORT, 2)
    admin = {"x-user": "admin"}
    page = await client.get("/ops/dead?job=dash.mail", headers=admin)
    assert 'href="/ops/bulk/retry?state=dead&amp;job=dash.mail" id="retry-all"' in page.text
    preview = await client.get("/ops/bulk/retry?state=dead&job=dash.mail", headers=admin)
    assert "Retry 7 runs" in preview.text
    token = re.search(r'name="token" value="([^"]+)"', preview.text)
    assert token is not None
    assert [await _state(backend, r) for r in mail] == ["dead"] * 7  # asked first
    answer = await client.post(
        "/ops/bulk/retry",
        data={
            "csrf_token": csrf_of(preview.text),
            "token": token.group(1),
            "job": "dash.mail",
            "state": "dead",
            "next": "/ops/search?job=dash.mail&state=dead",
        },
        headers=admin,
    )
    assert answer.status_code == 303
    assert [await _state(backend, r) for r in mail] == ["waiting"] * 7
    assert [await _state(backend, r) for r in report] == ["dead"] * 2
    [entry] = audit.entries
    assert (entry.operation, entry.target, entry.count) == (
        "jobs.retry_filtered",
        "runs matching job=dash.mail state=dead",
        7,
    )


async def test_selected_runs_and_pause_resume_and_no_open_redirect(client, backend, audit):
    """Bulk discard of the selection; pause then resume of a job; a ``next`` off the dashboard
    is ignored (no open redirect)."""
    a, b, c = await dead_runs(backend, MAIL, 3)
    admin = {"x-user": "admin"}
    token = csrf_of((await client.get("/ops/dead", headers=admin)).text)
    answer = await client.post(
        "/ops/dead/bulk",
        data={"csrf_token": token, "action": "discard", "id": [a, b], "next": "https://evil/"},
        headers=admin,
    )
    assert answer.headers["location"].startswith("/ops/?done=")
    assert [await _state(backend, r) for r in (a, b, c)] == ["discarded", "discarded", "dead"]
    for verb in ("pause", "resume"):
        answer = await client.post(
            f"/ops/jobs/dash.mail/{verb}", data={"csrf_token": token}, headers=admin
        )
        assert answer.status_code == 303
    assert [e.operation for e in audit.entries] == [
        "jobs.discard_many",
        "jobs.pause",
        "jobs.resume",
    ]
    overview = await client.get("/ops/", headers=admin)
    assert "dash.mail" in overview.text
    assert "<svg" in overview.text


async def test_runs_page_filters_and_pages_with_signed_cursors(client, backend):
    """S2: the runs page filters by state and job and pages by a signed cursor; a tampered
    cursor is a 400, not a 500."""
    await dead_runs(backend, MAIL, 60)
    await dead_runs(backend, REPORT, 3)
    admin = {"x-user": "admin"}
    first = await client.get("/ops/runs?state=dead&job=dash.mail", headers=admin)
    assert first.text.count('name="id"') == 50
    assert "dash.report" not in first.text.split("<tbody>")[1]
    cursor = first.text.split("cursor=")[1].split('"')[0].replace("&amp;", "&")
    second = await client.get(f"/ops/runs?state=dead&job=dash.mail&cursor={cursor}", headers=admin)
    assert second.text.count('name="id"') == 10
    bad = await client.get("/ops/runs?state=dead&job=dash.mail&cursor=xyz", headers=admin)
    assert bad.status_code == 400


async def test_s2_runs_page_of_each_state_says_its_order_and_pages_in_it(
    client, backend, ship_clock
):
    """S2: the runs page of each state lists it in that state's order and says which (waiting:
    claim order, priority shown; running: soonest lease first, its lease time shown; dead:
    newest first; completed: newest finished first, J18) and pages on in it; a time range on a
    live state is a 400 that says the range is for finished states, not a 500; on completed
    runs it is on their finish time."""
    from job_helpers import claim_request  # noqa: PLC0415 - tests/support, like the others

    from ship_sqla.jobs import EnqueueRequest  # noqa: PLC0415

    await dead_runs(backend, MAIL, 3)
    low = await backend.enqueue_many(REPORT, [EnqueueRequest({"n": n}) for n in range(55)])
    [high] = await backend.enqueue_many(REPORT, [EnqueueRequest({"top": 1}, priority=7)])
    claimed = await backend.claim(claim_request(REPORT, worker="w", limit=2))
    assert [run.run_id for run in claimed] == [high.run_id, low[0].run_id]
    admin = {"x-user": "admin"}

    waiting = await client.get("/ops/runs?state=waiting&job=dash.report", headers=admin)
    assert waiting.status_code == 200
    assert "In claim order: highest priority first" in waiting.text
    assert "<th>Due</th>" in waiting.text
    body = waiting.text.split("<tbody>")[1]
    assert body.index(low[1].run_id) < body.index(low[2].run_id)
    cursor = waiting.text.split("cursor=")[1].split('"')[0].replace("&amp;", "&")
    rest = await client.get(
        f"/ops/runs?state=waiting&job=dash.report&cursor={cursor}", headers=admin
    )
    assert rest.text.count('name="id"') == 4  # 54 waiting: 50, then 4
    assert low[-1].run_id in rest.text

    running = await client.get("/ops/runs?state=running", headers=admin)
    assert "Soonest lease to lapse first" in running.text
    assert "<th>Lease until</th>" in running.text
    assert running.text.count('name="id"') == 2

    dead = await client.get("/ops/runs?state=dead", headers=admin)
    assert "Newest first." in dead.text
    assert "<th>Finished</th>" in dead.text

    for state in ("waiting", "running"):
        ranged = await client.get(f"/ops/runs?state={state}&since=2026-01-01T00:00", headers=admin)
        assert ranged.status_code == 400
        assert "finished states" in ranged.text
    ranged = await client.get("/ops/runs?state=dead&since=2000-01-01T00:00", headers=admin)
    assert ranged.status_code == 200
    assert ranged.text.count('name="id"') == 3

    # J18: completed runs page newest finished first, and since / until are on the finish time:
    # runs created an hour before the range but finished in it are listed.
    from ship_sqla.kernel import completed  # noqa: PLC0415

    ship_clock.advance(3600)
    await backend.settle([completed(run) for run in claimed])
    since = (ship_clock.now() - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M")
    done = await client.get(f"/ops/runs?state=completed&since={since}", headers=admin)
    assert done.status_code == 200
    assert "Newest finished first." in done.text
    assert "Finished from" in done.text
    assert high.run_id in done.text
    assert low[0].run_id in done.text


async def test_s1_s2_outbox_page_counts_and_redrive_is_audited(ship_connection, ship_clock):
    """S1, S2: the outbox page shows an outbox's pending, claimed and dead messages; a viewer
    gets no re-drive form; a manager's "re-drive all" moves every dead message back to pending
    and the outbox's operations audit it; with no dead message left, the page offers no re-drive
    (nothing to select or re-drive), and still the purge."""
    from sqlalchemy import MetaData  # noqa: PLC0415

    from ship_sqla import create_outbox, create_outbox_operations, ship_outbox_table  # noqa: PLC0415

    metadata = MetaData()
    table = ship_outbox_table(metadata)
    await ship_connection.run_sync(metadata.create_all)
    outbox = create_outbox(database=ship_connection, table=table, clock=ship_clock, max_attempts=1)
    for n in range(3):
        await outbox.enqueue("main", "t", {"n": n})
    for message in await outbox.claim("main", 2, lease=10):
        assert await outbox.fail(message, "boom") == "dead"
    audit = InMemoryAuditLog(ship_clock)
    operations = create_outbox_operations(outbox, authorizer=lambda *_: False, audit=audit)
    dashboard = create_dashboard(
        InMemoryJobBackend(clock=ship_clock),
        authorizer=authorizer,
        actor=actor,
        audit=audit,
        outbox=operations,
        outbox_ids=["main"],
    )
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=dashboard), base_url="http://a")
    viewer = await client.get("/outbox", headers={"x-user": "viewer"})
    assert "pending 1 · claimed 0 · dead 2" in viewer.text
    assert 'method="post"' not in viewer.text
    page = await client.get("/outbox", headers={"x-user": "admin"})
    assert "Re-drive selected" in page.text
    assert "Re-drive all dead" in page.text
    answer = await client.post(
        "/outbox/main/redrive",
        data={"csrf_token": csrf_of(page.text), "action": "all", "next": "/outbox"},
        headers={"x-user": "admin"},
    )
    assert answer.status_code == 303
    after = await client.get("/outbox", headers={"x-user": "admin"})
    assert "pending 3 · claimed 0 · dead 0" in after.text
    assert "No dead messages." in after.text
    assert "Re-drive" not in after.text
    assert "/outbox/main/redrive" not in after.text
    assert "Purge delivered messages older than" in after.text
    [entry] = audit.entries
    assert (entry.actor, entry.operation, entry.count) == ("admin", "outbox.retry_dead_matching", 2)


async def test_s2_every_kind_of_response_carries_the_security_headers_issue_25(client, backend):
    """S2, issue 25 (D7's "no CSP or X-Content-Type-Options"): pages, a polling page's
    fragment, problem pages (400, 403), a refused form (403), a redirect (303), both static
    assets, Starlette's 404 and 405 carry Content-Security-Policy, X-Content-Type-Options,
    Referrer-Policy, X-Frame-Options and Cache-Control; the assets have their exact types (nosniff
    refuses any other)."""
    [run_id] = await dead_runs(backend, MAIL, 1)
    admin = {"x-user": "admin"}
    page = await client.get("/ops/dead", headers=admin)
    token = csrf_of(page.text)
    answers = {
        "page": (page, 200),
        "fragment": (await client.get("/ops/", headers={**admin, "x-ship-fragment": "1"}), 200),
        "bad parameter": (await client.get("/ops/dead?tenant=%00", headers=admin), 400),
        "refused page": (await client.get("/ops/dead", headers={"x-user": "nobody"}), 403),
        "refused form": (await client.post(f"/ops/runs/{run_id}/retry", headers=admin), 403),
        "redirect": (
            await client.post(
                f"/ops/runs/{run_id}/retry",
                data={"csrf_token": token, "next": "/ops/dead"},
                headers=admin,
            ),
            303,
        ),
        "stylesheet": (await client.get(f"/ops/static/{asset_name('dashboard.css')}"), 200),
        "script": (await client.get(f"/ops/static/{asset_name('dashboard.js')}"), 200),
        "unknown asset": (await client.get("/ops/static/evil.js"), 404),
        "unhashed asset": (await client.get("/ops/static/dashboard.css"), 404),
        "health": (await client.get("/ops/health"), 200),
        "json twin": (
            await client.get("/ops/dead", headers={**admin, "accept": "application/json"}),
            200,
        ),
        "unknown page": (await client.get("/ops/no-such-page", headers=admin), 404),
        "wrong method": (await client.get("/ops/dead/bulk", headers=admin), 405),
    }
    assets = ("stylesheet", "script")
    for kind, (answer, status) in answers.items():
        assert answer.status_code == status, (kind, answer.text[:200])
        if kind in assets:  # issue 36: hashed names, cached for good
            assert answer.headers["cache-control"] == IMMUTABLE, kind
            assert missing_security_headers({**answer.headers, "cache-control": "no-store"}) == {}
        else:
            assert missing_security_headers(answer.headers) == {}, kind
    assert answers["stylesheet"][0].headers["content-type"] == "text/css; charset=utf-8"
    assert answers["script"][0].headers["content-type"] == "text/javascript; charset=utf-8"
    assert "localStorage" in answers["script"][0].text


async def test_s2_an_unexpected_500_carries_the_security_headers_too_issue_25(ship_clock):
    """S2, issue 25: the headers are set outside Starlette's error handling, so even the 500 of
    a failing authorizer (a bug of the application's) carries them."""

    def failing(request: Any, permission: str, operation: str) -> bool:
        raise RuntimeError("the application's authorizer failed")

    dashboard = create_dashboard(
        InMemoryJobBackend(clock=ship_clock), authorizer=failing, audit=None
    )
    transport = httpx.ASGITransport(app=dashboard, raise_app_exceptions=False)
    client = httpx.AsyncClient(transport=transport, base_url="http://app")
    answer = await client.get("/dead")
    assert answer.status_code == 500
    assert missing_security_headers(answer.headers) == {}


async def test_s2_no_page_has_inline_style_or_script_so_the_csp_needs_no_unsafe_inline(
    client, backend
):
    """S2, issues 25 and 36: no page (the live overview and workers pages included) holds a
    ``<style>`` element, a ``style=`` attribute, an inline ``<script>`` or an event handler
    attribute: the stylesheet, htmx and the page script load from the dashboard's own static
    assets (hashed names), each tag carrying the response's CSP nonce."""
    [run_id] = await dead_runs(backend, MAIL, 1)
    css = asset_name("dashboard.css")
    for path in (*every_page(run_id), "/ops/dead?tenant=%00"):
        answer = await client.get(path, headers={"x-user": "admin"})
        html = answer.text
        nonce = CSP_PATTERN.fullmatch(answer.headers["content-security-policy"])
        assert nonce is not None, path
        assert f'<link rel="stylesheet" href="/ops/static/{css}" nonce="{nonce[1]}">' in html
        assert "<style" not in html, path
        assert not re.search(r"\sstyle=", html), path
        assert not re.search(r"\son[a-z]+=", html), path
        tags = re.findall(r"<script[^>]*>", html)
        assert tags, path
        for tag in tags:  # a file of the dashboard's, or a data island (never run)
            assert ' src="/ops/static/' in tag or 'type="application/json"' in tag, (path, tag)
            assert f'nonce="{nonce[1]}"' in tag, (path, tag)
    overview = (await client.get("/ops/", headers={"x-user": "admin"})).text
    assert 'hx-trigger="every 10000ms" hx-swap="morph:innerHTML"' in overview
    assert f'src="/ops/static/{asset_name("vendor/htmx-2.0.11.min.js")}"' in overview


async def test_s2_overview_lists_a_failing_job_with_its_dead_count_issue_36(backend, audit):
    """Issue 36: a job whose runs are all dead (nothing waiting or running), and whose
    definition the dashboard was not given, is on the overview with its dead count (a link to
    its dead runs) and marked failing; a job with waiting runs is not marked."""
    await dead_runs(backend, MAIL, 2)
    await backend.enqueue(REPORT, {})
    dashboard = create_dashboard(backend, authorizer=authorizer, actor=actor, audit=audit)
    transport = httpx.ASGITransport(app=dashboard)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        page = (await client.get("/", headers={"x-user": "viewer"})).text
    failing = page[page.index(f">{MAIL.id}<") :].split("</tr>")[0]
    assert f'href="/dead?job={MAIL.id}">2</a>' in failing, failing
    assert "failing" in failing
    waiting = page[page.index(f">{REPORT.id}<") :].split("</tr>")[0]
    assert "failing" not in waiting


async def test_every_page_has_a_json_twin_and_an_unknown_run_is_404_issue_36(client, backend):
    """Issue 36: ``Accept: application/json`` answers every page's JSON twin (its data, the
    health alarms, the same status); an unknown run id answers 404 as a page and as JSON; the
    health route answers without a user; the header's jump box redirects to the run."""
    [run_id] = await dead_runs(backend, MAIL, 1)
    wants_json = {"x-user": "admin", "accept": "application/json"}
    for path in every_page(run_id):
        answer = await client.get(path, headers=wants_json)
        assert answer.status_code == 200, (path, answer.text[:300])
        assert answer.headers["content-type"] == "application/json", path
        twin = answer.json()
        assert twin["status"] == 200, path
        assert "data" in twin, path
        assert twin["health"] == [], path
    run = (await client.get(f"/ops/runs/{run_id}", headers=wants_json)).json()["data"]["run"]
    assert (run["run_id"], run["state"]) == (run_id, "dead")
    dead = (await client.get("/ops/dead", headers=wants_json)).json()["data"]["runs"]
    assert [r["run_id"] for r in dead] == [run_id]
    unknown = await client.get("/ops/runs/no-such-run", headers=wants_json)
    assert unknown.status_code == 404
    assert "No run has the id" in unknown.json()["error"]
    page = await client.get("/ops/runs/no-such-run", headers={"x-user": "admin"})
    assert page.status_code == 404
    assert 'id="not-found"' in page.text
    refused = await client.get(
        "/ops/dead", headers={"x-user": "nobody", "accept": "application/json"}
    )
    assert refused.status_code == 403
    assert refused.json()["status"] == 403
    health = await client.get("/ops/health")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    jump = await client.get(f"/ops/goto?run={run_id}", headers={"x-user": "admin"})
    assert (jump.status_code, jump.headers["location"]) == (303, f"/ops/runs/{run_id}")
