"""What the operator commands print: tables for people, plain dicts for ``--json``."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

import attrs

from ship_sqla._jobs._tables import RUN_STATES as TABLE_RUN_STATES
from ship_sqla.kernel._consumers import progress_summary
from ship_sqla.kernel._workflows import CHILDREN_DONE, CHILDREN_WAIT

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from ship_sqla.kernel._operations import CancelResult
    from ship_sqla.kernel._page import Page
    from ship_sqla.kernel._ports import JobDemand, PausedJob, RunRecord
    from ship_sqla.kernel._workers import WorkerRecord
    from ship_sqla.kernel._workflows import StepRecord

__all__ = [
    "RUN_STATES",
    "attempts_used",
    "format_cancel",
    "format_dead",
    "format_demand",
    "format_paused",
    "format_run",
    "format_stats",
    "format_steps",
    "format_workers",
    "record_dict",
    "step_dict",
    "worker_dict",
]

RUN_STATES: Final = TABLE_RUN_STATES
"""The states ``jobs stats`` counts, in its column order: the runs table's own."""


def _jsonable(value: Any) -> Any:  # noqa: ANN401 - any RunRecord field
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


def record_dict(record: RunRecord) -> dict[str, Any]:
    return {k: _jsonable(v) for k, v in attrs.asdict(record, recurse=False).items()}


def worker_dict(record: WorkerRecord) -> dict[str, Any]:
    """One registry entry for ``ship-sqla workers --json`` (F6)."""
    return {k: _jsonable(v) for k, v in attrs.asdict(record, recurse=False).items()}


def step_dict(step: StepRecord) -> dict[str, Any]:
    """A stored workflow step as ``jobs show --json`` prints it (D6)."""
    return {
        "name": step.name,
        "seq": step.seq,
        "kind": step.kind,
        "state": step.state,
        "result": step.result,
        "wake_at": _jsonable(step.wake_at),
        "event": None if step.event_name is None else [step.event_name, step.event_key],
        "created_at": _jsonable(step.created_at),
        "finished_at": _jsonable(step.finished_at),
    }


def _waits_for(wait_for: str | None) -> str:
    if wait_for is None or wait_for == CHILDREN_DONE:
        return "-"
    if wait_for == CHILDREN_WAIT:
        return "its child runs"
    name, _, key = wait_for.partition("\x1f")
    return f"event {name} [{key}]"


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat(timespec="seconds")


def _first_line(error: str | None, width: int = 60) -> str:
    if not error:
        return "-"
    line = error.splitlines()[0]
    return line if len(line) <= width else f"{line[: width - 1]}…"


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    body = [list(headers), *(list(r) for r in rows)]
    widths = [max(len(r[i]) for r in body) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in body
    )


def attempts_used(record: RunRecord) -> str:
    """How ``jobs show``, ``retry`` and ``rerun`` all say a run's attempts: started of allowed."""
    return f"{record.attempt} of {record.max_attempts} used"


def format_dead(page: Page[RunRecord]) -> str:
    if not page.items:
        return "no dead runs."
    lines = _table(
        ("RUN_ID", "JOB", "ATTEMPTS", "FINISHED_AT", "LAST_ERROR"),
        (
            (
                r.run_id,
                r.job_id,
                f"{r.attempt}/{r.max_attempts}",
                _when(r.finished_at),
                _first_line(r.last_error),
            )
            for r in page.items
        ),
    )
    more = "" if page.next_cursor is None else f"\nmore: --cursor {page.next_cursor}"
    return f"{lines}\n{len(page.items)} dead run(s).{more}"


def format_steps(steps: Sequence[StepRecord]) -> str:
    """A workflow run's stored steps, one line each, in handler order (D6)."""
    lines = [f"steps ({len(steps)}):"]
    for step in steps:
        if step.state == "done":
            detail = f"done at {_when(step.finished_at)}"
        elif step.kind == "event":
            detail = f"waiting for {step.event_name} [{step.event_key}] until {_when(step.wake_at)}"
        elif step.kind == "sleep":
            detail = f"sleeping until {_when(step.wake_at)}"
        else:
            detail = "waiting for its child runs"
        lines.append(f"  {step.seq}. {step.name} ({step.kind}): {detail}")
    return "\n".join(lines)


