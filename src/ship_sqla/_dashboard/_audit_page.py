"""The audit log's page (S1; issue 36 item 6): ``GET /audit``, filtered and linked.

Filters: ``actor`` and ``operation`` (exact: the form offers every declared operation),
``target`` (text in the entry's target: a run id, a job id, a bulk filter), and ``since`` /
``until`` on the entry's time (UTC unless an offset is given). Each page is at most 50 entries,
newest first, read through the log's own newest-first pages (its primary key) and filtered,
reading at most :data:`~ship_sqla.kernel._audit.AUDIT_SCAN` entries: a page that stops there
says so and its "Older" link goes on from where it stopped. Bad input is a 400 naming the field
with the form kept as sent (:meth:`~._app._Dashboard.page`).

Each entry links to what it acted on: a run's page for a one-run action, the job's page for a
job's (pause, resume, run now), the search that was acted on and the first changed runs for a
bulk action by filter, the changed runs of a bulk action by selection, the outbox page for an
outbox's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

from markupsafe import Markup
from starlette.routing import BaseRoute, Route

from ship_sqla._dashboard._html import href, render
from ship_sqla._dashboard._page import PAGE_SIZE, Content, Nav
from ship_sqla.kernel._actions import OPERATOR_ACTIONS
from ship_sqla.kernel._audit import AUDIT_SCAN, AuditFilter

if TYPE_CHECKING:
    from collections.abc import Mapping

    from starlette.requests import Request
    from starlette.responses import Response

    from ship_sqla._dashboard._filters import Filters, Parameter
    from ship_sqla._dashboard._html import Html
    from ship_sqla._dashboard._page import Dashboard
    from ship_sqla.kernel._audit import AuditEntry
    from ship_sqla.kernel._operations import JobOperations

__all__ = ["NAV", "entry_links", "routes"]

NAV: Final = Nav("/audit", "Audit log", after="/upkeep")
OPERATIONS: Final = tuple(sorted({action.operation for action in OPERATOR_ACTIONS}))
"""The operations the form offers (every declared operator action's)."""
RUN_OPERATIONS: Final = frozenset(
    {"jobs.retry", "jobs.discard", "jobs.cancel", "jobs.rerun_from_step", "jobs.unpark"}
    | {"jobs.move_version"}
)
"""Operations whose target is one run id."""
JOB_OPERATIONS: Final = frozenset({"jobs.pause", "jobs.resume", "jobs.run_now"})
"""Operations whose target is one job id."""
_READS: Final[tuple[Parameter, ...]] = ("actor", "operation", "target", "since", "until", "before")
RUNS_LINKED: Final = 5
"""Changed runs an entry links to (its JSON twin has every id the entry recorded)."""


def entry_links(base: str, entry: AuditEntry) -> list[tuple[str, str]]:
    """``(label, href)`` of what ``entry`` acted on (see the module docstring)."""
    operation, target, details = entry.operation, entry.target, entry.details
    if operation in RUN_OPERATIONS:
        return [("run", href(base, "/runs/" + quote(target, safe="/")))]
    if operation in JOB_OPERATIONS:
        return [("job", href(base, "/jobs/" + quote(target, safe="")))]
    if operation.startswith("outbox."):
        return [("outbox", href(base, "/outbox"))]
    found: list[tuple[str, str]] = []
    links = details.get("links")
    search = links.get("search") if isinstance(links, dict) else None
    if isinstance(search, str) and search.startswith("/search?"):
        found.append(("search", base + search))
    changed = details.get("changed_ids")
    if isinstance(changed, list):
        found += [
            (str(run_id), href(base, "/runs/" + quote(str(run_id), safe="/")))
            for run_id in changed[:RUNS_LINKED]
        ]
    return found


def _audit_filter(f: Filters) -> AuditFilter:
    return AuditFilter(
        actor=f.actor or None,
        operation=f.operation or None,
        target=f.target or None,
        since=f.since,
        until=f.until,
    )


def _older(base: str, sent: Mapping[str, str], before: int | None) -> str:
    if before is None:
        return ""
    kept = {k: sent.get(k, "") for k in ("actor", "operation", "target", "since", "until")}
    return href(base, "/audit", {**kept, "before": before})


async def audit_page(dashboard: Dashboard, request: Request) -> Response:
    base = dashboard.base(request)

    def form(sent: Mapping[str, str]) -> Html:
        """The filters as sent (checked or refused: the form is kept to correct them)."""
        return render("pages/audit_form.html", base=base, sent=sent, operations=OPERATIONS)

    async def body(ops: JobOperations, _can_manage: bool, f: Filters) -> Html | Content:
        match = _audit_filter(f)
        page = await ops.search_audit(match, limit=PAGE_SIZE, before=f.before)
        older = _older(base, request.query_params, page.next_before)
        rows = [(e, entry_links(base, e)) for e in page.entries]
        html = render(
            "pages/audit.html",
            form=Markup(form(request.query_params)),  # noqa: S704 - rendered
            rows=rows,
            older_href=older,
            page=page,
            filtered=not match.empty,
            scan=AUDIT_SCAN,
        )
        data: dict[str, Any] = {
            "entries": page.entries,
            "links": [dict(links) for _e, links in rows],
            "older": older or None,
            "scanned": page.scanned,
            "stopped": page.stopped,
        }
        return Content(html, data)

    return await dashboard.page(request, "/audit", "Audit log", body, reads=_READS, form=form)


def routes(dashboard: Dashboard) -> list[BaseRoute]:
    """The audit page's route, found as a page module."""

    async def endpoint(request: Request) -> Response:
        return await audit_page(dashboard, request)

    return [Route("/audit", endpoint, methods=["GET"])]
