"""What a schedule's tick does, for every backend's :class:`ScheduleStore` (J9): the rules are
here once, the backends only store states and runs.

- Install: one state ``(job_id, trigger, next_at)`` per scheduled job (:func:`installable`,
  :func:`schedule_states`);
  a stored state whose trigger equals the definition's keeps its ``next_at`` (a restart, or a
  second process, replaces, never duplicates); a new or changed trigger starts at the first
  occurrence after now.
- Tick: a due state fires ONE run for the latest missed occurrence (:func:`fire_due`, from
  :func:`~ship_sqla.kernel._plans.schedule.due_occurrence`: a process that was down catches up
  with one run, not a storm) and advances to the first occurrence after now.
- A fired occurrence is stored like any run: prepared by
  :func:`~ship_sqla.kernel._plans.prepare.prepare_runs` and inserted through the store's one
  insert path (the one ``enqueue`` takes), with the durable id ``<job_id>/<occurrence>`` and
  ``run_at`` = the occurrence. So J1 holds: an id that exists is a duplicate tick and inserts
  nothing, and an idempotency policy on the job applies as on any enqueue.
- J2's ``queue_depth_limit`` bounds what ``enqueue`` admits, not schedules: a tick inserts its
  occurrence whatever the job's queue depth (a schedule admits at most one run per occurrence
  by construction, and catch-up is one run), and it never takes the job's enqueue gate, so an
  open unit of work that enqueued the job never holds up its schedule. An occurrence is never
  dropped, on any backend.

A tick has no caller to give a payload, so a scheduled job is declared with ``payload=None``
(its runs carry ``None``) or ``payload=dict`` (its runs carry ``{}``). Any other payload type
is refused when the schedule is installed, not at the first tick. Scheduled runs take no
dedupe key from the caller: their durable id is what makes a repeated tick a duplicate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ship_sqla.kernel._errors import ConfigurationError, InvalidPayloadError
from ship_sqla.kernel._plans.prepare import prepare_runs
from ship_sqla.kernel._plans.schedule import due_occurrence, next_occurrence, occurrence_id
from ship_sqla.kernel._ports import EnqueueRequest

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from datetime import datetime

    from ship_sqla.kernel._jobs import JobDefinition, Schedule
    from ship_sqla.kernel._plans.prepare import PreparedRun

__all__ = [
    "fire_due",
    "installable",
    "schedule_states",
    "scheduled_only",
    "scheduled_payload",
]


def scheduled_payload(job: JobDefinition[Any]) -> Any:  # noqa: ANN401 - the job's payload
    """The payload of every run a tick creates for ``job``: ``None``, else ``{}``."""
    candidates: tuple[Any, ...] = (None, {})
    for candidate in candidates:
        try:
            job.encode(candidate)
        except InvalidPayloadError:
            continue
        return candidate
    raise ConfigurationError(
        f"scheduled job {job.id!r} declares a payload that neither None nor {{}} satisfies; a"
        " schedule's tick has no payload to give its runs.",
        fix="declare scheduled jobs with payload=None or payload=dict, and enqueue the typed"
        " work from the scheduled handler if needed.",
    )


def scheduled_only(
    definitions: Iterable[JobDefinition[Any]],
) -> list[tuple[JobDefinition[Any], Schedule]]:
    """The definitions that have a schedule, each with it (for typed access)."""
    return [(job, job.schedule) for job in definitions if job.schedule is not None]


def installable(
    definitions: Iterable[JobDefinition[Any]],
) -> list[tuple[JobDefinition[Any], Schedule]]:
    """:func:`scheduled_only`, after refusing a job whose payload a tick could not give
    (:func:`scheduled_payload`): install checks every definition before it stores anything."""
    scheduled = scheduled_only(definitions)
    for job, _ in scheduled:
        scheduled_payload(job)
    return scheduled


def schedule_states(
    scheduled: Sequence[tuple[JobDefinition[Any], Schedule]], now: datetime
) -> list[tuple[str, str, datetime]]:
    """What install stores per scheduled job: ``(job_id, trigger, next_at)``, ``next_at`` the
    first occurrence after ``now`` (the store keeps its own instead when the stored trigger is
    unchanged)."""
    return [
        (job.id, schedule.trigger, next_occurrence(schedule, now)) for job, schedule in scheduled
    ]


def fire_due(
    job: JobDefinition[Any], schedule: Schedule, next_at: datetime, now: datetime
) -> tuple[list[PreparedRun], datetime]:
    """One tick of one stored state: the prepared run to insert (none when ``next_at`` is still
    ahead) and the ``next_at`` to store."""
    fire, new_next_at = due_occurrence(schedule, next_at, now)
    if fire is None:
        return [], new_next_at
    request = EnqueueRequest(
        scheduled_payload(job), run_at=fire, run_id=occurrence_id(job.id, fire)
    )
    return prepare_runs(job, [request]), new_next_at
