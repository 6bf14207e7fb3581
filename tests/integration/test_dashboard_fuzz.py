"""The route fuzzer (issue 32 part 3; S2): no 5xx and no state change.

Every route of the dashboard is read from its router (``app.routes``), so a route added later
is fuzzed without touching this file. For each route and method, every path segment
(``route.param_convertors``) and every request parameter the pages read is a slot: for a GET
the query parameters (the names of :data:`~ship_sqla._dashboard._filters.Parameter`, and every
``query_params.get("...")`` of the dashboard's modules, found by reading their syntax trees),
for a POST the form fields (every ``fields.get("...")`` and the CSRF field). One slot at a time
gets a bad value; the other slots keep valid ones (the manager's session and CSRF token, so a
POST reaches its handler; ``state=dead`` so ``since``/``until`` reach their check).

The valid values name things an accepted action cannot change: a completed run (retry, discard
and cancel leave it alone), a job with no dead run and not paused, an outbox with no dead
message. So the rule is strict: no request changes a run, a job's state, a worker or a
message, and a request the dashboard refused (4xx) or a page it showed changes nothing at all;
an accepted action (303) may only write its audit entry. Every answer is below 500 and carries
the security headers, and every 4xx says how to fix it (``Fix:``).

The inputs: the ones the issue's 52 answers of 500 were found with (an invalid date, a tenant
with NUL, CRLF, an RTL override, a zero-width space or 100 kB, a superscript digit, 10**22, a
NUL run id), on every slot, then Hypothesis: any text (lone surrogates included,
percent-encoded as their invalid UTF-8 bytes: what a client can put on the wire), numbers up to
10**30, digits of every script, control and format characters. Requests go through the ASGI
application itself (``dashboard_support.asgi_request``), the scope built as uvicorn builds it.
The default profile is derandomized and small: the sweep is 944 requests (118 slots today, 8
values each) in about 3 s, Hypothesis 200 examples in about 1.5 s, the file under 10 s;
``SHIP_SQLA_HYPOTHESIS_PROFILE=large`` runs ten times the examples, randomized.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import pkgutil
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final, Literal, get_args
from urllib.parse import quote

import attrs
import pytest
from dashboard_support import (
    MAIL,
    REPORT,
    Answer,
    actor,
    asgi_request,
    authorizer,
    dashboard_tables,
    dead_runs,
    missing_security_headers,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from job_helpers import claim_request
from sqlalchemy import MetaData, text
from starlette.routing import Mount, Route

import ship_sqla._dashboard as dashboard
from ship_sqla import (
    create_audit_log,
    create_dashboard,
    create_job_backend,
    create_outbox,
    create_outbox_operations,
    ship_outbox_table,
)
from ship_sqla._backfills import create_backfill_ledger, ship_backfills_table
from ship_sqla._dashboard import _csrf
from ship_sqla._dashboard._bulk_page import BulkPages, BulkTask
from ship_sqla._dashboard._filters import Parameter
from ship_sqla._dashboard._static import IMMUTABLE, asset_name
from ship_sqla.kernel import InMemoryJobBackend, completed
from ship_sqla.kernel._jobs import Schedule, define_job
from ship_sqla.kernel._operations import BulkResult
from ship_sqla.kernel._search import RunFilter
from ship_sqla.kernel._webhooks_out import WebhookDeliveryRecord
from ship_sqla.webhooks import (
    create_webhook_delivery_store,
    create_webhook_sender,
    ship_webhook_deliveries_table,
    ship_webhook_endpoints_table,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sqlalchemy import Table
    from sqlalchemy.ext.asyncio import AsyncEngine
    from starlette.applications import Starlette

LARGE = os.environ.get("SHIP_SQLA_HYPOTHESIS_PROFILE") == "large"
SECRET = b"issue-32-dashboard-fuzz-secret!!"
SESSION = "f" * 43
HEADERS: Final = {"x-user": "admin", "cookie": f"{_csrf.COOKIE}={SESSION}"}

ISSUE_32_VALUES: Final = (
    "x",  # ?state=dead&since=x
    "\x00",  # NUL: tenant, job, run id (GET and POST)
    "a\r\nb",  # CRLF
    "\u202eevil",  # RIGHT-TO-LEFT OVERRIDE
    "a\u200bb",  # ZERO WIDTH SPACE
    "t" * 100_000,  # 100 kB
    "\u00b2",  # SUPERSCRIPT TWO: str.isdigit() says yes, int() says no
    str(10**22),
)
"""The values the issue's 52 answers of 500 were found with."""

