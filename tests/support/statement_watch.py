"""A statement listener on an engine, for the tests of the direct path (``ship_sqla._direct``):
while anyone listens, a backend takes SQLAlchemy's path so the listener sees every statement;
the tests use that path as the reference the direct one (a plain INSERT, a bulk's COPY) must
match.

``tests/support`` is on pytest's ``pythonpath`` (pyproject.toml), so tests import this module
by its name.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy import event

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sqlalchemy.ext.asyncio import AsyncEngine


@contextmanager
def watched(engine: AsyncEngine) -> Iterator[list[str]]:
    """A ``before_cursor_execute`` listener on ``engine``; yields the statements it saw."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)
