"""Project-wide test configuration: every coroutine test runs on anyio's asyncio backend."""

from __future__ import annotations

import inspect
from typing import Any

import pytest


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: Any) -> None:
    # Marking at collection (before parametrize expands the function) rather than afterwards
    # keeps anyio's backend parametrization working together with @pytest.mark.parametrize.
    if collector.funcnamefilter(name) and inspect.iscoroutinefunction(obj):  # type: ignore[attr-defined]
        pytest.mark.anyio(obj)
