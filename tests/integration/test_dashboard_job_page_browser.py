"""The job page and the error groups in headless Chromium (issue 36, items 2 and 6; S1, S2):
the job page's charts (uPlot over its SVG, the SVG lines) under the Content-Security-Policy,
the range picker, and "retry all dead in this group" from the Errors page through its
confirmation page to the database, audited. Screenshots: ``artifacts/dashboard/job.png``,
``errors.png``, ``errors-retry.png`` (copies in docs/images/ as ``dashboard-*.png``). Skipped
without Chromium, like test_dashboard_browser.py, whose fixtures and helpers it shares."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from dashboard_support import MAIL, REPORT, actor, authorizer, dashboard_tables, served
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import create_async_engine
from test_dashboard_browser import (  # the shared fixtures and helpers
    NIGHTLY,
    _as,
    _click,
    _csp_violations,
    _shot,
    _wait,
    browser,
    seeded,
)

from ship_sqla import (
    create_audit_log,
    create_dashboard,
    create_job_backend,
    create_job_stats,
    ship_job_stats_table,
)
from ship_sqla.kernel._stats import StatsRow, minute_of

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["browser", "seeded"]


async def _history(engine: Any) -> None:
    """Two hours of dash.mail's minutes: completions, some retries and deaths, run times and
    waits, a backlog sample every minute."""
    table = ship_job_stats_table(MetaData())
    async with engine.begin() as connection:
        await connection.run_sync(table.metadata.create_all)
    now = minute_of(datetime.now(UTC))
    rows = [
        StatsRow(
            MAIL.id,
            now - timedelta(minutes=i),
            completed=20 + i % 17,
            retried=i % 5,
            dead=1 if i % 9 == 0 else 0,
            run_hist=(0,) * (20 + i % 6) + (3, 5, 1),
            wait_hist=(0,) * (10 + i % 4) + (4, 2),
        )
        for i in range(120)
    ]
    await create_job_stats(engine, table).add_stats(rows)
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "UPDATE ship_job_stats SET waiting = 5 + (extract(minute FROM minute)::int % 7),"
                " oldest_due_age = extract(minute FROM minute)::int % 11"
            )
        )


@pytest.fixture
async def history(seeded, ship_engine) -> Any:
    await _history(ship_engine)
    return seeded


@pytest.fixture
def stats_server(history, ship_engine_url) -> Iterator[str]:
    """The dashboard at /ops with the stats table (no live-update poll)."""
    from starlette.applications import Starlette  # noqa: PLC0415 - the dashboard extra
    from starlette.routing import Mount  # noqa: PLC0415

    _, runs, state, workers, audit_table = dashboard_tables()
    engine = create_async_engine(ship_engine_url)
    backend = create_job_backend(
        database=engine, table=runs, state_table=state, workers_table=workers
    )
    dashboard = create_dashboard(
        backend,
        authorizer=authorizer,
        actor=actor,
        audit=create_audit_log(database=engine, table=audit_table),
        definitions=[MAIL, REPORT, NIGHTLY],
        refresh_seconds=0,
        stats=create_job_stats(engine, ship_job_stats_table(MetaData())),
    )
    with served(Starlette(routes=[Mount("/ops", app=dashboard)]), dispose=engine.dispose) as base:
        yield base + "/ops"


async def test_s2_job_page_charts_and_error_group_retry_in_the_browser(
    stats_server, browser, ship_engine
) -> None:
    """S1, S2: the overview links a job to its page; the job page draws its throughput with
    uPlot (a canvas) and its other charts as SVG, picks a range, and shows its errors; the
    Errors page's "retry all dead in this group" opens a confirmation page with the count and,
    confirmed, retries the group's 60 dead runs (the database changes; the audit log names it).
    No Content-Security-Policy violation throughout."""
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    _as(browser, stats_server, "admin")
    browser.get(stats_server + "/")
    browser.find_element(By.LINK_TEXT, "dash.mail").click()
    _wait(browser, lambda d: d.find_element(By.TAG_NAME, "h1").text == "Job dash.mail")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".uplot-host canvas"))
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg.chart polyline")) >= 4
    assert "unflushed interval" in browser.find_element(By.ID, "loss-note").text
    browser.find_element(By.ID, "range-picker").find_element(By.LINK_TEXT, "6h").click()
    _wait(browser, lambda d: d.current_url.endswith("range=6h"))
    _shot(browser, "job")
    browser.get(stats_server + "/errors")
    _wait(browser, lambda d: d.find_element(By.ID, "error-groups"))
    _shot(browser, "errors")
    row = next(
        r
        for r in browser.find_elements(By.CSS_SELECTOR, "#error-groups tbody tr")
        if "dash.mail" in r.text
    )
    row.find_element(By.PARTIAL_LINK_TEXT, "Retry all dead in this group").click()
    _wait(browser, lambda d: "Retry 60 runs" in d.find_element(By.ID, "preview-count").text)
    _shot(browser, "errors-retry")
    _click(browser, "#confirm-form")
    _wait(browser, lambda d: "Retry: 60 changed" in d.page_source)
    async with ship_engine.connect() as connection:
        dead = await connection.execute(
            text("SELECT count(*) FROM ship_job_runs WHERE job_id = 'dash.mail' AND state = 'dead'")
        )
        assert dead.scalar() == 0
    browser.get(stats_server + "/audit")
    assert "jobs.retry_filtered" in browser.page_source
    assert _csp_violations(browser) == []
