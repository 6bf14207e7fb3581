"""D11 (with D7's message): the pytest plugin. ``@pytest.mark.ship_replay(registry=...,
histories="glob")`` turns a folder of history files into one test each, a diverging file failing
its test with the D7 message; ``pytest --ship-record-histories DIR`` writes the history of every
workflow run the session's tests execute. Driven through ``pytester`` (an inner pytest run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ship_sqla.testing import History, HistoryStep, read_histories, write_history

pytest_plugins = ["pytester"]

APP = """
import asyncio

from ship_sqla import JobContext, define_job
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.kernel._ports import ClaimRequest
from ship_sqla.testing import FrozenClock


async def handler(ctx, payload):
    async def value(v):
        return v

    await ctx.step("a", lambda: value(1))
    await ctx.step("b", lambda: value(2))
    await ctx.sleep("nap", 3600)
    await ctx.step("c", lambda: value(3))


JOB = define_job("plug.wf", handler, payload=dict)
REGISTRY = [JOB]


async def run_once(backend, clock):
    [run] = await backend.claim(
        ClaimRequest(job_id=JOB.id, worker="w", limit=1, max_running=None, lease=30.0)
    )
    ctx = JobContext.standalone(run)
    ctx.bind_workflows(backend.workflows, backend, clock)
    try:
        await handler(ctx, run.payload)
    except BaseException as exc:  # the sleep suspends the run
        return type(exc).__name__
    return "returned"


def drive():
    clock = FrozenClock()
    backend = InMemoryJobBackend(clock=clock)

    async def main():
        await backend.enqueue(JOB, {"n": 1}, run_id="run-1")
        return await run_once(backend, clock)

    return asyncio.run(main())
"""


def _history(*names: str) -> History:
    steps = tuple(
        HistoryStep(position, name, "step", "done", position + 1)
        for position, name in enumerate(names)
    )
    return History("run-1", "plug.wf", {"n": 1}, steps, source="recorded")


def test_d11_the_marker_makes_one_test_per_history_file_and_a_divergence_fails_it(
    pytester: pytest.Pytester,
) -> None:
    """D11, D7: two files, two tests named after them; the clean one passes, the one whose
    position 1 holds another step fails with the D7 message (position, recorded, requested)."""
    pytester.makepyfile(app=APP)
    folder = pytester.path / "histories"
    write_history(folder, _history("a", "b"))
    write_history(folder, History("run-2", "plug.wf", {}, _history("a", "renamed").steps))
    pytester.makepyfile(
        test_replays="""
        import pytest
        from app import REGISTRY

        @pytest.mark.ship_replay(registry=REGISTRY, histories="histories/*.json")
        def test_histories(ship_replay):
            pass
        """
    )
    result = pytester.runpytest("-v", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_histories?plug.wf__run-1.json? PASSED*",
            "*test_histories?plug.wf__run-2.json? FAILED*",
        ]
    )
    output = result.stdout.str()
    assert "SHIP_SQLA_REPLAY_FAILED" in output
    assert "run 'run-2' diverged from its history at position 1" in output
    assert "step 'renamed'" in output
    assert "step 'b'" in output


def test_d11_the_marker_takes_a_module_attr_registry_and_an_empty_glob_fails(
    pytester: pytest.Pytester,
) -> None:
    """D11: ``registry="module:attr"`` is imported; a glob matching no file is one failing
    test, never a silent pass."""
    pytester.makepyfile(app=APP)
    write_history(pytester.path / "histories", _history("a"))
    pytester.makepyfile(
        test_replays="""
        import pytest

        @pytest.mark.ship_replay(registry="app:REGISTRY", histories="histories/*.json")
        def test_by_reference(ship_replay):
            assert ship_replay.clean

        @pytest.mark.ship_replay(registry="app:REGISTRY", histories="nowhere/*.json")
        def test_empty(ship_replay):
            pass
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*no history file matches*nowhere*"])


def test_d11_record_histories_writes_the_runs_the_tests_execute(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """D11: ``--ship-record-histories DIR`` writes one history file per workflow run the tests
    ran (here: two steps, then a sleep), which the marker then replays clean."""
    pytester.makepyfile(app=APP)
    pytester.makepyfile(
        test_app="""
        from app import drive

        def test_runs_a_workflow():
            assert drive() == "WorkflowSuspended"
        """
    )
    out = tmp_path / "recorded"
    result = pytester.runpytest("-p", "no:randomly", "--ship-record-histories", str(out))
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*ship_sqla: recorded 1 workflow history(ies) in*"])
    [(path, history)] = read_histories(out)
    assert path.name == "plug.wf__run-1.json"
    assert (history.run_id, history.source, history.payload) == ("run-1", "recorded", {"n": 1})
    assert [(s.name, s.result) for s in history.steps] == [("a", 1), ("b", 2)]
    assert json.loads(path.read_text())["frontier"] == 2

    (pytester.path / "histories").mkdir()
    path.replace(pytester.path / "histories" / path.name)
    pytester.makepyfile(
        test_app="""
        import pytest
        from app import REGISTRY

        @pytest.mark.ship_replay(registry=REGISTRY, histories="histories/*.json")
        def test_recorded(ship_replay):
            assert ship_replay.clean and ship_replay.replayed == 2
        """
    )
    pytester.runpytest("-p", "no:randomly").assert_outcomes(passed=1)
