"""D11: the committed corpus of recorded histories (tests/histories/, from
examples/order_saga.py) replays clean against the example's handler, one test per file, through
the pytest plugin's ``ship_replay`` marker. The replay runs no effect: the saga's unit of work,
backend and webhook store are never used (a fake unit of work stands in).

``REGISTRY`` is also what the rollback-check recipe names from the shell (docs/
workflows-evolution.md): ``ship-sqla workflows replay --registry
tests.unit.test_history_corpus:REGISTRY --histories tests/histories``."""

from __future__ import annotations

from typing import Any

import pytest

from examples.order_saga import Order, Saga
from ship_sqla import define_job
from ship_sqla.testing import ReplayResult


class CountingUnitOfWork:
    """Stands in for the saga's unit of work: a replay must never run it."""

    def __init__(self) -> None:
        self.runs = 0

    async def run(self, handler: Any) -> Any:
        self.runs += 1
        return await handler(None)


UOW = CountingUnitOfWork()
SAGA = Saga(uow=UOW, backend=None, webhooks=None)  # type: ignore[arg-type]
REGISTRY = [define_job("orders.fulfil", SAGA.fulfil, payload=Order)]


@pytest.mark.ship_replay(registry=REGISTRY, histories="../histories/*.json")
def test_d11_the_committed_histories_replay_clean(ship_replay: ReplayResult) -> None:
    """D11: each recorded run of the saga replays every stored step on today's code, and no
    effect ran (no unit of work, no mail)."""
    assert ship_replay.clean, ship_replay.describe()
    assert ship_replay.replayed == ship_replay.frontier
    assert ship_replay.stopped == "returned"
    assert UOW.runs == 0
    assert SAGA.mailer.sent == []
