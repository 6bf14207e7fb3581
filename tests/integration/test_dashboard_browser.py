"""The dashboard in headless Chromium (issue 15; S1, S2), served by uvicorn on a free port over
a private PostgreSQL database with real runs: pages render with the data, filters and paging
work, a bulk retry from the browser changes the database (and is audited), a read-only user
sees no action button, and a forged POST is refused. Issue 25: all of it under the dashboard's
Content-Security-Policy, with no violation in the browser's console; the stylesheet applies
and the live-update poll refreshes the page.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them); skipped
without them, unless ``SHIP_SQLA_REQUIRE_BROWSER`` is set (CI): then it fails. Screenshots of
the main pages are saved under ``artifacts/dashboard/`` (copies live in ``docs/images/``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from dashboard_support import (
    MAIL,
    REPORT,
    actor,
    authorizer,
    dashboard_tables,
    dead_runs,
    missing_security_headers,
    served,
)
from job_helpers import claim_request
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import create_async_engine

from ship_sqla import (
    create_audit_log,
    create_dashboard,
    create_job_backend,
    define_job,
)
from ship_sqla._dashboard import _app as dashboard_app
from ship_sqla._jobs._stats import create_job_stats, ship_job_stats_table
from ship_sqla._outbox import create_outbox, create_outbox_operations, ship_outbox_table
from ship_sqla._outbox._stats import outbox_stats_id
from ship_sqla.jobs import HealthBounds, Schedule
from ship_sqla.kernel import completed
from ship_sqla.kernel._audit import AuditEntry
from ship_sqla.kernel._stats import Backlog, StatsRow

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "dashboard"


async def _noop(payload: dict[str, Any]) -> None:
    return None


NIGHTLY = define_job("dash.nightly", _noop, payload=dict, schedule=Schedule(cron="0 3 * * *"))


def _browser_or_skip() -> Any:
    try:
        from selenium import webdriver  # noqa: PLC0415 - optional: only these tests need it
        from selenium.webdriver.chrome.service import Service  # noqa: PLC0415
    except ImportError:
        webdriver = None
    missing = webdriver is None or not (Path(CHROMEDRIVER).exists() and Path(CHROMIUM).exists())
    if missing:
        reason = "selenium, chromium or chromium-driver is not installed"
        if os.environ.get("SHIP_SQLA_REQUIRE_BROWSER"):
            pytest.fail(f"{reason} (SHIP_SQLA_REQUIRE_BROWSER is set: browser tests must run)")
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # CSP reports: console
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
        "--disable-gpu",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@pytest.fixture
async def seeded(ship_engine):
    """Tables, 60 dead runs of dash.mail and 3 of dash.report, 40 completed, 5 waiting runs, a
    schedule and a worker entry."""
    metadata, runs, state, workers, _audit = dashboard_tables()
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(
        database=ship_engine, table=runs, state_table=state, workers_table=workers
    )
    await dead_runs(backend, MAIL, 60)
    await dead_runs(backend, REPORT, 3)
    for i in range(40):
        await backend.enqueue(REPORT, {"done": i})
    claimed = await backend.claim(claim_request(REPORT, worker="w", limit=40))
    await backend.settle([completed(run) for run in claimed])
    for i in range(5):
        await backend.enqueue(MAIL, {"later": i})
    await backend.install_schedules([NIGHTLY])
    async with ship_engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO ship_job_workers (id, host, pid, started_at, last_seen_at, job_ids,"
                " in_flight, draining) VALUES ('worker-1', 'app-1', 4242, now(), now(),"
                " ARRAY['dash.mail', 'dash.report'], 3, false)"
            )
        )
    return backend


def _serve(
    ship_engine_url: str,
    refresh_seconds: float,
    health_bounds: HealthBounds | None = None,
    *,
    console: bool = False,
) -> Any:
    """uvicorn serving the dashboard, mounted at /ops (``dashboard_support.served``); with
    ``console``, also the outbox ``main`` and the job history (issue 36 item 6)."""
    from starlette.applications import Starlette  # noqa: PLC0415 - the dashboard extra
    from starlette.routing import Mount  # noqa: PLC0415

    _, runs, state, workers, audit_table = dashboard_tables()
    engine = create_async_engine(ship_engine_url)
    backend = create_job_backend(
        database=engine,
        table=runs,
        state_table=state,
        workers_table=workers,
        health_bounds=health_bounds,
    )
    audit = create_audit_log(database=engine, table=audit_table)
    extra: dict[str, Any] = {}
    if console:
        outbox = create_outbox(database=engine, table=ship_outbox_table(MetaData()))
        extra = {
            "outbox": create_outbox_operations(outbox, authorizer=lambda *_: True, audit=audit),
            "outbox_ids": ["main"],
            "stats": create_job_stats(engine, ship_job_stats_table(MetaData())),
        }
    dashboard = create_dashboard(
        backend,
        authorizer=authorizer,
        actor=actor,
        audit=audit,
        definitions=[MAIL, REPORT, NIGHTLY],
        refresh_seconds=refresh_seconds,
        **extra,
    )
    return served(Starlette(routes=[Mount("/ops", app=dashboard)]), dispose=engine.dispose)


@pytest.fixture
def server(seeded, ship_engine_url) -> Iterator[str]:
    """The dashboard at /ops, without the live-update poll."""
    with _serve(ship_engine_url, refresh_seconds=0) as base:
        yield base + "/ops"


@pytest.fixture
async def console_seeded(seeded, ship_engine) -> Any:
    """Issue 36 item 6: two of the waiting dash.mail runs running on worker-1, an outbox
    ``main`` with 12 pending messages and 6 hours of its trend (delivered per minute, the
    pending gauge every 5 minutes), and audit entries of three kinds by two users."""
    await seeded.claim(claim_request(MAIL, worker="worker-1", limit=2))
    outbox_table = ship_outbox_table(MetaData())
    stats_table = ship_job_stats_table(MetaData())
    async with ship_engine.begin() as connection:
        await connection.run_sync(outbox_table.metadata.create_all)
        await connection.run_sync(stats_table.metadata.create_all)
    outbox = create_outbox(database=ship_engine, table=outbox_table)
    for n in range(12):
        await outbox.enqueue("main", "orders.created", {"n": n})
    stats = create_job_stats(ship_engine, stats_table)
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    minutes = [now - timedelta(minutes=m) for m in range(360)]
    await stats.add_stats(
        [
            StatsRow(outbox_stats_id("main"), m, completed=40 + (i * 7) % 25)
            for i, m in enumerate(minutes)
        ]
    )
    for i, m in enumerate(minutes[::5]):
        await stats.record_backlog(m, {outbox_stats_id("main"): Backlog(12 + (i * 13) % 40, None)})
    _, _, _, _, audit_table = dashboard_tables()
    audit = create_audit_log(database=ship_engine, table=audit_table)
    async with ship_engine.connect() as connection:
        dead = await connection.scalars(
            text("SELECT id FROM ship_job_runs WHERE state = 'dead' ORDER BY id LIMIT 3")
        )
        picked = list(dead)
    for run_id in picked:
        await audit.record(AuditEntry("alice", "jobs.retry", run_id, 1))
    await audit.record(AuditEntry("bob", "jobs.pause", MAIL.id, 1))
    await audit.record(AuditEntry("bob", "outbox.retry", "main", 2))
    return seeded


@pytest.fixture
def console_server(console_seeded, ship_engine_url) -> Iterator[str]:
    """The dashboard at /ops with the outbox and the job history, without the poll."""
    with _serve(ship_engine_url, refresh_seconds=0, console=True) as base:
        yield base + "/ops"


@pytest.fixture
def polling_server(seeded, ship_engine_url) -> Iterator[str]:
    """The dashboard at /ops, its overview and workers pages polling every 200 ms."""
    with _serve(ship_engine_url, refresh_seconds=0.2) as base:
        yield base + "/ops"


@pytest.fixture
def alarmed_server(seeded, ship_engine_url, monkeypatch) -> Iterator[str]:
    """The dashboard at /ops with a horizon bound every held snapshot has crossed (J22); its
    clock moves BANNER_HEALTH_TTL a page, so each page reads the health afresh (issue 36: the
    banner's reading is kept that long)."""
    ticks = itertools.count()
    monkeypatch.setattr(
        dashboard_app, "monotonic", lambda: next(ticks) * dashboard_app.BANNER_HEALTH_TTL
    )
    with _serve(ship_engine_url, 0, HealthBounds(horizon_alarm=1e-6)) as base:
        yield base + "/ops"


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = _browser_or_skip()
    try:
        yield driver
    finally:
        driver.quit()


def _wait(browser: Any, condition: Any) -> None:
    """Wait (at most 10 s) for a navigation's page: the driver does not always block on it.
    An element the live-update poll replaced meanwhile, or that the page has not drawn yet, is
    looked up again (not an error)."""
    from selenium.common.exceptions import (  # noqa: PLC0415
        NoSuchElementException,
        StaleElementReferenceException,
    )
    from selenium.webdriver.support.ui import WebDriverWait  # noqa: PLC0415

    ignored = (StaleElementReferenceException, NoSuchElementException)
    WebDriverWait(browser, 10, ignored_exceptions=ignored).until(condition)


def _click(browser: Any, css: str) -> None:
    """Click the button of the form ``css`` names, looked up again if the live-update poll
    replaced the page's content between the lookup and the click."""
    from selenium.common.exceptions import StaleElementReferenceException  # noqa: PLC0415
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    def clicked(driver: Any) -> bool:
        try:
            driver.find_element(By.CSS_SELECTOR, css).find_element(By.TAG_NAME, "button").click()
        except StaleElementReferenceException:
            return False
        return True

    _wait(browser, clicked)


def _csp_violations(browser: Any) -> list[str]:
    """The Content-Security-Policy violations Chromium reported to the console since the last
    call (each read of the log drains it)."""
    return [
        entry["message"]
        for entry in browser.get_log("browser")
        if "Content Security Policy" in entry["message"]
    ]


def _as(browser: Any, base: str, user: str) -> None:
    browser.get(base + "/audit")  # any page of the origin, to set its cookie
    browser.add_cookie({"name": "as", "value": user, "path": "/"})


def _shot(browser: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = browser.execute_script("return document.body.scrollHeight")
    browser.set_window_size(1280, min(max(int(height) + 120, 900), 1400))
    assert browser.save_screenshot(str(ARTIFACTS / f"{name}.png"))
    browser.set_window_size(1280, 1000)


async def _states(engine: Any, run_ids: list[str]) -> list[str]:
    async with engine.connect() as connection:
        rows = await connection.execute(
            text("SELECT id, state FROM ship_job_runs WHERE id = ANY(:ids)"), {"ids": run_ids}
        )
        found = dict(rows.all())
    return [found[r] for r in run_ids]


async def test_s2_pages_render_filters_page_and_a_bulk_retry_changes_the_database(
    server, browser, ship_engine
):
    """S1, S2: with real runs, the overview shows the chart, the backlog and the worker; the
    runs page shows waiting runs in claim order, filters by state and job (dead: newest first)
    and pages on; the run page shows the payload and the
    attempt's traceback; on the dead letters, retrying two selected runs and then everything
    matching the job changes the database and is in the audit log."""
    from selenium.webdriver.common.by import By  # noqa: PLC0415
    from selenium.webdriver.support.ui import Select  # noqa: PLC0415

    _as(browser, server, "admin")
    browser.get(server + "/")
    assert browser.find_element(By.CSS_SELECTOR, "svg.chart")
    assert "dash.mail" in browser.page_source
    assert browser.find_element(By.ID, "workers-alive").text.startswith("1 alive")
    _shot(browser, "overview")

    browser.get(server + "/runs")  # waiting by default: in claim order, due time shown
    assert browser.find_element(By.ID, "order").text.startswith("In claim order")
    assert "Due" in [th.text for th in browser.find_elements(By.CSS_SELECTOR, "thead th")]
    assert len(browser.find_elements(By.CSS_SELECTOR, "tbody tr")) == 5
    Select(browser.find_element(By.NAME, "state")).select_by_value("dead")
    browser.find_element(By.NAME, "job").send_keys("dash.mail")
    browser.find_element(By.ID, "filter").click()
    _wait(browser, lambda d: "job=dash.mail" in d.current_url)
    rows = browser.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) == 50, [r.text[:40] for r in rows][:3]
    assert browser.find_element(By.ID, "order").text == "Newest first."
    assert all("dash.mail" in row.text for row in rows)
    _shot(browser, "runs")
    browser.find_element(By.LINK_TEXT, "Next page →").click()
    _wait(browser, lambda d: "cursor=" in d.current_url)
    assert len(browser.find_elements(By.CSS_SELECTOR, "tbody tr")) == 10
    assert "End of the list." in browser.page_source

    browser.find_element(By.CSS_SELECTOR, "tbody tr td a").click()
    _wait(browser, lambda d: "/runs/" in d.current_url)
    assert "Payload" in browser.page_source
    assert "Traceback: line 1" in browser.find_element(By.ID, "attempts").text
    assert browser.find_element(By.CSS_SELECTOR, "#actions button").text == "Retry"
    _shot(browser, "run-detail")

    browser.get(server + "/dead?job=dash.mail")
    boxes = browser.find_elements(By.CSS_SELECTOR, 'input[name="id"]')
    picked = [box.get_attribute("value") for box in boxes[:2]]
    _shot(browser, "dead-letters")
    for box in boxes[:2]:
        box.click()
    browser.find_element(By.ID, "retry-selected").click()
    _wait(browser, lambda d: "done=" in d.current_url)
    assert "Retry: 2 changed, 0 unchanged." in browser.find_element(By.ID, "flash").text
    assert await _states(ship_engine, picked) == ["waiting", "waiting"]

    browser.find_element(By.ID, "retry-all").click()  # issue 36: the count first
    _wait(browser, lambda d: "/bulk/retry" in d.current_url)
    assert "Retry 58 runs" in browser.find_element(By.ID, "preview-count").text
    _shot(browser, "bulk-preview")
    browser.find_element(By.ID, "confirm").click()
    _wait(browser, lambda d: "/bulk/tasks/" in d.current_url)
    _wait(browser, lambda d: "58 changed" in d.find_element(By.ID, "bulk-result").text)
    _shot(browser, "bulk-result")
    browser.find_element(By.LINK_TEXT, "The audit log's entry →").click()
    _wait(browser, lambda d: "/audit" in d.current_url)
    async with ship_engine.connect() as connection:
        dead = await connection.execute(
            text("SELECT job_id, count(*) FROM ship_job_runs WHERE state = 'dead' GROUP BY 1")
        )
        assert dict(dead.all()) == {"dash.report": 3}

    browser.get(server + "/audit")
    audit = browser.find_element(By.TAG_NAME, "tbody").text
    assert "jobs.retry_filtered" in audit
    assert "jobs.retry_many" in audit
    assert "admin" in audit
    assert _csp_violations(browser) == []  # issue 25: every page and action under the CSP


async def test_every_page_renders_without_a_csp_violation_light_and_dark_issue_36(server, browser):
    """Issue 36: every page of the header renders its title under the CSP with the page
    script's local times; the overview also in dark mode (prefers-color-scheme: dark, which the
    stylesheet follows). Each is saved as a screenshot (docs/images/dashboard-*.png)."""
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    _as(browser, server, "admin")
    pages = {
        "workers": ("/workers", "Workers"),
        "consumers": ("/consumers", "Consumers & backfills"),
        "outbox": ("/outbox", "Outbox"),
        "webhooks": ("/webhooks", "Webhooks"),
        "upkeep": ("/upkeep", "Upkeep"),
        "audit": ("/audit", "Audit log"),
        "schedules": ("/schedules", "Schedules"),
        "search": ("/search?job=dash.mail&state=dead&limit=20", "Search"),
    }
    for name, (path, title) in pages.items():
        browser.get(server + path)
        assert browser.find_element(By.TAG_NAME, "h1").text == title, path
        if name not in ("workers", "outbox", "audit"):  # shot with their data: below
            _shot(browser, name)
    browser.get(server + "/schedules")
    shown = browser.find_element(By.CSS_SELECTOR, "tbody time")
    assert shown.text
    assert not shown.text.endswith("UTC")
    assert shown.get_attribute("title").endswith("UTC")
    browser.execute_cdp_cmd(
        "Emulation.setEmulatedMedia",
        {"features": [{"name": "prefers-color-scheme", "value": "dark"}]},
    )
    browser.get(server + "/")
    body = browser.find_element(By.TAG_NAME, "body")
    assert body.value_of_css_property("background-color") == "rgba(18, 20, 23, 1)"
    _shot(browser, "overview-dark")
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
    assert _csp_violations(browser) == []


async def test_s2_a_read_only_user_sees_no_action_buttons(server, browser, ship_engine):
    """S2: ship.jobs:read only: every page renders its data with no button, checkbox or POST
    form (the filter buttons aside), and the header says read only."""
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    _as(browser, server, "viewer")
    for path in ("/", "/runs?state=dead", "/dead", "/schedules", "/workers", "/upkeep", "/audit"):
        browser.get(server + path)
        assert "(read only)" in browser.page_source, path
        assert browser.find_elements(By.CSS_SELECTOR, 'form[method="post"]') == [], path
        assert browser.find_elements(By.CSS_SELECTOR, 'input[type="checkbox"]') == [], path
        buttons = [
            b.get_attribute("id") for b in browser.find_elements(By.CSS_SELECTOR, "main button")
        ]
        assert set(buttons) <= {"filter"}, (path, buttons)
    browser.get(server + "/dead")
    assert "dash.mail" in browser.page_source
    browser.find_element(By.CSS_SELECTOR, "tbody tr td a").click()
    _wait(browser, lambda d: "/runs/" in d.current_url)
    assert browser.find_elements(By.CSS_SELECTOR, "#actions button") == []
    browser.get(server + "/schedules")
    assert "dash.nightly" in browser.page_source
    _shot(browser, "schedules-read-only")
    assert _csp_violations(browser) == []


async def test_s1_cancel_all_of_a_filter_and_upkeep_from_the_browser(server, browser, ship_engine):
    """S1 (issue 33, 36): the runs page of waiting runs offers "Cancel all waiting runs" of its
    filter: clicked, it previews the count; confirmed, every waiting run of dash.mail is
    cancelled (JobOperations.cancel_filtered) and the result page says how many; the Upkeep
    page's cleanup runs; both under the CSP, both in the audit log."""
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    _as(browser, server, "admin")
    browser.get(server + "/runs?state=waiting&job=dash.mail")
    button = browser.find_element(By.ID, "cancel-all")
    assert button.text == "Cancel all waiting runs of job dash.mail…"
    button.click()
    _wait(browser, lambda d: "/bulk/cancel" in d.current_url)
    assert "Cancel 5 runs" in browser.find_element(By.ID, "preview-count").text
    browser.find_element(By.ID, "confirm").click()
    _wait(browser, lambda d: "/bulk/tasks/" in d.current_url)
    result = "Cancel: 5 changed, 0 unchanged."
    _wait(browser, lambda d: result in d.find_element(By.ID, "bulk-result").text)
    async with ship_engine.connect() as connection:
        waiting = await connection.execute(
            text("SELECT count(*) FROM ship_job_runs WHERE state = 'waiting'")
        )
        assert waiting.scalar() == 0

    browser.get(server + "/upkeep")
    assert "dash.report" in browser.find_element(By.TAG_NAME, "tbody").text
    _click(browser, 'form[action="/ops/upkeep/cleanup"]')
    _wait(browser, lambda d: "done=" in d.current_url)
    assert "Cleanup:" in browser.find_element(By.ID, "flash").text

    browser.get(server + "/audit")
    audit = browser.find_element(By.TAG_NAME, "tbody").text
    assert "jobs.cancel_filtered" in audit
    assert "jobs.cleanup" in audit
    assert _csp_violations(browser) == []


async def test_s2_a_forged_post_from_the_browser_is_refused(server, browser, ship_engine):
    """S2: a form posted without the session's CSRF token (as another site's page would) is
    refused with 403 and changes nothing, even for a manager."""
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    async with ship_engine.connect() as connection:
        run_id = (
            await connection.execute(
                text("SELECT id FROM ship_job_runs WHERE state = 'dead' ORDER BY id LIMIT 1")
            )
        ).scalar_one()
    _as(browser, server, "admin")
    browser.get(server + "/dead")
    for token in ("", "f" * 64):
        browser.execute_script(
            "const f = document.createElement('form'); f.method = 'post';"
            " f.action = arguments[0];"
            " const t = document.createElement('input'); t.name = 'csrf_token';"
            " t.value = arguments[1]; f.appendChild(t); document.body.appendChild(f); f.submit();",
            f"{server}/runs/{run_id}/retry",
            token,
        )
        _wait(browser, lambda d: "CSRF" in d.page_source)
        assert "CSRF" in browser.find_element(By.TAG_NAME, "body").text
    assert await _states(ship_engine, [run_id]) == ["dead"]


async def test_s2_pages_work_under_the_content_security_policy_issue_25(
    polling_server, browser, ship_engine
):
    """S2, issue 25: under the dashboard's Content-Security-Policy (no inline style or script
    allowed) the stylesheet applies, the live-update poll (a static script) refreshes the
    overview when a worker registers, a pause posts and redirects back, and the console reports
    no violation; content the policy forbids (an image from another origin) is refused and
    reported, so the check above would have seen a violation."""
    import httpx  # noqa: PLC0415 - the headers of the page the browser gets
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    async with httpx.AsyncClient() as client:
        answer = await client.get(polling_server + "/", headers={"x-user": "admin"})
    assert missing_security_headers(answer.headers) == {}
    _as(browser, polling_server, "admin")
    browser.execute_cdp_cmd("Network.clearBrowserCache", {})  # a first load: nothing cached
    browser.get(polling_server + "/")
    header = browser.find_element(By.TAG_NAME, "header")
    assert header.value_of_css_property("background-color") == "rgba(38, 50, 56, 1)"
    assert browser.find_element(By.ID, "workers-alive").text.startswith("1 alive")
    _wait(browser, lambda d: d.execute_script("return !!(window.htmx && window.uPlot)"))
    # Issue 36: the first load, every asset included, is at most 120 KB on the wire (gzip).
    transferred = browser.execute_script(
        "return performance.getEntriesByType('navigation').concat("
        "performance.getEntriesByType('resource')).reduce((n, e) => n + e.transferSize, 0)"
    )
    assert 0 < transferred <= 120 * 1024, transferred
    print(f"first load of the overview: {transferred} bytes transferred")  # noqa: T201
    async with ship_engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO ship_job_workers (id, host, pid, started_at, last_seen_at, job_ids,"
                " in_flight, draining) VALUES ('worker-2', 'app-2', 4343, now(), now(),"
                " ARRAY['dash.mail'], 0, false)"
            )
        )
    _wait(browser, lambda d: d.find_element(By.ID, "workers-alive").text.startswith("2 alive"))
    # Issue 36: "/" focuses the jump box; the header's toggle shows the times in UTC.
    browser.find_element(By.TAG_NAME, "body").send_keys("/")
    assert browser.switch_to.active_element.get_attribute("id") == "jump"
    browser.find_element(By.TAG_NAME, "h1").click()
    browser.find_element(By.ID, "tz-toggle").click()
    _wait(browser, lambda d: d.find_element(By.ID, "tz-toggle").text == "Times: UTC")

    _click(browser, 'form[action="/ops/jobs/dash.mail/pause"]')
    _wait(browser, lambda d: "Pause dash.mail: done." in d.find_element(By.ID, "flash").text)
    async with ship_engine.connect() as connection:
        paused = await connection.execute(
            text("SELECT job_id FROM ship_job_state WHERE job_id = 'dash.mail#paused'")
        )
        assert paused.scalars().all() == ["dash.mail#paused"]
    assert _csp_violations(browser) == []

    browser.execute_script(
        "const i = document.createElement('img'); i.src = 'https://example.invalid/x.png';"
        " document.body.appendChild(i);"
    )
    _wait(browser, lambda d: any("img-src" in m for m in _csp_violations(d)))