MORE_VALUES: Final = (
    "",
    " ",
    "\ud800",  # a lone surrogate: on the wire its invalid UTF-8 bytes ED A0 80
    "-1",
    "0",
    "9" * 400,
    "\u0661\u0662",  # ARABIC-INDIC DIGITS
    "\uff11\uff12",  # FULLWIDTH DIGITS
    "1e309",
    "2026-13-01T00:00",
    "2026-01-01T00:00+99:00",
    "<script>alert(1)</script>",
    "//evil.example/",
    "../../../../etc/passwd",
    "\x7f\u0085\u2028\ufeff",
)

VALUES = st.one_of(
    st.sampled_from(ISSUE_32_VALUES + MORE_VALUES),
    st.text(),
    st.text(st.characters(categories=("Cc", "Cf", "Cs", "Zl", "Zp", "Zs", "Co"))),
    st.text(st.characters(categories=("Nd", "No")), min_size=1),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
)


@attrs.frozen(eq=False)  # Starlette's Route is not hashable: a slot is itself
class Slot:
    """One place a request carries a value: ``name`` of ``kind`` in ``method`` ``route``."""

    route: Route
    method: str
    kind: Literal["path", "query", "form"]
    name: str

    def __str__(self) -> str:
        return f"{self.method} {self.route.path} {self.kind} {self.name}"


def names_the_pages_read() -> tuple[frozenset[str], frozenset[str]]:
    """(query parameter names, form field names) the dashboard reads, from its code: the
    :data:`Parameter` names (checked by ``read_filters``) and every ``.get("name")`` on the
    query parameters, a page's sent filters (``sent``) or a POST's ``fields``, in every module
    of ``ship_sqla._dashboard``."""
    query = set(get_args(Parameter)) - {"run_id"}  # run_id is a path segment
    form = {_csrf.FIELD}
    modules = [
        importlib.import_module(f"{dashboard.__name__}.{module.name}")
        for module in pkgutil.iter_modules(dashboard.__path__)
    ]
    trees = [ast.parse(inspect.getsource(module)) for module in modules]
    for node in (node for tree in trees for node in ast.walk(tree)):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            continue
        receiver = ast.unparse(node.func.value)
        if receiver.endswith("query_params") or receiver == "sent":
            query.add(node.args[0].value)
        elif receiver == "fields":
            form.add(node.args[0].value)
    return frozenset(query), frozenset(form)


QUERY_NAMES, FORM_NAMES = names_the_pages_read()


def slots_of(app: Starlette) -> list[Slot]:
    """Every slot of every route of ``app``'s router."""
    found = []
    for mounted in app.routes:
        route = mounted
        if isinstance(mounted, Mount) and mounted.path == "/static":  # the assets (issue 36)
            route = Route("/static/{name}", _described_only, methods=["GET"])
        assert isinstance(route, Route), f"{route!r}: the fuzzer knows Route only; teach it this"
        for method in sorted((route.methods or set()) - {"HEAD"}):
            found += [Slot(route, method, "path", name) for name in route.param_convertors]
            kind: Literal["query", "form"] = "query" if method == "GET" else "form"
            found += [
                Slot(route, method, kind, name)
                for name in sorted(QUERY_NAMES if kind == "query" else FORM_NAMES)
            ]
    return found


