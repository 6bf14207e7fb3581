"""What every dashboard page module needs, in one module of its own (issue 36): the page's
answer (:class:`Content`: its HTML and its JSON twin's data), the 404 (:class:`NotFound`), the
JSON twin's encoding, the cells several pages share, the links back, and how page modules are
found (:func:`page_routes`, :func:`header_links`).

A page module is a module of this package whose name ends in ``_page`` (``_run_page``,
``_audit_page``...). It defines ``routes(dashboard) -> list[BaseRoute]`` (its GET pages and POST
actions, each through ``dashboard.page`` or ``dashboard.act``) and, when the page belongs in the
header, ``NAV = Nav(path, label, after=<the path of the link it follows>)``. The application
finds it by its name (:func:`page_modules`): adding a page is its module (and its template,
when it has markup of its own), nothing else of the dashboard. It imports this module, the
HTML helpers (:mod:`._html`) and the filters (:mod:`._filters`), never the application
(:mod:`._app`): the dashboard it is given is typed by :class:`Dashboard` only.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeAlias
from urllib.parse import urlencode

import attrs
from markupsafe import Markup
from starlette.responses import JSONResponse

from ship_sqla._dashboard._html import PARTS, render
from ship_sqla._dashboard._security import NONCE_KEY

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
    from types import ModuleType

    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute

    from ship_sqla._dashboard._filters import Filters, Parameter
    from ship_sqla._dashboard._html import Html
    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._operations import AdministeredBackend, JobOperations
    from ship_sqla.kernel._ports import RunRecord
    from ship_sqla.kernel._stats import JobStatsStore

__all__ = [
    "PAGE_SIZE",
    "UNPARK",
    "Content",
    "Dashboard",
    "Nav",
    "NotFound",
    "PageBody",
    "divergence_section",
    "header_links",
    "here",
    "json_response",
    "jsonable",
    "marked",
    "no_run",
    "nonce",
    "page_modules",
    "page_routes",
    "state_cell",
    "wants_json",
    "with_params",
]

PAGE_SIZE: Final = 50
"""Rows a page lists (its "Next page" / "Older" link goes on)."""
PAGE_SUFFIX: Final = "_page"
"""The name a page module ends with (:func:`page_modules`)."""


@attrs.frozen
class Content:
    """A page's content: its HTML (rendered by its template) and the data its JSON twin
    answers (records, counts, cursors; issue 36)."""

    html: Html
    data: Any


PageBody: TypeAlias = "Callable[[JobOperations, bool, Filters], Awaitable[Html | Content]]"
"""A page's content: ``body(ops, can_manage, filters)`` (the filters it named, checked)."""


class Dashboard(Protocol):
    """What a page module uses of the dashboard it is given (:class:`~._app._Dashboard`): page
    modules type their dashboard by this protocol only, so everything one uses is here."""

    def base(self, request: Request) -> str:
        """The path the dashboard is mounted at (``""`` at the root)."""
        ...

    def csrf(self, request: Request) -> str:
        """The form token of ``request``'s session (a manager's forms carry it)."""
        ...

    @property
    def definitions(self) -> Mapping[str, JobDefinition[Any]]:
        """The job definitions the dashboard was given, by job id."""
        ...

    @property
    def backend(self) -> AdministeredBackend | None:
        """The backend the dashboard administers (None when it was given operations only)."""
        ...

    @property
    def stats(self) -> JobStatsStore | None:
        """The store of the jobs' history the job page charts (None: no charts)."""
        ...

    def ops(self, request: Request) -> JobOperations:
        """The job operations of ``request``'s user (its permissions, its audit actor)."""
        ...

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
        """The page ``current``: ``reads`` checked, then ``body``, in the layout; or its JSON
        twin; refusals as 400, 403, 404."""
        ...

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
        """The runs pages' table (one row per run, ``when`` heading the time column)."""
        ...

    async def act(
        self,
        request: Request,
        action: Callable[[JobOperations, dict[str, list[str]]], Awaitable[str]],
    ) -> Response:
        """A POST action: its CSRF token checked (403), then ``action(ops, fields)``; back to
        the form's page (``next``) with its message (``done``) or the library's refusal
        (``failed``); a refused permission a 403, a refused input a 400, an id nothing has a
        404 (:meth:`refused`)."""
        ...

    async def form(self, request: Request) -> dict[str, list[str]] | None:
        """A POST's fields, or None when its CSRF token is not its session's."""
        ...

    def back(self, request: Request, fields: Mapping[str, list[str]]) -> str:
        """The page an action goes back to (the form's ``next``, a path of this dashboard)."""
        ...

    async def refused(
        self, request: Request, ops: JobOperations, back: str, content: Html, status: int
    ) -> Response:
        """An action's 400 or 404 page: ``content`` and the way ``back``."""
        ...


@attrs.frozen
class Nav:
    """A page module's link in the header: ``path`` under the mount, its ``label``, placed
    after the link to ``after`` (at the end when no link has that path)."""

    path: str
    label: str
    after: str = ""


