"""Retry delays for failed outbox deliveries: pure functions over attrs values (O4).

A failure on attempt ``n`` (1-based, as counted by the claim that handed the message out) makes the
row pending again after ``delay(n)`` seconds, until ``max_attempts`` is spent and it turns dead.
The arithmetic is separated from the random draw so it is property-tested without a database.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Literal, TypeAlias

import attrs

from ship_sqla.kernel import ConfigurationError
from ship_sqla.kernel._durations import MAX_RETRY_DELAY, require_duration

__all__ = ["Backoff", "Jitter", "OutboxBackoff", "exponential_delay"]

Jitter: TypeAlias = Literal["none", "full", "equal"]

Backoff: TypeAlias = Callable[[int], float]
"""Seconds to wait before retrying after a failed attempt ``n`` (n >= 1). Must be >= 0."""


def exponential_delay(
    attempt: int,
    *,
    base: float,
    factor: float,
    max_delay: float,
    jitter: Jitter,
    draw: float,
) -> float:
    """``min(max_delay, base * factor ** (attempt - 1))``, jittered by ``draw`` in [0, 1).

    ``full`` jitter picks uniformly in [0, cap]; ``equal`` in [cap / 2, cap]; ``none`` is cap.
    Never negative, never above ``max_delay``, and the cap never decreases as attempts grow.
    """
    if attempt < 1:
        msg = f"attempt numbers start at 1, got {attempt}"
        raise ValueError(msg)
    draw = min(max(draw, 0.0), 1.0)
    # Compare exponents instead of computing factor ** attempt, which overflows for large n.
    cap = base
    for _ in range(attempt - 1):
        cap *= factor
        if cap >= max_delay:
            break
    cap = min(cap, max_delay)
    if jitter == "full":
        return cap * draw
    if jitter == "equal":
        return cap / 2 + (cap / 2) * draw
    return cap


def _non_negative(name: str) -> Callable[[object, attrs.Attribute[float], float], None]:
    def check(_instance: object, _attribute: attrs.Attribute[float], value: float) -> None:
        require_duration(value, f"backoff {name}", maximum=MAX_RETRY_DELAY, allow_zero=True)

    return check


def _check_factor(_instance: object, _attribute: attrs.Attribute[float], value: float) -> None:
    if not (value >= 1 and math.isfinite(value)):
        raise ConfigurationError(
            f"backoff factor must be finite and >= 1 (delays never shrink), got {value}.",
            fix="use 1 for a constant delay or 2 for doubling.",
        )


@attrs.frozen
class OutboxBackoff:
    """The default: 1 s, 2 s, 4 s ... capped at ``max_delay`` (an hour), full jitter."""

    base: float = attrs.field(default=1.0, validator=_non_negative("base"))
    factor: float = attrs.field(default=2.0, validator=_check_factor)
    max_delay: float = attrs.field(default=3600.0, validator=_non_negative("max_delay"))
    jitter: Jitter = "full"
    rng: random.Random = attrs.field(factory=random.Random, eq=False, repr=False)

    def __call__(self, attempt: int) -> float:
        return exponential_delay(
            attempt,
            base=self.base,
            factor=self.factor,
            max_delay=self.max_delay,
            jitter=self.jitter,
            draw=self.rng.random(),
        )