async def _tick(_payload: object) -> None:
    """The scheduled job's handler (never run here)."""


async def _described_only(_request: object) -> None:
    """The endpoint of the static files' slot description (requests go to the real app)."""


WEBHOOK_ENDPOINT = "fz.ep"
"""An enabled endpoint: the valid ``endpoint_id`` (its disable writes only the webhook tables)."""
WEBHOOK_DELIVERY = "fz.delivery"
"""A delivered delivery: the valid ``delivery_id`` (its redeliver enqueues on the sender's own
in-memory backend, so the runs table never changes)."""
WEBHOOK_ROUTES: Final = "/webhooks/"
"""An accepted webhook action changes the webhook tables (a disable, a redeliver), by design:
there they may change, and the audit log; a refused one changes nothing at all."""

SCHEDULED = define_job(
    "fz.tick", _tick, payload=dict, schedule=Schedule(interval=timedelta(hours=1))
)
"""A scheduled job: the valid ``job_id`` of the schedules' routes (issue 36: its page, its run
now). An accepted run now adds one run, by design: there the runs table may change."""
SCHEDULE_ROUTES: Final = "/schedules/"
BULK_TASK = "fz.task"
"""An ended bulk action by filter of the dashboard's process: the valid ``task_id``."""

DONE_BACKFILL = "fz.done"
"""A completed backfill: the valid ``backfill_id`` (a cancel leaves it as it is)."""


