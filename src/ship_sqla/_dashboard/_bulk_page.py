"""Find anything, act on what matches: the dashboard's search page and its bulk actions by
filter (issue 36 items 4-5; S1, S2).

- ``GET /search``: the search form (:mod:`._search`: run id, job, tenant, state, time range,
  worker, error text, payload fields, page size), one page of the runs that match
  (:meth:`JobOperations.search_runs`, each filter's bound said when a page stops scanning), and
  for a manager "Retry / Cancel / Discard all matching", links to the preview.
- ``GET /bulk/{verb}``: the preview (:meth:`JobOperations.preview_matching`: on PostgreSQL one
  counting statement, ``_jobs/_sql/count.py``): the count the action would take and a
  confirmation form carrying the preview's token (bound to the action, the filter and the
  count), the filter's fields and the CSRF token. A read: nothing changes.
- ``POST /bulk/{verb}``: the confirmation: ``<verb>_filtered`` with the token, in batches of
  1,000 runs, each batch one transaction (PostgreSQL: a unit of work over the backend's engine)
  holding one statement for the batch (the admin port's ``*_batch``).
  The action runs as a task of this process; the request waits until it ended or committed a
  first batch with more to do. An action that ended (a small set, or one refused: a bad or old
  token, a permission) answers as every action does; a large one goes on in the background and
  the answer is its progress page.
- ``GET /bulk/tasks/{task_id}``: the task's progress (runs done of the previewed count, batches
  committed), re-fetched every 2 s by the browser while it runs (a ``Refresh`` header: no
  JavaScript needed), then its result with the link to the audit log, which holds the action's
  one entry (the filter, the count, the runs' links).

Why a task and a progress page rather than a streamed answer: a streamed response ends when
the operator's browser closes the tab or the connection drops, and the action would stop with
it between two batches; the task does not depend on the request, and its page can be reloaded.
What it costs: progress lives in the process that runs the action (a replica behind a load
balancer without sticky sessions may answer the page with "not on this process": the audit log
then has the outcome). At most :data:`KEPT_TASKS` ended tasks are kept for their pages.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from typing import TYPE_CHECKING, Any, Final, cast

import attrs
from markupsafe import Markup
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from ship_sqla._dashboard._filters import INPUT_ERRORS
from ship_sqla._dashboard._html import href, render
from ship_sqla._dashboard._page import Content, NotFound, with_params
from ship_sqla._dashboard._search import PAGE_SIZES, SearchForm, read_search, search_query
from ship_sqla._jobs._backend import PostgresJobBackend
from ship_sqla._uow import create_unit_of_work
from ship_sqla.kernel._errors import PermissionDeniedError, ShipError
from ship_sqla.kernel._ports import RUN_STATES
from ship_sqla.kernel._search import (
    BULK_STATES,
    FILTER_BOUNDS,
    MAX_BULK_BATCH,
    BulkProgress,
    RunFilter,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from starlette.requests import Request

    from ship_sqla._dashboard._filters import Filters
    from ship_sqla._dashboard._html import Html
    from ship_sqla._dashboard._page import Dashboard
    from ship_sqla.kernel._operations import BatchTransaction, BulkResult, JobOperations

__all__ = ["KEPT_TASKS", "BulkPages", "BulkTask", "routes"]

KEPT_TASKS: Final = 50
"""Ended bulk tasks whose result page stays available, per process (the oldest go first)."""
PROGRESS_REFRESH: Final = 2
"""Seconds between two loads of a running task's page (the ``Refresh`` header)."""
_VERBS: Final = {"retry": "Retry", "cancel": "Cancel", "discard": "Discard"}
SEARCH_PAGE_SCAN: Final = 500
"""Index entries a search page reads past at most (the operations' default is 2,000): reading
and matching 2,000 full rows took 150-500 ms at 1,000,000 runs, past issue 36's 100 ms; at
500 a page with a filter the index does not serve stays within it, and its "scanned 500,
stopped" next page goes on from there."""


