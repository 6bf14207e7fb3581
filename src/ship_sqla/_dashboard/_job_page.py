"""The per-job page and the error groups (issue 36, item 6; S1, S2).

- ``GET /jobs/{job_id}``: the job's definition (when ``definitions=`` has it: retries, timeout,
  priority, limits with their partitions, aging, schedule), its runs by state now (due,
  delayed, running, dead: the overview's bounded counts), its history charts over a range
  (``?range=1h|6h|24h|7d``, from the stats table given as ``stats=``; without one the page says
  how to enable it), its top error groups and its newest dead runs. An id no job has (no
  definition, no run, no history, not paused) is a 404.
- ``GET /errors``: the dead runs grouped by job, exception type and normalised message
  (:mod:`ship_sqla.kernel._error_groups`: the newest 2,000 dead runs, stated on the page).
- A group's "retry all dead in this group" leads to the bulk-by-filter preview
  (``GET /bulk/retry?job=&state=dead&error=``, :mod:`._bulk_page`): the count and a
  confirmation form (no JavaScript needed), whose POST runs :meth:`JobOperations.retry_filtered`
  (audited, at most the previewed count, in transactions of 1,000).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

import attrs
from starlette.routing import BaseRoute, Route

from ship_sqla._dashboard._charts import bars_chart as _bars
from ship_sqla._dashboard._charts import outcome_island, series_charts
from ship_sqla._dashboard._html import render
from ship_sqla._dashboard._page import Content, Nav, NotFound, nonce
from ship_sqla._dashboard._reads import OVERVIEW_COUNT_CAP
from ship_sqla.kernel._error_groups import (
    ERROR_GROUP_JOBS,
    ERROR_GROUP_PER_JOB,
    ERROR_GROUP_SCAN,
    ErrorGroups,
    error_groups,
)
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._jobs import is_job_id
from ship_sqla.kernel._stats import RANGES, range_buckets, series_from_rows

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from ship_sqla._dashboard._filters import Filters
    from ship_sqla._dashboard._html import Html
    from ship_sqla._dashboard._page import Dashboard
    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._operations import JobOperations
    from ship_sqla.kernel._stats import StatsSeries

__all__ = ["errors_page", "job_page"]

JOB_PAGE_GROUPS_SCAN: Final = 500
"""The job page's top errors: grouped from its newest 500 dead runs (one page read)."""
JOB_PAGE_TOP_ERRORS: Final = 5
JOB_PAGE_RECENT_DEAD: Final = 10
DEFAULT_RANGE: Final = "1h"
GROUP_RETRY_PATH: Final = "/bulk/retry"
"""Where a group's "retry all dead in this group" link leads, with the group's filter as its
query (``job``, ``state=dead``, ``error``: :meth:`RunFilter.as_fields`): the bulk-by-filter
preview (GET), whose confirmation form posts the retry (:mod:`._bulk_page`)."""


def _unknown_job(job_id: str) -> NotFound:
    return NotFound(
        f"No job has the id {job_id[:200]!r} (no definition given, no run, no history).",
        fix="pick the job from the overview's Jobs table, or pass its definition to"
        " create_dashboard(definitions=...) (ship-sqla dashboard --registry APP:REGISTRY).",
    )


def _definition_rows(definition: JobDefinition[Any]) -> list[tuple[str, str]]:
    """The definition's settings as (name, value) lines (reprs of the library's records)."""
    rows: list[tuple[str, str]] = [
        ("retry", repr(definition.retry)),
        ("timeout", "none" if definition.timeout is None else f"{definition.timeout:g} s"),
        ("priority", str(definition.priority)),
        ("concurrency (limits)", repr(definition.concurrency)),
        ("rate limit", repr(definition.rate_limit)),
        ("fairness", repr(definition.fairness)),
        ("aging", repr(definition.aging)),
        ("schedule", repr(definition.schedule)),
        ("retention", repr(definition.retention)),
        ("version", repr(definition.version)),
    ]
    partition = getattr(definition, "partition", None)
    if partition is not None:
        rows.insert(4, ("partitioned limits", repr(partition)))
    return rows


async def _finished_once(ops: JobOperations, job_id: str) -> bool:
    """Whether the job has a finished run (one bounded index probe per finished state)."""
    for state in ("completed", "cancelled", "discarded"):
        if (await ops.list_runs(state=state, job_id=job_id, limit=1)).items:
            return True
    return False


async def _job_series(state: Dashboard, job_id: str, window: str) -> StatsSeries | None:
    """The job's history over ``window`` (None without a stats table): one read of the stats
    table's primary key, ``[start, end)`` of the range; on PostgreSQL a range of buckets wider
    than a minute is summed per bucket in the statement (7 days: 84 rows, not 10,080 minutes;
    ``read_stats_buckets``), another store's minutes are summed here."""
    stats = state.stats
    if stats is None:
        return None
    now = datetime.now(UTC)
    start, end, step = range_buckets(window, now)
    read_buckets = getattr(stats, "read_stats_buckets", None)
    if read_buckets is not None and step > timedelta(minutes=1):  # PostgreSQL: sums in SQL
        rows = await read_buckets([job_id], start, end, step, job_id=job_id)
    else:
        rows = await stats.read_stats(job_id, start, end)
    return series_from_rows(job_id, window, now, rows, loss_bound=stats.flush_interval)