@attrs.frozen
class Fuzzed:
    """The dashboard over seeded tables, and the valid value of every slot."""

    app: Starlette
    engine: AsyncEngine
    tables: tuple[Table, ...]
    completed_run: str
    dead: tuple[str, ...]

    def valid_segment(self, route: Route, name: str) -> str:
        """The valid value of path segment ``name`` of ``route`` (a new one: ``x``)."""
        return {
            "run_id": self.completed_run,
            "verb": "resume"
            if route.path.startswith("/jobs/")
            else "cleanup"
            if route.path.startswith("/upkeep/")
            else "cancel"
            if route.path.startswith("/backfills/")
            else "disable"
            if route.path.startswith(WEBHOOK_ROUTES)
            else "retry",
            "job_id": SCHEDULED.id if route.path.startswith(SCHEDULE_ROUTES) else REPORT.id,
            "backfill_id": DONE_BACKFILL,
            "endpoint_id": WEBHOOK_ENDPOINT,
            "delivery_id": WEBHOOK_DELIVERY,
            "outbox_id": "main",
            "task_id": BULK_TASK,
            "name": asset_name("dashboard.css"),
        }.get(name, "x")

    def valid_field(self, method: str, name: str) -> str | None:
        """The valid value of query parameter (GET) or form field (POST) ``name``; None: not
        sent."""
        if method == "GET":
            return "dead" if name == "state" else None
        return {
            _csrf.FIELD: _csrf.form_token(SECRET, SESSION),
            "next": "/runs?state=dead",
            "action": "retry",
            "id": self.completed_run,  # a UUID: the outbox's message id check passes too
            "job": REPORT.id,
            "tenant": "tenant-a",
            "older_than_days": "7",
            "reason": "fuzzing",
        }.get(name)

    def request(self, fuzzed: Mapping[Slot, str]) -> tuple[str, bytes]:
        """(target, form body) with the ``fuzzed`` slots (of one route and method) carrying
        their values, every other slot valid."""

        def encoded(v: str) -> str:
            return quote(v, safe="", errors="surrogatepass")

        [(_, method)] = {(slot.route.path, slot.method) for slot in fuzzed}
        route = next(iter(fuzzed)).route
        sent = {(slot.kind != "path", slot.name): value for slot, value in fuzzed.items()}
        path = route.path_format
        for name in route.param_convertors:
            segment = sent.get((False, name), self.valid_segment(route, name))
            path = path.replace("{" + name + "}", encoded(segment))
        pairs = []
        for name in sorted(QUERY_NAMES if method == "GET" else FORM_NAMES):
            value = sent.get((True, name), self.valid_field(method, name))
            if value is not None:
                pairs.append(f"{name}={encoded(value)}")
        if method == "GET":
            return path + ("?" + "&".join(pairs) if pairs else ""), b""
        return path, "&".join(pairs).encode("ascii")

    async def snapshot(self) -> dict[str, tuple[int, str]]:
        """Each table's row count and a checksum of its rows (one statement)."""
        statement = " UNION ALL ".join(  # names from our own MetaData, not from a request
            f"SELECT '{table.name}', count(*), md5(coalesce(string_agg(t::text, '|'"
            f" ORDER BY t::text), '')) FROM \"{table.name}\" t"
            for table in self.tables
        )
        async with self.engine.connect() as connection:
            rows = await connection.execute(text(statement))
            return {name: (count, digest) for name, count, digest in rows}

    async def send(self, fuzzed: Mapping[Slot, str]) -> Answer:
        """The ``fuzzed`` slots' values in one request, checked: below 500, the security
        headers, a fix on a 4xx; nothing changed unless an accepted action wrote its audit
        entry."""
        [method] = {slot.method for slot in fuzzed}
        target, body = self.request(fuzzed)
        headers = dict(HEADERS)
        if body:
            headers["content-type"] = "application/x-www-form-urlencoded"
        before = await self.snapshot()
        answer = await asgi_request(self.app, method, target, headers, body)
        after = await self.snapshot()
        sent = ", ".join(f"{slot} = {value[:80]!r}" for slot, value in fuzzed.items())
        where = f"{sent}: {answer.status} {answer.text[-1500:]}"
        assert answer.status < 500, where
        seen = dict(answer.headers)
        if answer.status == 200 and target.startswith("/static/"):  # an asset: cached for good
            assert seen["cache-control"] == IMMUTABLE, where
            seen["cache-control"] = "no-store"  # the one header an asset has its own value of
        assert missing_security_headers(seen) == {}, where
        if answer.status >= 400:  # every error a user sees says how to fix it
            assert "Fix:" in answer.text, where
        changed = {name for name in before if before[name] != after[name]}
        allowed = {"ship_audit"} if answer.status == 303 else set()
        if answer.status == 303 and next(iter(fuzzed)).route.path.startswith(WEBHOOK_ROUTES):
            allowed |= {"ship_webhook_endpoints", "ship_webhook_deliveries"}
        if answer.status == 303 and next(iter(fuzzed)).route.path.startswith(SCHEDULE_ROUTES):
            allowed |= {"ship_job_runs"}
        assert changed <= allowed, f"{where}\nchanged: {changed}"
        return answer