_TRANSFERRED = (
    "return performance.getEntriesByType('navigation').concat("
    "performance.getEntriesByType('resource')).reduce((n, e) => n + e.transferSize, 0)"
)


async def test_issue_36_the_first_load_of_each_page_with_every_asset_is_at_most_120_kb(
    polling_server, browser
):
    """S2, issue 36: each page's first load (a cleared cache: the HTML and every asset it
    loads, the charts' too) is at most 120 KB on the wire (gzip): the overview (above) and the
    pages added since, the job page with its charts, the error groups, the search, a run's
    page."""
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    _as(browser, polling_server, "admin")
    browser.get(polling_server + "/dead")
    run_href = browser.find_element(By.CSS_SELECTOR, 'tbody a[href*="/runs/"]').get_attribute(
        "href"
    )
    pages = [
        polling_server + "/",
        polling_server + "/jobs/dash.mail?range=7d",
        polling_server + "/errors",
        polling_server + "/search?job=dash.mail&state=dead&limit=200",
        run_href,
    ]
    for url in pages:
        browser.execute_cdp_cmd("Network.clearBrowserCache", {})
        browser.get(url)
        _wait(browser, lambda d: d.execute_script("return document.readyState") == "complete")
        transferred = browser.execute_script(_TRANSFERRED)
        assert 0 < transferred <= 120 * 1024, (url, transferred)
        print(f"first load of {url}: {transferred} bytes transferred")  # noqa: T201


