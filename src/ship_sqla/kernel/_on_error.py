"""Handing absorbed errors to the application's ``on_error`` (J11): one rule for every loop.

The worker loop, the relay and the stores absorb errors instead of raising them out of a
background task. Each such error reaches ``on_error`` exactly once, or the ``ship_sqla`` logger
when none is set; an ``on_error`` that raises is logged and never breaks the loop.

A log line never carries a statement's text: a database error's ``str`` (SQLAlchemy's) holds
the whole statement, and a claim's is kilobytes long, logged at every poll. An error that names
a statement (its own ``statement`` attribute, or one of its causes') is logged as one line,
:func:`error_line`, without its traceback; its type and first line say what failed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeAlias

__all__ = ["ErrorHandler", "deliver_error", "error_line", "names_a_statement"]

logger = logging.getLogger("ship_sqla")

ErrorHandler: TypeAlias = Callable[[BaseException], None]


def deliver_error(
    on_error: ErrorHandler | None,
    error: BaseException,
    *,
    source: str,
    log: logging.Logger = logger,
) -> None:
    """Pass ``error`` to ``on_error`` (or log it on ``log``, naming ``source``; a database
    error as :func:`error_line` alone). Never raises."""
    if on_error is None:
        if names_a_statement(error):
            log.error("%s absorbed an error: %s", source, error_line(error))
        else:
            log.error("%s absorbed an error: %s", source, error, exc_info=error)
        return
    try:
        on_error(error)
    except Exception:
        log.exception("%s: on_error raised while handling %r", source, error)


def names_a_statement(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from, carries a statement's text (a
    database driver's error as SQLAlchemy wraps it: its ``statement``)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(getattr(current, "statement", None), str):
            return True
        current = current.__cause__ or current.__context__
    return False


def error_line(error: BaseException) -> str:
    """``<type>: <first line>`` of ``error`` (a ship error's code and message, a database
    error's driver message): never the ``[SQL: ...]`` text SQLAlchemy appends on the next
    lines; the first line of a cause that names a statement is added after ``from``."""
    line = f"{type(error).__name__}: {_first_line(error)}"
    cause = error.__cause__ or error.__context__
    if cause is not None and names_a_statement(cause) and not hasattr(error, "statement"):
        line += f" (from {type(cause).__name__}: {_first_line(cause)})"
    return line


def _first_line(error: BaseException) -> str:
    text = str(error)
    # SQLAlchemy writes the statement after a newline; a statement in a first line is cut.
    first = text.split("\n", 1)[0]
    return first.split("[SQL:", 1)[0].rstrip()
