"""What a scheduled run carries, shared by every backend's ``schedule``/``tick`` (J9).

A tick has no caller to give a payload, so a scheduled job is declared with ``payload=None``
(its runs carry ``None``) or ``payload=dict`` (its runs carry ``{}``). Any other payload type
is refused when the schedule is installed, not at the first tick. Scheduled runs take no
dedupe key from the caller: their durable id ``<job_id>/<occurrence>`` is what makes a repeated
tick a duplicate (an idempotency policy on the job still applies, as on any enqueue).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._jobs import InvalidPayloadError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ship_sqla.kernel._jobs import JobDefinition, Schedule

__all__ = ["scheduled_only", "scheduled_payload"]


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
