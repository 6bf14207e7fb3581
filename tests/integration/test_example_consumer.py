"""examples/consumer.py on a private database: in process, and as the script a reader runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from examples.consumer import EVENTS, run

ROOT = Path(__file__).parents[2]


async def test_the_consumer_folds_every_event_once(ship_engine: AsyncEngine) -> None:
    """C1, C3: every event is folded into its customer's total once (each batch and its cursor
    committed together), and the key's lag reaches 0."""
    totals, progress = await run(ship_engine)
    expected: dict[str, int] = {}
    for n in range(EVENTS):
        expected[f"c{n % 5}"] = expected.get(f"c{n % 5}", 0) + 100 + n
    assert totals == expected
    assert (progress.lag, progress.items) == (0, EVENTS)


@pytest.mark.timeout(120)
async def test_the_example_runs_as_a_script(ship_engine_url: str) -> None:
    """``python examples/consumer.py`` finds its imports and exits 0 on the server
    SHIP_SQLA_DATABASE_URL names."""
    env = {**os.environ, "SHIP_SQLA_DATABASE_URL": ship_engine_url, "PYTHONUNBUFFERED": "1"}
    with anyio.fail_after(110):
        done = await anyio.run_process(
            [sys.executable, "examples/consumer.py"], cwd=ROOT, env=env, check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    assert "progress  : lag=0 batches=5 items=250" in done.stdout.decode()