async def test_j22_the_health_banner_shows_while_a_snapshot_is_held(
    alarmed_server, browser, ship_engine
):
    """J22: while a REPEATABLE READ transaction holds a snapshot past the bound, every page
    shows the database-health banner naming its holder (pid, application name; never its
    query), styled under the Content-Security-Policy; once it ends the banner is gone."""
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    _as(browser, alarmed_server, "admin")
    browser.get(alarmed_server + "/")
    assert not browser.find_elements(By.ID, "health-banner")
    async with ship_engine.connect() as plain:
        holder = await plain.execution_options(isolation_level="REPEATABLE READ")
        await holder.execute(text("SET application_name = 'nightly-report'"))
        await holder.execute(text("SELECT 'never-shown', count(*) FROM pg_class"))
        pid = (await holder.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        browser.get(alarmed_server + "/runs?state=dead")
        banner = browser.find_element(By.ID, "health-banner")
        assert f"pid {pid}" in banner.text
        assert "nightly-report" in banner.text
        assert "never-shown" not in browser.page_source
        assert banner.value_of_css_property("background-color") == "rgba(255, 235, 238, 1)"
        _shot(browser, "health-banner")
        await holder.rollback()
    browser.get(alarmed_server + "/")
    assert not browser.find_elements(By.ID, "health-banner")
    assert _csp_violations(browser) == []


async def test_issue_36_schedule_pause_asks_first_run_now_and_the_run_page_in_the_browser(
    server, browser, ship_engine
):
    """Issue 36: on the Schedules page "Pause…" opens the confirmation (no script needed),
    whose button pauses the job (shown on the list, audited); "Run now" adds one run of the
    scheduled job; a dead run's page shows its attempt timeline with local times. Screenshots:
    schedule-pause-confirm, run."""
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    _as(browser, server, "admin")
    browser.get(server + "/schedules")
    browser.find_element(By.LINK_TEXT, "Pause…").click()
    _wait(browser, lambda d: "confirm=pause" in d.current_url)
    assert browser.find_element(By.ID, "pause-confirm").is_displayed()
    _shot(browser, "schedule-pause-confirm")
    _click(browser, "#pause-confirm form")
    _wait(browser, lambda d: "done=" in d.current_url)
    browser.get(server + "/schedules")
    assert "paused since" in browser.find_element(By.ID, "schedules").text
    _click(browser, 'form[action$="/run-now"]')
    _wait(browser, lambda d: "done=" in d.current_url)
    async with ship_engine.connect() as connection:
        runs = await connection.scalar(
            text("SELECT count(*) FROM ship_job_runs WHERE job_id = 'dash.nightly'")
        )
        dead = await connection.scalar(
            text("SELECT id FROM ship_job_runs WHERE state = 'dead' ORDER BY id LIMIT 1")
        )
    assert runs == 1
    browser.get(server + "/audit")
    audit = browser.find_element(By.TAG_NAME, "main").text
    assert "jobs.pause" in audit
    assert "jobs.run_now" in audit
    browser.get(f"{server}/runs/{dead}")
    attempt = browser.find_element(By.CSS_SELECTOR, "#attempts li time")
    assert attempt.text
    assert not attempt.text.endswith("UTC")
    _shot(browser, "run")
    assert _csp_violations(browser) == []


async def test_issue_36_the_live_overview_morphs_the_stream_in_and_pauses_while_hidden(
    server, browser, ship_engine
):
    """Issue 36 item 3: the header's Refresh form (a plain GET) sets "live"; the overview then
    morphs in its server-sent-events stream: a worker registering shows within the test's wait
    while the focused Pause button keeps the focus (a morphing swap), and "updated N s ago"
    shows; the stream is closed while the tab is hidden and opened again (and swapping) when it
    shows; a reading that fails keeps the last good content under a notice naming the failure
    and its time while the stamp goes on growing, and the next good one clears it (screenshot:
    overview-live-problem); no
    Content-Security-Policy violation."""
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    _as(browser, server, "admin")
    browser.get(server + "/refresh?every=live&next=/ops/")
    _wait(browser, lambda d: d.execute_script("return !!window.htmx"))
    assert browser.find_element(By.ID, "refresh-every").get_attribute("value") == "live"
    source = "return document.getElementById('overview-live')['htmx-internal-data'].sseEventSource"
    _wait(browser, lambda d: d.execute_script(source + ".readyState") == 1)
    pause = 'form[action="/ops/jobs/dash.mail/pause"] button'
    browser.execute_script(f"document.querySelector('{pause}').focus()")
    async with ship_engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO ship_job_workers (id, host, pid, started_at, last_seen_at, job_ids,"
                " in_flight, draining) VALUES ('worker-3', 'app-3', 4444, now(), now(),"
                " ARRAY['dash.mail'], 0, false)"
            )
        )
    _wait(browser, lambda d: d.find_element(By.ID, "workers-alive").text.startswith("2 alive"))
    focused = browser.execute_script(
        f"return document.activeElement === document.querySelector('{pause}')"
    )
    assert focused
    _wait(browser, lambda d: "s ago" in d.find_element(By.ID, "live-stamp").text)
    hide = (
        "Object.defineProperty(document, 'hidden', {value: %s, configurable: true});"
        " document.dispatchEvent(new Event('visibilitychange'));"
    )
    browser.execute_script(hide % "true")
    assert browser.execute_script(source + ".readyState") == 2  # closed
    browser.execute_script(hide % "false")
    _wait(browser, lambda d: d.execute_script(source + ".readyState") == 1)
    async with ship_engine.begin() as connection:  # the reopened stream swaps again
        await connection.execute(
            text(
                "INSERT INTO ship_job_workers (id, host, pid, started_at, last_seen_at, job_ids,"
                " in_flight, draining) VALUES ('worker-4', 'app-4', 4545, now(), now(),"
                " ARRAY['dash.mail'], 0, false)"
            )
        )
    _wait(browser, lambda d: d.find_element(By.ID, "workers-alive").text.startswith("3 alive"))
    # A reading that fails (here the workers table is away) keeps the page under a notice; the
    # next good reading clears it.
    async with ship_engine.begin() as connection:
        await connection.execute(text("ALTER TABLE ship_job_workers RENAME TO away_workers"))
    _wait(browser, lambda d: "Live updates failed" in d.find_element(By.ID, "live-problem").text)
    assert "The figures below are from" in browser.find_element(By.ID, "live-problem").text
    assert browser.find_element(By.ID, "workers-alive").text.startswith("3 alive")
    # The stamp goes on growing from the last good reading while failed ones arrive.
    _wait(browser, lambda d: int(d.find_element(By.ID, "live-stamp").text.split()[1]) >= 2)
    assert browser.find_elements(By.ID, "live-problem")
    _shot(browser, "overview-live-problem")
    async with ship_engine.begin() as connection:
        await connection.execute(text("ALTER TABLE away_workers RENAME TO ship_job_workers"))
    _wait(browser, lambda d: not d.find_elements(By.ID, "live-problem"))
    assert _csp_violations(browser) == []


