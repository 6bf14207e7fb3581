"""Running the command line as an operator would: ``python -m ship_sqla`` in a subprocess."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["ship_sqla"]


async def ship_sqla(*args: str, cwd: Path) -> tuple[int, str, str]:
    """Run ``python -m ship_sqla ARGS`` as a user would (no job settings from this process)."""
    environment = {
        k: v
        for k, v in os.environ.items()
        if k != "SHIP_SQLA_DATABASE_URL" and not k.startswith("SHIP_SQLA_JOB_")
    }
    result = await anyio.run_process(
        [sys.executable, "-m", "ship_sqla", *args], cwd=cwd, env=environment, check=False
    )
    return result.returncode, result.stdout.decode(), result.stderr.decode()
