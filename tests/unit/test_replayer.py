"""D11 (with D7's rule): ``ship_sqla.testing.Replayer`` replays a run's history against a
handler without running any effect, and reports the first divergence (position, what was
recorded, what the code asked for, ``file:line``) or "clean" up to the history's frontier.

Histories are recorded by running the handler on the in-memory backend (``execute_once``), then
exported through ``JobOperations.export_history``. No database."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from workflow_helpers import FakeUnitOfWork, execute_once

from ship_sqla import create_job_operations, define_job
from ship_sqla.errors import PermissionDeniedError, ReplayFailedError
from ship_sqla.jobs import RetryPolicy
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.testing import FrozenClock, History, Replayer, write_history

UOW = FakeUnitOfWork()


@attrs.frozen
class Receipt:
    order: str
    cents: int


class Effects:
    """What the step functions did: a replay must leave it unchanged."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def fn(self, name: str, value: Any) -> Any:
        async def body(*_: Any) -> Any:
            self.calls.append(name)
            return value

        return body


EFFECTS = Effects()


async def v1(ctx: Any, payload: Any) -> None:
    await ctx.step("charge", EFFECTS.fn("charge", Receipt("o1", 1250)), result=Receipt)
    await ctx.transaction("reserve", UOW, EFFECTS.fn("reserve", True))
    await ctx.step("invoice", EFFECTS.fn("invoice", "inv-1"))
    await ctx.sleep("cool-off", 3600)
    await ctx.step("notify", EFFECTS.fn("notify", "sent"))


def job(handler: Any) -> Any:
    return define_job("orders.saga", handler, payload=dict, retry=RetryPolicy(attempts=3))


async def _history(handler: Any = v1, payload: Any = None) -> History:
    """Run ``handler`` once on the in-memory backend (to its first sleep) and export it."""
    clock = FrozenClock()
    backend = InMemoryJobBackend(clock=clock)
    definition = job(handler)
    enqueued = await backend.enqueue(definition, payload or {"order": "o1"})
    execution = await execute_once(backend, definition, clock)
    assert execution.ended == "suspended", execution.error
    ops = create_job_operations(backend, authorizer=lambda *_: True)
    assert enqueued.run_id is not None
    history = await ops.export_history(enqueued.run_id)
    assert history is not None
    EFFECTS.calls.clear()
    return history


async def test_d11_the_same_code_replays_clean_to_the_frontier_running_no_effect() -> None:
    """D11: replayed against the code that recorded it, a history is clean up to its frontier
    (the waiting sleep); no step function and no unit of work ran."""
    history = await _history()
    assert [s.name for s in history.steps] == ["charge", "reserve", "invoice", "cool-off"]
    runs_before = UOW.runs
    result = await Replayer([job(v1)]).replay(history)
    assert result.clean, result.describe()
    assert (result.replayed, result.frontier, result.stopped) == (4, 4, "suspended")
    assert EFFECTS.calls == []
    assert UOW.runs == runs_before
    assert "clean" in result.describe()
    result.raise_if_not_clean()


async def test_d7_d11_a_renamed_step_is_reported_at_its_position_with_file_and_line() -> None:
    """D7, D11: a step renamed at position 2 is the first divergence: position 2, recorded
    ``step 'invoice'``, asked ``step 'bill'``, and the handler's file:line of the call."""
    history = await _history()

    async def renamed(ctx: Any, payload: Any) -> None:
        await ctx.step("charge", EFFECTS.fn("charge", None), result=Receipt)
        await ctx.transaction("reserve", UOW, EFFECTS.fn("reserve", True))
        await ctx.step("bill", EFFECTS.fn("bill", "inv-1"))  # the renamed call

    result = await Replayer([job(renamed)]).replay(history)
    assert not result.clean
    assert result.stopped == "diverged"
    divergence = result.divergence
    assert divergence is not None
    assert divergence.position == 2
    assert (divergence.recorded.name, divergence.recorded.kind) == ("invoice", "step")
    assert divergence.requested is not None
    assert (divergence.requested.name, divergence.requested.kind) == ("bill", "step")
    assert divergence.location is not None
    assert divergence.location.startswith(__file__)
    assert EFFECTS.calls == []
    with pytest.raises(ReplayFailedError, match="position 2") as caught:
        result.raise_if_not_clean()
    assert "'invoice'" in str(caught.value)
    assert "'bill'" in str(caught.value)