@attrs.define
class BulkTask:
    """One bulk action by filter running (or ended) in this process."""

    task_id: str
    verb: str
    run_filter: RunFilter
    actor: str
    progress: BulkProgress | None = None
    result: BulkResult | None = None
    error: str | None = None
    started: asyncio.Event = attrs.Factory(asyncio.Event)
    """Set once a batch committed with more to do, or when the task ended."""

    @property
    def ended(self) -> bool:
        return self.result is not None or self.error is not None

    def told(self, step: BulkProgress) -> None:
        self.progress = step
        if step.done < step.total:
            self.started.set()

    def summary(self) -> str:
        """What it did, in words."""
        verb = _VERBS[self.verb]
        if self.result is not None:
            rest = "" if self.result.complete else " It stopped before the end: preview again."
            return (
                f"{verb}: {len(self.result.changed)} changed, {len(self.result.unchanged)}"
                f" unchanged.{rest}"
            )
        done = self.progress.done if self.progress is not None else 0
        if self.error is not None:
            return f"{verb} failed after {done} runs: {self.error}"
        total = self.progress.total if self.progress is not None else "?"
        return f"{verb}: {done} of {total} runs done, going on."


class BulkPages:
    """The search page and the bulk-by-filter pages of one dashboard (module doc)."""

    batch_size: int = MAX_BULK_BATCH
    """Runs per transaction (issue 36: 1,000)."""

    def __init__(self, state: Dashboard) -> None:
        self.state = state
        self.tasks: dict[str, BulkTask] = {}
        self._running: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/search", self.search, methods=["GET"]),
            Route("/bulk/tasks/{task_id}", self.task_page, methods=["GET"]),
            Route("/bulk/{verb}", self.preview, methods=["GET"]),
            Route("/bulk/{verb}", self.confirm, methods=["POST"]),
        ]

    # --- the search page ------------------------------------------------------------------------

    def _form(self, base: str, form: SearchForm, job_ids: list[str]) -> Html:
        error = form.error
        return render(
            "pages/search_form.html",
            base=base,
            form=form,
            states=RUN_STATES,
            sizes=PAGE_SIZES,
            job_ids=job_ids,
            bounds=FILTER_BOUNDS,
            error_field=None if error is None else error.field,
            error=None if error is None else str(error),
        )

    async def search(self, request: Request) -> Response:
        base = self.state.base(request)
        form = _search_fields(request)
        job_ids = sorted(self.state.definitions)

        async def body(ops: JobOperations, can_manage: bool, _f: Filters) -> Content:
            flt = form.run_filter
            page = None
            if flt is not None:
                page = await ops.search_runs(
                    flt, limit=form.limit, cursor=form.cursor, scan=SEARCH_PAGE_SCAN
                )
            table = self.state.run_table(
                base,
                () if page is None else page.items,
                selectable=False,
                when="Finished / due",
                empty="No runs match." if flt is not None else "Correct the filter above.",
            )

            def page_href(cursor: str | None) -> str:
                if flt is None or cursor is None:
                    return ""
                return f"{base}/search?{search_query(flt, limit=form.limit, cursor=cursor)}"

            query = "" if flt is None else search_query(flt)
            html = render(
                "pages/search.html",
                base=base,
                form=Markup(self._form(base, form, job_ids)),  # noqa: S704 - rendered
                table=Markup(table),  # noqa: S704 - rendered
                note=None if page is None else page.note,
                next_href=page_href(None if page is None else page.next_cursor),
                previous_href=page_href(None if page is None else page.previous_cursor),
                first_href=f"{base}/search?{query}" if form.cursor else "",
                bulk=[] if flt is None or not can_manage else _bulk_links(base, flt),
            )
            data = None
            if page is not None:
                data = {"runs": page.items, "next_cursor": page.next_cursor, "note": page.note}
            return Content(html, data)

        return await self.state.page(request, "/search", "Search", body)

    # --- the preview ------------------------------------------------------------------------------

    async def preview(self, request: Request) -> Response:
        base = self.state.base(request)
        verb = request.path_params["verb"]
        form = _search_fields(request)

        async def body(ops: JobOperations, can_manage: bool, _f: Filters) -> Content:
            _check_verb(verb)
            if form.error is not None:
                raise form.error
            flt = cast("RunFilter", form.run_filter)
            seen = await ops.preview_matching(verb, flt)
            html = render(
                "pages/bulk_preview.html",
                base=base,
                verb=verb,
                label=_VERBS[verb],
                preview=seen,
                described=flt.describe(),
                states=", ".join(BULK_STATES[verb]),
                fields=flt.as_fields(),
                can_manage=can_manage,
                csrf=self.state.csrf(request) if can_manage else "",
                back=f"{base}/search?{search_query(flt)}",
            )
            data = {
                "action": verb,
                "filter": flt.as_fields(),
                "count": seen.count,
                "capped": seen.capped,
                "stopped": seen.stopped,
                "scanned": seen.scanned,
            }
            return Content(html, data)

        return await self.state.page(
            request, "/search", f"{_VERBS.get(verb, 'Act')} matching", body
        )

    # --- the confirmation, and the task ---------------------------------------------------------

    async def confirm(self, request: Request) -> Response:
        """``POST /bulk/{verb}``: the confirmed action (module doc)."""
        verb = request.path_params["verb"]
        fields = await self.state.form(request)
        if fields is None:
            message = (
                "Refused: the form's CSRF token is missing or not this session's; nothing was"
                " changed. Fix: reload the page and submit again."
            )
            return HTMLResponse(render("refused.html", message=message), 403)
        back = self.state.back(request, fields)
        ops = self.state.ops(request)
        try:
            _check_verb(verb)
            form = read_search(_filter_fields(fields))
            if form.error is not None:
                raise form.error
            token = (fields.get("token") or [""])[0]
            task = await self._start(ops, verb, cast("RunFilter", form.run_filter), token)
        except PermissionDeniedError as exc:
            return HTMLResponse(render("refused.html", message=str(exc)), 403)
        except NotFound as exc:
            return await self.state.refused(request, ops, back, exc.html(), 404)
        except INPUT_ERRORS as exc:  # refused before any statement: nothing changed
            problem = render(
                "notice.html",
                message=f"The action was refused; nothing was changed. {exc}",
                kind="error",
                id="problem",
            )
            return await self.state.refused(request, ops, back, problem, 400)
        except ShipError as exc:  # a token too old, a refused operation: said on the page
            return RedirectResponse(with_params(back, failed=str(exc)), 303)
        # the task's page says what it did (or how far it is): no flash message beside it
        return RedirectResponse(f"{self.state.base(request)}/bulk/tasks/{task.task_id}", 303)

    async def _start(self, ops: JobOperations, verb: str, flt: RunFilter, token: str) -> BulkTask:
        """Start the action as a task; answer once it ended or committed a first batch with more
        to do. An error before that is raised here (the request answers it)."""
        task = BulkTask(f"{next(self._ids)}-{secrets.token_hex(4)}", verb, flt, ops.actor)
        action = cast("Callable[..., Awaitable[BulkResult]]", getattr(ops, f"{verb}_filtered"))
        failure: list[BaseException] = []

        async def run() -> None:
            try:
                task.result = await action(
                    flt,
                    token=token,
                    batch_size=self.batch_size,
                    transaction=self._transaction(),
                    progress=task.told,
                )
            except Exception as exc:  # noqa: BLE001 - kept for the page, raised to the request
                failure.append(exc)
                task.error = str(exc)
            finally:
                task.started.set()
                self._keep(task)

        running = asyncio.create_task(run())
        self._running.add(running)
        running.add_done_callback(self._running.discard)
        self.tasks[task.task_id] = task
        await task.started.wait()
        if failure and task.progress is None:  # refused before its first batch: said as such
            del self.tasks[task.task_id]
            raise failure[0]
        return task

    def _transaction(self) -> BatchTransaction | None:
        """Each batch in one transaction on PostgreSQL (a unit of work over the backend's
        engine: the admin port's statements join it); the in-memory backend has none."""
        backend = self.state.backend
        if not isinstance(backend, PostgresJobBackend):
            return None
        database: Any = backend.database
        engine = database if isinstance(database, AsyncEngine) else database.engine
        uow = create_unit_of_work(engine, repositories=lambda scope: scope)

        async def transaction(work: Callable[[], Awaitable[None]]) -> None:
            async def handler(_scope: object) -> None:
                await work()

            await uow.run(handler)

        return transaction

    def _keep(self, ended: BulkTask) -> None:
        """Forget the oldest ended tasks past :data:`KEPT_TASKS`."""
        done = [t for t in self.tasks.values() if t.ended and t is not ended]
        for old in done[: max(0, len(done) + 1 - KEPT_TASKS)]:
            del self.tasks[old.task_id]

    async def task_page(self, request: Request) -> Response:
        base = self.state.base(request)
        task_id = request.path_params["task_id"]

        async def body(_ops: JobOperations, _can_manage: bool, _f: Filters) -> Content:
            task = self.tasks.get(task_id)
            if task is None:
                raise NotFound(
                    f"No bulk action {task_id[:40]!r} on this dashboard process.",
                    fix="it ran on another replica or before a restart: its outcome is in the"
                    " audit log.",
                )
            progress = task.progress
            html = render(
                "pages/bulk_task.html",
                base=base,
                task=task,
                label=_VERBS[task.verb],
                described=task.run_filter.describe(),
                progress=progress,
                refresh=PROGRESS_REFRESH,
                search=f"{base}/search?{search_query(task.run_filter)}",
                audit=href(base, "/audit"),
            )
            data = {
                "action": task.verb,
                "filter": task.run_filter.as_fields(),
                "ended": task.ended,
                "done": 0 if progress is None else progress.done,
                "total": None if progress is None else progress.total,
                "changed": None if task.result is None else len(task.result.changed),
                "error": task.error,
            }
            return Content(html, data)

        response = await self.state.page(request, "/search", "Bulk action", body)
        task = self.tasks.get(task_id)
        if response.status_code == 200 and task is not None and not task.ended:  # noqa: PLR2004
            response.headers["Refresh"] = str(PROGRESS_REFRESH)
        return response


