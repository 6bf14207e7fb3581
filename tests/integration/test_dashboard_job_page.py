"""The per-job page, the error groups and the overview's history chart (issue 36, items 2 and 6)
on real PostgreSQL, through the ASGI application (S1: the group's retry is one permissioned,
audited operation, confirmed first; S2: every read bounded: the job page's history one range of
the stats table's primary key, the groups at most 2,000 dead runs read by the dead-letters
page's statement, the bound shown on the page)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from dashboard_support import (
    MAIL,
    REPORT,
    actor,
    authorizer,
    dashboard_tables,
    dead_runs,
)
from job_helpers import claim_request
from sqlalchemy import MetaData, text

from ship_sqla import (
    create_audit_log,
    create_dashboard,
    create_job_backend,
    create_job_stats,
    ship_job_stats_table,
)
from ship_sqla._jobs._sql.stats import READ_STATS_BUCKETS
from ship_sqla.kernel import failed
from ship_sqla.kernel._error_groups import ERROR_GROUP_SCAN
from ship_sqla.kernel._stats import StatsRow, minute_of

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

ADMIN = {"x-user": "admin"}
VIEWER = {"x-user": "viewer"}
JSON = {"accept": "application/json"}


async def _fail(backend: Any, job: Any, error: str, count: int) -> list[str]:
    """``count`` runs of ``job`` dead with ``error`` (its numbers vary per run)."""
    for i in range(count):
        await backend.enqueue(job, {"i": i})
    claimed = await backend.claim(claim_request(job, worker="w", limit=count))
    outcomes = await backend.settle(
        [failed(run, error.format(n=i * 7919), retry_at=None) for i, run in enumerate(claimed)]
    )
    assert set(outcomes) == {"dead"}
    return [run.run_id for run in claimed]


@pytest.fixture
async def setup(ship_engine: AsyncEngine) -> dict[str, Any]:
    metadata, runs, state, workers, audit_table = dashboard_tables()
    stats_table = ship_job_stats_table(MetaData())
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await connection.run_sync(stats_table.metadata.create_all)
    backend = create_job_backend(
        database=ship_engine, table=runs, state_table=state, workers_table=workers
    )
    audit = create_audit_log(database=ship_engine, table=audit_table)
    stats = create_job_stats(ship_engine, stats_table)

    def client(*, with_stats: bool) -> httpx.AsyncClient:
        app = create_dashboard(
            backend,
            authorizer=authorizer,
            actor=actor,
            audit=audit,
            definitions=[MAIL],
            stats=stats if with_stats else None,
            refresh_seconds=0,
        )
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app")

    return {"backend": backend, "stats": stats, "client": client, "engine": ship_engine}


async def test_s2_job_page_shows_definition_counts_history_errors_and_dead(setup) -> None:
    """S2: /jobs/ID shows the definition given (retries, limits), the runs now, the history of
    the range picked (exact totals of the stored minutes, the loss note), the top error groups
    and the newest dead runs with links; its JSON twin carries the same; an id no job has is a
    404 as a page and as JSON; a bad range is a 400 naming the fix."""
    backend, stats = setup["backend"], setup["stats"]
    dead = await _fail(backend, MAIL, "ValueError: order {n} has no address", 3)
    now = minute_of(datetime.now(UTC))
    await stats.add_stats(
        [
            StatsRow(
                MAIL.id,
                now - timedelta(minutes=i),
                completed=10,
                retried=2,
                dead=1,
                run_hist=(0, 5, 5),
                wait_hist=(3,),
            )
            for i in range(5)
        ]
        + [StatsRow(MAIL.id, now - timedelta(hours=3), completed=100)]  # outside 1h, inside 6h
    )
    async with setup["client"](with_stats=True) as client:
        page = await client.get("/jobs/dash.mail", headers=ADMIN)
        assert page.status_code == 200, page.text
        html = page.text
        assert "RetryPolicy(attempts=1" in html
        assert "Concurrency(max=1000" in html
        assert "50 completed" in html
        assert "10 retried attempts" in html
        assert "5 dead" in html
        assert 'id="loss-note"' in html
        assert "unflushed interval" in html
        assert "ValueError" in html
        assert "order &lt;n&gt; has no address" in html
        for run_id in dead:
            assert f'href="/runs/{run_id}"' in html
        assert html.count("<svg") >= 5  # throughput, run time, wait, failure rate, backlog
        wide = (await client.get("/jobs/dash.mail?range=6h", headers=ADMIN)).text
        assert "150 completed" in wide
        twin = (await client.get("/jobs/dash.mail?range=6h", headers={**ADMIN, **JSON})).json()
        assert twin["status"] == 200
        assert twin["data"]["series"]["total"]["completed"] == 150
        assert twin["data"]["top_errors"]["groups"][0]["count"] == 3
        assert {r["run_id"] for r in twin["data"]["recent_dead"]} == set(dead)
        missing = await client.get("/jobs/dash.nobody", headers=ADMIN)
        assert missing.status_code == 404
        assert 'id="not-found"' in missing.text
        missing_json = await client.get("/jobs/dash.nobody", headers={**ADMIN, **JSON})
        assert missing_json.status_code == 404
        assert "error" in missing_json.json()
        bad = await client.get("/jobs/dash.mail?range=2h", headers=ADMIN)
        assert bad.status_code == 400
        assert "1h, 6h, 24h, 7d" in bad.text


async def test_s2_job_page_without_a_stats_table_says_how_to_enable_it(setup) -> None:
    """S2: no stats table is not an error: the page says how to enable the history; a job
    known only by its runs (no definition) is shown, saying how to give its definition."""
    await dead_runs(setup["backend"], REPORT, 1)
    async with setup["client"](with_stats=False) as client:
        page = await client.get("/jobs/dash.report", headers=ADMIN)
        assert page.status_code == 200
        assert 'id="stats-off"' in page.text
        assert "ship_job_stats_table" in page.text
        assert 'id="no-definition"' in page.text
        twin = (await client.get("/jobs/dash.report", headers={**ADMIN, **JSON})).json()
        assert twin["data"]["stats"] is False
        assert twin["data"]["series"] is None
        overview = await client.get("/", headers=ADMIN)
        assert 'href="/jobs/dash.report"' in overview.text  # the overview links to it
        assert 'id="history-totals"' not in overview.text  # the per-request chart stays


async def test_s2_overview_chart_comes_from_the_stats_table(setup) -> None:
    """S2: with a stats table the overview's chart is its history, summed over the jobs
    listed (exact, not capped), with the loss note; its JSON twin carries the series."""
    await dead_runs(setup["backend"], MAIL, 1)
    now = minute_of(datetime.now(UTC))
    await setup["stats"].add_stats(
        [StatsRow(MAIL.id, now, completed=700, dead=1), StatsRow(REPORT.id, now, completed=5)]
    )
    await setup["backend"].enqueue(REPORT, {})
    async with setup["client"](with_stats=True) as client:
        page = await client.get("/", headers=ADMIN)
        assert 'id="history-totals"' in page.text
        assert "705 completed" in page.text
        assert 'id="loss-note"' in page.text
        twin = (await client.get("/", headers={**ADMIN, **JSON})).json()
        assert twin["data"]["history"]["series"]["total"]["completed"] == 705


async def test_s1_s2_error_groups_and_retry_all_dead_in_a_group_confirmed_and_audited(
    setup,
) -> None:
    """S1, S2: /errors groups dead runs by job, exception type and normalised message (the
    numbers differ per run: one group), with counts, first/last seen, an example link and the
    read's bound; "retry all dead in this group" is a GET confirmation page (the preview's
    count, no change) whose POST (CSRF) retries exactly that group's dead runs through
    retry_filtered, audited with the filter and the count. A viewer sees no form."""
    backend, engine = setup["backend"], setup["engine"]
    lost = await _fail(backend, MAIL, "KeyError: 'customer {n}'", 2)
    timeouts = await _fail(backend, MAIL, "TimeoutError: after {n} ms", 3)
    async with setup["client"](with_stats=False) as client:
        page = await client.get("/errors", headers=ADMIN)
        assert page.status_code == 200
        assert f"newest {ERROR_GROUP_SCAN} dead runs" in page.text
        rows = re.findall(r"<tr><td><a href=\"/jobs/dash.mail\">.*?</tr>", page.text, re.DOTALL)
        assert len(rows) == 2
        assert "TimeoutError" in rows[0]
        assert "<td>3</td>" in rows[0]
        assert "KeyError" in rows[1]
        assert "<td>2</td>" in rows[1]
        confirm = re.search(r'href="(/bulk/retry\?[^"]+)"', rows[0])
        assert confirm is not None
        link = confirm.group(1).replace("&amp;", "&")
        assert "post" not in (await client.get("/errors", headers=VIEWER)).text
        preview = await client.get(link, headers=ADMIN)
        assert preview.status_code == 200
        assert "Retry 3 runs" in preview.text
        async with engine.connect() as connection:
            states = await connection.execute(
                text("SELECT count(*) FROM ship_job_runs WHERE state = 'dead'")
            )
            assert states.scalar() == 5  # the preview changed nothing
        form = preview.text[preview.text.index('id="confirm-form"') :]
        form = form[: form.index("</form>")]
        fields: dict[str, list[str]] = {}
        for name, value in re.findall(r'name="([^"]+)" value="([^"]*)"', form):
            fields.setdefault(name, []).append(value.replace("&#43;", "+").replace("&amp;", "&"))
        assert fields["job"] == [MAIL.id]
        assert fields["state"] == ["dead"]
        done = await client.post("/bulk/retry", data=fields, headers=ADMIN)
        assert done.status_code == 303, done.text
        result = await client.get(done.headers["location"], headers=ADMIN)
        assert "Retry: 3 changed" in result.text
        for run_id in timeouts:
            assert (await backend.admin.get_run(run_id)).state == "waiting"
        for run_id in lost:
            assert (await backend.admin.get_run(run_id)).state == "dead"
        forged = await client.post(
            "/bulk/retry", data={"job": MAIL.id, "token": fields["token"][0]}, headers=ADMIN
        )
        assert forged.status_code == 403
        twin = (await client.get("/errors", headers={**ADMIN, **JSON})).json()
        assert [g["count"] for g in twin["data"]["groups"]] == [2]
        audit = (await client.get("/audit", headers={**ADMIN, **JSON})).json()
    entries = audit["data"]["entries"] if isinstance(audit["data"], dict) else audit["data"]
    assert any("retry_filtered" in str(entry) for entry in entries)


async def test_s2_overview_history_is_one_primary_key_read_of_the_jobs_listed(setup) -> None:
    """S2: the overview's history is one statement (``READ_STATS_BUCKETS``) over a week of
    minutes of three jobs: a range of ``<stats>_pkey`` per job asked, never a sequential scan;
    it sums only the jobs and minutes asked, per 5-minute bucket (72 rows, not 720 minutes)."""
    engine = setup["engine"]
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO ship_job_stats (job_id, minute, completed)"
                " SELECT j, timestamptz '2030-01-01 00:00+00' + g * interval '1 minute', 1"
                " FROM generate_series(0, 7 * 24 * 60 - 1) g, unnest(ARRAY['a', 'b', 'c']) j"
            )
        )
        await connection.execute(text("ANALYZE ship_job_stats"))
    start = datetime(2030, 1, 7, 18, tzinfo=UTC)
    found = await setup["stats"].read_stats_buckets(
        ["b", "c"], start, start + timedelta(hours=6), timedelta(minutes=5)
    )
    assert len(found) == 72
    assert {row.completed for row in found} == {2 * 5}
    assert found[0].minute == start
    async with engine.connect() as connection:
        plan = await connection.execute(
            text(
                "EXPLAIN (FORMAT TEXT) "
                + READ_STATS_BUCKETS.replace("{stats}", "ship_job_stats")
                .replace("CAST(:job_ids AS text[])", "ARRAY['b', 'c']")
                .replace(":start", "timestamptz '2030-01-07 18:00+00'")
                .replace(":end", "timestamptz '2030-01-08 00:00+00'")
                .replace(":step", "300")
            )
        )
        text_plan = "\n".join(str(row[0]) for row in plan)
    assert "ship_job_stats_pkey" in text_plan, text_plan
    assert "Seq Scan" not in text_plan, text_plan
