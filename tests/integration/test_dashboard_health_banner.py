"""J22 and issue 36: the dashboard's health banner reads the storage health at most every
BANNER_HEALTH_TTL seconds across pages and viewers (its reads stat each ship table's files and
count the history's DEFAULT partitions up to 100,000 rows each: 20-60 ms a page at 10,000,000
runs), and each page still asks the authorizer for it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from dashboard_support import MAIL, actor

from ship_sqla import create_dashboard
from ship_sqla._dashboard import _app
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.kernel._health import StorageHealth
from ship_sqla.kernel._operations import JobOperations

ALARMED = StorageHealth(known=True, history_strays=3)


async def test_j22_the_banner_reads_storage_health_once_per_ttl_and_asks_every_page(
    ship_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """J22, issue 36: two pages within BANNER_HEALTH_TTL read the storage health once and both
    show its alarm; past the TTL it is read again; a viewer the authorizer refuses it on a
    page gets no banner there though a fresh reading is kept (the authorizer is asked on every
    page, as ``storage_health`` asks)."""
    reads: list[str] = []
    asked: list[tuple[str, str, str]] = []

    async def storage_health(self: JobOperations) -> StorageHealth:
        reads.append(self.actor)
        return ALARMED

    now = [1000.0]
    monkeypatch.setattr(JobOperations, "storage_health", storage_health)
    monkeypatch.setattr(_app, "monotonic", lambda: now[0])
    refuse_health = {"carl"}

    def authorizer(request: Any, permission: str, operation: str) -> bool:
        user = actor(request)
        asked.append((user, permission, operation))
        return permission == "ship.jobs:read" and not (
            operation == "storage_health" and user in refuse_health
        )

    app = create_dashboard(
        InMemoryJobBackend(clock=ship_clock),
        authorizer=authorizer,
        actor=actor,
        audit=None,
        definitions=[MAIL],
    )
    json = {"accept": "application/json"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://app"
    ) as client:

        async def health(user: str, path: str = "/") -> list[str]:
            page = await client.get(path, headers={**json, "x-user": user})
            assert page.status_code == 200, page.text
            return [alarm["kind"] for alarm in page.json()["health"]]

        assert await health("ann") == ["history_strays"]
        now[0] += _app.BANNER_HEALTH_TTL / 2
        assert await health("bob", "/runs") == ["history_strays"]
        assert reads == ["ann"]
        assert ("bob", "ship.jobs:read", "storage_health") in asked
        assert await health("carl", "/dead") == []
        assert reads == ["ann"]
        now[0] += _app.BANNER_HEALTH_TTL
        assert await health("bob") == ["history_strays"]
        assert reads == ["ann", "bob"]