def routes(dashboard: Dashboard) -> list[BaseRoute]:
    """The search page and the bulk-by-filter pages of ``dashboard`` (module doc); their
    header link is the application's (Search, after Runs)."""
    return BulkPages(dashboard).routes()


def _filter_fields(fields: Mapping[str, list[str]]) -> list[tuple[str, str]]:
    """A confirmation's filter fields, as ``(name, value)`` pairs (each read by name: the route
    fuzzer reads these names from the code)."""
    sent = {
        "id": fields.get("id"),
        "job": fields.get("job"),
        "tenant": fields.get("tenant"),
        "state": fields.get("state"),
        "from": fields.get("from"),
        "to": fields.get("to"),
        "worker": fields.get("worker"),
        "error": fields.get("error"),
        "payload": fields.get("payload"),
    }
    return [(name, value) for name, values in sent.items() for value in values or ()]


def _search_fields(request: Request) -> SearchForm:
    """The search form of a GET (the names read one by one, for the route fuzzer, then every
    value by :func:`read_search`: ``payload`` may repeat)."""
    named = (
        request.query_params.get("from"),
        request.query_params.get("to"),
        request.query_params.get("worker"),
        request.query_params.get("error"),
        request.query_params.get("payload"),
        request.query_params.get("limit"),
        request.query_params.get("id"),
    )
    del named
    return read_search(request.query_params.multi_items())


def _check_verb(verb: str) -> None:
    if verb not in _VERBS:
        raise NotFound(
            f"There is no bulk action {verb[:40]!r}.",
            fix="use retry, cancel or discard from the search page.",
        )


def _bulk_links(base: str, flt: RunFilter) -> list[tuple[str, str, str]]:
    """(id, label, preview link) of each bulk action the filter's state allows."""
    query = search_query(flt)
    return [
        (f"bulk-{verb}", f"{label} all matching…", f"{base}/bulk/{verb}?{query}")
        for verb, label in _VERBS.items()
        if flt.state is None or flt.state in BULK_STATES[verb]
    ]


def preview_href(base: str, verb: str, **fields: str | None) -> str:
    """The preview of ``verb`` on the runs matching ``fields`` (the dead and runs pages' "all
    matching" links)."""
    return href(base, f"/bulk/{verb}", fields)
