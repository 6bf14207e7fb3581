"""The run page (issue 36 item 6): ``GET /runs/{run_id}``.

What it shows, from what the run record and its stored steps carry:

- the run's fields, with its worker (the holder of a running run, or the worker of its last
  attempt: J18), the last attempt's start, its queue wait (start minus due time) and run time
  (end minus start);
- a timeline of its attempts: each history entry (an attempt that did not complete: failed,
  lapsed, released, snoozed...) with when it ended, its kind and its error's first line, the
  time since the previous entry, and its start, worker and run time (J18: kept in the entry;
  an entry written before has none, and the page says so); then the last attempt with its
  start, worker, queue wait and run time when the run has ended;
- a workflow run's stored steps (D1) with their results (behind ``ship.jobs:payloads``), and,
  on a run that failed, the step that failed: a failing step stores nothing, so it is the one
  after the last stored step, named when the error's traceback shows the call;
- its children (D5: the runs its spawn steps enqueued), each linked, with its state;
- for a manager, on a dead or waiting workflow run, "Re-run from here" per step (D6): a link
  to this page with ``?rerun=STEP``, which shows what the re-run drops and the confirming POST
  form (CSRF, audited by the operator surface as ``jobs.rerun_from_step``). No JavaScript.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

from markupsafe import Markup
from starlette.routing import BaseRoute, Route

from ship_sqla._dashboard._html import ENV, PARTS, at, button_form, href, link, render, text
from ship_sqla._dashboard._page import (
    UNPARK,
    Content,
    divergence_section,
    marked,
    no_run,
    state_cell,
)
from ship_sqla._dashboard._redact import HIDDEN, ShownOperations
from ship_sqla.kernel._consumers import progress_summary
from ship_sqla.kernel._errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from starlette.requests import Request
    from starlette.responses import Response

    from ship_sqla._dashboard._filters import Filters
    from ship_sqla._dashboard._html import Html
    from ship_sqla._dashboard._page import Dashboard
    from ship_sqla.kernel._operations import JobOperations
    from ship_sqla.kernel._ports import RunRecord
    from ship_sqla.kernel._workflows import StepRecord

__all__ = ["CHILDREN_SHOWN", "run_page", "span"]

CHILDREN_SHOWN: Final = 50
"""Children whose state the page reads (one primary-key probe each); the rest are counted."""
RESULT_SHOWN: Final = 200
"""Characters of a step's result the page shows (the JSON twin has all of it)."""
MAX_STEP_PARAM: Final = 200
"""The longest ``rerun`` parameter read (a step name's bound, MAX_STEP_NAME)."""
RERUN_STATES: Final = ("dead", "waiting")
"""The states D6's re-run takes (the operator surface refuses the others)."""
_RUN_PARTS: Any = ENV.get_template("pages/run_parts.html").module
"""The run page's own macros (``templates/pages/run_parts.html``)."""
_STEP_CALL: Final = re.compile(r"\.(?:step|transaction)\(\s*['\"]([^'\"\n]{1,200})['\"]")
"""A workflow step's call in a traceback's source line (``ctx.step("charge", ...)``)."""


def span(seconds: float | None) -> str:  # noqa: PLR0911 - one per unit
    """A duration for people: ``340 ms``, ``12.5 s``, ``3 min 5 s``, ``2.1 h``, ``3.0 d``."""
    if seconds is None:
        return "—"
    if seconds < 0:
        return "-" + span(-seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:  # noqa: PLR2004 - display thresholds
        return f"{seconds:.1f} s"
    if seconds < 3600:  # noqa: PLR2004
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    if seconds < 172_800:  # noqa: PLR2004
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} d"


def _when(raw: object) -> datetime | None:
    """A history entry's ``at`` (ISO 8601 text) as an aware time, None when it is not one."""
    try:
        when = datetime.fromisoformat(raw) if isinstance(raw, str) else None
    except ValueError:
        return None
    if when is not None and when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when


