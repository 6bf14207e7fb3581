"""How the runtime's parts are wired: two small objects instead of a callback per argument.

- :class:`Plumbing`: what every loop shares (the clock, where absorbed errors go, J11, and the
  one error backoff);
- :class:`RuntimeEvents`: what the parts tell the runtime (:class:`JobRuntime` implements it):
  an attempt's outcome (J10, S3), a run settled or given up, a slot freed, a claim that buried a
  run (J6), and, while it stops, the drain deadline (J12).

Each part takes these two and the peers it calls directly (the completer's ``add``, the
executor's ``start`` and ``cancel``), so a new event is one method here and one in the runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable

    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._metrics import JobOutcome
    from ship_sqla.kernel._ports import BuriedRun
    from ship_sqla.kernel._runtime.state import InFlight

__all__ = ["Plumbing", "RuntimeEvents"]


@attrs.frozen
class Plumbing:
    """What every part of one runtime shares."""

    clock: Clock
    report_error: Callable[[BaseException], None]
    """Where an error a loop absorbed goes (the backend's ``on_error``, J11); never raises."""
    error_backoff: Callable[[int], float]
    """Seconds to wait after the n-th failure in a row (the one error backoff, J11)."""


class RuntimeEvents(Protocol):
    """What the runtime's parts tell it (see the module docstring)."""

    def outcome(self, entry: InFlight, outcome: JobOutcome) -> None:
        """An attempt ended with ``outcome``: its log line (S3) and metrics (J10)."""
        ...

    def settled(self, entry: InFlight) -> None:
        """``entry``'s settle was answered, or given up: the run leaves this process."""
        ...

    def flushed(self) -> None:
        """A settle batch was answered: the backend's counts freed room (F1)."""
        ...

    def given_up(self) -> None:
        """Settles were given up: only this process's own room grew."""
        ...

    def task_ended(self) -> None:
        """An executor task ended: its slot is free."""
        ...

    def buried(self, job_id: str, buried: BuriedRun) -> None:
        """A claim dead-lettered a run whose lease lapsed on its final attempt (J6)."""
        ...

    @property
    def drain_deadline(self) -> float | None:
        """While stopping, when settle retries give up (monotonic); None otherwise (J12)."""
        ...
