"""The schedules pages (issue 36 item 6): ``GET /schedules`` and ``GET /schedules/{job_id}``,
and ``POST /schedules/{job_id}/run-now``.

- The list: each stored schedule (J9) with its trigger, next and last occurrence, whether its
  job is paused, and for a manager "Run now" (:meth:`JobOperations.run_now`, audited) and
  pause / resume of its job (K3: the existing ``/jobs/{job_id}/pause|resume`` actions). Pause
  asks first: its link opens the schedule's page with ``?confirm=pause``, which shows what a
  pause does and the confirming POST form. No JavaScript.
- One schedule: the same, and its last 20 occurrences (from the job definition's schedule,
  newest first), each with the run its tick inserted (its durable id ``<job_id>/<occurrence>``,
  one primary-key probe each) and that run's state; an occurrence with no run was not fired (a
  process down catches up with one run, J9) or its run is past retention.

A paused job's schedule still fires (at most one run per occurrence); its runs wait until the
job is resumed. An unknown job id answers 404.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

from starlette.routing import BaseRoute, Route

from ship_sqla._dashboard._html import href, render
from ship_sqla._dashboard._page import Content, Nav, NotFound, jsonable
from ship_sqla.kernel._plans.schedule import occurrence_id, previous_occurrence

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence
    from datetime import datetime

    from starlette.requests import Request
    from starlette.responses import Response

    from ship_sqla._dashboard._filters import Filters
    from ship_sqla._dashboard._html import Html
    from ship_sqla._dashboard._page import Dashboard
    from ship_sqla.kernel._browse import ScheduleState
    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._operations import JobOperations

__all__ = ["NAV", "OCCURRENCES_SHOWN", "routes"]

OCCURRENCES_SHOWN: Final = 20
"""The occurrences a schedule's page lists (one primary-key probe each)."""
SCHEDULES_READ: Final = 1000
"""The schedules the pages read (the operator surface's bound)."""
_MICROSECOND: Final = timedelta(microseconds=1)


def last_occurrences(definition: JobDefinition[Any], next_at: datetime) -> list[datetime]:
    """The schedule's last :data:`OCCURRENCES_SHOWN` occurrences before ``next_at``, newest
    first."""
    schedule = definition.schedule
    found: list[datetime] = []
    at = next_at
    while schedule is not None and len(found) < OCCURRENCES_SHOWN:
        previous = previous_occurrence(schedule, at - _MICROSECOND)
        if previous is None:
            break
        found.append(previous)
        at = previous
    return found


def _last_at(definition: JobDefinition[Any] | None, s: ScheduleState) -> datetime | None:
    if definition is None or definition.schedule is None or s.next_at is None:
        return None
    return previous_occurrence(definition.schedule, s.next_at - _MICROSECOND)


async def _occurrences(
    ops: JobOperations, base: str, job_id: str, times: Sequence[datetime]
) -> list[dict[str, Any]]:
    rows = []
    for when in times:
        run_id = occurrence_id(job_id, when)
        run = await ops.get_run(run_id)
        rows.append(
            {
                "at": when,
                "run_id": run_id if run is not None else None,
                "href": href(base, "/runs/" + quote(run_id, safe="/")) if run else None,
                "state": None if run is None else run.state,
                "finished_at": None if run is None else run.finished_at,
            }
        )
    return rows


