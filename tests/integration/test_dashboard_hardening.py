"""The dashboard's answers to bad input, over real HTTP (issue 25; S1, S2).

D5 of the 2026-12-02 trials: ``GET /dead?tenant=%00`` escaped as an unhandled
``TenantViolationError``: a 500 ``text/plain`` and a reset keep-alive connection, on a mounted
dashboard and on ``ship-sqla dashboard`` alike. Now every bad request parameter of every page
(tenant, job, state, cursor, creation-time range, audit position, run id) is a 400 HTML problem
page naming the parameter and carrying the library's error code and fix, and the server keeps
the connection open; a bad value in an action is refused with the library's code and changes
nothing (S2). Each is served by uvicorn over PostgreSQL, requests go over one HTTP/1.1
keep-alive connection (``dashboard_support.exchange`` fails on a closed one), and every answer
carries the security headers (``dashboard_support.SECURITY_HEADERS``).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from dashboard_support import (
    MAIL,
    REPORT,
    Answer,
    actor,
    authorizer,
    dashboard_tables,
    dead_runs,
    exchange,
    missing_security_headers,
    served,
)
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from starlette.applications import Starlette
from starlette.routing import Mount

from ship_sqla import (
    create_audit_log,
    create_dashboard,
    create_job_backend,
)
from ship_sqla._dashboard._csrf import COOKIE, form_token

if TYPE_CHECKING:
    from collections.abc import Iterator

SECRET = b"issue-25-dashboard-secret-bytes!"
SESSION = "s" * 43
ADMIN = {"x-user": "admin"}

CONTROL_TENANTS = (
    "%00",  # NUL: D5
    "%01",
    "%1F",
    "%7F",  # DEL
    "%C2%85",  # NEL, a C1 control
    "%E2%80%A8",  # LINE SEPARATOR
    "%E2%80%8B",  # ZERO WIDTH SPACE (a format character)
    "%20%20",  # blank: would alias "no tenant"
    "t" * 300,  # over 255 bytes
)
SURROGATE_LIKE_TENANTS = (
    "%ED%A0%80",  # the UTF-8 form of the lone surrogate U+D800 (invalid UTF-8)
    "%ED%BF%BF",  # of U+DFFF
    "%F4%90%80%80",  # past U+10FFFF
    "%C0%80",  # an overlong NUL
)
"""Invalid UTF-8 is decoded as U+FFFD REPLACEMENT CHARACTERs (no lone surrogate reaches the
page): a printable tenant that matches no run, so a 200."""

TENANT_PAGES = ("/runs", "/runs?state=running", "/runs?state=dead", "/dead")
JOB_PAGES = ("/runs", "/runs?state=dead", "/dead")


def _with(page: str, name: str, value: str) -> str:
    return f"{page}{'&' if '?' in page else '?'}{name}={value}"


def bad_requests() -> list[tuple[str, str]]:
    """(path and query, the parameter the 400 must name), over every page taking parameters."""
    cases = [(_with(page, "tenant", v), "tenant") for page in TENANT_PAGES for v in CONTROL_TENANTS]
    for value in ("%00", "a%20b", "j" * 129, ".starts.with.a.symbol", "%E2%80%A8"):
        cases += [(_with(page, "job", value), "job") for page in JOB_PAGES]
    cases += [(f"/runs?state={value}", "state") for value in ("bogus", "%00", "DEAD", "dead%00")]
    for value in ("xyz", "%00", "c" * 5000, "%C3%A9t%C3%A9"):
        cases += [(_with(page, "cursor", value), "cursor") for page in JOB_PAGES]
    for name in ("since", "until"):
        for value in ("%00", "yesterday", "2026-13-01T00:00", "9" * 100):
            cases.append((f"/runs?state=dead&{name}={value}", name))
        for state in ("waiting", "running"):  # a range applies to finished states only
            cases.append((f"/runs?state={state}&{name}=2026-01-01T00:00", name))
    for value in ("abc", "%C2%B2", "-1", "0", "99999999999999999999", "1%00"):
        cases.append((f"/audit?before={value}", "before"))
    cases += [("/runs/%00", "run_id"), ("/runs/" + "r" * 300, "run_id")]
    return cases


def check_bad_request(answer: Answer, path: str, parameter: str) -> None:
    """A 400 HTML problem page naming ``parameter``, with a library code, all headers."""
    where = f"{path[:80]}: {answer.status} {answer.text[:300]}"
    assert answer.status == 400, where
    assert answer.headers["content-type"].startswith("text/html"), where
    assert f'data-parameter="{parameter}"' in answer.text, where
    assert "SHIP_SQLA_" in answer.text, where
    assert "Fix:" in answer.text, where
    assert "Traceback" not in answer.text, where
    assert missing_security_headers(answer.headers) == {}, where


@pytest.fixture
async def seeded(ship_engine: Any) -> list[str]:
    """The job, worker and audit tables; two dead runs of dash.mail."""
    metadata, runs, state, workers, _audit = dashboard_tables()
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(
        database=ship_engine, table=runs, state_table=state, workers_table=workers
    )
    return await dead_runs(backend, MAIL, 2)


@pytest.fixture
def mounted(seeded: list[str], ship_engine_url: str) -> Iterator[str]:
    """The dashboard mounted at /ops in an application, served by uvicorn."""
    _, runs, state, workers, audit_table = dashboard_tables()
    engine = create_async_engine(ship_engine_url)
    dashboard = create_dashboard(
        create_job_backend(database=engine, table=runs, state_table=state, workers_table=workers),
        authorizer=authorizer,
        actor=actor,
        audit=create_audit_log(database=engine, table=audit_table),
        definitions=[MAIL, REPORT],
        secret=SECRET,
        refresh_seconds=0,
    )
    with served(Starlette(routes=[Mount("/ops", app=dashboard)]), dispose=engine.dispose) as base:
        yield base + "/ops"


async def test_s2_every_bad_parameter_of_every_page_is_a_400_naming_it_keep_alive_issue_25(
    mounted: str,
) -> None:
    """S2, issue 25 (D5): over ONE keep-alive connection, every bad parameter of every page
    that takes one (a tenant with a control character on each page with a tenant filter, a bad
    job, state, cursor, creation-time range, audit position or run id) is a 400 HTML problem
    page naming it, with the library's code and fix, never a 500, and the connection stays
    open; invalid UTF-8 (the URL form of a lone surrogate) decodes to replacement characters, a
    printable tenant: a 200. Good filters still answer 200."""
    cases = bad_requests()
    good = [
        "/dead?tenant=acme",
        "/dead?job=dash.mail&tenant=acme",
        "/runs?state=dead&job=dash.mail&tenant=acme&since=2000-01-01T00:00",
        "/audit?before=12",
        *[_with(page, "tenant", v) for page in TENANT_PAGES for v in SURROGATE_LIKE_TENANTS],
    ]
    unknown = "/runs/%01"  # a run id PostgreSQL can store, that no run has: 404 (issue 32)
    answers = await anyio.to_thread.run_sync(
        exchange,
        mounted,
        [("GET", path, ADMIN, None) for path, _ in cases]
        + [("GET", path, ADMIN, None) for path in good]
        + [("GET", unknown, ADMIN, None)],
    )
    for (path, parameter), answer in zip(cases, answers, strict=False):
        check_bad_request(answer, path, parameter)
    for path, answer in zip(good, answers[len(cases) : -1], strict=True):
        assert answer.status == 200, (path, answer.text[:300])
        assert missing_security_headers(answer.headers) == {}, path
    assert "\ufffd" in answers[len(cases) + 4].text  # the decoded tenant, in the filter form
    assert answers[-1].status == 404, answers[-1].text[-400:]
    assert "No run has the id &#39;\\x01&#39;. Fix: find the run" in answers[-1].text
    assert missing_security_headers(answers[-1].headers) == {}


async def test_s1_s2_a_bad_value_in_an_action_is_refused_with_its_code_and_changes_nothing(
    mounted: str, seeded: list[str], ship_engine: Any
) -> None:
    """S1, S2, issues 25 and 32: a run id with a NUL (one run's action, or among the selected
    runs next to a good id), a bulk "retry all matching" with a tenant or job that has a
    control character, a pause of a job id with a NUL: each is refused before any statement (a
    400 page with the library's code and fix, and the way back), over one kept connection; the
    dead runs stay dead and nothing is audited."""
    form = {"cookie": f"{COOKIE}={SESSION}", **ADMIN}
    token = form_token(SECRET, SESSION)
    posts = [
        ("/runs/%00/retry", f"csrf_token={token}", "SHIP_SQLA_KEY_INVALID"),
        ("/runs/%00/cancel", f"csrf_token={token}", "SHIP_SQLA_KEY_INVALID"),
        ("/bulk/retry", f"csrf_token={token}&state=dead&tenant=%00", "SHIP_SQLA_RUN_FILTER"),
        ("/bulk/discard", f"csrf_token={token}&job=%01", "SHIP_SQLA_RUN_FILTER_INVALID"),
        ("/jobs/a%00b/pause", f"csrf_token={token}", "SHIP_SQLA_CONFIGURATION"),
        ("/runs/%00/discard", f"csrf_token={token}", "SHIP_SQLA_KEY_INVALID"),
        ("/runs/bulk", f"csrf_token={token}&action=retry&id=%00", "SHIP_SQLA_KEY_INVALID"),
        (
            "/runs/bulk",
            f"csrf_token={token}&action=retry&id={seeded[0]}&id=%00",
            "SHIP_SQLA_KEY_INVALID",
        ),
        ("/dead/bulk", f"csrf_token={token}&action=discard&id=%00", "SHIP_SQLA_KEY_INVALID"),
    ]
    answers = await anyio.to_thread.run_sync(
        exchange, mounted, [("POST", path, form, body) for path, body, _ in posts]
    )
    for (path, _, code), answer in zip(posts, answers, strict=True):
        assert answer.status == 400, (path, answer.status, answer.text[:200])
        assert code in answer.text, path
        assert "nothing was changed" in answer.text, path
        assert "Fix:" in answer.text, path
        assert 'id="back"' in answer.text, path
        assert missing_security_headers(answer.headers) == {}, path
    async with ship_engine.connect() as connection:
        states = (
            await connection.execute(
                text("SELECT state FROM ship_job_runs WHERE id = ANY(:ids)"), {"ids": seeded}
            )
        ).scalars()
        assert list(states) == ["dead", "dead"]
        audited = (await connection.execute(text("SELECT count(*) FROM ship_audit"))).scalar()
        assert audited == 0


async def test_s2_ship_sqla_dashboard_answers_bad_parameters_with_400_keep_alive_issue_25(
    seeded: list[str], ship_engine_url: str, tmp_path: Any
) -> None:
    """S2, issue 25 (D5 "ship-sqla dashboard behaves the same"): the standalone server, started
    as an operator would (``--port 0``: it prints its address once it listens), answers a
    tenant with a control character on each page with a tenant filter, and the other bad
    parameters, with a 400 naming them over one kept connection, with every security header;
    the dashboard still serves its pages."""
    environment = {
        k: v
        for k, v in os.environ.items()
        if k != "SHIP_SQLA_DATABASE_URL" and not k.startswith("SHIP_SQLA_JOB_")
    }
    command = [sys.executable, "-m", "ship_sqla", "dashboard", "--database-url", ship_engine_url]
    process = await anyio.open_process(
        [*command, "--port", "0"], cwd=tmp_path, env=environment, stderr=None
    )
    try:
        assert process.stdout is not None
        with anyio.fail_after(60):
            line = await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 4096)
        printed = line.decode()
        assert printed.startswith("ship-sqla dashboard on http://127.0.0.1:"), printed
        base = printed.split(" on ", 1)[1].split("/ ", 1)[0]
        cases = [
            (_with(page, "tenant", v), "tenant")
            for page in TENANT_PAGES
            for v in ("%00", "%1B", "%C2%9B")
        ]
        cases += [
            ("/dead?job=%00", "job"),
            ("/runs?state=%00", "state"),
            ("/dead?cursor=%00", "cursor"),
            ("/runs?state=dead&since=%00", "since"),
            ("/audit?before=%00", "before"),
            ("/runs/%00", "run_id"),
        ]
        pages = ["/", "/dead", "/runs?state=dead", f"/runs/{quote(seeded[0])}"]
        answers = await anyio.to_thread.run_sync(
            exchange,
            base,
            [("GET", path, {}, None) for path, _ in cases]
            + [("GET", path, {}, None) for path in pages],
        )
        for (path, parameter), answer in zip(cases, answers, strict=False):
            check_bad_request(answer, path, parameter)
        for path, answer in zip(pages, answers[len(cases) :], strict=True):
            assert answer.status == 200, (path, answer.text[:300])
            assert missing_security_headers(answer.headers) == {}, path
        assert seeded[0] in answers[len(cases) + 1].text
    finally:
        process.terminate()
        with anyio.fail_after(30):
            await process.wait()
        await process.aclose()
