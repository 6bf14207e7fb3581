"""The dashboard application (issue 15; S1, S2): Starlette, server-rendered HTML.

Every read and every action goes through the operator surfaces
(:class:`~ship_sqla.jobs.JobOperations`, :class:`~ship_sqla.outbox.OutboxOperations`), bound per
request to the request's actor and to ``authorizer(request, permission, operation)``: reads ask
``ship.jobs:read`` (or manage), actions ``ship.jobs:manage``, and the surfaces write every
action to the audit log. A read-only user gets pages without a single action form, and a POST
they forge anyway is refused by the surface. Every POST must carry the CSRF token of its
session cookie (:mod:`._csrf`) or is refused with 403 before anything runs.

A page's parameters (filters, cursor, run id) are read and checked in one place,
:func:`._filters.read_filters`, before the page asks anything; a refused one is a 400 problem
page naming it (issue 25, D5). Every response carries the security headers of
:mod:`._security` (Content-Security-Policy, nosniff, Referrer-Policy, X-Frame-Options,
no-store) with a per-response CSP nonce. Issue 36: the pages are Jinja2 templates
(:mod:`._html`, ``templates/``), each page's body returning its HTML and its JSON twin's data
(:class:`Content`); the static files (:mod:`._static`) are served under content-hashed names.
"""

from __future__ import annotations

import contextlib
import inspect
import secrets
import uuid
from datetime import UTC, datetime, timedelta
from time import monotonic
from typing import TYPE_CHECKING, Any, Final, TypeAlias
from urllib.parse import parse_qs, quote

import anyio
import attrs
from markupsafe import Markup
from sqlalchemy import text as sql_text
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import BaseRoute, Mount, Route

from ship_sqla._dashboard import _csrf
from ship_sqla._dashboard._charts import (
    bars_chart,
    outbox_trend,
    outcome_island,
    overview_history,
)
from ship_sqla._dashboard._filters import (
    INPUT_ERRORS,
    RUN_STATES,
    BadParameter,
    Filters,
    Parameter,
    read_filters,
)
from ship_sqla._dashboard._html import (
    PARTS,
    Html,
    ago,
    at,
    button_form,
    error_summary,
    health_banner,
    href,
    layout,
    link,
    render,
    table,
    text,
)
from ship_sqla._dashboard._live import (
    REFRESH_CHOICES,
    REFRESH_COOKIE,
    LiveOverview,
    refresh_choice,
)
from ship_sqla._dashboard._page import (
    PAGE_SIZE,
    Content,
    NotFound,
    PageBody,
    header_links,
    here,
    json_response,
    jsonable,
    marked,
    no_run,
    nonce,
    page_modules,
    page_routes,
    state_cell,
    wants_json,
    with_params,
)
from ship_sqla._dashboard._reads import (
    OVERVIEW_COUNT_CAP,
    THROUGHPUT_BUCKET,
    THROUGHPUT_BUCKETS,
    THROUGHPUT_CAP,
    JobRow,
    overview_jobs,
)
from ship_sqla._dashboard._redact import Redact, Shown, check_redact, shown_operations
from ship_sqla._dashboard._security import SecurityHeaders
from ship_sqla._dashboard._static import StaticAssets
from ship_sqla._dashboard._svg import throughput_chart
from ship_sqla._jobs._backend import PostgresJobBackend
from ship_sqla._schema_probe import MissingTablesError
from ship_sqla._webhooks._operations import MANAGE_PERMISSION as WEBHOOKS_MANAGE
from ship_sqla._webhooks._operations import WebhookOperations, create_webhook_operations
from ship_sqla._webhooks._sender import WebhookSender
from ship_sqla.kernel._authorize import authorize_read
from ship_sqla.kernel._backfill_operations import BackfillOperations, create_backfill_operations
from ship_sqla.kernel._backfills import BackfillLedger
from ship_sqla.kernel._browse import run_order
from ship_sqla.kernel._errors import (
    ConfigurationError,
    InvalidCursorError,
    PermissionDeniedError,
    ShipError,
)
from ship_sqla.kernel._keys import require_key
from ship_sqla.kernel._operations import (
    LIVE_STATES,
    MANAGE_PERMISSION,
    READ_PERMISSION,
    JobOperations,
    create_job_operations,
)
from ship_sqla.kernel._ports import JobBackend
from ship_sqla.kernel._search import DEFAULT_SCAN
from ship_sqla.kernel._serving import serving_of
from ship_sqla.kernel._webhooks_out import WebhookEndpointUnknownError, excerpt
from ship_sqla.kernel._workers import WORKER_STALE_AFTER

HEALTH_TIMEOUT: Final = 2.0
"""Seconds the health route waits for the database's ``SELECT 1``."""
BANNER_HEALTH_TTL: Final = 5.0
"""Seconds the health banner's storage health (J22) is kept between reads: the reads stat each
ship table's files and count the history's DEFAULT partitions up to 100,000 rows each, 20-60 ms
a page at 10,000,000 runs with the history's older days in DEFAULT (issue 36: every page paid
it). Each page still asks the authorizer; an alarm shows at most this late."""
LIMIT_WAITS_SHOWN: Final = 100
"""The most partitions per job the overview's "Waiting on a limit" table visits (tenant order)."""

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence

    from starlette.requests import Request
    from starlette.types import ASGIApp, Receive, Scope, Send

    from ship_sqla._outbox._operations import OutboxOperations
    from ship_sqla.kernel._audit import AuditSink
    from ship_sqla.kernel._backfills import BackfillRecord
    from ship_sqla.kernel._browse import ConsumerKeyProgress, RunOrder, ThroughputBucket
    from ship_sqla.kernel._health import StorageHealth
    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._operations import AdministeredBackend
    from ship_sqla.kernel._ports import PausedJob, RunRecord, RunState
    from ship_sqla.kernel._serving import Serving
    from ship_sqla.kernel._stats import JobStatsStore, StatsSeries
    from ship_sqla.kernel._webhooks_out import (
        DeliveryAttempt,
        WebhookDeliveryRecord,
        WebhookEndpointRecord,
    )
    from ship_sqla.kernel._workers import WorkerRecord

__all__ = ["DashboardAuthorizer", "create_dashboard"]

DashboardAuthorizer: TypeAlias = "Callable[[Request, str, str], bool | Awaitable[bool]]"
"""``authorizer(request, permission, operation) -> bool`` (or an awaitable of it): whether the
user of ``request`` holds ``permission`` (``"ship.jobs:read"``, ``"ship.jobs:manage"``,
``"ship.outbox:read"``, ``"ship.outbox:manage"``, ``"ship.webhooks:read"``,
``"ship.webhooks:manage"``); fail closed: anything but True refuses."""

CONSUMER_KEYS_SHOWN: Final = 200
"""Consumer keys the Consumers & backfills page lists (one index probe each, C3)."""
BACKFILLS_SHOWN: Final = 200
"""Backfills the page lists (the ledger holds a handful per deploy)."""
WEBHOOK_ENDPOINTS_SHOWN: Final = 200
"""Endpoints the Webhooks page lists (one bounded read in id order)."""
WEBHOOK_ATTEMPTS_SHOWN: Final = 5
"""A delivery's latest attempts the Webhooks page shows (it says how many earlier ones)."""
WEBHOOK_REASON_CHARS: Final = 500
"""The bound on a disable's reason typed on the Webhooks page."""
WEBHOOK_BODY_SHOWN: Final = 200
"""Characters of an attempt's answer excerpt the Webhooks page shows (marked when cut)."""
MAX_ACTOR_CHARS: Final = 200
"""The operator surfaces' bound on an actor's name."""
REDRIVE_SELECTED: Final = "selected"
REDRIVE_ALL: Final = "all"
"""The outbox page's two re-drive buttons' ``action`` values (any other: the selection)."""
OUTBOX_REDRIVE_PAGES: Final = 10
"""Pages of 1,000 dead messages one "re-drive all" re-drives (call it again for more)."""


@attrs.frozen
class OverviewReading:
    """What the overview reads (:meth:`_Dashboard.overview_reading`), before it is rendered."""

    paused: Mapping[str, PausedJob]
    jobs: Sequence[JobRow]
    buckets: Sequence[ThroughputBucket]
    history: tuple[StatsSeries, int] | None
    workers: Sequence[WorkerRecord] | None
    limit_waits: Html


def _chart_data(buckets: Sequence[ThroughputBucket]) -> dict[str, Any]:
    """The throughput chart's uPlot data island: bucket starts (epoch seconds), completed and
    dead counts (the SVG beside it is the chart without JavaScript)."""
    return {
        "series": [
            {"label": "completed", "color": "#2e7d32"},
            {"label": "dead", "color": "#c62828"},
        ],
        "data": [
            [int(b.start.timestamp()) for b in buckets],
            [b.completed for b in buckets],
            [b.dead for b in buckets],
        ],
    }


