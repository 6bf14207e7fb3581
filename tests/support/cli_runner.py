"""Running the command line: ``python -m ship_sqla`` in a subprocess, as an operator would
(:func:`ship_sqla`), or the same command in this process (:func:`ship_sqla_in_process`)."""

from __future__ import annotations

import functools
import os
import sys
import traceback
from typing import TYPE_CHECKING

import anyio
from click.testing import CliRunner

from ship_sqla._cli import cli

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

__all__ = ["ship_sqla", "ship_sqla_in_process"]


def _operator_environment() -> dict[str, str]:
    """This process's environment without the job settings an operator's shell would not have."""
    return {
        k: v
        for k, v in os.environ.items()
        if k != "SHIP_SQLA_DATABASE_URL" and not k.startswith("SHIP_SQLA_JOB_")
    }


async def ship_sqla(*args: str, cwd: Path) -> tuple[int, str, str]:
    """Run ``python -m ship_sqla ARGS`` as a user would (no job settings from this process)."""
    result = await anyio.run_process(
        [sys.executable, "-m", "ship_sqla", *args],
        cwd=cwd,
        env=_operator_environment(),
        check=False,
    )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def ship_sqla_in_process(
    *args: str, env: Mapping[str, str] | None = None
) -> tuple[int, str, str]:
    """``ship-sqla ARGS`` run in this process by click's runner, in a worker thread (a command
    runs its own event loop), without this process's job settings (``env``: the variables to
    set for it): (exit code, stdout,
    stderr), like :func:`ship_sqla`, and an uncaught exception's traceback on stderr as Python
    prints it. For operator commands whose test reads their exit code and output: a process of
    their own costs a second or more of imports each (tests/integration/test_cli.py keeps the
    ``python -m ship_sqla`` entry point itself covered)."""
    variables: dict[str, str | None] = {
        k: None for k in os.environ if k not in _operator_environment()
    }
    variables.update(env or {})
    invoke = functools.partial(
        CliRunner().invoke, cli, list(args), env=variables, prog_name="ship-sqla"
    )
    result = await anyio.to_thread.run_sync(invoke)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return result.exit_code, result.stdout, stderr
