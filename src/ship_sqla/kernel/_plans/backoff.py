"""The one backoff: how long to wait after the n-th failure, as a pure function of a
:class:`Backoff` value, the attempt number and one random draw. No clock, no I/O.

It serves every wait that grows with failures:

- a job's :class:`~ship_sqla.jobs.RetryPolicy` (the wait after failed attempt n, J7; see
  :mod:`ship_sqla.kernel._plans.retry`);
- the outbox's message backoff (``create_outbox(backoff=Backoff(...))``, O4);
- the loops' error backoff (:data:`ERROR_BACKOFF`: the job runtime and the outbox relay after
  consecutive failed database calls, J11).

Attempts are numbered from 1. The un-jittered delay after attempt ``n`` is

- ``exponential``: ``base * factor ** (n - 1)``
- ``linear``: ``base * n``
- ``fixed``: ``base``

capped by ``max_delay`` (:func:`capped_delay`), then jittered by a draw in ``[0, 1)``
(:func:`jittered`): ``full`` scales it by the draw (``[0, d]``), ``equal`` keeps half and scales
the other half (``[d / 2, d]``), ``none`` keeps ``d``. Jitter comes after the cap, so a delay
never exceeds ``max_delay`` and failures that happened together do not retry in lockstep even
once capped. The cap never decreases as ``n`` grows (``factor >= 1``), and no attempt number,
however large, overflows: a delay past the cap is the cap.
"""

from __future__ import annotations

import math
import random as _random
from collections.abc import Callable
from typing import Final, Literal, TypeAlias

import attrs

from ship_sqla.kernel._durations import MAX_RETRY_DELAY, require_duration
from ship_sqla.kernel._errors import ConfigurationError

__all__ = [
    "ERROR_BACKOFF",
    "Backoff",
    "BackoffKind",
    "Jitter",
    "Random",
    "capped_delay",
    "check_attempt",
    "error_backoff",
    "jittered",
]

BackoffKind: TypeAlias = Literal["exponential", "linear", "fixed"]
Jitter: TypeAlias = Literal["full", "equal", "none"]

Random: TypeAlias = Callable[[], float]
"""Returns a float in ``[0, 1)``, like :func:`random.random` (the default draw)."""

_KINDS: Final = ("exponential", "linear", "fixed")
_JITTERS: Final = ("full", "equal", "none")


def _duration(name: str) -> Callable[[object, attrs.Attribute[float], float], None]:
    def check(_instance: object, _attribute: attrs.Attribute[float], value: float) -> None:
        require_duration(value, f"backoff {name}", maximum=MAX_RETRY_DELAY, allow_zero=True)

    return check


