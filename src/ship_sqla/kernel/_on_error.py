"""Handing absorbed errors to the application's ``on_error`` (J11): one rule for every loop.

The worker loop, the relay and the stores absorb errors instead of raising them out of a
background task. Each such error reaches ``on_error`` exactly once, or the ``ship_sqla`` logger
when none is set; an ``on_error`` that raises is logged and never breaks the loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeAlias

__all__ = ["ErrorHandler", "deliver_error"]

logger = logging.getLogger("ship_sqla")

ErrorHandler: TypeAlias = Callable[[BaseException], None]


def deliver_error(
    on_error: ErrorHandler | None,
    error: BaseException,
    *,
    source: str,
    log: logging.Logger = logger,
) -> None:
    """Pass ``error`` to ``on_error`` (or log it on ``log``, naming ``source``). Never raises."""
    if on_error is None:
        log.error("%s absorbed an error: %s", source, error, exc_info=error)
        return
    try:
        on_error(error)
    except Exception:
        log.exception("%s: on_error raised while handling %r", source, error)
