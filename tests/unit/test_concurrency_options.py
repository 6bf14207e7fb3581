"""F1: ``Concurrency.max`` is None (no fleet-wide cap) by default, else a bounded int."""

from __future__ import annotations

from typing import Any

import pytest

from ship_sqla.errors import ConfigurationError
from ship_sqla.kernel._jobs import MAX_CONCURRENCY, Concurrency, define_job


async def _noop(_ctx: object, _payload: object) -> None:
    return None


def test_no_fleet_wide_cap_by_default() -> None:
    """F1: a job defined without options has no concurrency.max: its claims take no gate."""
    assert Concurrency().max is None
    assert define_job("plain", _noop, payload=dict).concurrency.max is None


@pytest.mark.parametrize("value", [0, -1, MAX_CONCURRENCY + 1, True, 2.5, "10"])
def test_a_bad_cap_is_refused_with_its_value(value: Any) -> None:
    """F1: a cap must be None or an int from 1 to MAX_CONCURRENCY (bools refused)."""
    with pytest.raises(
        ConfigurationError, match=r"concurrency\.max must be an int from 1 to 1,000,000"
    ):
        Concurrency(max=value)


def test_the_largest_cap_is_accepted() -> None:
    """F1: the bound itself is a valid cap."""
    assert Concurrency(max=MAX_CONCURRENCY).max == MAX_CONCURRENCY
