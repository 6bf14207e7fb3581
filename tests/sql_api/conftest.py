"""Fixtures of the SQL enqueue tests: a real PgBouncer in transaction mode (F7)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from pgbouncer import PgBouncer, running_pgbouncer

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ship_sqla.testing import ResolvedServer


@pytest.fixture(scope="session")
def pgbouncer(ship_server: ResolvedServer) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode in front of the test server (tests/support/pgbouncer.py);
    skipped when it is not installed, unless SHIP_SQLA_REQUIRE_PGBOUNCER is set."""
    with running_pgbouncer(ship_server) as bouncer:
        yield bouncer
