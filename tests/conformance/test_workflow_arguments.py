"""J23 (and D1, D3, D4, D5): every workflow call checks every argument before any statement and
before any user function runs; what it accepts round-trips through storage. On both backends,
Hypothesis feeds each call arbitrary text (lone surrogates and NUL included), numbers, datetimes
with odd time zones and wrong types: the answer is a typed ShipError with nothing read or
written, or a value the store keeps and gives back, never a raw driver error."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from job_helpers import claim_request

from ship_sqla import JobContext, define_job
from ship_sqla.errors import ShipError
from ship_sqla.jobs import Concurrency, EnqueueRequest
from ship_sqla.kernel._workflows import WorkflowSuspended

pytestmark = pytest.mark.anyio  # Hypothesis wraps the coroutine: anyio runs each example

EXAMPLES = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=24)
"""Any code points, lone surrogates and NUL included (Hypothesis leaves surrogates out by
default)."""


class _NoOffset(tzinfo):
    """A tzinfo that knows no offset: a naive datetime in disguise."""

    def utcoffset(self, _dt: datetime | None) -> timedelta | None:
        return None

    def dst(self, _dt: datetime | None) -> timedelta | None:
        return None


ZONES = st.sampled_from(
    [UTC, timezone(timedelta(hours=23)), timezone(timedelta(hours=-23)), _NoOffset(), None]
)
WHENS = st.builds(
    lambda day, zone: day.replace(tzinfo=zone),
    st.datetimes(),
    ZONES,
)
WRONG = st.sampled_from([None, 7, 2.5, b"bytes", ["a"], {"a": 1}, object(), math.nan])
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**20), max_value=10**20),
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=6,
)


class SpyStore:
    """The backend's workflow store, counting every call (a typed refusal must make none)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if not callable(attribute):
            return attribute

        def spied(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return attribute(*args, **kwargs)

        return spied


async def _noop(_ctx: Any, _payload: Any) -> None:
    return None


JOB = define_job("j23.args", _noop, payload=dict, concurrency=Concurrency(lease=60))
CHILD = define_job("j23.args.child", _noop, payload=dict)


async def _context(backend: Any, clock: Any) -> tuple[JobContext, SpyStore]:
    await backend.enqueue_many(JOB, [EnqueueRequest({})])
    [run] = await backend.claim(claim_request(JOB, worker="w"))
    ctx = JobContext.standalone(run)
    spy = SpyStore(backend.workflows)
    ctx.bind_workflows(spy, backend, clock)  # type: ignore[arg-type]
    return ctx, spy


async def _outcome(call: Any, spy: SpyStore, user_calls: list[object]) -> object:
    """Run ``call``: a typed refusal (nothing read or written, no user function run) answers
    the error; anything else it answers (a value, or the suspension it raised)."""
    try:
        return await call()
    except WorkflowSuspended as suspended:
        return suspended
    except ShipError as refused:
        error = refused
    assert error.code.startswith("SHIP_SQLA_")
    assert error.fix, error
    if error.code in {"SHIP_SQLA_CONFIGURATION", "SHIP_SQLA_WORKFLOW_MISUSE"}:
        assert spy.calls == [], (error, spy.calls)
        assert user_calls == [], error
    return error


@pytest.fixture
def backend_of(clock: Any, job_backend_factory: Any) -> Any:
    return job_backend_factory(clock)


@EXAMPLES
@given(name=ANY_TEXT | WRONG, value=JSON)
async def test_j23_d1_a_step_refuses_its_name_before_anything_or_round_trips_its_value(
    backend_of: Any, clock: Any, name: Any, value: Any
) -> None:
    """J23, D1: a step whose name cannot be stored is refused before any statement and before
    its function runs; an accepted step's result (any JSON, odd text included, escaped or
    refused as the payload rules say) comes back the same on replay."""
    ctx, spy = await _context(backend_of, clock)
    user_calls: list[object] = []

    async def fn() -> Any:
        user_calls.append(value)
        return value

    first = await _outcome(lambda: ctx.step(name, fn), spy, user_calls)
    if isinstance(first, ShipError):
        return
    expected = json.loads(json.dumps(value))
    assert first == expected
    replay = JobContext.standalone(ctx.run)
    replay.bind_workflows(backend_of.workflows, backend_of, clock)
    assert await replay.step(name, fn) == expected
    assert len(user_calls) == 1


@EXAMPLES
@given(name=ANY_TEXT, fn=WRONG)
async def test_j23_a_step_whose_function_is_not_callable_is_refused_first(
    backend_of: Any, clock: Any, name: str, fn: Any
) -> None:
    """J23: ``step(name, fn=<not a function>)`` is a typed error before any statement."""
    ctx, spy = await _context(backend_of, clock)
    error = await _outcome(lambda: ctx.step(name, fn), spy, [])
    assert isinstance(error, ShipError)


@EXAMPLES
@given(name=ANY_TEXT, when=WHENS | WRONG)
async def test_j23_d3_sleep_until_refuses_odd_times_or_suspends_storably(
    backend_of: Any, clock: Any, name: str, when: Any
) -> None:
    """J23, D3: a naive time, a tzinfo without an offset, a time that leaves the datetime range
    in UTC, or not a datetime at all is refused before any statement; an accepted sleep's
    suspension settles (the store keeps its wake time)."""
    ctx, spy = await _context(backend_of, clock)
    outcome = await _outcome(lambda: ctx.sleep_until(name, when), spy, [])
    if isinstance(outcome, ShipError):
        return
    assert isinstance(outcome, WorkflowSuspended)
    assert await backend_of.settle([outcome.settlement]) == ["suspended"]


@EXAMPLES
@given(name=ANY_TEXT, duration=NUMBERS | WRONG)
async def test_j23_d3_sleep_refuses_odd_durations(
    backend_of: Any, clock: Any, name: str, duration: Any
) -> None:
    """J23, D3: a sleep's duration (NaN, infinite, negative, huge, not a number) is checked
    before any statement; an accepted one suspends and settles."""
    ctx, spy = await _context(backend_of, clock)
    outcome = await _outcome(lambda: ctx.sleep(name, duration), spy, [])
    if isinstance(outcome, ShipError):
        return
    assert isinstance(outcome, WorkflowSuspended)
    assert await backend_of.settle([outcome.settlement]) == ["suspended"]


@EXAMPLES
@given(name=ANY_TEXT, event=ANY_TEXT | WRONG, key=ANY_TEXT | WRONG, timeout=NUMBERS | st.none())
async def test_j23_d4_event_waits_refuse_odd_names_keys_and_timeouts(  # noqa: PLR0917 - Hypothesis names each argument
    backend_of: Any,
    clock: Any,
    name: str,
    event: Any,
    key: Any,
    timeout: Any,  # noqa: ASYNC109 - the wait's durable timeout, not this test's
) -> None:
    """J23, D4: ``wait_for_event`` and ``expect_event`` check the step name, the event name, the
    key and the timeout before any statement; an accepted wait suspends and settles, an
    accepted expectation is stored."""
    ctx, spy = await _context(backend_of, clock)
    outcome = await _outcome(
        lambda: ctx.wait_for_event(name, event, key=key, timeout=timeout), spy, []
    )
    if not isinstance(outcome, ShipError):
        assert isinstance(outcome, WorkflowSuspended)
        assert await backend_of.settle([outcome.settlement]) == ["suspended"]
    ctx, spy = await _context(backend_of, clock)
    await _outcome(lambda: ctx.expect_event(name, event, key=key, timeout=timeout), spy, [])


@EXAMPLES
@given(event=ANY_TEXT | WRONG, key=ANY_TEXT | WRONG, payload=JSON)
async def test_j23_d4_publish_event_refuses_what_it_cannot_store(
    backend_of: Any, event: Any, key: Any, payload: Any
) -> None:
    """J23, D4: ``publish_event`` answers an event id, or a typed error for a name, key or
    payload the store could not hold; never a driver error."""
    outcome: object
    try:
        outcome = await backend_of.publish_event(event, payload, key=key)
    except ShipError as error:
        outcome = error
    assert isinstance(outcome, int) or (isinstance(outcome, ShipError) and outcome.fix)


@EXAMPLES
@given(name=ANY_TEXT, job=st.sampled_from(["j23.args.child", None, CHILD]), payloads=WRONG)
async def test_j23_d5_spawn_refuses_a_job_id_or_payloads_that_are_no_list(
    backend_of: Any, clock: Any, name: str, job: Any, payloads: Any
) -> None:
    """J23, D5: ``spawn(job="an.id")``, ``spawn(payloads=None)``, a generator or a string of
    payloads is a typed error before any statement: nothing enqueued, nothing stored."""
    ctx, spy = await _context(backend_of, clock)
    outcome = await _outcome(lambda: ctx.spawn(name, job, payloads), spy, [])
    assert isinstance(outcome, ShipError)
    outcome = await _outcome(lambda: ctx.spawn(name, CHILD, (p for p in [{}])), spy, [])
    assert isinstance(outcome, ShipError)
