"""F5 demand over HTTP: an ASGI endpoint an autoscaler polls (KEDA's ``metrics-api`` scaler, a
cron, a dashboard), and the one JSON shape the endpoint and ``ship-sqla jobs demand --json``
share.

``GET`` answers ``{"jobs": [{"job_id", "due", "delayed", "running", "oldest_due_seconds",
"capped"}, ...], "cap": N}`` from :meth:`~ship_sqla.jobs.JobOperations.demand` (so the
application's authorizer is asked first, like every operator operation). ``?job=ID`` (repeated)
narrows it to those jobs; ``?cap=N`` changes the cap. Anything else answers an RFC 9457 problem:
405 for another method, 400 for bad input, 403 when the authorizer refuses, 503 while the
database is unreachable.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from ship_sqla._asgi_io import problem_response, send_response, send_stored
from ship_sqla.kernel._errors import (
    BoundExceededError,
    ConfigurationError,
    DatabaseUnavailableError,
    PermissionDeniedError,
)
from ship_sqla.kernel._operations import DEFAULT_DEMAND_CAP

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from ship_sqla._asgi_io import Receive, Scope, Send
    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._operations import JobOperations
    from ship_sqla.kernel._partition_waits import PartitionWait
    from ship_sqla.kernel._ports import JobDemand

__all__ = ["DemandEndpoint", "demand_document"]


def demand_document(
    demands: Sequence[JobDemand], cap: int, waits: Sequence[PartitionWait] | None = None
) -> dict[str, Any]:
    """The JSON document of a demand answer (the endpoint's body, ``jobs demand --json``).
    With ``waits`` (F8/F9 seen: the endpoint given the job definitions), each job reported
    also lists ``waiting_on_limits``: its partitions whose due runs wait on a limit."""
    jobs: list[dict[str, Any]] = [
        {
            "job_id": d.job_id,
            "due": d.due,
            "delayed": d.delayed,
            "running": d.running,
            "oldest_due_seconds": None if d.oldest_due_age is None else round(d.oldest_due_age, 3),
            "capped": d.capped,
        }
        for d in demands
    ]
    if waits is not None:
        for job in jobs:
            job["waiting_on_limits"] = [
                _wait_document(w) for w in waits if w.job_id == job["job_id"]
            ]
    return {"jobs": jobs, "cap": cap}


def _wait_document(wait: PartitionWait) -> dict[str, Any]:
    return {
        "partition": wait.partition,
        "due": wait.due,
        "running": wait.running,
        "started": wait.started,
        "waiting_on": list(wait.waiting_on),
        "until": None if wait.until is None else wait.until.isoformat(),
        "capped": wait.capped,
    }


class DemandEndpoint:
    """An ASGI app answering F5 demand (see the module). ``job_ids``: the jobs it reports when
    the request names none (None: every job with waiting or running runs)::

        ops = create_job_operations(backend, authorizer=metrics_scraper_allowed)
        app = Starlette(routes=[Mount("/ship/demand", DemandEndpoint(ops))])
    """

    def __init__(
        self,
        operations: JobOperations,
        *,
        job_ids: Sequence[str] | None = None,
        definitions: Iterable[JobDefinition[Any]] = (),
    ) -> None:
        self._operations = operations
        self._job_ids = None if job_ids is None else list(job_ids)
        self._partitioned = [d for d in definitions if d.partition is not None]

    async def _waits(self, demands: Sequence[JobDemand]) -> list[PartitionWait] | None:
        """F8/F9 seen: the partitions waiting on a limit of the reported jobs whose definitions
        the endpoint was given (None: it was given none with partitioned limits)."""
        if not self._partitioned:
            return None
        reported = {d.job_id for d in demands}
        jobs = [d for d in self._partitioned if d.id in reported]
        return await self._operations.partition_waits(jobs) if jobs else []

    async def __call__(self, scope: Scope, _receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            msg = f"DemandEndpoint serves HTTP requests only, got an ASGI {scope['type']!r} scope."
            raise RuntimeError(msg)
        if scope["method"] not in ("GET", "HEAD"):
            await send_stored(
                send,
                problem_response(
                    405,
                    title="Method Not Allowed",
                    code="SHIP_SQLA_METHOD_NOT_ALLOWED",
                    detail=f"the demand endpoint answers GET, not {scope['method']}.",
                ),
                [("allow", "GET, HEAD")],
            )
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"))
        named = [value for key, value in query if key == "job"]
        caps = [value for key, value in query if key == "cap"]
        cap = DEFAULT_DEMAND_CAP
        try:
            if caps:
                try:
                    cap = int(caps[-1])
                except ValueError:
                    raise BoundExceededError(
                        f"demand cap must be an integer, got {caps[-1]!r}.",
                        fix="pass ?cap=10000, or omit it.",
                    ) from None
            demands = await self._operations.demand(named or self._job_ids, cap=cap)
            waits = await self._waits(demands)
        except (BoundExceededError, ConfigurationError) as exc:
            await send_stored(
                send,
                problem_response(
                    400, title="Bad Request", code=exc.code, detail=str(exc), fix=exc.fix
                ),
            )
            return
        except PermissionDeniedError as exc:
            await send_stored(
                send, problem_response(403, title="Forbidden", code=exc.code, detail=str(exc))
            )
            return
        except DatabaseUnavailableError as exc:
            await send_stored(
                send,
                problem_response(503, title="Service Unavailable", code=exc.code, detail=str(exc)),
                [("retry-after", "1")],
            )
            return
        body = json.dumps(demand_document(demands, cap, waits), separators=(",", ":")).encode()
        await send_response(
            send, 200, [("content-type", "application/json"), ("cache-control", "no-store")], body
        )
