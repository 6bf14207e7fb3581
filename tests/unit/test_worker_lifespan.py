"""Issue 27, item 4: a worker's handlers reach the application's resources (``ctx.resources``)
through a lifespan given to the registry or to ``start_job_runtime``, entered before the first
claim and exited after the drain (J12), an error entering it refusing the start."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import anyio
import attrs
import pytest
from job_helpers import claim_request, record_of

from ship_sqla import JobContext, define_job, start_job_runtime
from ship_sqla.errors import ConfigurationError, LifespanFailedError, ResourcesNotConfiguredError
from ship_sqla.jobs import JobRegistry
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@attrs.define
class Resources:
    """What an application's lifespan builds once per worker (an engine, a client...)."""

    name: str
    closed: bool = False


@pytest.fixture
def backend() -> InMemoryJobBackend:
    return InMemoryJobBackend(clock=FrozenClock())


def _recording_lifespan(log: list[str]):
    @contextlib.asynccontextmanager
    async def lifespan() -> AsyncIterator[Resources]:
        log.append("enter")
        resources = Resources("app")
        try:
            yield resources
        finally:
            resources.closed = True
            log.append("exit")

    return lifespan


@pytest.mark.parametrize("given_to", ["registry", "start_job_runtime"])
async def test_friction_4_handlers_read_the_lifespans_resources_until_the_drain_ends(
    backend: InMemoryJobBackend, given_to: str
) -> None:
    """Issue 27 item 4, J12: the handler reads ``ctx.resources`` (typed, the lifespan's value);
    the lifespan is entered once before the first claim and exited once, after the drain let
    the running handler finish, never under it."""
    log: list[str] = []
    started, release = anyio.Event(), anyio.Event()

    async def handler(ctx: JobContext[Resources], payload: dict[str, int]) -> None:
        log.append(f"run {payload['n']} with {ctx.resources.name}")
        started.set()
        await release.wait()
        assert not ctx.resources.closed  # still open while the handler runs
        log.append(f"done {payload['n']}")

    job = define_job("lifespan.job", handler, payload=dict)
    lifespan = _recording_lifespan(log)
    registry = JobRegistry([job], lifespan=lifespan if given_to == "registry" else None)
    result = await backend.enqueue(job, {"n": 1})
    runtime = await start_job_runtime(
        registry,
        backend=backend,
        lifespan=lifespan if given_to == "start_job_runtime" else None,
        drain_timeout=30,
    )
    with anyio.fail_after(5):
        await started.wait()
    assert log == ["enter", "run 1 with app"]
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.stop)
        with anyio.fail_after(5):
            await anyio.wait_all_tasks_blocked()
        assert not runtime.running
        assert "exit" not in log  # draining: the handler still runs with its resources
        release.set()
    assert log == ["enter", "run 1 with app", "done 1", "exit"]
    assert (await record_of(backend, result.run_id)).state == "completed"
    await runtime.stop()
    assert log.count("exit") == 1


async def test_friction_4_an_error_entering_the_lifespan_refuses_the_start(
    backend: InMemoryJobBackend,
) -> None:
    """Issue 27 item 4: a lifespan that raises while entered refuses the start with
    LifespanFailedError (code, fix, the cause chained); nothing is claimed."""

    @contextlib.asynccontextmanager
    async def broken() -> AsyncIterator[None]:
        message = "cannot reach the cache"
        raise OSError(message)
        yield  # pragma: no cover

    ran: list[int] = []

    async def handler(ctx: JobContext, payload: dict[str, int]) -> None:
        ran.append(payload["n"])

    job = define_job("lifespan.broken", handler, payload=dict)
    result = await backend.enqueue(job, {"n": 1})
    with pytest.raises(LifespanFailedError) as refused:
        await start_job_runtime(job, backend=backend, lifespan=broken)
    assert refused.value.code == "SHIP_SQLA_LIFESPAN_FAILED"
    assert "OSError: cannot reach the cache" in refused.value.message
    assert refused.value.fix is not None
    assert isinstance(refused.value.__cause__, OSError)
    assert ran == []
    assert (await record_of(backend, result.run_id)).state == "waiting"


async def test_friction_4_the_lifespan_exits_after_the_drain_even_when_a_handler_is_cancelled(
    backend: InMemoryJobBackend,
) -> None:
    """Issue 27 item 4, J12: a handler the drain deadline cancels ends first; then the
    lifespan exits (its resources are closed after every handler ended)."""
    log: list[str] = []
    started = anyio.Event()

    async def handler(ctx: JobContext[Resources], payload: dict[str, int]) -> None:
        started.set()
        try:
            await anyio.Event().wait()
        finally:
            log.append(f"handler ended, resources closed: {ctx.resources.closed}")

    job = define_job("lifespan.cancelled", handler, payload=dict)
    await backend.enqueue(job, {"n": 1})
    runtime = await start_job_runtime(job, backend=backend, lifespan=_recording_lifespan(log))
    with anyio.fail_after(5):
        await started.wait()
    await runtime.stop(drain_timeout=0)
    assert log == ["enter", "handler ended, resources closed: False", "exit"]


async def test_friction_4_reading_resources_without_a_lifespan_names_the_fix(
    backend: InMemoryJobBackend,
) -> None:
    """Issue 27 item 4: ``ctx.resources`` in a runtime given no lifespan raises
    ResourcesNotConfiguredError naming the three ways to give one; a lifespan given both to
    the registry and to start_job_runtime, or one that is not callable, is refused."""
    seen: list[BaseException] = []
    done = anyio.Event()

    async def handler(ctx: JobContext, payload: dict[str, int]) -> None:
        try:
            ctx.resources  # noqa: B018 - the read is the test
        except ResourcesNotConfiguredError as exc:
            seen.append(exc)
        done.set()

    job = define_job("lifespan.none", handler, payload=dict)
    await backend.enqueue(job, {"n": 1})
    async with await start_job_runtime(job, backend=backend):
        with anyio.fail_after(5):
            await done.wait()
    [error] = seen
    assert isinstance(error, ResourcesNotConfiguredError)
    assert error.fix is not None
    assert "lifespan=" in error.fix
    assert "--lifespan" in error.fix

    one, other = _recording_lifespan([]), _recording_lifespan([])
    with pytest.raises(ConfigurationError, match="another one"):
        await start_job_runtime(JobRegistry([job], lifespan=one), backend=backend, lifespan=other)
    with pytest.raises(ConfigurationError, match="must be callable"):
        JobRegistry([job], lifespan=one())  # type: ignore[arg-type]


async def test_friction_4_a_standalone_context_carries_test_resources() -> None:
    """Issue 27 item 4: a handler unit test hands its fake resources to
    ``JobContext.standalone``."""
    backend = InMemoryJobBackend(clock=FrozenClock())
    job = define_job("lifespan.standalone", _noop, payload=dict)
    await backend.enqueue(job, {})
    [run] = await backend.claim(claim_request(job, worker="w", limit=1))
    ctx = JobContext.standalone(run, resources=Resources("fake"))
    assert ctx.resources.name == "fake"


async def _noop(ctx: JobContext, payload: dict[str, int]) -> None:
    return None