def _check_factor(_instance: object, _attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(
            f"backoff factor must be a number, got {value!r}.",
            fix="use 1 for a constant delay or 2 for doubling.",
        )
    if not (value >= 1 and math.isfinite(value)):
        raise ConfigurationError(
            f"backoff factor must be finite and >= 1 (delays never shrink), got {value}.",
            fix="use 1 for a constant delay or 2 for doubling.",
        )


def _check_choice(
    name: str, choices: tuple[str, ...]
) -> Callable[[object, attrs.Attribute[str], str], None]:
    def check(_instance: object, _attribute: attrs.Attribute[str], value: str) -> None:
        if value not in choices:
            listed = ", ".join(repr(c) for c in choices)
            raise ConfigurationError(f"backoff {name} {value!r} is unknown.", fix=f"use {listed}.")

    return check


@attrs.frozen
class Backoff:
    """A backoff plan: ``kind`` of growth from ``base`` seconds (by ``factor`` when
    exponential), capped at ``max_delay`` seconds, then ``jitter``.

    The default is the outbox's message backoff: 1 s, 2 s, 4 s ... capped at an hour, full
    jitter. Durations are checked when the value is built (finite, ``0 <= s <= 365 days``), the
    factor too (finite, ``>= 1``), so a plan that could overflow or shrink never exists.
    """

    kind: BackoffKind = attrs.field(default="exponential", validator=_check_choice("kind", _KINDS))
    base: float = attrs.field(default=1.0, validator=_duration("base"))
    factor: float = attrs.field(default=2.0, validator=_check_factor)
    max_delay: float = attrs.field(default=3600.0, validator=_duration("max_delay"))
    jitter: Jitter = attrs.field(default="full", validator=_check_choice("jitter", _JITTERS))

    def capped(self, attempt: int) -> float:
        """The un-jittered delay after failed attempt ``attempt``: :func:`capped_delay`."""
        return capped_delay(self, attempt)

    def delay(self, attempt: int, *, random: Random = _random.random) -> float:
        """Seconds to wait after failed attempt ``attempt``: ``0 <= delay <= max_delay``, one
        ``random()`` draw jittering :meth:`capped`."""
        return jittered(capped_delay(self, attempt), self.jitter, random())

    def starting_at_most(self, first: float) -> Backoff:
        """This plan with its base lowered to ``first`` seconds when that is shorter (a loop
        whose poll interval is shorter than the error backoff's first step)."""
        return self if first >= self.base else attrs.evolve(self, base=first)


ERROR_BACKOFF: Final = Backoff(
    kind="exponential", base=0.1, factor=2.0, max_delay=1.0, jitter="equal"
)
"""The loops' error backoff (job runtime and outbox relay, J11): after consecutive failed
database calls, 0.1 s doubling up to 1 s, equal jitter (never below half a step, so a fleet that
failed together does not retry in lockstep, and never a tight loop). Capped low on purpose: a
backoff that kept doubling through an outage brought workers back long after the server (12 s
after a 15 s outage, with a 30 s cap); a failed attempt against a server that is down costs
one refused connection a second per task."""


def error_backoff(poll_interval: float) -> Backoff:
    """:data:`ERROR_BACKOFF`, starting at ``poll_interval`` when that is shorter than its first
    step (a loop polling faster than 0.1 s also retries faster after a failure)."""
    return ERROR_BACKOFF.starting_at_most(poll_interval)


def check_attempt(attempt: int) -> None:
    """Refuse an attempt number below 1 (attempts are counted from the first run)."""
    if attempt < 1:
        raise ConfigurationError(
            f"attempt numbers start at 1, got {attempt}.",
            fix="pass the number of the attempt that just failed (ClaimedRun.attempt,"
            " OutboxMessage.attempt, or the count of consecutive failures).",
        )


def _exponential(base: float, factor: float, steps: int, cap: float) -> float:
    # Multiplied step by step up to the cap: each product is >= the one before (factor >= 1 and
    # rounding is monotone), so the delay never decreases as attempts grow, and the loop ends
    # within log(cap / base) / log(factor) steps; factor ** steps could overflow or round down.
    if base <= 0 or factor == 1:
        return min(base, cap)
    delay = base
    for _ in range(steps):
        delay *= factor
        if delay >= cap:
            return cap
    return min(delay, cap)


def capped_delay(backoff: Backoff, attempt: int) -> float:
    """The un-jittered delay in seconds after failed attempt ``attempt``, capped by
    ``max_delay``: never negative, never above the cap, never decreasing in ``attempt``."""
    check_attempt(attempt)
    cap = backoff.max_delay
    if backoff.kind == "exponential":
        return _exponential(backoff.base, backoff.factor, attempt - 1, cap)
    if backoff.kind == "linear":
        try:
            raw = backoff.base * attempt
        except OverflowError:  # an attempt number beyond any float
            return cap
        return min(raw, cap)
    return min(backoff.base, cap)


def jittered(delay: float, jitter: Jitter, draw: float) -> float:
    """``delay`` jittered by ``draw``: ``full`` in ``[0, delay]``, ``equal`` in
    ``[delay / 2, delay]``, ``none`` exactly ``delay``. The draw is clamped to ``[0, 1]`` (NaN
    counts as 0), so a misbehaving random source can never push a delay out of its band."""
    draw = 0.0 if math.isnan(draw) else min(max(draw, 0.0), 1.0)
    if jitter == "full":
        return delay * draw
    if jitter == "equal":
        half = delay / 2
        return min(half + half * draw, delay)
    return delay
