"""Time in the ship statements: the one place that writes the clock rule.

Every statement reads "now" as ``coalesce(:now, now())`` (``{now}`` in a
:class:`~ship_sqla._sql.Template`, :func:`now_param` in a statement built with SQLAlchemy Core:
outbox, idempotency, webhooks): ``:now`` is the store's injected clock when it is frozen (tests
move time), else NULL, so the database's own ``now()`` (the transaction's start) decides; every
store binds it with :func:`now_bound`. Durations travel as float seconds times
``interval '1 second'``, one SQL text whatever the value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import Float, bindparam, func, literal_column
from sqlalchemy.dialects.postgresql import TIMESTAMP

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.sql import ColumnElement

    from ship_sqla.kernel import Clock

__all__ = ["ONE_SECOND", "TSTZ", "now_bound", "now_param", "seconds_param"]

TSTZ = TIMESTAMP(timezone=True)
ONE_SECOND: ColumnElement[Any] = literal_column("interval '1 second'")


def now_bound(clock: Clock) -> datetime | None:
    """``:now`` of ``coalesce(:now, now())`` for a store on ``clock``: its time when it is frozen,
    else None (the database's clock decides)."""
    return clock.now() if clock.frozen else None


def now_param() -> ColumnElement[Any]:
    """``coalesce(:now, now())``: the injected clock's time when given, else the database's."""
    return func.coalesce(bindparam("now", type_=TSTZ), func.now())


def seconds_param(name: str) -> ColumnElement[Any]:
    """``:name * interval '1 second'`` for a duration bound as float seconds."""
    return bindparam(name, type_=Float) * ONE_SECOND