@pytest.fixture
async def fuzzed(ship_engine: AsyncEngine) -> Fuzzed:
    """Two dead runs and a waiting run of dash.mail, a completed run of dash.report, a pending
    outbox message, a completed backfill (its cancel changes nothing); the dashboard over them
    with the audit log, the outbox and the backfill ledger."""
    metadata, runs, state, workers, audit_table = dashboard_tables()
    outbox_table = ship_outbox_table(MetaData())
    backfills_table = ship_backfills_table(MetaData())
    webhook_metadata = MetaData()
    endpoints_table = ship_webhook_endpoints_table(webhook_metadata)
    deliveries_table = ship_webhook_deliveries_table(webhook_metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(webhook_metadata.create_all)
        await connection.run_sync(metadata.create_all)
        await connection.run_sync(outbox_table.metadata.create_all)
        await connection.run_sync(backfills_table.metadata.create_all)
    backend = create_job_backend(
        database=ship_engine, table=runs, state_table=state, workers_table=workers
    )
    dead = await dead_runs(backend, MAIL, 2)
    await backend.enqueue(REPORT, {"n": 1})
    [run] = await backend.claim(claim_request(REPORT, worker="w"))
    assert await backend.settle([completed(run)]) == ["completed"]
    await backend.enqueue(MAIL, {"n": 2})
    await backend.install_schedules([SCHEDULED])
    outbox = create_outbox(database=ship_engine, table=outbox_table)
    await outbox.enqueue("main", "topic", {"n": 1})
    audit = create_audit_log(database=ship_engine, table=audit_table)
    ledger = create_backfill_ledger(database=ship_engine, table=backfills_table)
    await ledger.begin(
        DONE_BACKFILL, run_id="r", token=1, pace=1.0, stall_after=60.0, required_by=None
    )
    assert await ledger.finish(DONE_BACKFILL, run_id="r", token=1, state="completed")
    sender = create_webhook_sender(
        backend=InMemoryJobBackend(),
        store=create_webhook_delivery_store(
            database=ship_engine, endpoints_table=endpoints_table, deliveries_table=deliveries_table
        ),
    )
    await sender.add_endpoint("https://hooks.example.com/in", ["*"], endpoint_id=WEBHOOK_ENDPOINT)
    await sender.store.insert_deliveries([_delivered(WEBHOOK_DELIVERY, WEBHOOK_ENDPOINT)])
    await sender.store.set_delivery_state(WEBHOOK_DELIVERY, "delivered")
    app = create_dashboard(
        backend,
        authorizer=authorizer,
        actor=actor,
        audit=audit,
        outbox=create_outbox_operations(outbox, authorizer=lambda *_: False, audit=audit),
        outbox_ids=["main"],
        definitions=[MAIL, REPORT, SCHEDULED],
        secret=SECRET,
        refresh_seconds=0,
        backfills=ledger,
        webhooks=sender,
    )
    pages = next(
        route.endpoint.__self__
        for route in app.routes
        if isinstance(getattr(getattr(route, "endpoint", None), "__self__", None), BulkPages)
    )
    ended = BulkTask(BULK_TASK, "retry", RunFilter.of(job_id=MAIL.id), "admin")
    ended.result = BulkResult((), ())
    pages.tasks[BULK_TASK] = ended
    tables = (
        runs,
        state,
        workers,
        audit_table,
        outbox_table,
        backfills_table,
        endpoints_table,
        deliveries_table,
    )
    return Fuzzed(app, ship_engine, tables, run.run_id, tuple(dead))


def _delivered(delivery_id: str, endpoint_id: str) -> WebhookDeliveryRecord:
    now = datetime.now(UTC)
    return WebhookDeliveryRecord(delivery_id, endpoint_id, "t", {}, None, "pending", (), now, now)


def test_the_fuzzer_reads_the_names_from_the_code() -> None:
    """Issue 32: the names the fuzzer sends are the ones the dashboard's code reads (a broken
    reading of ``_app.py`` would fuzz nothing: these are the names it has today)."""
    assert {"state", "job", "tenant", "since", "until", "cursor", "before"} <= QUERY_NAMES
    assert {"done", "failed"} <= QUERY_NAMES  # the flash after an action, on every page
    assert {"csrf_token", "next", "action", "id", "job", "tenant"} <= FORM_NAMES


@pytest.mark.timeout(600)  # ~600 slots x 52 values: 176 s at load 11 on 2 cores, ~30 s quiet
async def test_s2_every_slot_of_every_route_answers_the_issues_values_below_500_unchanged(
    fuzzed: Fuzzed,
) -> None:
    """S2, issue 32 (the route fuzzer: no 5xx and no state change): every path segment, query
    parameter and form field of every route of the router, one at a time, carrying each value
    the issue's 52 answers of 500 were found with: each answer is below 500 with its security
    headers, a 4xx says how to fix it, and nothing changed but the audit entry of an
    accepted action. The routes come from the router, so a new route is fuzzed here too."""
    slots = slots_of(fuzzed.app)
    paths = {slot.route.path for slot in slots}
    assert {"/runs", "/runs/{run_id:path}", "/runs/bulk", "/dead", "/audit"} <= paths
    statuses: dict[int, int] = {}
    accepted: set[str] = set()  # routes whose handler ran and accepted the request
    for slot in slots:
        for value in ISSUE_32_VALUES:
            answer = await fuzzed.send({slot: value})
            statuses[answer.status] = statuses.get(answer.status, 0) + 1
            if answer.status in (200, 303):
                accepted.add(slot.route.path)
    # The values were refused, not ignored; and the valid values beside them carry every
    # request past the CSRF check to its handler: the fuzzing reached every route's code.
    assert {200, 303, 400, 403, 404} <= set(statuses), statuses
    assert accepted == paths, paths - accepted
    dead = dict.fromkeys(fuzzed.dead, "dead")
    async with fuzzed.engine.connect() as connection:
        states = await connection.execute(
            text("SELECT id, state FROM ship_job_runs WHERE id = ANY(:ids)"), {"ids": fuzzed.dead}
        )
        assert {row.id: row.state for row in states} == dead


async def test_s2_the_issues_cases_are_400_naming_the_parameter_with_the_form_kept(
    fuzzed: Fuzzed,
) -> None:
    """S2, issue 32: the cases that answered 500 are a 400 naming the refused parameter with
    the library's code and fix, the filter form kept with the value as sent (escaped) so it
    can be corrected; an unknown run is a 404 saying how to find it; an action with a NUL run
    id is a 400 with the way back, and nothing changed."""
    cases = [
        ("/runs?state=dead&since=x", "since", 'name="since" value="x"'),
        ("/runs?state=dead&until=x", "until", 'name="until" value="x"'),
        ("/runs?tenant=a%0D%0Ab", "tenant", 'name="tenant" value="a\r\nb"'),
        ("/dead?tenant=%E2%80%AEevil", "tenant", 'name="tenant" value="\u202eevil"'),
        ("/dead?tenant=a%E2%80%8Bb", "tenant", 'name="tenant" value="a\u200bb"'),
        ("/runs?state=dead&tenant=" + "t" * 100_000, "tenant", "t" * 100_000),
        ("/dead?job=%00", "job", 'name="job" value="\x00"'),
        ("/dead?job=%3Cb%3E", "job", 'name="job" value="&lt;b&gt;"'),
        ("/audit?before=%C2%B2", "before", None),
        (f"/audit?before={10**22}", "before", None),
        ("/runs/%00", "run_id", None),
    ]
    for target, parameter, kept in cases:
        answer = await asgi_request(fuzzed.app, "GET", target, HEADERS)
        where = f"{target[:80]}: {answer.status} {answer.text[-600:]}"
        assert answer.status == 400, where
        assert f'data-parameter="{parameter}"' in answer.text, where
        assert "SHIP_SQLA_" in answer.text, where
        assert "Fix:" in answer.text, where
        if kept is not None:
            assert kept in answer.text, where
            assert 'id="filter"' in answer.text, where
    unknown = await asgi_request(fuzzed.app, "GET", "/runs/no-such-run", HEADERS)
    assert unknown.status == 404, unknown.text
    assert "No run has the id &#39;no-such-run&#39;. Fix: find the run" in unknown.text
    token = _csrf.form_token(SECRET, SESSION)
    form = {**HEADERS, "content-type": "application/x-www-form-urlencoded"}
    for target, body, status in (
        ("/runs/%00/retry", "", 400),
        ("/runs/%00/discard", "", 400),
        ("/runs/bulk", "action=retry&id=%00", 400),
        ("/runs/bulk", f"action=discard&id={fuzzed.dead[0]}&id=%00", 400),
        ("/runs/no-such-run/retry", "", 404),
        ("/runs/x/explode", "", 404),
        ("/jobs/dash.mail/explode", "", 404),
        ("/outbox/other/redrive", "action=all", 404),
    ):
        before = await fuzzed.snapshot()
        answer = await asgi_request(
            fuzzed.app,
            "POST",
            target,
            form,
            f"{_csrf.FIELD}={token}&next=/dead%3Fjob%3Ddash.mail&{body}".encode(),
        )
        where = f"POST {target} {body[:80]}: {answer.status} {answer.text[-600:]}"
        assert answer.status == status, where
        assert "Fix:" in answer.text, where
        assert '<a id="back" href="/dead?job=dash.mail">' in answer.text, where
        assert await fuzzed.snapshot() == before, where


def _fuzzed_slots() -> st.SearchStrategy[dict[Slot, str]]:
    """One route and method of the router, then one to three of its slots with values. The
    routes come from a dashboard over the in-memory backend (its router is the same for every
    backend), so everything is drawn before the test's coroutine runs: a draw inside it that
    Hypothesis stops would break the async runner."""
    slots = slots_of(
        create_dashboard(InMemoryJobBackend(), authorizer=authorizer, audit=None, secret=SECRET)
    )
    routes = sorted({(slot.route.path, slot.method) for slot in slots})

    def of(route: tuple[str, str]) -> st.SearchStrategy[dict[Slot, str]]:
        mine = [slot for slot in slots if (slot.route.path, slot.method) == route]
        return st.dictionaries(st.sampled_from(mine), VALUES, min_size=1, max_size=3)

    return st.sampled_from(routes).flatmap(of)


@settings(
    max_examples=2000 if LARGE else 200,
    derandomize=not LARGE,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(values=_fuzzed_slots())
@pytest.mark.anyio
async def test_s2_route_fuzzer_no_5xx_and_no_state_change(
    fuzzed: Fuzzed, values: dict[Slot, str]
) -> None:
    """S2, issue 32 (the route fuzzer: no 5xx and no state change): one to three slots of a
    route of the router (path segments, query parameters a page reads, form fields an action
    reads) carrying any text, a huge number or digits of any script: below 500, with the
    security headers, a fix on every 4xx, and nothing changed but the audit entry of an
    accepted action (the other slots name nothing an action can change)."""
    await fuzzed.send(values)


async def test_s1_s2_an_odd_or_long_user_name_never_fails_a_page_nor_goes_unaudited(
    fuzzed: Fuzzed,
) -> None:
    """S1, S2, issue 32: a user whose name (the dashboard's ``actor(request)``) holds a NUL or
    is 300 characters long gets their pages (it was a 500 on every page) and their action is
    audited under the name's escaped form, saying how long it was (a NUL actor would have let
    the action run and its audit entry fail)."""
    _, runs, state, workers, audit_table = dashboard_tables()
    backend = create_job_backend(
        database=fuzzed.engine, table=runs, state_table=state, workers_table=workers
    )
    audit = create_audit_log(database=fuzzed.engine, table=audit_table)
    for name, shown in (
        ("ad\x00min", "'ad\\x00min'"),
        ("a" * 300, "'" + "a" * 149 + "... (300 characters)"),
    ):
        app = create_dashboard(
            backend,
            authorizer=lambda *_: True,
            actor=lambda _request, name=name: name,
            audit=audit,
            secret=SECRET,
            refresh_seconds=0,
        )
        for page in ("/", "/runs?state=dead", "/dead", "/audit"):
            answer = await asgi_request(app, "GET", page, HEADERS)
            assert answer.status == 200, (page, answer.text[-400:])
        run_id = fuzzed.dead[0 if name.startswith("ad") else 1]
        token = _csrf.form_token(SECRET, SESSION)
        done = await asgi_request(
            app,
            "POST",
            f"/runs/{run_id}/retry",
            {**HEADERS, "content-type": "application/x-www-form-urlencoded"},
            f"{_csrf.FIELD}={token}".encode(),
        )
        assert done.status == 303, done.text[-400:]
        [entry] = [e for e in await audit.list_entries(limit=10) if e.target == run_id]
        assert entry.actor == shown
