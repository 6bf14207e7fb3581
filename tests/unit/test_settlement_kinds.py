"""J5, J7: the PostgreSQL settle statement is told every settlement's kind explicitly."""

from __future__ import annotations

import typing

from ship_sqla._jobs._backend import _KIND_OF
from ship_sqla.kernel._ports import Settlement, Suspend


def test_j7_every_batched_settlement_has_its_own_settle_kind() -> None:
    """J7: every settlement class but Suspend (its store's own case) maps to a kind of
    SETTLE_IF_TOKEN_CURRENT, and nothing else does: a new settlement class fails here instead of
    reaching the database as a guessed "release" (which would refund the attempt)."""
    batched = set(typing.get_args(Settlement)) - {Suspend}
    assert set(_KIND_OF) == batched
    assert len(set(_KIND_OF.values())) == len(_KIND_OF)
