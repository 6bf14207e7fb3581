"""F10 against the in-memory model, step by step: priority aging never passes over a run that
has waited its aging bound, and every claim takes exactly what the kernel's rule ranks first.

Hypothesis drives the model with enqueues (any priority, due now, in the past or later), claims
by two workers with any limit, completes, failures retried later, releases, operator cancels and
clock steps past leases (lapsed runs retaken or buried), under a drawn ``Aging`` (step, every,
ceiling). After every claim it checks, from what it enqueued and the records the model answers:

- the claim's due (not retaken) runs are a prefix of the due waiting runs ranked by (effective
  priority DESC, run_at, seq) at the claim's instant (kernel ``effective_priority``);
- no due run that has waited its aging bound (``aging_bound``) was passed over: every due run
  the claim took instead was due before it (or its priority is above the ceiling).

The PostgreSQL claim is held to the same rule by the conformance suite
(``tests/conformance/test_job_aging_conformance.py``) and to its cost by the EXPLAIN test.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from job_helpers import claim_request

from ship_sqla import define_job
from ship_sqla.jobs import Aging, Concurrency, RetryPolicy, aging_bound
from ship_sqla.kernel import InMemoryJobBackend, completed, failed, released
from ship_sqla.kernel._ports import ClaimedRun
from ship_sqla.kernel._priority import MAX_PRIORITY, MIN_PRIORITY, effective_priority
from ship_sqla.testing import FrozenClock

START = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = 20.0


async def noop(ctx: Any, payload: Any) -> None:
    return None


priorities = st.integers(min_value=MIN_PRIORITY, max_value=MAX_PRIORITY)


class AgingMachine(RuleBasedStateMachine):
    """The model under a drawn Aging; ``self.runs``: run id -> (n, priority) as enqueued."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FrozenClock(START)
        self.backend = InMemoryJobBackend(clock=self.clock)
        self.runs: dict[str, tuple[int, int]] = {}
        self.held: dict[str, ClaimedRun] = {}
        self.claims = 0

    def _run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def teardown(self) -> None:
        self.loop.close()

    @initialize(
        step=st.integers(min_value=1, max_value=8),
        every=st.integers(min_value=1, max_value=120),
        ceiling=priorities,
        cap=st.one_of(st.none(), st.integers(min_value=1, max_value=6)),
    )
    def declare(self, step: int, every: int, ceiling: int, cap: int | None) -> None:
        self.aging = Aging(step=step, every=float(every), ceiling=ceiling)
        self.job = define_job(
            "f10.machine",
            noop,
            payload=dict,
            aging=self.aging,
            concurrency=Concurrency(max=cap, lease=LEASE),
            retry=RetryPolicy(attempts=50, max_lapses=None),
        )

    @rule(priority=priorities, due_in=st.integers(min_value=-600, max_value=60))
    def enqueue(self, priority: int, due_in: int) -> None:
        n = len(self.runs)
        at = self.clock.now() + timedelta(seconds=due_in)
        result = self._run(self.backend.enqueue(self.job, {"n": n}, priority=priority, run_at=at))
        self.runs[result.run_id] = (n, priority)

    def _waiting(self) -> list[tuple[int, int, datetime, str]]:
        """(n, priority, run_at, id) of every waiting run, from the model's records."""
        found = []
        for run_id, (n, priority) in self.runs.items():
            record = self._run(self.backend.admin.get_run(run_id))
            if record is not None and record.state == "waiting":
                found.append((n, priority, record.run_at, run_id))
        return found

    @rule(worker=st.sampled_from(["A", "B"]), limit=st.integers(min_value=1, max_value=8))
    def claim(self, worker: str, limit: int) -> None:
        now = self.clock.now()
        due = [run for run in self._waiting() if run[2] <= now]
        batch = self._run(self.backend.claim(claim_request(self.job, worker=worker, limit=limit)))
        self.claims += 1
        for run in batch:
            self.held[run.run_id] = run
        for buried in batch.buried:
            self.held.pop(buried.run_id, None)
        ranked = sorted(
            due,
            key=lambda run: (-effective_priority(run[1], run[2], now, self.aging), run[2], run[0]),
        )
        taken = {run.run_id for run in batch if not run.retaken}
        # The due runs taken are the rule's first ones (a prefix of the ranking).
        assert {run[3] for run in ranked[: len(taken)]} == taken, (ranked, taken)
        # F10: none passed over beyond its aging bound.
        for n, priority, run_at, run_id in due:
            if run_id in taken or now - run_at < aging_bound(priority, self.aging):
                continue
            for other in (run for run in due if run[3] in taken):
                assert other[1] > self.aging.ceiling or (other[2], other[0]) < (run_at, n), (
                    f"run {n} (priority {priority}, due {run_at}) waited its bound and was"
                    f" passed over by run {other[0]} (priority {other[1]}, due {other[2]})"
                )

    @precondition(lambda self: self.held)
    @rule(data=st.data(), how=st.sampled_from(["complete", "fail", "release"]))
    def settle(self, data: st.DataObject, how: str) -> None:
        run = self.held.pop(data.draw(st.sampled_from(sorted(self.held))))
        later = self.clock.now() + timedelta(seconds=data.draw(st.integers(0, 90)))
        settlement = {
            "complete": lambda: completed(run),
            "fail": lambda: failed(run, "boom", later),
            "release": lambda: released(run, later, reason="lock-held"),
        }[how]()
        self._run(self.backend.settle([settlement]))

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        run_id = data.draw(st.sampled_from(sorted(self.runs)))
        self._run(self.backend.admin.cancel(run_id))

    @rule(seconds=st.integers(min_value=1, max_value=200))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @invariant()
    def stored_priorities_never_change(self) -> None:
        for run_id, (_, priority) in list(self.runs.items())[:20]:
            record = self._run(self.backend.admin.get_run(run_id))
            assert record is None or record.priority == priority


AgingMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_f10_no_due_run_is_passed_over_beyond_the_aging_bound = AgingMachine.TestCase
test_f10_no_due_run_is_passed_over_beyond_the_aging_bound.__doc__ = (
    "F10, K6, F1: under any script of enqueues, claims, settles, cancels and clock steps, claims"
    " take due runs by effective priority and never pass over a run that waited its aging bound."
)