def _seconds(end: datetime | None, start: datetime | None) -> float | None:
    return None if end is None or start is None else (end - start).total_seconds()


def _last_attempt(record: RunRecord) -> dict[str, Any]:
    """The last attempt's start, worker, queue wait and run time (J18), as far as known."""
    ended = record.finished_at
    return {
        "attempt": record.attempt,
        "started_at": record.started_at,
        "worker": record.worker,
        "wait": span(_seconds(record.started_at, record.run_at)),
        "run": span(_seconds(ended, record.started_at)),
        "wait_s": _seconds(record.started_at, record.run_at),
        "run_s": _seconds(ended, record.started_at),
    }


def timeline(record: RunRecord) -> list[dict[str, Any]]:
    """The run's attempts, oldest first: each history entry (``ended_at``, ``kind``, the
    error, the time since the previous entry, and J18's ``started_at``, ``worker`` and run
    time, None for an entry written before), then the last attempt of an ended or running
    run (``last``: its start, worker, queue wait and run time, :func:`_last_attempt`), merged
    into its own history entry when it ended with one (a failure)."""
    lines: list[dict[str, Any]] = []
    previous: datetime | None = record.created_at
    for entry in record.history:
        if not isinstance(entry, dict):
            continue
        ended = _when(entry.get("at"))
        started = _when(entry.get("started"))
        worker = entry.get("worker")
        lines.append(
            {
                "attempt": entry.get("attempt"),
                "kind": entry.get("kind") or "failed",
                "ended_at": ended,
                "raw_at": entry.get("at"),
                "error": entry.get("error"),
                "since": span(_seconds(ended, previous)),
                "after": "the previous" if lines else "creation",
                "started_at": started,
                "worker": worker if isinstance(worker, str) else None,
                "run": span(_seconds(ended, started)),
                "run_s": _seconds(ended, started),
                "last": None,
            }
        )
        previous = ended or previous
    ended_run = record.finished_at is not None
    if record.state == "running" or ended_run:
        last = _last_attempt(record)
        tail = lines[-1] if lines else None
        if ended_run and tail is not None and tail["attempt"] == record.attempt:
            tail["last"] = last  # the failure that ended it is its last attempt
        else:
            lines.append(
                {
                    "attempt": record.attempt,
                    "kind": record.state,
                    "ended_at": record.finished_at,
                    "raw_at": None,
                    "error": None,
                    "since": span(_seconds(record.finished_at, previous)) if ended_run else "",
                    "after": "the previous" if lines else "creation",
                    "started_at": last["started_at"],
                    "worker": last["worker"],
                    "run": last["run"],
                    "run_s": last["run_s"],
                    "last": last,
                }
            )
    return lines


def bar(wait: float | None, run: float | None) -> Html:
    """The last attempt's queue wait and run time as one small SVG bar (presentation
    attributes only: the CSP allows no inline style)."""
    if wait is None or run is None or wait < 0 or run < 0 or wait + run <= 0:
        return ""
    width = 240
    split = round(width * wait / (wait + run))
    return str(_RUN_PARTS.wait_run_bar(width, split))


def _bar_of(line: dict[str, Any]) -> tuple[float | None, float | None]:
    last = line["last"]
    return (None, None) if last is None else (last["wait_s"], last["run_s"])


def failed_step(record: RunRecord, steps: Sequence[StepRecord]) -> dict[str, Any] | None:
    """The step that failed, for a workflow run whose last attempt failed (dead, or waiting
    for a retry with an error): the position after the last stored step, and its name when the
    error's traceback shows the call (else None)."""
    if not steps or not record.last_error or record.state not in RERUN_STATES:
        return None
    if record.state == "waiting" and record.wait_for is not None:
        return None  # suspended: waiting on a step, not failed at one
    names = _STEP_CALL.findall(record.last_error)
    done = {s.name for s in steps}
    name = next((n for n in reversed(names) if n not in done), None)
    return {"seq": max(s.seq for s in steps) + 1, "name": name}