def format_run(record: RunRecord) -> str:
    fields = [
        ("run", record.run_id),
        ("job", record.job_id),
        ("state", record.state),
        ("attempts", attempts_used(record)),
        ("snoozes", str(record.snoozes)),
        ("lapses", f"{record.lapses} ({record.consecutive_lapses} in a row)"),
        ("key", record.key or "-"),
        ("dedupe_key", record.dedupe_key or "-"),
        ("run_at", _when(record.run_at)),
        ("created_at", _when(record.created_at)),
        ("updated_at", _when(record.updated_at)),
        ("finished_at", _when(record.finished_at)),
        ("lease_expires_at", _when(record.lease_expires_at)),
        ("cancel_requested", _when(record.cancel_requested_at)),
        ("parent", record.parent_id or "-"),
        ("waits_for", _waits_for(record.wait_for)),
        ("progress", progress_summary(record.progress)),
        ("last_error", record.last_error or "-"),
        ("payload", json.dumps(record.payload, sort_keys=True)),
    ]
    lines = [_indented(f"{name + ':':<18}{value}", " " * 18) for name, value in fields]
    lines.append(f"history ({len(record.history)}):")
    for entry in record.history:
        if isinstance(entry, dict):
            kind = f" [{entry['kind']}]" if "kind" in entry else ""
            # J18: the attempt's start and worker (absent from an entry written before)
            ran = (
                f" (started {entry.get('started')} on {entry.get('worker') or '?'})"
                if "started" in entry
                else ""
            )
            line = (
                f"  attempt {entry.get('attempt')}{kind} at {entry.get('at')}{ran}:"
                f" {entry.get('error')}"
            )
            lines.append(_indented(line, " " * 4))
        else:
            lines.append(f"  {entry}")
    return "\n".join(lines)


def _indented(text: str, indent: str) -> str:
    """``text`` with its continuation lines (a traceback's) indented by ``indent``, so a
    multi-line value stays under its field instead of reading as the next fields; blank lines
    are dropped."""
    first, *rest = text.splitlines() or [""]
    return "\n".join([first, *(indent + line for line in rest if line.strip())])


def format_cancel(result: CancelResult) -> str:
    """What ``jobs cancel`` did, in one line (K2)."""
    record = result.record
    run = f"run {record.run_id} ({record.job_id})"
    if result.outcome == "cancelled":
        return f"{run} is cancelled; it will not run."
    if result.outcome == "requested":
        return (
            f"{run} is running: cancel requested. Its worker cancels the handler (at once when"
            " it listens, else at its next heartbeat) and the run ends cancelled."
        )
    return f"{run} had already finished ({record.state}): nothing changed."


def format_demand(demands: Sequence[JobDemand]) -> str:
    """``jobs demand`` as a table; a count that reached the cap is marked ``+``."""
    if not demands:
        return "no jobs with waiting or running runs."

    def count(value: int, cap: int) -> str:
        return f"{value}+" if value >= cap else str(value)

    return _table(
        ("JOB", "DUE", "DELAYED", "RUNNING", "OLDEST_DUE_S"),
        (
            (
                d.job_id,
                count(d.due, d.cap),
                count(d.delayed, d.cap),
                count(d.running, d.cap),
                "-" if d.oldest_due_age is None else f"{d.oldest_due_age:.1f}",
            )
            for d in demands
        ),
    )


def format_workers(records: Sequence[WorkerRecord]) -> str:
    """``ship-sqla workers`` as a table (F6); the fleet's queue sampler (F5) is marked."""
    if not records:
        return "no workers registered."
    table = _table(
        (
            "WORKER",
            "HOST",
            "PID",
            "STARTED_AT",
            "LAST_SEEN_AT",
            "IN_FLIGHT",
            "STATE",
            "SAMPLER",
            "JOBS",
        ),
        (
            (
                r.worker_id,
                r.host,
                str(r.pid),
                _when(r.started_at),
                _when(r.last_seen_at),
                str(r.in_flight),
                "draining" if r.draining else "running",
                "yes" if r.sampler else "-",
                _first_line(", ".join(r.job_ids)),
            )
            for r in records
        ),
    )
    return f"{table}\n{len(records)} worker(s)."


def format_paused(paused: Sequence[PausedJob]) -> str:
    if not paused:
        return "no paused jobs."
    return _table(("JOB", "PAUSED_AT"), ((p.job_id, _when(p.paused_at)) for p in paused))


def format_stats(jobs: Sequence[dict[str, Any]]) -> str:
    if not jobs:
        return "no runs."
    return _table(
        ("JOB", *(s.upper() for s in RUN_STATES), "OLDEST_DUE_S", "WORKERS"),
        (
            (
                j["job_id"],
                *(str(j[s]) for s in RUN_STATES),
                "-" if j["oldest_due_seconds"] is None else f"{j['oldest_due_seconds']:.1f}",
                "-" if j.get("live_workers") is None else str(j["live_workers"]),
            )
            for j in jobs
        ),
    )
