"""J22 on every backend (in-memory reference, PostgreSQL): the storage health is a port
(``StorageHealthSource``) each backend answers, through the operator gate too; a fresh store is
never an alarm: the in-memory one answers "unknown" (it has no tables, vacuum or snapshots), the
PostgreSQL one "healthy" with its tables listed."""

from __future__ import annotations

from typing import Any

import pytest

from ship_sqla import create_job_operations
from ship_sqla.errors import PermissionDeniedError
from ship_sqla.kernel import StorageHealthSource
from ship_sqla.testing import FrozenClock


def allow(permission: str, operation: str) -> bool:
    return True


def deny(permission: str, operation: str) -> bool:
    return False


async def test_j22_a_fresh_store_is_healthy_or_unknown(
    job_backend_factory: Any, clock: FrozenClock
) -> None:
    """J22: every backend is a StorageHealthSource; a fresh store answers healthy (it reads its
    tables) or unknown (it reads none), never an alarm, and the operator gate answers the
    same health. J16, J17: a history (the default shape) is maintained first: its day
    partitions are counted from the backend's clock (frozen here, not the server's today)."""
    backend = job_backend_factory(clock)
    assert isinstance(backend, StorageHealthSource)
    if getattr(backend, "history_maintenance", None) is not None:
        await backend.maintain_history()
    health = await backend.storage_health()
    assert health.status in {"healthy", "unknown"}
    assert health.alarms() == ()
    if health.known:
        assert health.table("runs") is not None
        assert health.status == "healthy"
    else:
        assert health.tables == ()
    ops = create_job_operations(backend, authorizer=allow)
    assert (await ops.storage_health()).status == health.status


async def test_j22_reading_the_health_needs_the_read_permission(
    job_backend_factory: Any, clock: FrozenClock
) -> None:
    """J22 through J8's gate: the health is a read; an authorizer that grants nothing refuses
    it before any read."""
    ops = create_job_operations(job_backend_factory(clock), authorizer=deny)
    with pytest.raises(PermissionDeniedError):
        await ops.storage_health()
