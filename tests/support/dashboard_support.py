"""Shared by the dashboard's tests: jobs, users, dead runs, and reading a page's CSRF token.

``tests/support`` is on pytest's ``pythonpath`` (pyproject.toml): import this module by its name.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from job_helpers import claim_request

from ship_sqla.kernel import Fail
from ship_sqla.kernel._jobs import Concurrency, RetryPolicy, define_job


async def _noop(payload: dict[str, Any]) -> None:
    return None


MAIL = define_job(
    "dash.mail",
    _noop,
    payload=dict,
    concurrency=Concurrency(max=1000, lease=30),
    retry=RetryPolicy(attempts=1),
)
REPORT = define_job(
    "dash.report",
    _noop,
    payload=dict,
    concurrency=Concurrency(max=1000, lease=30),
    retry=RetryPolicy(attempts=1),
)

USERS = {
    "admin": {"ship.jobs:manage", "ship.jobs:read", "ship.outbox:manage", "ship.outbox:read"},
    "viewer": {"ship.jobs:read", "ship.outbox:read"},
    "nobody": set(),
}


def actor(request: Any) -> str:
    """The test application's user: the X-User header, or (for the browser) the ``as``
    cookie."""
    return str(request.headers.get("x-user") or request.cookies.get("as") or "nobody")


def authorizer(request: Any, permission: str, operation: str) -> bool:
    """The test application's authorizer: the permissions USERS gives the request's user."""
    return permission in USERS.get(actor(request), set())


async def dead_runs(backend: Any, job: Any, count: int, *, tenant_every: int = 0) -> list[str]:
    """Enqueue ``count`` runs of ``job`` and fail each on its only attempt: dead."""
    for i in range(count):
        await backend.enqueue(job, {"i": i})
    ids: list[str] = []
    while len(ids) < count:
        claimed = await backend.claim(claim_request(job, worker="w", limit=count - len(ids)))
        assert claimed
        outcomes = await backend.settle(
            [Fail(run, f"boom {run.run_id}\nTraceback: line 1", retry_at=None) for run in claimed]
        )
        assert set(outcomes) == {"dead"}
        ids += [run.run_id for run in claimed]
    return ids


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([0-9a-f]+)"', html)
    assert found is not None, "no CSRF token on the page"
    return found.group(1)


HOUR = timedelta(hours=1)
