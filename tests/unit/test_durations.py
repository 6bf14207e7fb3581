"""Every duration option is finite, positive and bounded, checked before any work (issue #10:
a ``nan``, ``inf`` or ``1e12`` lease was accepted, then broke every claim of its runtime).

One validator (``ship_sqla.kernel._durations.require_duration``) serves every option; each test
below names the option and the bound the ConfigurationError must state.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from ship_sqla import create_job_backend, define_job, start_job_runtime
from ship_sqla.errors import ConfigurationError
from ship_sqla.jobs import Concurrency, RetryPolicy
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.kernel._durations import (
    MAX_DRAIN_TIMEOUT,
    MAX_LEASE,
    MAX_OPERATION_TIMEOUT,
    MAX_POLL_INTERVAL,
    MAX_RETRY_DELAY,
    MAX_SAMPLE_INTERVAL,
    require_duration,
)
from ship_sqla.testing import FrozenClock

BAD = [
    pytest.param(math.nan, "must be finite", id="nan"),
    pytest.param(math.inf, "must be finite", id="inf"),
    pytest.param(-math.inf, "must be finite", id="-inf"),
    pytest.param(-1, "must be positive", id="-1"),
    pytest.param(0, "must be positive", id="0"),
    pytest.param(0.0, "must be positive", id="0.0"),
    pytest.param(1e12, "must be at most", id="1e12"),
    pytest.param(10**400, "must be at most", id="10**400"),
    pytest.param(True, "must be a number of seconds", id="bool"),
    pytest.param("30", "must be a number of seconds", id="str"),
    pytest.param(None, "must be a number of seconds", id="None"),
]


async def _noop(ctx: Any, payload: Any) -> None:
    return None


@pytest.mark.parametrize(("value", "says"), BAD)
def test_require_duration_refuses_what_would_break_later(value: object, says: str) -> None:
    """The one validator: the error names the option, what is wrong and the bound."""
    with pytest.raises(ConfigurationError, match=r"concurrency\.lease") as raised:
        require_duration(value, "concurrency.lease", maximum=MAX_LEASE)
    assert says in str(raised.value)
    assert "86400 s (1 day)" in str(raised.value)  # the bound, in the fix


def test_require_duration_answers_float_seconds() -> None:
    assert require_duration(30, "x", maximum=60) == 30.0
    assert isinstance(require_duration(30, "x", maximum=60), float)
    assert require_duration(Fraction(1, 4), "x", maximum=60) == 0.25
    assert require_duration(60, "x", maximum=60) == 60.0
    assert require_duration(0, "x", maximum=60, allow_zero=True) == 0.0
    with pytest.raises(ConfigurationError, match="zero or more"):
        require_duration(-0.5, "x", maximum=60, allow_zero=True)


@pytest.mark.parametrize(("value", "says"), BAD)
def test_job_declarations_refuse_bad_durations(value: object, says: str) -> None:
    """concurrency.lease, retry.base_delay and retry.max_delay, at declaration."""
    for build, name, bound in (
        (lambda v: Concurrency(lease=v), "concurrency.lease", MAX_LEASE),
        (lambda v: RetryPolicy(base_delay=v), "retry.base_delay", MAX_RETRY_DELAY),
        (lambda v: RetryPolicy(max_delay=v), "retry.max_delay", MAX_RETRY_DELAY),
    ):
        with pytest.raises(ConfigurationError, match=re.escape(name)) as raised:
            build(value)
        assert says in str(raised.value)
        assert f"{bound:g} s" in str(raised.value)


@pytest.mark.parametrize(("value", "says"), BAD)
def test_the_postgres_backend_refuses_a_bad_operation_timeout(value: object, says: str) -> None:
    """operation_timeout on the PostgreSQL backend: refused when the backend is built (no
    connection is opened)."""
    engine = create_async_engine("postgresql+asyncpg://nobody@127.0.0.1:1/none")
    with pytest.raises(ConfigurationError, match="operation_timeout") as raised:
        create_job_backend(database=engine, operation_timeout=value)  # type: ignore[arg-type]
    assert says in str(raised.value)
    assert f"{MAX_OPERATION_TIMEOUT:g} s" in str(raised.value)


@pytest.mark.parametrize(("value", "says"), BAD)
async def test_the_runtime_refuses_bad_durations(value: object, says: str) -> None:
    """J3: poll_interval (at most an hour), drain_timeout (zero allowed: cancel at once) and
    queue_sample_interval, at start, before anything runs; the drain_timeout of stop() too."""
    backend = InMemoryJobBackend(clock=FrozenClock())
    job = define_job("durations", _noop, payload=dict)
    zero_ok = says == "must be positive" and value == 0
    if not zero_ok:
        with pytest.raises(ConfigurationError, match="drain_timeout") as raised:
            await start_job_runtime(job, backend=backend, drain_timeout=value)  # type: ignore[arg-type]
        assert f"{MAX_DRAIN_TIMEOUT:g} s" in str(raised.value)
    with pytest.raises(ConfigurationError, match="poll_interval") as raised:
        await start_job_runtime(job, backend=backend, poll_interval=value)  # type: ignore[arg-type]
    assert says in str(raised.value)
    assert f"{MAX_POLL_INTERVAL:g} s" in str(raised.value)
    if value is not None:
        with pytest.raises(ConfigurationError, match="queue_sample_interval") as raised:
            await start_job_runtime(job, backend=backend, queue_sample_interval=value)  # type: ignore[arg-type]
        assert says in str(raised.value)
        assert f"{MAX_SAMPLE_INTERVAL:g} s" in str(raised.value)
    runtime = await start_job_runtime(job, backend=backend, mode="enqueue-only")
    if not zero_ok and value is not None:  # stop(drain_timeout=None): the runtime's own
        with pytest.raises(ConfigurationError, match="drain_timeout"):
            await runtime.stop(drain_timeout=value)  # type: ignore[arg-type]
    await runtime.stop()


async def test_zero_drain_and_no_sampling_stay_allowed() -> None:
    """drain_timeout=0 (cancel at once) and queue_sample_interval=None (never sample) are
    choices, not mistakes."""
    backend = InMemoryJobBackend(clock=FrozenClock())
    job = define_job("durations.ok", _noop, payload=dict)
    runtime = await start_job_runtime(
        job, backend=backend, drain_timeout=0, queue_sample_interval=None
    )
    await runtime.stop(drain_timeout=0)