def children_of(steps: Sequence[StepRecord]) -> list[str]:
    """D5: the run ids a run's spawn steps enqueued, in step order."""
    ids: list[str] = []
    for s in steps:
        if s.kind == "spawn" and s.result_json is not None:
            found = s.result
            if isinstance(found, list):
                ids += [str(i) for i in found]
    return ids


def _result_cell(step: StepRecord) -> Html:
    if step.result_json is None:
        return text("—")
    shown = step.result_json
    if shown == f'"{HIDDEN}"':
        return text(HIDDEN)
    cut = shown if len(shown) <= RESULT_SHOWN else shown[: RESULT_SHOWN - 1] + "…"
    return str(PARTS.code(cut))


def _step_rows(
    steps: Sequence[StepRecord], here: str, failed: dict[str, Any] | None, *, rerun: bool
) -> list[tuple[Html, ...]]:
    rows: list[tuple[Html, ...]] = []
    for s in steps:
        took = span(_seconds(s.finished_at, s.created_at)) if s.state == "done" else ""
        action = link("", here, "Re-run from here…", {"rerun": s.name}) if rerun else ""
        rows.append(
            (
                text(s.seq),
                text(s.name),
                text(s.kind),
                state_cell(s.state),
                at(s.created_at),
                at(s.finished_at),
                text(took),
                _result_cell(s),
                action,
            )
        )
    if failed is not None:
        name = failed["name"] or "(not stored; see the error)"
        rows.append(
            (
                text(failed["seq"]),
                text(name),
                "",
                state_cell("failed"),
                "",
                "",
                "",
                text("a failing step stores nothing: the run's error is its error"),
                "",
            )
        )
    return rows


async def _children(ops: JobOperations, ids: Sequence[str]) -> list[dict[str, Any]]:
    shown = []
    for child_id in ids[:CHILDREN_SHOWN]:
        child = await ops.get_run(child_id)
        shown.append(
            {
                "run_id": child_id,
                "job_id": None if child is None else child.job_id,
                "state": None if child is None else child.state,
            }
        )
    return shown


def _fields(base: str, record: RunRecord) -> list[tuple[str, Html]]:
    last = _last_attempt(record)
    return [
        ("Job", text(record.job_id)),
        ("State", state_cell(record.state)),
        ("Attempt", text(f"{record.attempt} of {record.max_attempts}")),
        ("Worker", text(record.worker or "—")),
        ("Last attempt started", at(record.started_at)),
        ("Queue wait", text(last["wait"])),
        ("Run time", text(last["run"])),
        # J15: lapses (its worker died while it ran), in all and in a row.
        ("Lapses", text(f"{record.lapses} ({record.consecutive_lapses} in a row)")),
        # C3: a consumer run's last batch (lag, time, totals), recorded with the batch.
        ("Progress", text(progress_summary(record.progress))),
        ("Priority", text(record.priority)),
        ("Tenant", text(record.tenant or "—")),
        ("Dedupe key", text(record.dedupe_key or "—")),
        ("Created", at(record.created_at)),
        ("Due", at(record.run_at)),
        ("Finished", at(record.finished_at)),
        ("Lease expires", at(record.lease_expires_at)),
        ("Cancel requested", at(record.cancel_requested_at)),
        (
            "Parent",
            link(base, "/runs/" + quote(record.parent_id, safe="/"), record.parent_id)
            if record.parent_id
            else "—",
        ),
    ]


def _actions(record: RunRecord, here: str, csrf: str) -> Html:
    actions = ""
    for verb, states in (
        ("retry", ("dead",)),
        ("cancel", ("waiting", "running")),
        ("discard", ("waiting", "dead")),
        ("unpark", ()),
    ):
        if record.state in states or (verb, record.wait_for) == UNPARK:
            actions += button_form(f"{here}/{verb}", verb.capitalize(), csrf=csrf, back=here)
    return actions


