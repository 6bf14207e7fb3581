"""Bounding how long a claim waits for another transaction's uncommitted row.

An INSERT that conflicts with a row another transaction inserted but has not committed waits for
that transaction to end (SPEC section 10). An idempotency claim, or a webhook record, joins the
caller's unit of work, which may stay open for the whole request: without a bound, a duplicate
request would hang for as long as the first one runs. So the statements that may wait run in a
SAVEPOINT with ``SET LOCAL lock_timeout``; on SQLSTATE 55P03 only the savepoint is rolled back
(the unit of work's transaction stays usable) and the caller answers "in progress".
"""

from __future__ import annotations

import math
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from sqlalchemy.exc import DBAPIError

from ship_sqla._idempotency._sql import LOCK_NOT_AVAILABLE, RESTORE_LOCK_TIMEOUT, SET_LOCK_TIMEOUT
from ship_sqla._sql_errors import sqlstate_of
from ship_sqla.kernel._errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from datetime import timedelta

    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = ["LockWaitTimedOutError", "bounded_lock_wait", "lock_timeout_setting"]


class LockWaitTimedOutError(Exception):
    """Internal: another transaction held the row longer than the lock timeout."""


def lock_timeout_setting(timeout: timedelta) -> str:
    """``lock_timeout`` as PostgreSQL takes it; refuses 0, which PostgreSQL reads as 'forever'."""
    seconds = timeout.total_seconds()
    if seconds <= 0:
        raise ConfigurationError(
            f"lock_timeout must be positive, got {seconds:g} s (0 would mean wait forever).",
            fix="use a short bound such as timedelta(seconds=1).",
        )
    return f"{max(1, math.ceil(seconds * 1000))}ms"


@asynccontextmanager
async def bounded_lock_wait(connection: AsyncConnection, setting: str) -> AsyncIterator[None]:
    """Run the block in a SAVEPOINT whose lock waits end after ``setting`` (e.g. ``'1000ms'``).

    Raises :class:`LockWaitTimedOutError` when a lock wait timed out; the savepoint is then rolled
    back and the surrounding transaction is intact. On success the transaction's previous
    ``lock_timeout`` is restored, so the rest of the unit of work is unaffected.
    """
    try:
        async with connection.begin_nested():
            previous = (await connection.execute(SET_LOCK_TIMEOUT, {"timeout": setting})).one()
            yield
            await connection.execute(RESTORE_LOCK_TIMEOUT, {"previous": previous.previous})
    except DBAPIError as exc:
        if sqlstate_of(exc) == LOCK_NOT_AVAILABLE:
            raise LockWaitTimedOutError from exc
        raise