async def test_d7_d11_an_inserted_step_a_kind_change_and_a_reorder_diverge() -> None:
    """D7, D11: an insertion before the frontier, a kind change and a swap are each reported
    at the first position they change."""
    history = await _history()

    async def inserted(ctx: Any, payload: Any) -> None:
        await ctx.step("charge", EFFECTS.fn("charge", None), result=Receipt)
        await ctx.step("fraud-check", EFFECTS.fn("fraud", True))
        await ctx.transaction("reserve", UOW, EFFECTS.fn("reserve", True))

    async def kind_changed(ctx: Any, payload: Any) -> None:
        await ctx.transaction("charge", UOW, EFFECTS.fn("charge", None))

    async def swapped(ctx: Any, payload: Any) -> None:
        await ctx.step("charge", EFFECTS.fn("charge", None), result=Receipt)
        await ctx.step("invoice", EFFECTS.fn("invoice", "inv-1"))
        await ctx.transaction("reserve", UOW, EFFECTS.fn("reserve", True))

    found = {}
    for handler in (inserted, kind_changed, swapped):
        result = await Replayer([job(handler)]).replay(history)
        assert result.divergence is not None, handler.__name__
        found[handler.__name__] = (result.divergence.position, result.divergence.reason)
    assert found == {
        "inserted": (1, "changed"),
        "kind_changed": (0, "changed"),
        "swapped": (1, "changed"),
    }
    assert EFFECTS.calls == []


async def test_d7_d11_a_premature_return_and_a_codec_change_diverge() -> None:
    """D7, D11: a handler that returns while stored steps remain, and a step whose result=
    codec no longer decodes its stored result, are divergences too."""
    history = await _history()

    async def returns_early(ctx: Any, payload: Any) -> None:
        await ctx.step("charge", EFFECTS.fn("charge", None), result=Receipt)

    @attrs.frozen
    class NewReceipt:
        order_id: str  # renamed field: the stored {"order", "cents"} no longer decodes

    async def new_codec(ctx: Any, payload: Any) -> None:
        await ctx.step("charge", EFFECTS.fn("charge", None), result=NewReceipt)

    early = await Replayer([job(returns_early)]).replay(history)
    assert early.divergence is not None
    assert (early.divergence.reason, early.divergence.position) == ("returned", 1)
    codec = await Replayer([job(new_codec)]).replay(history)
    assert codec.divergence is not None
    assert (codec.divergence.reason, codec.divergence.position) == ("codec", 0)


async def test_d11_steps_added_past_the_frontier_replay_clean() -> None:
    """D11: what the history does not hold is not judged: new steps after the frontier (the
    run has not come that far) replay clean, and nothing of them runs."""
    history = await _history()

    async def extended(ctx: Any, payload: Any) -> None:
        await v1(ctx, payload)
        await ctx.step("survey", EFFECTS.fn("survey", None))

    history_without_sleep = attrs.evolve(history, steps=history.steps[:3])
    for candidate in (history, history_without_sleep):
        result = await Replayer([job(extended)]).replay(candidate)
        assert result.clean, result.describe()
    assert EFFECTS.calls == []


async def test_d11_code_between_steps_reaching_the_backend_is_a_failure_not_an_effect() -> None:
    """D11: the replay has no backend: plain code that enqueues between two steps fails the
    replay (the effect is not made), naming what it reached for."""
    history = await _history()

    async def enqueues(ctx: Any, payload: Any) -> None:
        await ctx.step("charge", EFFECTS.fn("charge", None), result=Receipt)
        await ctx.backend.enqueue(job(v1), {})

    result = await Replayer([job(enqueues)]).replay(history)
    assert result.failure is not None
    assert "ctx.backend.enqueue" in result.failure
    assert result.replayed == 1


