"""`ship-sqla workflows export | replay` (D11, with D7's rule) against a real database, as an
operator runs them before a deploy: `python -m ship_sqla` in a subprocess, the registry of the
code about to be deployed named as MODULE:ATTR."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli_runner import ship_sqla
from workflow_helpers import execute_once, workflow_backend

from ship_sqla import define_job
from ship_sqla.jobs import RetryPolicy
from ship_sqla.kernel._browse import RunQuery
from ship_sqla.testing import FrozenClock, read_histories

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

APP = '''
from ship_sqla import define_job


async def value(v):
    return v


async def v1(ctx, payload):
    await ctx.step("a", lambda: value(1))
    await ctx.step("b", lambda: value(2))
    await ctx.sleep("nap", 3600)


async def v2(ctx, payload):
    """The change about to be deployed: step b renamed, for the runs of payload n == 1 only."""
    await ctx.step("a", lambda: value(1))
    await ctx.step("b2" if payload["n"] == 1 else "b", lambda: value(2))
    await ctx.sleep("nap", 3600)


V1 = [define_job("cli.replay", v1, payload=dict)]
V2 = [define_job("cli.replay", v2, payload=dict)]


def redact(where, value):
    if where == "payload":
        return {**value, "email": "***"}
    return value
'''


async def _value(v: Any) -> Any:
    return v


async def _v1(ctx: Any, payload: Any) -> None:
    await ctx.step("a", lambda: _value(1))
    await ctx.step("b", lambda: _value(2))
    await ctx.sleep("nap", 3600)


JOB = define_job("cli.replay", _v1, payload=dict, retry=RetryPolicy(attempts=3))


async def test_d11_export_writes_one_file_per_run_bounded_and_redacted(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """D11: `workflows export` writes one history file per run (payload redacted by --redact,
    steps in position order), stops at --limit saying so, and filters by --state."""
    (tmp_path / "replay_app.py").write_text(APP, encoding="utf-8")
    clock = FrozenClock()
    backend = await workflow_backend(ship_engine, listen=False, clock=clock)
    for n in range(3):
        await backend.enqueue(JOB, {"n": n, "email": f"u{n}@example.com"}, run_id=f"r-{n}")
    for _ in range(3):
        assert (await execute_once(backend, JOB, clock)).outcome == "suspended"
    url = ("--database-url", ship_engine_url)

    out = tmp_path / "some"
    code, text, err = await ship_sqla(
        "workflows", "export", "--out", str(out), "--limit", "2", *url, cwd=tmp_path
    )
    assert (code, err) == (0, ""), err
    assert "exported 2 history file(s)" in text
    assert "more runs match: the export stopped at --limit 2." in text
    assert len(list(out.glob("*.json"))) == 2

    out = tmp_path / "all"
    args = ("workflows", "export", "--out", str(out), "--redact", "replay_app:redact", "--json")
    code, text, err = await ship_sqla(*args, *url, cwd=tmp_path)
    assert (code, err) == (0, ""), err
    assert json.loads(text)["exported"] == 3
    histories = {h.run_id: h for _, h in read_histories(out)}
    assert sorted(histories) == ["r-0", "r-1", "r-2"]
    assert histories["r-1"].payload == {"n": 1, "email": "***"}
    assert histories["r-1"].redacted
    assert [(s.position, s.name, s.status) for s in histories["r-1"].steps] == [
        (0, "a", "done"),
        (1, "b", "done"),
        (2, "nap", "waiting"),
    ]

    args = ("workflows", "export", "--out", str(tmp_path / "none"), "--state", "dead")
    code, text, err = await ship_sqla(*args, *url, cwd=tmp_path)
    assert (code, err) == (0, ""), err
    assert "exported 0 history file(s)" in text


async def test_d11_replay_sample_exits_1_naming_the_diverging_run_and_position(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """D11, D7: `workflows replay --sample` replays live runs read-only: clean against the code
    that ran them (exit 0); against a change that breaks one of them, exit 1 naming that run and
    the position (the others clean); the same from exported files with --histories. Nothing of
    the runs changed."""
    (tmp_path / "replay_app.py").write_text(APP, encoding="utf-8")
    clock = FrozenClock()
    backend = await workflow_backend(ship_engine, listen=False, clock=clock)
    for n in range(3):
        await backend.enqueue(JOB, {"n": n}, run_id=f"r-{n}")
    for _ in range(3):
        assert (await execute_once(backend, JOB, clock)).outcome == "suspended"
    await backend.enqueue(JOB, {"n": 9}, run_id="r-not-started")  # no step: nothing to replay
    url = ("--database-url", ship_engine_url)
    before = {s.run_id: await backend.workflows.list_steps(s.run_id) for s in await _all(backend)}

    args = ("workflows", "replay", "--registry", "replay_app:V1", "--sample", "10")
    code, text, err = await ship_sqla(*args, *url, cwd=tmp_path)
    assert (code, err) == (0, ""), err
    assert "replayed 3 history(ies): 3 clean, 0 not." in text

    args = ("workflows", "replay", "--registry", "replay_app:V2", "--sample", "10")
    code, text, err = await ship_sqla(*args, *url, cwd=tmp_path)
    assert code == 1, (text, err)
    assert (
        "DIVERGED: job 'cli.replay' run 'r-1' diverged from its history at position 1: the"
        " history recorded step 'b', the code asked for step 'b2'"
    ) in text
    assert "replay_app.py:" in text  # the handler's file:line
    assert "replayed 3 history(ies): 2 clean, 1 not." in text

    args = ("workflows", "replay", "--registry", "replay_app:V2", "--sample", "1", "--json")
    code, text, err = await ship_sqla(*args, *url, cwd=tmp_path)
    assert json.loads(text)["replayed"] == 1  # bounded by --sample

    out = tmp_path / "exported"
    code, _, err = await ship_sqla("workflows", "export", "--out", str(out), *url, cwd=tmp_path)
    assert code == 0, err
    for registry, expected in (("replay_app:V1", 0), ("replay_app:V2", 1)):
        args = ("workflows", "replay", "--registry", registry, "--histories", str(out))
        code, text, err = await ship_sqla(*args, cwd=tmp_path)
        assert code == expected, (registry, text, err)
    assert "run 'r-1' diverged from its history at position 1" in text

    after = {s.run_id: await backend.workflows.list_steps(s.run_id) for s in await _all(backend)}
    assert after == before


async def _all(backend: Any) -> list[Any]:
    rows = await backend.admin.list_runs(RunQuery(state="waiting", limit=100), max_jobs=10)
    return [row.record for row in rows]


ROOT = Path(__file__).resolve().parents[2]
PREVIOUS_BUILD = '''
from ship_sqla import define_job


async def value(v):
    return v


class NoUnitOfWork:
    async def run(self, handler):
        raise AssertionError("a replay runs no unit of work")


UOW = NoUnitOfWork()


async def fulfil(ctx, order):
    """The saga as an older build had it: no compensation after a timeout."""
    await ctx.transaction("charge", UOW, lambda shop: value(None))
    reserved = await ctx.transaction("reserve", UOW, lambda shop: value(None))
    if reserved:
        await ctx.wait_for_event("shipped", "order.shipped", key=order["order_id"], timeout=1.0)
    await ctx.step("notify", lambda: value(None))


REGISTRY = [define_job("orders.fulfil", fulfil, payload=dict)]
'''


async def test_d11_the_rollback_check_recipe_over_the_committed_corpus(tmp_path: Path) -> None:
    """D11: the documented rollback check, over tests/histories/: the corpus replays clean on
    this build (`--registry tests.unit.test_history_corpus:REGISTRY`), and on a previous build
    without the compensation step the timed-out order's history diverges at position 3, exit 1
    (a rollback would break it)."""
    root = ROOT
    corpus = str(root / "tests" / "histories")
    args = ("workflows", "replay", "--histories", corpus)
    code, text, err = await ship_sqla(
        *args, "--registry", "tests.unit.test_history_corpus:REGISTRY", cwd=root
    )
    assert (code, err) == (0, ""), err
    assert "replayed 2 history(ies): 2 clean, 0 not." in text

    (tmp_path / "previous_build.py").write_text(PREVIOUS_BUILD, encoding="utf-8")
    code, text, err = await ship_sqla(*args, "--registry", "previous_build:REGISTRY", cwd=tmp_path)
    assert code == 1, (text, err)
    assert "run 'B-2' diverged from its history at position 3" in text
    assert "recorded transaction 'compensate', the code asked for step 'notify'" in text
    assert "replayed 2 history(ies): 1 clean, 1 not." in text