def _confirmation(
    wanted: str | None, steps: Sequence[StepRecord], here: str, csrf: str | None
) -> dict[str, Any] | None:
    """The re-run's confirmation (``?rerun=STEP``): the step, the steps it drops, the form; or
    what is wrong with the request (no such step; not a manager; a state D6 refuses)."""
    if wanted is None:
        return None
    step = next((s for s in steps if s.name == wanted), None)
    if step is None:
        return {
            "problem": f"This run has no stored step named {wanted[:80]!r}. Fix: pick a step"
            " from the table's Re-run links."
        }
    if csrf is None:
        return {
            "problem": "Re-running from a step needs ship.jobs:manage, on a dead or waiting"
            " run. Fix: ask for the permission, or retry the run when it is dead."
        }
    dropped = [s.name for s in steps if s.seq >= step.seq]
    form = button_form(
        f"{here}/rerun",
        f"Re-run from {step.name}",
        csrf=csrf,
        back=here,
        fields={"step": step.name},
    )
    return {"problem": None, "step": step, "dropped": dropped, "form": Markup(form)}  # noqa: S704


def routes(dashboard: Dashboard) -> list[BaseRoute]:
    """The run page (``GET /runs/{run_id}``), found as a page module; its actions are the
    application's (``POST /runs/{run_id}/{verb}``, declared before it)."""
    return [Route("/runs/{run_id:path}", run_page(dashboard), methods=["GET"])]


def run_page(dashboard: Dashboard) -> Callable[[Request], Awaitable[Response]]:
    """The run page's endpoint over ``dashboard``."""

    async def endpoint(request: Request) -> Response:
        base = dashboard.base(request)
        wanted = request.query_params.get("rerun", "").strip()[:MAX_STEP_PARAM] or None

        async def body(ops: JobOperations, can_manage: bool, f: Filters) -> Html | Content:
            assert f.run_id is not None  # noqa: S101 - read_filters requires it
            run_id = f.run_id
            record = await ops.get_run(run_id)
            if record is None:
                raise no_run(run_id)
            try:
                raw_steps = await ops.list_steps(run_id)
            except ConfigurationError:
                raw_steps = []
            steps = raw_steps
            if isinstance(ops, ShownOperations):
                steps = await ops.shown.steps(raw_steps, record.job_id)
            here = f"{base}/runs/{quote(run_id, safe='/')}"
            rerun = can_manage and record.state in RERUN_STATES
            csrf = dashboard.csrf(request) if can_manage else ""
            failed = failed_step(record, steps)
            child_ids = children_of(raw_steps)
            children = await _children(ops, child_ids)
            lines = timeline(record)
            shown_lines = [
                {**line, "bar": Markup(bar(*_bar_of(line)))}  # noqa: S704 - rendered
                for line in lines
            ]
            html = render(
                "pages/run.html",
                base=base,
                record=record,
                payload_hidden=record.payload == HIDDEN,
                actions=Markup(_actions(record, here, csrf) if can_manage else ""),  # noqa: S704
                fields=marked(_fields(base, record)),
                divergence=Markup(divergence_section(record)),  # noqa: S704 - rendered
                timeline=shown_lines,
                steps=marked(_step_rows(steps, here, failed, rerun=rerun)) if steps else [],
                failed=failed,
                children=[
                    {**c, "href": href(base, "/runs/" + quote(c["run_id"], safe="/"))}
                    for c in children
                ],
                more_children=max(0, len(child_ids) - CHILDREN_SHOWN),
                confirm=_confirmation(wanted, steps, here, csrf if rerun else None),
                cancel_href=here,
            )
            data = {
                "run": record,
                "steps": steps,
                "timeline": lines,
                "failed_step": failed,
                "children": children,
                "children_total": len(child_ids),
            }
            return Content(html, data)

        return await dashboard.page(
            request, "/runs", f"Run {request.path_params['run_id']}", body, reads=("run_id",)
        )

    return endpoint
