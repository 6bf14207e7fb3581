"""Worker processes for the chaos tests: started from a script (each with its own arguments, so
processes of different builds can live side by side), waited for until they print ``ready``,
killed with SIGKILL, and stopped with SIGTERM (their runtime drains, J12).

``tests/support`` is on pytest's ``pythonpath`` (pyproject.toml), so tests import this module
by its name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    import random
    from collections.abc import Sequence
    from pathlib import Path


class WorkerFleet:
    """The live and dead worker processes of one test; each writes its stderr to
    ``logs/<name>.log``."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.live: dict[str, subprocess.Popen[str]] = {}
        self.dead: list[subprocess.Popen[str]] = []
        self.kills = 0

    def spawn(self, name: str, script: Path, *args: str) -> subprocess.Popen[str]:
        """Start ``python script *args`` as worker ``name`` (not waiting for it)."""
        with (self.logs / f"{name}.log").open("w") as stderr:
            process = subprocess.Popen(
                [sys.executable, str(script), *args],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.live[name] = process
        return process

    async def start(self, name: str, script: Path, *args: str) -> subprocess.Popen[str]:
        """:meth:`spawn` worker ``name`` and wait until it prints ``ready`` (its runtime
        started: for a new build, after its unpark)."""
        process = self.spawn(name, script, *args)
        assert process.stdout is not None
        line = await anyio.to_thread.run_sync(process.stdout.readline)
        assert line.strip() == "ready", (
            f"worker {name} did not start: {line!r}; see {self.logs / f'{name}.log'}"
        )
        return process

    def kill(self, name: str) -> None:
        """SIGKILL worker ``name`` (nothing drains: its runs lapse, J6)."""
        victim = self.live.pop(name)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        self.dead.append(victim)
        self.kills += 1

    def kill_one(self, rng: random.Random, prefix: str = "") -> str:
        """SIGKILL a random live worker whose name starts with ``prefix``; its name."""
        name = rng.choice(sorted(n for n in self.live if n.startswith(prefix)))
        self.kill(name)
        return name

    def stop(self) -> None:
        """SIGTERM every live worker, wait for its drain (SIGKILL past 20 s), close the pipes."""
        stop_processes(list(self.live.values()), closed=self.dead)

    def log_lines(self, needle: str) -> int:
        """How many lines of the workers' logs contain ``needle``."""
        return sum(
            line.count(needle)
            for log in self.logs.glob("*.log")
            for line in log.read_text().splitlines()
        )


def stop_processes(
    processes: Sequence[subprocess.Popen[str]], closed: Sequence[subprocess.Popen[str]] = ()
) -> None:
    """SIGTERM each live process, wait for its drain (SIGKILL past 20 s), then close its pipe
    (and those of ``closed``, already ended)."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    for process in [*processes, *closed]:
        if process.stdout is not None:
            process.stdout.close()