async def test_issue_36_workers_outbox_and_audit_pages_in_the_browser(console_server, browser):
    """Issue 36 item 6 (S1, S2): the workers page's in-flight link opens the search of that
    worker's running runs (the two it holds); the outbox page draws its delivered and pending
    trend charts; the audit page filters by who and what, keeps its form on a bad date with
    the message, and an entry's link opens its run. Screenshots: workers, outbox, audit,
    audit-bad-input."""
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    _as(browser, console_server, "admin")
    browser.get(console_server + "/workers")
    _shot(browser, "workers")
    browser.find_element(By.LINK_TEXT, "its running runs →").click()
    _wait(browser, lambda d: "worker=worker-1" in d.current_url)
    rows = browser.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) == 2, [r.text[:60] for r in rows]
    assert all("running" in row.text for row in rows)

    browser.get(console_server + "/outbox")
    trend = browser.find_element(By.ID, "trend-main")
    assert len(trend.find_elements(By.CSS_SELECTOR, "svg.chart")) == 2
    assert "delivered" in trend.text
    assert browser.find_elements(By.CSS_SELECTOR, "polyline.line-pending")
    _shot(browser, "outbox")

    browser.get(console_server + "/audit")
    browser.find_element(By.NAME, "actor").send_keys("alice")
    browser.find_element(By.NAME, "operation").send_keys("jobs.retry")
    browser.find_element(By.ID, "filter").click()
    _wait(browser, lambda d: "actor=alice" in d.current_url)
    rows = browser.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) == 3, [r.text[:60] for r in rows]
    assert all("alice" in row.text and "jobs.retry" in row.text for row in rows)
    _shot(browser, "audit")
    browser.execute_script(
        "document.querySelector('input[name=since]').type = 'text';"
        "document.querySelector('input[name=since]').value = 'yesterday';"
    )
    browser.find_element(By.ID, "filter").click()
    _wait(browser, lambda d: "since=yesterday" in d.current_url)
    assert browser.find_element(By.ID, "problem").get_attribute("data-parameter") == "since"
    assert browser.find_element(By.NAME, "actor").get_attribute("value") == "alice"
    _shot(browser, "audit-bad-input")
    browser.get(console_server + "/audit?actor=alice")
    browser.find_element(By.LINK_TEXT, "run").click()
    _wait(browser, lambda d: "/runs/" in d.current_url)
    assert "Payload" in browser.page_source
    assert _csp_violations(browser) == []
