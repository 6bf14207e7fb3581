"""A worker's lifespan: the application's resources, made once per worker runtime or relay.

A lifespan is a callable returning an async context manager (an ``@asynccontextmanager``
function, as FastAPI's ``lifespan``): its ``__aenter__`` builds what the handlers need (an
engine, a unit of work, an HTTP client, a container) and yields it; handlers read that value
as ``ctx.resources``. The runtime enters it once, after its start checks and before its first
claim, and exits it once, after its drain (J12), whatever the stop met on the way: a handler
never runs without its resources, and the resources are never closed under a running handler.
An error while entering refuses the start (:class:`LifespanFailedError`, the cause chained);
nothing was claimed.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeAlias

from ship_sqla.kernel._errors import ConfigurationError

__all__ = ["Lifespan", "LifespanFailedError", "enter_lifespan", "require_lifespan"]

Lifespan: TypeAlias = Callable[[], AbstractAsyncContextManager[Any]]
"""``lifespan() -> async context manager``; the value it yields is the handlers'
``ctx.resources``."""


class LifespanFailedError(ConfigurationError):
    """The application's lifespan raised while it was entered: the worker (or relay) refused
    to start and claimed nothing; the lifespan's own error is the ``__cause__``."""

    code = "SHIP_SQLA_LIFESPAN_FAILED"


def require_lifespan(lifespan: object, where: str) -> None:
    """A lifespan is callable (it is called once per start), not an async context manager
    already made (which could be entered once only), or the refusal says what to pass."""
    if not callable(lifespan) or hasattr(lifespan, "__aenter__"):
        raise ConfigurationError(
            f"{where}'s lifespan must be callable (it is called once per start to make the"
            f" resources), got {type(lifespan).__name__}.",
            fix="pass the function itself: an @asynccontextmanager async def that yields the"
            " resources, e.g. lifespan=app_lifespan (not app_lifespan()).",
        )


async def enter_lifespan(
    lifespan: Lifespan, where: str
) -> tuple[AbstractAsyncContextManager[Any], Any]:
    """Call and enter ``lifespan``: the context manager to exit at the stop, and the value it
    yielded. Any error of the application's is :class:`LifespanFailedError`, chained."""
    try:
        manager = lifespan()
        resources = await manager.__aenter__()
    except Exception as exc:
        first_line = (str(exc).splitlines() or [""])[0]
        raise LifespanFailedError(
            f"{where} did not start: its lifespan {_name(lifespan)} raised"
            f" {type(exc).__name__}: {first_line}",
            fix="fix what the lifespan opens (its traceback is this error's cause); the"
            " lifespan must return an async context manager (an @asynccontextmanager function"
            " that yields once).",
        ) from exc
    return manager, resources


def _name(lifespan: object) -> str:
    qualified = getattr(lifespan, "__qualname__", None)
    module = getattr(lifespan, "__module__", None)
    if qualified is None:
        return repr(lifespan)
    return f"{module}.{qualified}" if module else str(qualified)