class NotFound(Exception):  # noqa: N818 - an answer (404), not an error of the library
    """The page or action names something that does not exist (a run id no run has, an action
    or outbox the dashboard does not have): a 404 saying what and how to find the right one."""

    def __init__(self, what: str, *, fix: str) -> None:
        super().__init__(what)
        self.what = what
        self.fix = fix

    def html(self) -> Html:
        return render(
            "notice.html", message=f"{self.what} Fix: {self.fix}", kind="error", id="not-found"
        )


def no_run(run_id: str) -> NotFound:
    return NotFound(
        f"No run has the id {run_id[:300]!r}.",
        fix="find the run on the Runs or Dead letters page (a finished run is deleted once its"
        " job's retention has passed).",
    )


# --- the JSON twin ---------------------------------------------------------------------------


def wants_json(request: Request) -> bool:
    """The JSON twin is asked for: ``Accept`` names ``application/json`` before any HTML."""
    accept = request.headers.get("accept", "").lower()
    if "application/json" not in accept:
        return False
    html_at = accept.find("text/html")
    return html_at < 0 or accept.find("application/json") < html_at


def jsonable(value: Any) -> Any:  # noqa: ANN401, PLR0911 - any record
    """``value`` as JSON values: attrs records and mappings as objects, times as ISO 8601,
    durations as seconds, ids and anything else as text."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if attrs.has(type(value)):
        return {
            f.name: jsonable(getattr(value, f.name))
            for f in attrs.fields(type(value))
            if not f.name.startswith("_")
        }
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    return str(value)


def json_response(content: Any, status: int) -> Response:  # noqa: ANN401 - any JSON value
    return JSONResponse(jsonable(content), status)


# --- cells and sections several pages show ----------------------------------------------------


def marked(rows: Iterable[Iterable[Html]]) -> list[list[Markup]]:
    """Table rows of cells rendered by the macros, marked safe for a page's template."""
    return [[Markup(cell) for cell in row] for row in rows]  # noqa: S704 - rendered cells


def state_cell(state: str | None) -> Html:
    return str(PARTS.state_cell(state))


UNPARK: Final = ("unpark", "#diverged")
"""D10: the run page offers Unpark for a run parked on a divergence (waiting for it)."""


def divergence_section(record: RunRecord) -> Html:
    """D10: a parked run's divergence, what its history recorded beside what the code asked
    for, from its last ``diverged`` history entry (whose last line is the divergence as JSON);
    empty for any other run."""
    if record.wait_for != "#diverged":
        return ""
    entries = [h for h in record.history if isinstance(h, dict) and h.get("kind") == "diverged"]
    if not entries:
        return ""
    error = str(entries[-1].get("error", ""))
    try:
        found = json.loads(error.rsplit("\n", 1)[-1])
    except ValueError:
        found = {}
    if not isinstance(found, dict):
        found = {}

    def call(side: object) -> str:
        if not isinstance(side, dict):
            return "— (nothing)"
        return f"{side.get('name')} ({side.get('kind')})"

    rows = (
        ("Position", found.get("position", "?"), ""),
        ("Step", call(found.get("recorded")), call(found.get("requested"))),
        ("Reason", found.get("reason", "?"), found.get("location") or ""),
    )
    return str(PARTS.divergence(rows, error.rsplit("\n", 1)[0]))


# --- the request ------------------------------------------------------------------------------


def nonce(request: Request) -> str:
    """The response's CSP nonce (:class:`~._security.SecurityHeaders` put it in the scope)."""
    return str(request.scope.get(NONCE_KEY, ""))


def with_params(path: str, **params: str) -> str:
    return path + ("&" if "?" in path else "?") + urlencode(params)


def here(request: Request, *, keep_flash: bool = False) -> str:
    """This page's path and query under the mount; without an action's ``done`` / ``failed``
    message unless ``keep_flash`` (the live refresh: the message stays while the page does)."""
    root = str(request.scope.get("root_path", "")).rstrip("/")
    path = request.url.path
    if not path.startswith(root):
        path = root + path
    flash = () if keep_flash else ("done", "failed")
    query = [(k, v) for k, v in request.query_params.multi_items() if k not in flash]
    return path + ("?" + urlencode(query) if query else "")


# --- page modules -----------------------------------------------------------------------------


def page_modules() -> list[ModuleType]:
    """Every page module of the dashboard (a module of this package whose name ends in
    ``_page`` and that defines ``routes``), in name order."""
    package = importlib.import_module(__package__ or "ship_sqla._dashboard")
    found = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name.endswith(PAGE_SUFFIX):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            if callable(getattr(module, "routes", None)):
                found.append(module)
    return found


def page_routes(dashboard: Dashboard, modules: Sequence[ModuleType]) -> list[BaseRoute]:
    """The routes of ``modules`` (:func:`page_modules`) over ``dashboard``."""
    return [route for module in modules for route in module.routes(dashboard)]


def header_links(
    core: Sequence[tuple[str, str]], modules: Sequence[ModuleType]
) -> tuple[tuple[str, str], ...]:
    """The header's links: ``core`` (path, label) with each page module's :class:`Nav` placed
    after the link it names."""
    links = list(core)
    for module in modules:
        nav = getattr(module, "NAV", None)
        if not isinstance(nav, Nav) or any(path == nav.path for path, _ in links):
            continue
        at = next((i + 1 for i, (path, _) in enumerate(links) if path == nav.after), len(links))
        links.insert(at, (nav.path, nav.label))
    return tuple(links)
