"""Worker processes for the kill -9 chaos tests: started, killed with SIGKILL once ready,
replaced at once, stopped.

A worker is ready once it printed ``ready`` on its stdout (its runtime claims from then on).
Only ready workers are killed, and only while more than ``keep`` of them are ready: a worker
killed while it still imports and connects held nothing, and under CPU load starting one takes
seconds, so kills on a timer alone killed nearly every worker before it claimed anything and
the runs did not end by the test's deadline (test_transactional_chaos: 93-97 kills in 60 s,
0-56 of 300 runs done, at load 8-12)."""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
from typing import TYPE_CHECKING

from worker_fleet import stop_processes

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


class ChaosFleet:
    """``command(n)`` is the n-th worker's argv (n counts every worker started); its stderr
    goes to ``logs/worker-<n>.log``. ``live`` are the ready workers, ``starting`` the others."""

    def __init__(self, command: Callable[[int], list[str]], logs: Path, *, keep: int) -> None:
        self.command = command
        self.logs = logs
        self.keep = keep
        self.started = 0
        self.live: list[subprocess.Popen[bytes]] = []
        self.starting: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        log = self.logs / f"worker-{self.started}.log"
        with log.open("w") as stderr:
            argv = self.command(self.started)
            process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr)
        self.started += 1
        self.starting.append(process)

    def ready(self) -> int:
        """How many workers have said ``ready`` (read without blocking). A worker that exited
        by itself before it was ready fails the test, its log named."""
        for process in list(self.starting):
            assert process.stdout is not None
            readable, _, _ = select.select([process.stdout], [], [], 0)
            if not readable:
                continue
            line = process.stdout.readline()
            assert line == b"ready\n", (
                f"worker {process.pid} ended before it was ready (exit {process.wait(10)}):"
                f" see its log in {self.logs}"
            )
            self.starting.remove(process)
            self.live.append(process)
        return len(self.live)

    def kill_and_replace(self, rng: random.Random) -> bool:
        """Kill a random ready worker with SIGKILL and start its replacement, if more than
        ``keep`` are ready; whether it did."""
        if self.ready() <= self.keep:
            return False
        victim = rng.choice(self.live)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        _close(victim)
        self.live.remove(victim)
        self.start()
        return True

    def stop(self) -> None:
        """SIGTERM every worker, ready or starting, and close its pipe (worker_fleet's)."""
        stop_processes([*self.live, *self.starting])


def _close(process: subprocess.Popen[bytes]) -> None:
    if process.stdout is not None:
        process.stdout.close()