async def job_page(state: Dashboard, request: Request) -> Response:
    """``GET /jobs/{job_id}`` (see the module docstring)."""
    base = state.base(request)
    job_id = str(request.path_params.get("job_id", ""))
    window = request.query_params.get("range", DEFAULT_RANGE)

    async def body(ops: JobOperations, can_manage: bool, _f: Filters) -> Html | Content:
        if not is_job_id(job_id):
            raise _unknown_job(job_id)
        if window not in RANGES:
            raise ConfigurationError(
                f"range {window[:20]!r} is not a history range.",
                fix=f"choose among {', '.join(RANGES)}.",
            )
        definition = state.definitions.get(job_id)
        demand = (await ops.demand([job_id], cap=OVERVIEW_COUNT_CAP))[0]
        failures = next(
            (f for f in await ops.dead_by_job(cap=OVERVIEW_COUNT_CAP) if f.job_id == job_id), None
        )
        paused = next((p for p in await ops.paused() if p.job_id == job_id), None)
        series = await _job_series(state, job_id, window)
        active = demand.due or demand.delayed or demand.running
        has_history = series is not None and any(
            b.completed or b.retried or b.dead or b.cancelled for b in series.buckets
        )
        known = definition or active or failures or paused or has_history
        if not known and not await _finished_once(ops, job_id):
            raise _unknown_job(job_id)
        groups = await error_groups(ops, job_id=job_id, scan=JOB_PAGE_GROUPS_SCAN)
        dead = (await ops.list_runs(state="dead", job_id=job_id, limit=JOB_PAGE_RECENT_DEAD)).items
        html = render(
            "pages/job.html",
            base=base,
            job_id=job_id,
            job_q=quote(job_id, safe=""),
            definition=None if definition is None else _definition_rows(definition),
            demand=demand,
            failures=failures,
            paused=paused,
            count_cap=OVERVIEW_COUNT_CAP,
            ranges=list(RANGES),
            window=window,
            series=series,
            throughput=None if series is None else _bars(series, "attempts by outcome"),
            island=None if series is None else outcome_island(series),
            charts=[] if series is None else series_charts(series),
            nonce=nonce(request),
            groups=groups.groups[:JOB_PAGE_TOP_ERRORS],
            groups_note=groups.note,
            dead=dead,
            can_manage=can_manage,
        )
        data = {
            "job_id": job_id,
            "definition": None if definition is None else dict(_definition_rows(definition)),
            "demand": demand,
            "failures": failures,
            "paused": paused,
            "range": window,
            "series": series,
            "stats": series is not None,
            "top_errors": _groups_data(groups, limit=JOB_PAGE_TOP_ERRORS),
            "recent_dead": dead,
        }
        return Content(html, data)

    return await state.page(
        request, f"/jobs/{quote(job_id, safe='')}", f"Job {job_id[:128]}", body, charts=True
    )


def _groups_data(groups: ErrorGroups, *, limit: int | None = None) -> dict[str, Any]:
    shown = groups.groups if limit is None else groups.groups[:limit]
    return {
        "groups": [{**attrs.asdict(g), "filter": dict(g.run_filter.as_fields())} for g in shown],
        "scanned": groups.scanned,
        "complete": groups.complete,
        "bound": groups.bound,
        "note": groups.note,
    }


async def errors_page(state: Dashboard, request: Request) -> Response:
    """``GET /errors[?job=]``: the error groups of the newest dead runs."""
    base = state.base(request)

    async def body(ops: JobOperations, can_manage: bool, f: Filters) -> Html | Content:
        groups = await error_groups(ops, job_id=f.job)
        html = render(
            "pages/errors.html",
            base=base,
            job=f.job,
            groups=groups.groups,
            note=groups.note,
            bound=ERROR_GROUP_SCAN,
            per_job=ERROR_GROUP_PER_JOB,
            jobs=ERROR_GROUP_JOBS,
            retry_path=GROUP_RETRY_PATH,
            can_manage=can_manage,
        )
        return Content(html, _groups_data(groups))

    return await state.page(request, "/errors", "Errors", body, reads=("job",))


NAV: Final = Nav("/errors", "Errors", after="/dead")
"""The error groups' link in the header (the job page is reached from the overview)."""


def routes(dashboard: Dashboard) -> list[BaseRoute]:
    """The per-job page and the error groups (issue 36 item 6), found as a page module."""
    handlers = route_handlers(dashboard)
    return [
        Route("/jobs/{job_id}", handlers["job"], methods=["GET"]),
        Route("/errors", handlers["errors"], methods=["GET"]),
    ]


def route_handlers(state: Dashboard) -> dict[str, Any]:
    """The handlers bound to ``state`` (for :func:`routes`)."""

    async def job(request: Request) -> Response:
        return await job_page(state, request)

    async def errors(request: Request) -> Response:
        return await errors_page(state, request)

    return {"job": job, "errors": errors}