def _history_parts(history: tuple[StatsSeries, int]) -> dict[str, Any]:
    """The overview's history chart (issue 36 item 2): its SVG, its uPlot island, its totals
    and the loss note."""
    series, summed = history
    return {
        "series": series,
        "summed": summed,
        "chart": bars_chart(series, "attempts by outcome, every job"),
        "island": outcome_island(series),
        "step_minutes": int(series.step.total_seconds() // 60),
    }


def _overview_data(
    buckets: Sequence[ThroughputBucket],
    jobs: Sequence[JobRow],
    paused: Mapping[str, Any],
    *,
    alive: int,
    workers: Sequence[WorkerRecord] | None,
) -> dict[str, Any]:
    """The overview's JSON twin: the chart's buckets, each job's line, the workers' counts."""
    return {
        "throughput": buckets,
        "jobs": [
            {
                "job_id": job.job_id,
                "demand": job.demand,
                "failures": job.failures,
                "failing": job.failing,
                "paused": paused.get(job.job_id),
            }
            for job in jobs
        ],
        "workers": {"alive": alive, "registered": len(workers or ())},
    }


class _Unset:
    """``create_dashboard``'s ``audit`` when not given: refused (S1: say which log, or None)."""


_UNSET: Final = _Unset()


_NAV: Final = (
    ("", "Overview"),
    ("/runs", "Runs"),
    ("/search", "Search"),
    ("/dead", "Dead letters"),
    ("/workers", "Workers"),
    ("/consumers", "Consumers & backfills"),
    ("/outbox", "Outbox"),
    ("/webhooks", "Webhooks"),
    ("/upkeep", "Upkeep"),
)
"""The header's links to the pages of this module (path under the mount, label), in order; a
page module adds its own (its ``NAV``, :func:`~._page.header_links`)."""


def _default_actor(request: Request) -> str:
    user = request.scope.get("user")
    if user is not None and getattr(user, "is_authenticated", False):
        return str(getattr(user, "display_name", "") or user)
    client = request.client.host if request.client is not None else "unknown"
    return f"anonymous@{client}"


_OVERVIEW_HEADERS: Final = (
    "Job",
    "Due",
    "Delayed",
    "Running",
    "Oldest due",
    "Dead",
    "Newest dead",
    "Workers",
    "Paused",
    "",
)


class _Dashboard:
    def __init__(
        self,
        jobs: JobOperations,
        *,
        authorizer: DashboardAuthorizer,
        actor: Callable[[Request], str],
        outbox: OutboxOperations | None,
        outbox_ids: tuple[str, ...],
        secret: bytes,
        definitions: Mapping[str, JobDefinition[Any]],
        refresh_seconds: float,
        backfills: tuple[BackfillLedger, JobBackend] | None = None,
        audit_sink: AuditSink | None = None,
        webhooks: WebhookSender | None = None,
        backend: AdministeredBackend | None = None,
        stats: JobStatsStore | None = None,
        redact: Redact | None = None,
    ) -> None:
        self.jobs = jobs
        self.stats = stats
        self.redact = redact
        self.backend = backend
        self.webhooks = webhooks
        self.backfills = backfills
        self.audit_sink = audit_sink
        self.authorizer = authorizer
        self.actor = actor
        self.outbox = outbox
        self.outbox_ids = outbox_ids
        self.secret = secret
        self.definitions = definitions
        self.poll_ms = int(refresh_seconds * 1000) if refresh_seconds > 0 else None
        # What the header's Refresh control shows before a choice: the dashboard's own interval
        # when it is one of the choices ("" otherwise: the control says "default").
        default = "off" if self.poll_ms is None else f"{refresh_seconds:g}"
        self._default_choice = refresh_choice(default) or ""
        self._banner_health: tuple[float, StorageHealth] | None = None
        """The storage health last read for the banner, and when (monotonic seconds)."""
        self.nav: tuple[tuple[str, str], ...] = _NAV
        """The header's links (:func:`_routes` adds the page modules')."""

    # --- per request ---------------------------------------------------------------------------

    def _authorizer_for(self, request: Request) -> Callable[[str, str], Any]:
        authorizer = self.authorizer

        async def asks(permission: str, operation: str) -> bool:
            answer = authorizer(request, permission, operation)
            if inspect.isawaitable(answer):
                answer = await answer
            return answer is True

        return asks

    def ops(self, request: Request) -> JobOperations:
        """The operator surface for ``request``'s user: its actor and authorizer, answering
        runs as that user may see them (:mod:`._redact`: the ``redact`` hook, payloads behind
        ``ship.jobs:payloads``)."""
        asks = self._authorizer_for(request)
        ops = self.jobs.acting_as(self.actor_of(request), authorizer=asks)
        return shown_operations(ops, Shown(self.redact, asks))

    def outbox_ops(self, request: Request) -> OutboxOperations:
        if self.outbox is None:
            raise ConfigurationError(
                "this dashboard was given no outbox.",
                fix="pass outbox=create_outbox_operations(...) and outbox_ids=[...].",
            )
        return self.outbox.acting_as(
            self.actor_of(request), authorizer=self._authorizer_for(request)
        )

    def backfill_ops(self, request: Request) -> BackfillOperations:
        """The backfill operations (C4, C5) for ``request``'s user: the dashboard's authorizer,
        its audit log and the request's actor, as the job operations."""
        if self.backfills is None:
            raise ConfigurationError(
                "this dashboard was given no backfill ledger.",
                fix="pass backfills=create_backfill_ledger(...) to create_dashboard (or"
                " ship-sqla dashboard --backfills-table ship_backfills).",
            )
        ledger, backend = self.backfills
        return create_backfill_operations(
            ledger,
            backend,
            authorizer=self._authorizer_for(request),
            audit=self.audit_sink,
            actor=self.actor_of(request),
        )

    def webhook_ops(self, request: Request) -> WebhookOperations:
        """The outbound webhooks' operations (SPEC §16) for ``request``'s user: the dashboard's
        authorizer (``ship.webhooks:read`` / ``:manage``), its audit log and the request's
        actor."""
        if self.webhooks is None:
            raise ConfigurationError(
                "this dashboard was given no webhook sender.",
                fix="pass webhooks=create_webhook_sender(...) to create_dashboard (or"
                " ship-sqla dashboard --webhooks).",
            )
        return create_webhook_operations(
            self.webhooks,
            authorizer=self._authorizer_for(request),
            audit=self.audit_sink,
            actor=self.actor_of(request),
        )

    def actor_of(self, request: Request) -> str:
        """Who the audit log names for ``request``: ``actor(request)`` when it is printable text
        of 1 to 200 characters; else its escaped form (``ascii``), cut at 150 characters saying
        how long it was. A user's odd or long display name never fails their pages, nor leaves
        an action unaudited (issue 32). Not text at all is the application's bug: refused."""
        name = self.actor(request)
        if not isinstance(name, str):
            raise ConfigurationError(
                f"the dashboard's actor(request) returned {type(name).__name__}, not text.",
                fix="return the user's name as a str from actor=...",
            )
        if name and len(name) <= MAX_ACTOR_CHARS and name.isprintable():
            return name
        escaped = ascii(name)
        if len(escaped) > MAX_ACTOR_CHARS:
            escaped = f"{escaped[:150]}... ({len(name)} characters)"
        return escaped

    @staticmethod
    def base(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    @staticmethod
    def session_id(request: Request) -> str:
        sid = request.cookies.get(_csrf.COOKIE)
        if sid and len(sid) <= 128:  # noqa: PLR2004 - the session id's bound
            return sid
        minted = request.scope.setdefault("ship_dashboard_new_session", _csrf.new_session_id())
        return str(minted)

    def csrf(self, request: Request) -> str:
        return _csrf.form_token(self.secret, self.session_id(request))

    async def page(
        self,
        request: Request,
        current: str,
        title: str,
        body: PageBody,
        *,
        poll: bool = False,
        reads: tuple[Parameter, ...] = (),
        form: Callable[[Mapping[str, str]], Html] | None = None,
        charts: bool = False,
    ) -> Response:
        """The page ``current`` (a path under the dashboard): its parameters ``reads`` checked
        first (:func:`read_filters`), then ``body``. A refused parameter (or a cursor the
        operator surface refuses) is a 400 problem page naming it, followed by the page's
        filter ``form`` filled with what was sent (the form kept, to correct it); another typed
        input error of the library a 400 saying why; a refused permission a 403; an id nothing
        has (:class:`NotFound`) a 404. No 5xx for any request value (issue 32: the route
        fuzzer, tests/integration/test_dashboard_fuzz.py).

        Issue 36: ``Accept: application/json`` answers the page's JSON twin (the same reads,
        the same statuses: ``{"page", "title", "status", "data" | "error", "health"}``); the
        live refresh (``X-Ship-Fragment: 1``) gets ``<main>``'s content only."""
        ops = self.ops(request)
        can_manage = False
        data: Any = None
        problem: str | None = None
        try:
            can_manage = await ops.can_manage()
            filters = read_filters(request.query_params, request.path_params, reads)
            answer = await body(ops, can_manage, filters)
            content, data = (
                (answer.html, answer.data)
                if isinstance(answer, Content)
                else (
                    answer,
                    None,
                )
            )
            status = 200
        except PermissionDeniedError as exc:
            content, status, can_manage = render("notice.html", message=str(exc)), 403, False
            problem = str(exc)
        except NotFound as exc:
            content, status, problem = exc.html(), 404, f"{exc.what} Fix: {exc.fix}"
        except BadParameter as exc:
            content, status = self._problem(request, current, exc.parameter, exc.error), 400
            problem = f"{exc.parameter}: {exc.error}"
        except InvalidCursorError as exc:  # signed for another query, or altered
            content, status = self._problem(request, current, "cursor", exc), 400
            problem = f"cursor: {exc}"
        except INPUT_ERRORS as exc:
            content, status = render("notice.html", message=str(exc), id="problem"), 400
            problem = str(exc)
        alarms = await self._health_alarms(request, ops)
        if wants_json(request):
            twin: dict[str, Any] = {"page": current or "/", "title": title, "status": status}
            twin["error" if status != 200 else "data"] = problem if status != 200 else data  # noqa: PLR2004
            twin["health"] = [{"kind": k, "message": m} for k, m in alarms]
            return self._respond(request, json_response(twin, status))
        if status == 400 and form is not None:  # noqa: PLR2004 - the refused request's form
            content += form(request.query_params)
        html = layout(
            self.base(request),
            current,
            title,
            content,
            nav=self.nav,
            actor=ops.actor,
            can_manage=can_manage,
            nonce=nonce(request),
            here=here(request, keep_flash=True),
            flash=request.query_params.get("done"),
            error=request.query_params.get("failed"),
            **self._refreshing(request, poll=poll),
            banner=health_banner(alarms),
            charts=charts,
            fragment=request.headers.get("x-ship-fragment") == "1",
        )
        return self._respond(request, HTMLResponse(html, status))

    def _refreshing(self, request: Request, *, poll: bool) -> dict[str, Any]:
        """The layout's refresh arguments: the page's poll (when it polls), the header's
        Refresh control and its current choice."""
        return {
            "poll_ms": self.poll_ms_of(request) if poll else None,
            "refresh": refresh_choice(request.cookies.get(REFRESH_COOKIE)) or self._default_choice,
            "refresh_choices": REFRESH_CHOICES,
        }

    def poll_ms_of(self, request: Request) -> int | None:
        """How often a polling page refreshes for this user (issue 36 item 3): the refresh
        cookie's N s, none for "off", else (no cookie, or "live" on a page with no stream) the
        dashboard's ``refresh_seconds``."""
        choice = refresh_choice(request.cookies.get(REFRESH_COOKIE))
        if choice == "off":
            return None
        if choice is None or choice == "live":
            return self.poll_ms
        return int(choice) * 1000

    async def refresh(self, request: Request) -> Response:
        """``GET /refresh?every=live|2..60|off&next=PATH`` (the header's control, a form that
        works without JavaScript): sets this browser's refresh cookie and returns to ``next``
        (a path of this dashboard only); without ``every`` it clears the choice (the
        dashboard's own ``refresh_seconds`` again)."""
        every = request.query_params.get("every", "")
        back = self.back(request, {"next": [request.query_params.get("next", "")]})
        if not every:
            cleared = RedirectResponse(back, 303)
            cleared.delete_cookie(REFRESH_COOKIE, path=self.base(request) or "/")
            return cleared
        if refresh_choice(every) is None:
            return PlainTextResponse(
                f"400 every={every[:20]!r}: not a refresh choice. Fix: pick one of"
                f" {', '.join(REFRESH_CHOICES)} in the header's Refresh control.",
                400,
            )
        response = RedirectResponse(back, 303)
        response.set_cookie(
            REFRESH_COOKIE,
            every,
            max_age=365 * 24 * 3600,
            httponly=True,
            samesite="lax",
            path=self.base(request) or "/",
        )
        return response

    async def _health_alarms(self, request: Request, ops: JobOperations) -> list[tuple[str, str]]:
        """J22: the storage-health alarms (a few catalog reads, at most every
        :data:`BANNER_HEALTH_TTL` seconds across pages and viewers); none for a viewer the
        authorizer does not let read them (asked on every page, as ``storage_health`` asks)."""
        kept, now = self._banner_health, monotonic()
        try:
            if kept is not None and 0 <= now - kept[0] < BANNER_HEALTH_TTL:
                asks = self._authorizer_for(request)
                await authorize_read(asks, MANAGE_PERMISSION, READ_PERMISSION, "storage_health")
                health = kept[1]
            else:
                health = await ops.storage_health()
                self._banner_health = (now, health)
        except PermissionDeniedError:
            return []
        return [(alarm.kind, alarm.message) for alarm in health.alarms()]

    def _problem(self, request: Request, current: str, parameter: str, error: ShipError) -> Html:
        """A 400's content: which parameter was refused, the library's error (code, what, fix),
        and the page without parameters."""
        return render(
            "problem.html",
            parameter=parameter,
            error=str(error),
            again=href(self.base(request), current or "/"),
        )

    def _respond(self, request: Request, response: Response) -> Response:
        """``response`` with the session cookie when this request minted one (the security
        headers are set on every response by :class:`SecurityHeaders`)."""
        minted = request.scope.get("ship_dashboard_new_session")
        if minted is not None:
            response.set_cookie(
                _csrf.COOKIE,
                str(minted),
                httponly=True,
                samesite="strict",
                path=self.base(request) or "/",
            )
        return response

    async def form(self, request: Request) -> dict[str, list[str]] | None:
        """The POST's fields, or None when its CSRF token is not its session's."""
        body = (await request.body()).decode("utf-8", "replace")
        fields = parse_qs(body, keep_blank_values=True)
        token = next(iter(fields.get(_csrf.FIELD) or ()), None)
        if not _csrf.token_matches(self.secret, request.cookies.get(_csrf.COOKIE), token):
            return None
        return fields

    async def act(
        self,
        request: Request,
        action: Callable[[JobOperations, dict[str, list[str]]], Awaitable[str]],
    ) -> Response:
        fields = await self.form(request)
        if fields is None:
            return HTMLResponse(
                render(
                    "refused.html",
                    message="Refused: the form's CSRF token is missing or not this session's;"
                    " nothing was changed. Fix: reload the page and submit again.",
                ),
                403,
            )
        back = self.back(request, fields)
        ops = self.ops(request)
        try:
            done = await action(ops, fields)
        except PermissionDeniedError as exc:
            return HTMLResponse(render("refused.html", message=str(exc)), 403)
        except NotFound as exc:
            return await self.refused(request, ops, back, exc.html(), 404)
        except INPUT_ERRORS as exc:  # refused before any statement: nothing changed
            problem = render(
                "notice.html",
                message=f"The action was refused; nothing was changed. {exc}",
                kind="error",
                id="problem",
            )
            return await self.refused(request, ops, back, problem, 400)
        except ShipError as exc:  # e.g. a run no longer in a state the action takes
            return RedirectResponse(with_params(back, failed=str(exc)), 303)
        return RedirectResponse(with_params(back, done=done), 303)

    async def refused(
        self, request: Request, ops: JobOperations, back: str, content: Html, status: int
    ) -> Response:
        """An action's 400 or 404: what was wrong and its fix, and the way back to the page the
        form was on (``next``, with its filters)."""
        html = layout(
            self.base(request),
            "#refused",  # no page of the header is the current one
            "Action refused",
            content + render("back.html", back=back),
            nav=self.nav,
            actor=ops.actor,
            can_manage=await ops.can_manage(),
            nonce=nonce(request),
        )
        return self._respond(request, HTMLResponse(html, status))

    def back(self, request: Request, fields: Mapping[str, list[str]]) -> str:
        """The page an action goes back to: the form's ``next`` when it is a path of this
        dashboard, else the overview."""
        base = self.base(request)
        wanted = (fields.get("next") or [""])[0]
        # Only a path of this dashboard: never an open redirect.
        if wanted.startswith(base + "/") and not wanted.startswith("//") and "\\" not in wanted:
            return wanted
        return base + "/"

    # --- pages ---------------------------------------------------------------------------------

    async def health(self, _request: Request) -> Response:
        """``GET /health`` (issue 36): 200 ``{"status": "ok"}`` when the database answers a
        ``SELECT 1`` within 2 s (the job tables are checked before, by :class:`_TablesChecked`:
        a missing one is a 503 naming it), else 503 saying why. No permission asked, no data
        shown: for a load balancer's or an uptime check's probe."""
        if isinstance(self.backend, PostgresJobBackend):
            database = self.backend.database
            engine = database if isinstance(database, AsyncEngine) else database.engine
            try:
                with anyio.fail_after(HEALTH_TIMEOUT):
                    async with engine.connect() as connection:
                        await connection.execute(sql_text("SELECT 1"))
            except Exception as exc:  # noqa: BLE001 - any failure is "unavailable", said
                why = f"{type(exc).__name__}: {str(exc)[:200]}"
                return JSONResponse({"status": "unavailable", "error": why}, 503)
        return JSONResponse({"status": "ok"})

    async def goto(self, request: Request) -> Response:
        """The header's jump box (``/`` focuses it): ``/goto?run=ID`` redirects to the run's
        page (which answers 404 for an id no run has); empty, to the runs page."""
        run_id = request.query_params.get("run", "").strip()[:MAX_ACTOR_CHARS]
        base = self.base(request)
        if not run_id:
            return RedirectResponse(base + "/runs", 303)
        return RedirectResponse(f"{base}/runs/{quote(run_id, safe='')}", 303)

    async def overview(self, request: Request) -> Response:
        base = self.base(request)
        choice = refresh_choice(request.cookies.get(REFRESH_COOKIE))
        stream = base + "/live/overview?format=html" if choice == "live" else None

        async def body(ops: JobOperations, can_manage: bool, _f: Filters) -> Html | Content:
            reading = await self.overview_reading(ops)
            csrf = self.csrf(request) if can_manage else None
            html, data = self.overview_content(reading, base=base, csrf=csrf, nonce=nonce(request))
            live = render("pages/overview_live.html", stream=stream, content=Markup(html))  # noqa: S704
            return Content(live, data)

        return await self.page(request, "", "Overview", body, poll=stream is None, charts=True)

    async def overview_reading(self, ops: JobOperations) -> OverviewReading:
        """The overview's reads (one set for the page, and one per second for every client of
        the live stream: :mod:`._live`)."""
        paused = {p.job_id: p for p in await ops.paused()}
        jobs = await overview_jobs(ops, also=[*paused, *self.definitions])
        buckets, history = await self._throughput(ops, [job.job_id for job in jobs])
        try:
            workers: list[WorkerRecord] | None = await ops.workers()
        except ConfigurationError:
            workers = None
        limit_waits = await self._limit_waits(ops)
        return OverviewReading(paused, jobs, buckets, history, workers, limit_waits)

    def overview_content(
        self, reading: OverviewReading, *, base: str, csrf: str | None, nonce: str
    ) -> tuple[Html, dict[str, Any]]:
        """The overview's content (``pages/overview.html``) and JSON twin from ``reading``: the
        one rendering path of the page, its poll and its live stream. ``csrf`` (None: a viewer,
        no pause / resume buttons) is the manager's form token."""
        paused, jobs, workers = reading.paused, reading.jobs, reading.workers
        buckets, history = reading.buckets, reading.history
        now = datetime.now(UTC)
        alive = [
            w for w in workers or () if (now - w.last_seen_at).total_seconds() < WORKER_STALE_AFTER
        ]
        served = None if workers is None else serving_of(workers, now=now)
        rows = []
        for job in jobs:
            job_id, d = job.job_id, job.demand
            due = "0" if d is None else f"{d.due}{'+' if d.capped else ''}"
            action = ""
            if csrf is not None:
                verb = "resume" if job_id in paused else "pause"
                action = button_form(
                    f"{base}/jobs/{quote(job_id)}/{verb}",
                    verb.capitalize(),
                    csrf=csrf,
                    back=base + "/",
                )
            rows.append(
                (
                    link(base, f"/jobs/{quote(job_id, safe='')}", job_id),
                    link(base, "/runs", due, {"job": job_id, "state": "waiting"}),
                    text(0 if d is None else d.delayed),
                    text(0 if d is None else d.running),
                    ago(None if d is None else d.oldest_due_age),
                    link(base, "/dead", job.dead, {"job": job_id})
                    + (' <span class="state-dead">failing</span>' if job.failing else ""),
                    at(job.last_dead_at),
                    _serving_cell(served, job_id),
                    "paused since " + at(paused[job_id].paused_at) if job_id in paused else "",
                    action,
                )
            )
        html = render(
            "pages/overview.html",
            base=base,
            nonce=nonce,
            hours=THROUGHPUT_BUCKETS * THROUGHPUT_BUCKET // 3600,
            bucket_minutes=THROUGHPUT_BUCKET // 60,
            completed=sum(b.completed for b in buckets),
            dead=sum(b.dead for b in buckets),
            chart=Markup(throughput_chart(buckets, bucket_seconds=THROUGHPUT_BUCKET)),  # noqa: S704
            chart_data=_chart_data(buckets),
            rows=marked(rows),
            limit_waits=Markup(reading.limit_waits),  # noqa: S704 - rendered
            alive=len(alive),
            registered=len(workers or ()),
            headers=_OVERVIEW_HEADERS,
            count_cap=OVERVIEW_COUNT_CAP,
            history=None if history is None else _history_parts(history),
        )
        data = _overview_data(buckets, jobs, paused, alive=len(alive), workers=workers)
        if history is not None:
            data["history"] = {"series": history[0], "jobs_summed": history[1]}
        return html, data

    async def _throughput(
        self, ops: JobOperations, job_ids: Sequence[str]
    ) -> tuple[list[ThroughputBucket], tuple[StatsSeries, int] | None]:
        """The overview's chart: with a stats table its exact history (issue 36 item 2), and
        the capped per-request count (:meth:`JobOperations.throughput`) only without one."""
        if self.stats is not None:
            return [], await overview_history(self.stats, job_ids)
        buckets = await ops.throughput(
            bucket_seconds=THROUGHPUT_BUCKET, buckets=THROUGHPUT_BUCKETS, cap=THROUGHPUT_CAP
        )
        return buckets, None

    async def _limit_waits(self, ops: JobOperations) -> Html:
        """F8/F9 seen: the partitions whose due runs wait on a partitioned limit, and until when
        (only when a definition given has partitioned limits)."""
        partitioned = [d for d in self.definitions.values() if d.partition is not None]
        if not partitioned:
            return ""
        waits = await ops.partition_waits(partitioned, max_partitions=LIMIT_WAITS_SHOWN)
        rows = [
            (
                text(w.job_id),
                text("(untenanted)" if w.partition is None else w.partition),
                f"{w.due}{'+' if w.capped else ''}",
                text(w.running),
                text(w.started),
                text(", ".join(w.waiting_on)),
                "until a run ends" if w.until is None else at(w.until),
            )
            for w in waits
        ]
        return render("pages/limit_waits.html", rows=marked(rows))

    def run_table(
        self,
        base: str,
        runs: Iterable[RunRecord],
        *,
        selectable: bool,
        when: str,
        empty: str,
        time_of: Callable[[RunRecord], datetime | None] | None = None,
    ) -> Html:
        """The runs and dead-letter pages' table: one row per run, a selection box when the
        page has bulk actions, ``when`` heading the time column, ``time_of`` its value (by
        default the finished time, else the due time)."""
        headers = (
            "",
            "Run",
            "Job",
            "State",
            "Priority",
            "Attempt",
            "Created",
            when,
            "Tenant",
            "Last error",
        )
        rows: list[tuple[Html, ...]] = []
        for r in runs:
            pick = str(PARTS.checkbox(r.run_id, r.run_id)) if selectable else ""
            rows.append(
                (
                    pick,
                    link(base, "/runs/" + quote(r.run_id, safe="/"), r.run_id),
                    text(r.job_id),
                    state_cell(r.state),
                    text(str(r.priority)),
                    text(f"{r.attempt}/{r.max_attempts}"),
                    at(r.created_at),
                    at(
                        time_of(r)
                        if time_of is not None
                        else r.finished_at
                        if r.finished_at is not None
                        else r.run_at
                    ),
                    text(r.tenant or ""),
                    error_summary(r.last_error),
                )
            )
        return table(headers, rows, empty=empty)

    async def runs(self, request: Request) -> Response:
        base = self.base(request)

        async def body(ops: JobOperations, can_manage: bool, f: Filters) -> Html | Content:
            state, job, tenant = f.state, f.job, f.tenant
            page = await ops.list_runs(
                state=state,
                job_id=job,
                tenant=tenant,
                # The range is on the state's own time: finish for completed runs (J18).
                **_time_range(state, f.since, f.until),
                limit=PAGE_SIZE,
                cursor=f.cursor,
            )
            filters = {
                "state": state,
                "job": job,
                "tenant": tenant,
                "since": f.raw_since,
                "until": f.raw_until,
            }
            order, when, time_of = _RUN_ORDERS[run_order(state)]
            actions = _RUN_ACTIONS.get(state, ()) if can_manage else ()
            listing = self.run_table(
                base,
                page.items,
                selectable=bool(actions),
                when=when,
                time_of=time_of,
                empty="No runs match.",
            )
            cursor = page.next_cursor
            html = render(
                "pages/runs.html",
                base=base,
                form=Markup(runs_form(request.query_params)),  # noqa: S704 - rendered
                order=order,
                table=Markup(listing),  # noqa: S704 - rendered
                actions=actions,
                csrf=self.csrf(request) if actions else "",
                here=here(request),
                bulk=Markup(_bulk_buttons(actions, state, job, tenant, base)),  # noqa: S704
                next_href=href(base, "/runs", {**filters, "cursor": cursor}) if cursor else "",
            )
            return Content(html, {"runs": page.items, "next_cursor": cursor, "order": order})

        def runs_form(sent: Mapping[str, str]) -> Html:
            """The filters as sent (checked or refused: the form is kept to correct them)."""
            return render(
                "pages/runs_form.html",
                base=base,
                sent=sent,
                states=RUN_STATES,
                state=sent.get("state") or "waiting",
            )

        return await self.page(
            request,
            "/runs",
            "Runs",
            body,
            reads=("state", "job", "tenant", "since", "until", "cursor"),
            form=runs_form,
        )

    async def dead(self, request: Request) -> Response:
        base = self.base(request)

        async def body(ops: JobOperations, can_manage: bool, f: Filters) -> Html | Content:
            job, tenant = f.job, f.tenant
            page = await ops.list_dead(job_id=job, tenant=tenant, limit=PAGE_SIZE, cursor=f.cursor)
            listing = self.run_table(
                base, page.items, selectable=can_manage, when="Finished", empty="No dead runs."
            )
            filters = {"job": job, "tenant": tenant}
            cursor = page.next_cursor
            html = render(
                "pages/dead.html",
                base=base,
                form=Markup(dead_form(request.query_params)),  # noqa: S704 - rendered
                table=Markup(listing),  # noqa: S704 - rendered
                can_manage=can_manage,
                csrf=self.csrf(request) if can_manage else "",
                here=here(request),
                job=job,
                tenant=tenant,
                next_href=href(base, "/dead", {**filters, "cursor": cursor}) if cursor else "",
            )
            return Content(html, {"runs": page.items, "next_cursor": cursor})

        def dead_form(sent: Mapping[str, str]) -> Html:
            """The filters as sent (checked or refused: the form is kept to correct them)."""
            return render("pages/dead_form.html", base=base, sent=sent)

        return await self.page(
            request,
            "/dead",
            "Dead letters",
            body,
            reads=("job", "tenant", "cursor"),
            form=dead_form,
        )

    async def workers(self, request: Request) -> Response:
        """F6: each registered worker, its in-flight count a link to its running runs: the
        search page's ``state=running&worker=ID``, which walks ``<runs>_lease_idx`` (the running
        runs, each job's in lease order) and keeps that worker's, at most
        :data:`~ship_sqla.kernel._search.DEFAULT_SCAN` entries a page (it says when it
        stops). No new statement: the search page's own reads."""
        base = self.base(request)

        async def body(ops: JobOperations, can_manage: bool, _f: Filters) -> Html | Content:  # noqa: ARG001
            now = datetime.now(UTC)
            workers = await ops.workers()
            shown = [
                (
                    w,
                    ago((now - w.last_seen_at).total_seconds()),
                    href(base, "/search", {"state": "running", "worker": w.worker_id}),
                )
                for w in workers
            ]
            html = render("pages/workers.html", workers=shown, scan=DEFAULT_SCAN)
            data = [{**jsonable(w), "in_flight_href": link} for w, _seen, link in shown]
            return Content(html, {"workers": data})

        return await self.page(request, "/workers", "Workers", body, poll=True)

    async def consumers(self, request: Request) -> Response:
        """C3, C4: each consumer key's lag and last batch (from its runs, one index probe per
        key) and each backfill's ledger row (progress, pace, last key, stalled), with cancel
        and start for a manager."""
        base = self.base(request)

        async def body(ops: JobOperations, can_manage: bool, _f: Filters) -> Html | Content:
            keys = await ops.consumer_progress(limit=CONSUMER_KEYS_SHOWN + 1)
            rows = [_consumer_row(base, k) for k in keys[:CONSUMER_KEYS_SHOWN]]
            missing, failed, backfills = await self._backfill_rows(request, can_manage)
            html = render(
                "pages/consumers.html",
                rows=marked(rows),
                more=len(keys) > CONSUMER_KEYS_SHOWN,
                shown=CONSUMER_KEYS_SHOWN,
                backfills_missing=missing,
                backfills_error=failed,
                backfills=marked(backfills),
            )
            return Content(html, {"consumer_keys": keys[:CONSUMER_KEYS_SHOWN]})

        return await self.page(request, "/consumers", "Consumers & backfills", body, poll=True)

    async def _backfill_rows(
        self, request: Request, can_manage: bool
    ) -> tuple[str, bool, list[tuple[Html, ...]]]:
        """(why no backfill is listed, whether that is an error, the backfills' rows)."""
        if self.backfills is None:
            return _NO_BACKFILLS, False, []
        backfill_ops = self.backfill_ops(request)
        probe = getattr(self.backfills[0], "require_tables", None)
        if probe is not None:  # the PostgreSQL ledger: a missing table says so, in place
            try:
                await probe("the dashboard's backfills")
            except MissingTablesError as exc:
                return str(exc), True, []
        records = await backfill_ops.list_backfills(limit=BACKFILLS_SHOWN)
        now = backfill_ops.now()
        base = self.base(request)
        csrf = self.csrf(request) if can_manage else None
        return "", False, [_backfill_row(base, r, now, csrf) for r in records]

    async def webhooks_page(self, request: Request) -> Response:
        """SPEC §16: each endpoint's state (and why disabled), failure streak (W4), topics and
        url, and the latest deliveries with their latest attempts (W3: status, duration, error,
        the answer's bounded excerpt); a manager's disable, enable (W4: resumes the paused
        deliveries) and redeliver. No secret is read into the page: adding an endpoint and
        rotating its secret (which show one) stay at the shell."""
        base = self.base(request)

        async def body(_ops: JobOperations, _can_manage: bool, _f: Filters) -> Html | Content:
            if self.webhooks is None:
                missing = (
                    "No webhook sender given (create_dashboard(webhooks=create_webhook_sender("
                    "...)), or ship-sqla dashboard --webhooks)."
                )
                return render("pages/webhooks.html", missing=missing, missing_error=False)
            probe = getattr(self.webhooks.store, "require_tables", None)
            if probe is not None:  # the PostgreSQL store: a missing table says so, in place
                try:
                    await probe("the dashboard's webhooks")
                except MissingTablesError as exc:
                    return render("pages/webhooks.html", missing=str(exc), missing_error=True)
            hooks = self.webhook_ops(request)
            endpoints = await hooks.list_endpoints(limit=WEBHOOK_ENDPOINTS_SHOWN + 1)
            deliveries = await hooks.list_deliveries(limit=PAGE_SIZE + 1)
            asks = self._authorizer_for(request)
            manage = await asks(WEBHOOKS_MANAGE, "webhooks.dashboard")
            csrf = self.csrf(request) if manage else None
            back = base + "/webhooks"
            html = render(
                "pages/webhooks.html",
                missing="",
                endpoints=marked(
                    _endpoint_row(base, e, csrf, back) for e in endpoints[:WEBHOOK_ENDPOINTS_SHOWN]
                ),
                more_endpoints=len(endpoints) > WEBHOOK_ENDPOINTS_SHOWN,
                endpoints_shown=WEBHOOK_ENDPOINTS_SHOWN,
                deliveries=marked(
                    _delivery_row(base, d, csrf, back) for d in deliveries[:PAGE_SIZE]
                ),
                more_deliveries=len(deliveries) > PAGE_SIZE,
                deliveries_shown=PAGE_SIZE,
            )
            return Content(
                html,
                {
                    "endpoints": endpoints[:WEBHOOK_ENDPOINTS_SHOWN],
                    "deliveries": deliveries[:PAGE_SIZE],
                },
            )

        return await self.page(request, "/webhooks", "Webhooks", body)

    async def webhook_endpoint_action(self, request: Request) -> Response:
        """An endpoint's disable (with its reason) or enable (W4: its paused deliveries
        resume): the webhook operations' own, audited."""
        endpoint_id, verb = request.path_params["endpoint_id"], request.path_params["verb"]

        async def action(_ops: JobOperations, fields: dict[str, list[str]]) -> str:
            if verb not in ("disable", "enable"):
                raise NotFound(
                    f"A webhook endpoint has no action {verb[:40]!r}.",
                    fix="use the Webhooks page's buttons: disable or enable.",
                )
            hooks = self.webhook_ops(request)
            require_key(endpoint_id, "endpoint id")  # InvalidKeyError: refused before any read
            try:
                if verb == "disable":
                    reason = (fields.get("reason") or [""])[0].strip()
                    require_key(reason, "reason", max_chars=WEBHOOK_REASON_CHARS)
                    await hooks.disable_endpoint(endpoint_id, reason=reason)
                    return f"Endpoint {endpoint_id} is disabled; its deliveries wait."
                resumed = await hooks.enable_endpoint(endpoint_id)
            except WebhookEndpointUnknownError as exc:
                raise NotFound(str(exc), fix="act from the Webhooks page.") from exc
            return (
                f"Endpoint {endpoint_id} is enabled; {len(resumed)} paused delivery(ies) resumed."
            )

        return await self.act(request, action)

    async def webhook_redeliver(self, request: Request) -> Response:
        """A delivery sent again (pending, a new run, the same webhook-id): audited."""
        delivery_id = request.path_params["delivery_id"]

        async def action(_ops: JobOperations, _fields: dict[str, list[str]]) -> str:
            hooks = self.webhook_ops(request)
            require_key(delivery_id, "delivery id")  # InvalidKeyError: refused before any read
            try:
                delivery = await hooks.redeliver(delivery_id)
            except WebhookEndpointUnknownError as exc:
                raise NotFound(str(exc), fix="act from the Webhooks page.") from exc
            return f"Delivery {delivery_id} is {delivery.state}: it will be sent again."

        return await self.act(request, action)

    async def outbox_page(self, request: Request) -> Response:
        base = self.base(request)

        async def body(ops: JobOperations, can_manage: bool, _f: Filters) -> Html | Content:  # noqa: ARG001
            if self.outbox is None:
                return render("pages/outbox.html", configured=False)
            outbox = self.outbox_ops(request)
            manage = await outbox.can_manage()
            shown: list[dict[str, Any]] = []
            for outbox_id in self.outbox_ids:
                pending, claimed = await outbox.counts(outbox_id)
                dead = await outbox.list_dead(outbox_id, limit=PAGE_SIZE)
                trend = None if self.stats is None else await outbox_trend(self.stats, outbox_id)
                shown.append(
                    {
                        "id": outbox_id,
                        "pending": pending,
                        "claimed": claimed,
                        "dead": dead.items,
                        "more": dead.next_cursor is not None,
                        "purge": f"{base}/outbox/{quote(outbox_id)}/purge",
                        "trend": trend,
                    }
                )
            html = render(
                "pages/outbox.html",
                configured=True,
                outboxes=shown,
                manage=manage,
                base=base,
                csrf=self.csrf(request) if manage else "",
                max_days=MAX_RETENTION_DAYS,
                redrive=(REDRIVE_SELECTED, REDRIVE_ALL),
            )
            return Content(html, {"outboxes": [_outbox_data(o) for o in shown]})

        return await self.page(request, "/outbox", "Outbox", body)

    async def upkeep(self, request: Request) -> Response:
        """Retention: cleanup of finished runs past their jobs' retention, and the purge of old
        workflow events (the operator actions ``ship-sqla jobs cleanup`` / ``events-purge``
        run from the shell or a schedule)."""
        base = self.base(request)

        async def body(ops: JobOperations, can_manage: bool, _f: Filters) -> Html | Content:  # noqa: ARG001
            html = render(
                "pages/upkeep.html",
                definitions=list(self.definitions.values()),
                can_manage=can_manage,
                base=base,
                csrf=self.csrf(request) if can_manage else "",
                max_days=MAX_RETENTION_DAYS,
            )
            retentions = {d.id: d.retention for d in self.definitions.values()}
            return Content(html, {"retention": retentions})

        return await self.page(request, "/upkeep", "Upkeep", body)

    # --- actions -------------------------------------------------------------------------------

    async def run_action(self, request: Request) -> Response:
        run_id, verb = request.path_params["run_id"], request.path_params["verb"]

        async def action(ops: JobOperations, fields: dict[str, list[str]]) -> str:
            if verb not in ("retry", "discard", "cancel", "rerun", "unpark"):
                raise NotFound(
                    f"A run has no action {verb[:40]!r}.",
                    fix="use the run page's buttons: retry, cancel, discard, unpark or re-run"
                    " from a step.",
                )
            require_key(run_id, "run id")  # InvalidKeyError: refused before any statement
            if await ops.get_run(run_id) is None:
                raise no_run(run_id)
            if verb == "rerun":
                step = (fields.get("step") or [""])[0]
                await ops.rerun_from_step(run_id, step)
                return f"Re-run of {run_id} from step {step!r}: due now."
            if verb == "retry":
                await ops.retry(run_id)
            elif verb == "unpark":
                await ops.unpark(run_id)
                return f"Unpark of {run_id}: due now, it replays on the deployed code."
            elif verb == "discard":
                await ops.discard(run_id)
            else:
                result = await ops.cancel(run_id)
                return f"Cancel of {run_id}: {result.outcome}."
            return f"{verb.capitalize()} of {run_id}: done."

        return await self.act(request, action)

    async def backfill_action(self, request: Request) -> Response:
        """A backfill's start or cancel (C4, C5): the backfill operations' own, audited."""
        backfill_id, verb = request.path_params["backfill_id"], request.path_params["verb"]

        async def action(_ops: JobOperations, _fields: dict[str, list[str]]) -> str:
            if verb not in ("start", "cancel"):
                raise NotFound(
                    f"A backfill has no action {verb[:40]!r}.",
                    fix="use the Consumers & backfills page's buttons: start or cancel.",
                )
            backfill_ops = self.backfill_ops(request)
            if verb == "cancel":
                cancelled = await backfill_ops.cancel(backfill_id)
                if cancelled.changed:
                    return f"Backfill {backfill_id} is cancelled; start resumes it."
                return f"Backfill {backfill_id} is {cancelled.record.state}: nothing changed."
            started = await backfill_ops.start(backfill_id)
            return f"Start of backfill {backfill_id}: {started.outcome}."

        return await self.act(request, action)

    async def runs_bulk(self, request: Request) -> Response:
        async def action(ops: JobOperations, fields: dict[str, list[str]]) -> str:
            verb = (fields.get("action") or [""])[0]
            ids = fields.get("id") or []
            if not ids:
                raise ConfigurationError("no run selected.", fix="tick the runs first.")
            operation = {
                "retry": ops.retry_many,
                "discard": ops.discard_many,
                "cancel": ops.cancel_many,
            }.get(verb)
            if operation is None:
                raise ConfigurationError(f"unknown action {verb!r}.", fix="use the buttons.")
            result = await operation(ids)
            return _summary(verb.capitalize(), result.changed, result.unchanged)

        return await self.act(request, action)

    async def dead_bulk(self, request: Request) -> Response:
        async def action(ops: JobOperations, fields: dict[str, list[str]]) -> str:
            verb = (fields.get("action") or [""])[0]
            ids = fields.get("id") or []
            if not ids:
                raise ConfigurationError("no run selected.", fix="tick the runs first.")
            if verb == "retry":
                result = await ops.retry_many(ids)
            elif verb == "discard":
                result = await ops.discard_many(ids)
            else:
                raise ConfigurationError(f"unknown action {verb!r}.", fix="use the buttons.")
            return _summary(verb.capitalize(), result.changed, result.unchanged)

        return await self.act(request, action)

    async def job_action(self, request: Request) -> Response:
        job_id, verb = request.path_params["job_id"], request.path_params["verb"]

        async def action(ops: JobOperations, _fields: dict[str, list[str]]) -> str:
            if verb == "pause":
                paused = await ops.pause(job_id)
                said = f"Pause {job_id}: {'done' if paused.changed else 'nothing to do'}."
                if not paused.known:
                    said += (
                        f" Job {job_id} is not known to the database yet (no run, schedule or"
                        " other state): its runs are held from the first one; if the id is"
                        " wrong, resume it."
                    )
                return said
            if verb == "resume":
                resumed = await ops.resume(job_id)
                return f"Resume {job_id}: {'done' if resumed else 'nothing to do'}."
            raise NotFound(
                f"A job has no action {verb[:40]!r}.", fix="use the overview's pause or resume."
            )

        return await self.act(request, action)

    async def upkeep_action(self, request: Request) -> Response:
        verb = request.path_params["verb"]

        async def action(ops: JobOperations, fields: dict[str, list[str]]) -> str:
            if verb == "cleanup":
                if not self.definitions:
                    raise ConfigurationError(
                        "this dashboard was given no job definitions, so no retention to apply.",
                        fix="pass create_dashboard(definitions=[...]).",
                    )
                deleted = await ops.cleanup(self.definitions.values())
                return f"Cleanup: {sum(deleted.values())} run(s) deleted."
            if verb == "events-purge":
                older_than = _older_than(fields)
                purged = await ops.delete_events(older_than=older_than)
                return f"Purged {purged} workflow event(s)."
            raise NotFound(
                f"Upkeep has no action {verb[:40]!r}.", fix="use the upkeep page's buttons."
            )

        return await self.act(request, action)

    async def outbox_purge(self, request: Request) -> Response:
        outbox_id = request.path_params["outbox_id"]

        async def action(_ops: JobOperations, fields: dict[str, list[str]]) -> str:
            outbox = self._shown_outbox(request, outbox_id)
            deleted = await outbox.purge_delivered(outbox_id, older_than=_older_than(fields))
            return f"Purged {deleted} delivered message(s) of {outbox_id}."

        return await self.act(request, action)

    def _shown_outbox(self, request: Request, outbox_id: str) -> OutboxOperations:
        """The outbox operations for ``outbox_id`` when this dashboard shows it, else a 404."""
        if self.outbox is None or outbox_id not in self.outbox_ids:
            raise NotFound(
                f"This dashboard shows no outbox {outbox_id[:80]!r}.",
                fix="act from the outbox page; an outbox appears there when it is in"
                " create_dashboard(outbox_ids=[...]).",
            )
        return self.outbox_ops(request)

    async def outbox_redrive(self, request: Request) -> Response:
        outbox_id = request.path_params["outbox_id"]

        async def action(_ops: JobOperations, fields: dict[str, list[str]]) -> str:
            outbox = self._shown_outbox(request, outbox_id)
            if (fields.get("action") or [""])[0] == REDRIVE_ALL:
                result = await outbox.retry_dead_matching(
                    outbox_id, max_batches=OUTBOX_REDRIVE_PAGES
                )
                rest = "" if result.complete else " More remain: run it again."
                return f"Re-drove {len(result.moved)} dead message(s) of {outbox_id}.{rest}"
            try:
                ids = [uuid.UUID(i) for i in fields.get("id") or []]
            except ValueError as exc:
                raise ConfigurationError(
                    "a message id is not a UUID.", fix="use the form."
                ) from exc
            moved_ids = await outbox.retry(ids)
            return f"Re-drove {len(moved_ids)} of {len(ids)} selected message(s)."

        return await self.act(request, action)


_RUN_ORDERS: Final[dict[RunOrder, tuple[str, str, Callable[[RunRecord], datetime | None]]]] = {
    "claim": (
        "In claim order: highest priority first, then soonest due, then oldest.",
        "Due",
        lambda r: r.run_at,
    ),
    "lease": (
        "Soonest lease to lapse first (lapsed leases first: a claim retakes them).",
        "Lease until",
        lambda r: r.lease_expires_at,
    ),
    "created": ("Newest first.", "Finished", lambda r: r.finished_at),
    "finished": ("Newest finished first.", "Finished", lambda r: r.finished_at),
}
"""What the runs page says about its order, per state's order (:func:`run_order`), the time
column's heading and its value."""


def _time_range(
    state: RunState, since: datetime | None, until: datetime | None
) -> dict[str, datetime | None]:
    """The runs page's since / until as :meth:`JobOperations.list_runs` takes them for
    ``state``: a finish-time range for completed runs (J18), else a creation-time range."""
    if run_order(state) == "finished":
        return {"finished_from": since, "finished_to": until}
    return {"created_from": since, "created_to": until}


_NO_BACKFILLS: Final = (
    "No backfill ledger given (create_dashboard(backfills=create_backfill_ledger(...)), or"
    " ship-sqla dashboard --backfills-table ship_backfills)."
)

_RUN_ACTIONS: Final[dict[str, tuple[str, ...]]] = {
    "waiting": ("cancel", "discard"),
    "running": ("cancel",),
    "dead": ("retry", "discard"),
}


def _consumer_row(base: str, k: ConsumerKeyProgress) -> tuple[Html, ...]:
    """One consumer key (C3): its lag and last batch as its newest run recorded them, that run,
    and the key's live run (its state; often a newer run, before its first batch)."""
    progress = k.progress
    lag = progress.get("lag")
    last = progress.get("last_batch_at")
    try:
        last_at = datetime.fromisoformat(last) if isinstance(last, str) else None
    except ValueError:
        last_at = None
    live = (
        "—"
        if k.live_run_id is None
        else link(base, "/runs/" + quote(k.live_run_id, safe="/"), k.live_state or "")
    )
    return (
        text(k.job_id),
        text(k.key),
        text("—" if lag is None else f"{lag:,}" if isinstance(lag, int) else lag),
        at(last_at) if last_at is not None else text(last or "—"),
        text(progress.get("batches", "—")),
        text(progress.get("items", "—")),
        str(PARTS.run_link(href(base, "/runs/" + quote(k.run_id, safe="/")), k.run_id, k.state)),
        live,
    )


def _backfill_row(
    base: str, r: BackfillRecord, now: datetime, csrf: str | None
) -> tuple[Html, ...]:
    """One backfill's ledger row (C4): progress, pace, last key, stalled; the manager's cancel
    (a live one: pending or running) or start (a failed or cancelled one: it resumes from its
    last key)."""
    status = r.status(now)
    stalled = r.stalled_since(now)
    here = f"{base}/backfills/{quote(r.id, safe='')}"
    action = ""
    if csrf is not None:
        if r.live:
            action = button_form(f"{here}/cancel", "Cancel", csrf=csrf, back=base + "/consumers")
        elif r.state != "completed":
            action = button_form(f"{here}/start", "Start", csrf=csrf, back=base + "/consumers")
    last_key = "—" if r.last_key is None else ", ".join(str(part) for part in r.last_key)
    return (
        text(r.id),
        state_cell(status),
        text(f"{r.pages:,}"),
        text(f"{r.rows:,}"),
        text("—" if r.pace is None else f"{r.pace:g} pages/s"),
        str(PARTS.code(last_key[:120])),
        at(r.started_at),
        at(r.updated_at),
        at(stalled),
        text(r.required_by or "—"),
        action,
    )


def _endpoint_row(
    base: str, e: WebhookEndpointRecord, csrf: str | None, back: str
) -> tuple[Html, ...]:
    """One endpoint (W4): its state and why it is disabled, its failure streak, topics and url
    (never a secret); the manager's disable (with a reason) or enable."""
    here = f"{base}/webhooks/endpoints/{quote(e.id, safe='')}"
    state = str(PARTS.endpoint_state(e.state, (e.disabled_reason or "")[:300]))
    action = ""
    if csrf is not None:
        if e.state == "enabled":
            action = str(PARTS.disable_form(f"{here}/disable", csrf, back, WEBHOOK_REASON_CHARS))
        else:
            action = button_form(f"{here}/enable", "Enable", csrf=csrf, back=back)
    return (
        text(e.id),
        state,
        text(e.consecutive_failures),
        text(", ".join(e.topics)),
        str(PARTS.code(e.url[:300])),
        at(e.updated_at),
        action,
    )


def _attempt_line(a: DeliveryAttempt) -> dict[str, Any]:
    return {
        "at": a.at,
        "status": "no answer" if a.status is None else f"HTTP {a.status}",
        "duration": f"{a.duration:.3f}",
        "error": a.error,
        "body": excerpt(a.body, WEBHOOK_BODY_SHOWN) if a.body else "",
    }


def _delivery_row(
    base: str, d: WebhookDeliveryRecord, csrf: str | None, back: str
) -> tuple[Html, ...]:
    """One delivery (W1, W3) and its latest attempts; the manager's redeliver for one that
    ended (delivered or failed)."""
    latest = d.attempts[-WEBHOOK_ATTEMPTS_SHOWN:]
    earlier = len(d.attempts) - len(latest)
    lines = [_attempt_line(a) for a in reversed(latest)]
    cell = str(PARTS.attempts(lines, earlier)) if d.attempts else "none yet"
    action = ""
    if csrf is not None and d.state in ("delivered", "failed"):
        action = button_form(
            f"{base}/webhooks/deliveries/{quote(d.id, safe='')}/redeliver",
            "Redeliver",
            csrf=csrf,
            back=back,
        )
    return (
        text(d.id),
        text(d.endpoint_id),
        text(d.topic),
        state_cell(d.state),
        at(d.created_at),
        cell,
        action,
    )


def _outbox_data(shown: Mapping[str, Any]) -> dict[str, Any]:
    """One outbox on the JSON twin: its counts, dead messages and trend (no SVG)."""
    data = {k: v for k, v in shown.items() if k not in ("purge", "trend")}
    trend = shown.get("trend")
    if trend is not None:
        data["trend"] = {k: trend[k] for k in ("range", "step_minutes", "sampled", "buckets")}
    return data


def _serving_cell(served: Serving | None, job_id: str) -> Html:
    """How many live workers serve ``job_id`` (issue 27 item 8): 'none' when workers are live
    and none declares it (its runs wait until one starts; a mistyped id waits forever)."""
    if served is None:
        return text("-")
    if served.unserved(job_id):
        return str(PARTS.unserved())
    return text(served.workers_for(job_id))


def _bulk_buttons(
    actions: Iterable[str], state: str, job: str | None, tenant: str | None, base: str
) -> Html:
    """The runs page's bulk buttons: each action on the selection and, for waiting and running
    runs, a link to the preview of cancelling every run of the page's filter (issue 36: the
    count first, then a confirmation; ``_bulk_page``)."""
    scope = f"of job {job}" if job else "of every job"
    scope += f", tenant {tenant}" if tenant else ""
    live = state in LIVE_STATES
    preview = href(base, "/bulk/cancel", {"state": state, "job": job, "tenant": tenant})
    return str(PARTS.bulk_buttons(list(actions), live, state, preview, scope))


MAX_RETENTION_DAYS: Final = 36_500
"""The oldest age a retention form takes (a century)."""


def _retention_form(action: str, label: str, *, csrf: str, back: str) -> Html:
    """A retention action's form: an age in days (default 7), then the button."""
    return str(PARTS.retention_form(action, label, csrf, back, MAX_RETENTION_DAYS))


def _older_than(fields: Mapping[str, list[str]]) -> timedelta:
    """A retention form's age: ``older_than_days``, a number of days from 0 to a century."""
    raw = (fields.get("older_than_days") or [""])[0].strip()
    try:
        days = float(raw)
    except ValueError:
        days = -1.0
    if not 0 <= days <= MAX_RETENTION_DAYS:  # NaN fails both comparisons
        raise ConfigurationError(
            f"older_than_days must be a number of days from 0 to {MAX_RETENTION_DAYS}, got"
            f" {raw[:40]!r}.",
            fix="enter an age in days, e.g. 7.",
        )
    return timedelta(days=days)


def _summary(verb: str, changed: tuple[str, ...], unchanged: tuple[str, ...]) -> str:
    return f"{verb}: {len(changed)} changed, {len(unchanged)} unchanged."


def create_dashboard(
    backend: AdministeredBackend,
    *,
    authorizer: DashboardAuthorizer,
    actor: Callable[[Request], str] | None = None,
    audit: AuditSink | _Unset | None = _UNSET,
    outbox: OutboxOperations | None = None,
    outbox_ids: Iterable[str] = (),
    definitions: Iterable[JobDefinition[Any]] = (),
    secret: bytes | str | None = None,
    refresh_seconds: float = 10.0,
    backfills: BackfillLedger | None = None,
    webhooks: WebhookSender | None = None,
    stats: JobStatsStore | None = None,
    redact: Redact | None = None,
) -> Starlette:
    """The operator dashboard over ``backend`` (any job backend), an ASGI application to mount
    anywhere (``app.mount("/ops", create_dashboard(...))``) or serve alone
    (``ship-sqla dashboard``).

    - ``authorizer(request, permission, operation)``: whether the request's user holds
      ``permission``; reads ask ``ship.jobs:read`` (or manage), actions ``ship.jobs:manage``
      (the outbox page: ``ship.outbox:read`` / ``ship.outbox:manage``; the Webhooks page:
      ``ship.webhooks:read`` / ``ship.webhooks:manage``). Fail closed.
    - ``actor(request)``: who the audit log names (default: the authenticated
      ``request.user``'s display name, else ``anonymous@<client address>``).
    - ``audit``: the audit log every action is written to (S1; e.g.
      :func:`~ship_sqla.create_audit_log`); also shown on the audit page. Required: an action
      whose audit cannot be written (its table is missing) changes nothing and says which table
      to create; ``audit=None`` runs the dashboard unaudited, the explicit opt-out.
    - ``outbox`` / ``outbox_ids``: the outbox operations and the outbox ids to show; under an
      audited dashboard the outbox operations must be audited too (their own ``audit``).
    - ``definitions``: the job definitions, for the schedules' last occurrence and to list idle
      jobs on the overview.
    - ``secret``: signs CSRF tokens and page cursors (at least 16 bytes; default random per
      process: give every replica behind one load balancer the same one).
    - ``refresh_seconds``: how often the overview, workers and consumers pages refresh
      themselves (0: never).
    - ``backfills``: the backfill ledger (:func:`~ship_sqla.backfills.create_backfill_ledger`)
      whose backfills the Consumers & backfills page lists, with start and cancel (C4, C5);
      ``backend`` must then be a whole job backend (the backfills' runs live there).
    - ``webhooks``: the webhook sender (:func:`~ship_sqla.webhooks.create_webhook_sender`)
      whose endpoints and deliveries the Webhooks page lists (``ship.webhooks:read``), with
      disable, enable and redeliver (``ship.webhooks:manage``, audited). No secret is shown;
      adding an endpoint and rotating its secret stay at the shell.
    - ``stats``: the job history (:func:`~ship_sqla.create_job_stats`) the workers and relays
      flush into: the job pages' and overview's charts, the outbox page's trend (issue 36).
    - ``redact(field, value, job_id) -> value``: shown in place of a payload (``"payload"``),
      error text (``"error"``) or step result (``"result"``) on every page and JSON twin; a
      hook that raises hides it. Payloads need ``ship.jobs:payloads`` (:mod:`._redact`).
    """
    _check_authorizer(authorizer)
    audit = _checked_audit(audit, outbox)
    key_bytes = _checked_secret(secret)
    jobs = create_job_operations(
        backend, authorizer=lambda _p, _o: False, cursor_secret=key_bytes, audit=audit
    )
    state = _Dashboard(
        jobs,
        authorizer=authorizer,
        actor=actor or _default_actor,
        outbox=outbox,
        outbox_ids=tuple(outbox_ids),
        secret=key_bytes,
        definitions={d.id: d for d in definitions},
        refresh_seconds=refresh_seconds,
        backfills=_checked_backfills(backfills, backend),
        audit_sink=audit,
        webhooks=_checked_webhooks(webhooks),
        backend=backend,
        stats=stats,
        redact=check_redact(redact),
    )
    tables = _TablesCheck(backend)
    return _DashboardApp(
        routes=_routes(state),
        exception_handlers={404: _router_error, 405: _router_error},
        middleware=[Middleware(_TablesChecked, tables=tables)],
        lifespan=tables.at_startup,
    )


def _check_authorizer(authorizer: object) -> None:
    if not callable(authorizer):
        raise ConfigurationError(
            "authorizer must be callable(request, permission, operation) -> bool.",
            fix="pass authorizer=lambda request, permission, operation: ...",
        )


def _routes(state: _Dashboard) -> list[BaseRoute]:
    """The dashboard's routes: each page (GET) and each action (POST, declared in
    :data:`~ship_sqla.kernel._actions.OPERATOR_ACTIONS`)."""
    modules = page_modules()
    state.nav = header_links(_NAV, modules)
    return [
        Route("/", state.overview, methods=["GET"]),
        Mount("/static", StaticAssets()),
        Route("/health", state.health, methods=["GET"]),
        Route("/goto", state.goto, methods=["GET"]),
        Route("/refresh", state.refresh, methods=["GET"]),
        Route("/runs", state.runs, methods=["GET"]),
        Route("/runs/bulk", state.runs_bulk, methods=["POST"]),
        Route("/runs/{run_id:path}/{verb}", state.run_action, methods=["POST"]),
        Route("/dead", state.dead, methods=["GET"]),
        Route("/dead/bulk", state.dead_bulk, methods=["POST"]),
        Route("/workers", state.workers, methods=["GET"]),
        Route("/consumers", state.consumers, methods=["GET"]),
        Route("/backfills/{backfill_id}/{verb}", state.backfill_action, methods=["POST"]),
        Route("/outbox", state.outbox_page, methods=["GET"]),
        Route("/outbox/{outbox_id}/redrive", state.outbox_redrive, methods=["POST"]),
        Route("/outbox/{outbox_id}/purge", state.outbox_purge, methods=["POST"]),
        Route("/webhooks", state.webhooks_page, methods=["GET"]),
        Route(
            "/webhooks/endpoints/{endpoint_id:path}/{verb}",
            state.webhook_endpoint_action,
            methods=["POST"],
        ),
        Route(
            "/webhooks/deliveries/{delivery_id:path}/redeliver",
            state.webhook_redeliver,
            methods=["POST"],
        ),
        Route("/upkeep", state.upkeep, methods=["GET"]),
        Route("/upkeep/{verb}", state.upkeep_action, methods=["POST"]),
        Route("/jobs/{job_id}/{verb}", state.job_action, methods=["POST"]),
        Route("/live/overview", LiveOverview.of(state).stream, methods=["GET"]),
        *page_routes(state, modules),
    ]


def _checked_secret(secret: bytes | str | None) -> bytes:
    """The secret as bytes (default: random per process); at least 16 bytes."""
    key = secrets.token_bytes(32) if secret is None else secret
    key_bytes = key.encode() if isinstance(key, str) else key
    if len(key_bytes) < 16:  # noqa: PLR2004 - the documented minimum
        raise ConfigurationError(
            "the dashboard secret must be at least 16 bytes.", fix="pass secrets.token_bytes(32)."
        )
    return key_bytes


def _checked_backfills(
    ledger: BackfillLedger | None, backend: AdministeredBackend
) -> tuple[BackfillLedger, JobBackend] | None:
    if ledger is None:
        return None
    if not isinstance(ledger, BackfillLedger):
        raise ConfigurationError(
            f"backfills must be a backfill ledger, got {type(ledger).__name__}.",
            fix="pass backfills=create_backfill_ledger(database=engine) (or an"
            " InMemoryBackfillLedger), or omit it.",
        )
    if not isinstance(backend, JobBackend):
        raise ConfigurationError(
            "backfills= needs the dashboard's backend to be a whole job backend: a backfill's"
            " start enqueues its run and its cancel cancels it there.",
            fix="pass the backend from create_job_backend(...) (or InMemoryJobBackend).",
        )
    return ledger, backend


def _checked_webhooks(sender: WebhookSender | None) -> WebhookSender | None:
    if sender is not None and not isinstance(sender, WebhookSender):
        raise ConfigurationError(
            f"webhooks must be a webhook sender, got {type(sender).__name__}.",
            fix="pass webhooks=create_webhook_sender(database=engine, backend=backend), or omit"
            " it.",
        )
    return sender


def _checked_audit(
    audit: AuditSink | _Unset | None, outbox: OutboxOperations | None
) -> AuditSink | None:
    """S1's one audit rule for the dashboard: ``audit`` must be given (None is the explicit
    opt-out), and an audited dashboard's outbox operations must be audited too, so that no
    action of the dashboard changes anything unaudited."""
    if isinstance(audit, _Unset):
        raise ConfigurationError(
            "create_dashboard needs audit=: every dashboard action is written to the audit log"
            " (S1).",
            fix="pass audit=create_audit_log(database=engine) (its table: ship_audit_table, or"
            " `ship-sqla schema apply --only audit`), or audit=None to run the dashboard"
            " unaudited on purpose.",
        )
    if audit is not None and outbox is not None and not outbox.audited:
        raise ConfigurationError(
            "the dashboard is audited but its outbox operations write no audit log: their"
            " re-drives would change messages unaudited (S1).",
            fix="pass the same log to create_outbox_operations(..., audit=audit).",
        )
    return audit


_ROUTER_ERRORS: Final[dict[int, str]] = {
    404: "This dashboard has no such page. Fix: follow the links in the header.",
    405: "This address does not take that method (its actions are forms the pages submit)."
    " Fix: use the page's own buttons.",
}


def _plain_error(request: Request, status: int) -> Response:
    """A 404 or 405 of the router or of a static asset: what and the fix, as plain text (no
    session, no database read: the request matched nothing to read for)."""
    path = str(request.scope.get("path", ""))[:200]
    return PlainTextResponse(f"{status} {path!r}: {_ROUTER_ERRORS[status]}", status)


async def _router_error(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 404)
    response = _plain_error(request, status if status in _ROUTER_ERRORS else 404)
    if status == 405:  # noqa: PLR2004 - RFC 9110: a 405 names the methods allowed
        response.headers.update(getattr(exc, "headers", None) or {})
    return response


class _TablesCheck:
    """Issue 27 item 7: the job tables the dashboard reads, checked once by the backend's one
    probe (:meth:`PostgresJobBackend.require_tables`) at the application's startup when it is
    served alone, else at its first request (a mounted app receives no lifespan events); asked
    until it answers (the backend keeps the answer). Another backend has no tables to check."""

    def __init__(self, backend: AdministeredBackend) -> None:
        self._backend = backend if isinstance(backend, PostgresJobBackend) else None

    async def require(self) -> None:
        if self._backend is not None:
            await self._backend.require_tables("the dashboard")

    @contextlib.asynccontextmanager
    async def at_startup(self, _app: object) -> AsyncIterator[None]:
        """Starlette's lifespan: a missing table fails the startup (``ship-sqla dashboard``
        exits naming it) instead of every page answering 500."""
        await self.require()
        yield


class _TablesChecked:
    """The first request's check (:class:`_TablesCheck`): a missing table is a 503 naming the
    tables and the ``ship-sqla schema apply`` command, never a bare 500."""

    def __init__(self, app: ASGIApp, tables: _TablesCheck) -> None:
        self.app = app
        self.tables = tables

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                await self.tables.require()
            except MissingTablesError as exc:
                await PlainTextResponse(f"503 {exc}", 503)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _DashboardApp(Starlette):
    """The dashboard's Starlette application with :class:`SecurityHeaders` outermost: outside
    Starlette's own error handling, so its 404, 405 and 500 answers carry the headers too."""

    def build_middleware_stack(self) -> ASGIApp:
        return SecurityHeaders(super().build_middleware_stack())