class _Schedules:
    def __init__(self, dashboard: Dashboard) -> None:
        self.d = dashboard

    def _row(
        self, request: Request, s: ScheduleState, paused: dict[str, Any], *, manage: bool
    ) -> dict[str, Any]:
        base = self.d.base(request)
        definition = self.d.definitions.get(s.job_id)
        page = f"{base}/schedules/{quote(s.job_id, safe='')}"
        return {
            "state": s,
            "last_at": _last_at(definition, s),
            "paused_at": paused.get(s.job_id),
            "href": page,
            "run_now": f"{page}/run-now" if manage and definition is not None else None,
            "resume": f"{base}/jobs/{quote(s.job_id, safe='')}/resume" if manage else None,
            "pause_confirm": href(
                base, f"/schedules/{quote(s.job_id, safe='')}", {"confirm": "pause"}
            )
            if manage
            else None,
        }

    async def list_page(self, request: Request) -> Response:
        async def body(ops: JobOperations, can_manage: bool, _f: Filters) -> Html | Content:
            paused = {p.job_id: p.paused_at for p in await ops.paused()}
            rows = [
                self._row(request, s, paused, manage=can_manage)
                for s in await ops.schedules(limit=SCHEDULES_READ)
            ]
            html = render(
                "pages/schedules.html",
                rows=rows,
                has_definitions=bool(self.d.definitions),
                csrf=self.d.csrf(request) if can_manage else "",
                back=self.d.base(request) + "/schedules",
            )
            data = [
                {**jsonable(r["state"]), "last_at": r["last_at"], "paused_at": r["paused_at"]}
                for r in rows
            ]
            return Content(html, {"schedules": data})

        return await self.d.page(request, "/schedules", "Schedules", body)

    async def one_page(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        confirm = request.query_params.get("confirm") == "pause"

        async def body(ops: JobOperations, can_manage: bool, _f: Filters) -> Html | Content:
            found = [s for s in await ops.schedules(limit=SCHEDULES_READ) if s.job_id == job_id]
            if not found:
                raise NotFound(
                    f"No schedule is stored for job {job_id[:200]!r}.",
                    fix="pick one on the Schedules page (a schedule is stored when a worker"
                    " whose registry schedules the job starts).",
                )
            paused = {p.job_id: p.paused_at for p in await ops.paused()}
            row = self._row(request, found[0], paused, manage=can_manage)
            definition = self.d.definitions.get(job_id)
            next_at = found[0].next_at
            times = (
                []
                if definition is None or next_at is None
                else last_occurrences(definition, next_at)
            )
            occurrences = await _occurrences(ops, self.d.base(request), job_id, times)
            here = row["href"]
            html = render(
                "pages/schedule.html",
                row=row,
                occurrences=occurrences,
                has_definition=definition is not None,
                confirm=confirm and can_manage and row["paused_at"] is None,
                pause=f"{self.d.base(request)}/jobs/{quote(job_id, safe='')}/pause",
                csrf=self.d.csrf(request) if can_manage else "",
                back=here,
                shown=OCCURRENCES_SHOWN,
            )
            data = {
                "schedule": {
                    **jsonable(found[0]),
                    "last_at": row["last_at"],
                    "paused_at": row["paused_at"],
                },
                "occurrences": occurrences,
            }
            return Content(html, data)

        return await self.d.page(request, "/schedules", f"Schedule {job_id}", body)

    async def run_now(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]

        async def action(ops: JobOperations, _fields: dict[str, list[str]]) -> str:
            definition = self.d.definitions.get(job_id)
            if definition is None:
                raise NotFound(
                    f"This dashboard has no definition of job {job_id[:200]!r}.",
                    fix="pass its definition in create_dashboard(definitions=[...]) (or"
                    " ship-sqla dashboard APP:REGISTRY), then use the Schedules page.",
                )
            result = await ops.run_now(definition)
            if result.rejected is not None:
                return f"Run now of {job_id}: refused ({result.rejected})."
            if result.deduplicated:
                return f"Run now of {job_id}: deduplicated onto run {result.run_id}."
            return f"Run now of {job_id}: run {result.run_id} is due now."

        return await self.d.act(request, action)


NAV: Final = Nav("/schedules", "Schedules", after="/errors")


def routes(dashboard: Dashboard) -> list[BaseRoute]:
    """The schedules pages' routes, found as a page module."""
    pages = _Schedules(dashboard)
    endpoints: list[tuple[str, Callable[[Request], Awaitable[Response]], str]] = [
        ("/schedules", pages.list_page, "GET"),
        ("/schedules/{job_id}", pages.one_page, "GET"),
        ("/schedules/{job_id}/run-now", pages.run_now, "POST"),
    ]
    return [Route(path, endpoint, methods=[method]) for path, endpoint, method in endpoints]
