"""Issue 27, item 3: a sync handler is refused at definition, naming the fix; async handlers in
every callable shape are accepted."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from ship_sqla import define_job
from ship_sqla.errors import ConfigurationError


async def _async_handler(_ctx: Any, _payload: Any) -> None:
    return None


def _sync_handler(_ctx: Any, _payload: Any) -> None:
    return None


class _AsyncCallable:
    async def __call__(self, _ctx: Any, _payload: Any) -> None:
        return None


def test_27_3_a_sync_handler_is_refused_at_definition() -> None:
    """A plain function (or a lambda) would run its body at every attempt and then fail; it is
    refused when the job is defined, the fix naming async def and asyncio.to_thread."""
    for handler in (_sync_handler, lambda _ctx, _payload: None, "not callable"):
        with pytest.raises(ConfigurationError, match="async") as refused:
            define_job("sync.refused", handler, payload=dict)  # type: ignore[arg-type]
        assert refused.value.fix is not None
        assert "async def" in refused.value.fix


def test_27_3_async_handlers_in_every_callable_shape_are_accepted() -> None:
    """An async function, a functools.partial of one and an object with an async __call__."""
    for handler in (
        _async_handler,
        functools.partial(_async_handler),
        _AsyncCallable(),
    ):
        assert define_job("async.ok", handler, payload=dict).handler is handler