async def test_d11_a_history_without_steps_is_clean_and_the_handler_is_not_run() -> None:
    """D11: nothing to replay: clean at frontier 0, and the handler (which might hold plain
    effects) is not called."""
    called: list[str] = []

    async def plain(ctx: Any, payload: Any) -> None:
        called.append("plain")

    result = await Replayer([job(plain)]).replay(History("r-1", "orders.saga", {}))
    assert result.clean
    assert (result.stopped, result.frontier) == ("no-steps", 0)
    assert called == []


async def test_d11_export_is_a_permissioned_read_and_a_file_replays_like_the_history(
    tmp_path: Any,
) -> None:
    """D11: export asks the read permission (refused without it, nothing read); the file it is
    written to replays as the history does."""
    history = await _history()
    backend = InMemoryJobBackend()
    refused = create_job_operations(backend, authorizer=lambda *_: False)
    with pytest.raises(PermissionDeniedError, match="export_history"):
        await refused.export_history("r-1")
    path = write_history(tmp_path, history)
    result = await Replayer([job(v1)]).replay_file(path)
    assert result.clean
    assert result.origin == str(path)


def test_d9_d11_a_history_replays_on_the_handler_of_its_recorded_version() -> None:
    """D9, D11: the replayer asks the job definition for the handler of the history's version
    (``JobDefinition.at_version``, where the definition keeps versions); none is a failure of the
    replay, not a replay on another version's handler."""
    from types import SimpleNamespace  # noqa: PLC0415

    from ship_sqla.kernel._replay import _at_version  # noqa: PLC0415

    kept = SimpleNamespace(at_version={None: "v1", 1: "v1", 2: "v2"}.get)
    assert _at_version(kept, 2) == "v2"  # type: ignore[arg-type]
    assert _at_version(kept, None) == "v1"  # type: ignore[arg-type]
    assert _at_version(kept, 3) is None  # type: ignore[arg-type]


async def test_d8_d11_patch_markers_are_exported_and_replayed_by_position() -> None:
    """D8, D11: a patch marker is a step of the history: the patched code replays it clean,
    code that dropped the call while the run holds the marker diverges at the marker's position,
    and a history recorded before the patch existed takes the old branch clean."""

    async def patched(ctx: Any, payload: Any) -> None:
        await ctx.step("a", EFFECTS.fn("a", 1))
        if await ctx.patched("fast-path"):
            await ctx.step("fast", EFFECTS.fn("fast", 2))
        else:
            await ctx.step("slow", EFFECTS.fn("slow", 2))
        await ctx.sleep("nap", 60)

    async def unpatched(ctx: Any, payload: Any) -> None:
        await ctx.step("a", EFFECTS.fn("a", 1))
        await ctx.step("slow", EFFECTS.fn("slow", 2))
        await ctx.sleep("nap", 60)

    async def call_deleted(ctx: Any, payload: Any) -> None:
        await ctx.step("a", EFFECTS.fn("a", 1))
        await ctx.step("fast", EFFECTS.fn("fast", 2))
        await ctx.sleep("nap", 60)

    with_marker = await _history(patched)
    assert [(s.name, s.kind) for s in with_marker.steps] == [
        ("a", "step"),
        ("patch:fast-path", "patch"),
        ("fast", "step"),
        ("nap", "sleep"),
    ]
    assert (await Replayer([job(patched)]).replay(with_marker)).clean
    deleted = await Replayer([job(call_deleted)]).replay(with_marker)
    assert deleted.divergence is not None
    assert deleted.divergence.position == 1
    assert deleted.divergence.recorded is not None
    assert deleted.divergence.recorded.name == "patch:fast-path"
    before_patch = await _history(unpatched)
    result = await Replayer([job(patched)]).replay(before_patch)
    assert result.clean, result.describe()
    assert result.replayed == result.frontier == 3
    assert EFFECTS.calls == []
