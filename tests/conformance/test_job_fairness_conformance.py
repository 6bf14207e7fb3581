"""Fair claims across tenants (F2) on every backend: weighted, work-conserving shares of each
claim, untenanted runs as one more tenant, and tenants taking turns past ``max_tenants``."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from job_helpers import claim_request

from ship_sqla import define_job
from ship_sqla.errors import ConfigurationError
from ship_sqla.jobs import Concurrency, EnqueueRequest, Fairness
from ship_sqla.kernel import completed
from ship_sqla.kernel._plans.fairness import fair_shares
from ship_sqla.kernel._tenancy import tenant_ambient


async def noop(ctx: Any, payload: Any) -> None:
    return None


async def fill(backend: Any, job: Any, tenant: str | None, count: int) -> None:
    with tenant_ambient(tenant):
        await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(count)])


def by_tenant(batch: Any) -> Counter[str | None]:
    return Counter(run.tenant for run in batch)


async def test_f2_a_claim_is_shared_work_conserving(clock, job_backend_factory):
    """F2: a claim of 12 with tenant A holding 50 due runs, B 2 and C 3 takes all of B's and
    C's and gives A the rest (7): the big backlog never takes the small tenants' room, and
    nothing is left unclaimed while runs are due."""
    backend = job_backend_factory(clock)
    job = define_job("f2.fair", noop, payload=dict, fairness=Fairness())
    await fill(backend, job, "a", 50)
    await fill(backend, job, "b", 2)
    await fill(backend, job, "c", 3)
    batch = await backend.claim(claim_request(job, worker="w", limit=12))
    assert by_tenant(batch) == {"a": 7, "b": 2, "c": 3}


async def test_f2_a_lone_tenant_gets_the_whole_claim(clock, job_backend_factory):
    """F2: with one tenant a fair claim takes as many as a FIFO one would, oldest first."""
    backend = job_backend_factory(clock)
    job = define_job("f2.lone", noop, payload=dict, fairness=Fairness())
    await fill(backend, job, "solo", 30)
    batch = await backend.claim(claim_request(job, worker="w", limit=25))
    assert len(batch) == 25
    assert [run.payload["n"] for run in batch] == list(range(25))


async def test_f2_weights_give_their_shares(clock, job_backend_factory):
    """F2: weights 3:1 give 75 % / 25 % of 10,000 claimed runs (within 5 %), both tenants
    having backlogs throughout."""
    backend = job_backend_factory(clock)
    job = define_job(
        "f2.weights", noop, payload=dict, fairness=Fairness(weights={"gold": 3, "std": 1})
    )
    await fill(backend, job, "gold", 8_000)
    await fill(backend, job, "std", 8_000)
    taken: Counter[str | None] = Counter()
    while sum(taken.values()) < 10_000:
        batch = await backend.claim(claim_request(job, worker="w", limit=100))
        taken += by_tenant(batch)
        await backend.settle([completed(run) for run in batch])
    total = sum(taken.values())
    assert abs(taken["gold"] / total - 0.75) <= 0.05
    assert abs(taken["std"] / total - 0.25) <= 0.05


async def test_f2_untenanted_runs_are_one_more_tenant(clock, job_backend_factory):
    """F2: runs enqueued with no tenant share a claim as one tenant beside the named ones."""
    backend = job_backend_factory(clock)
    job = define_job("f2.untenanted", noop, payload=dict, fairness=Fairness())
    await fill(backend, job, None, 20)
    await fill(backend, job, "acme", 20)
    batch = await backend.claim(claim_request(job, worker="w", limit=10))
    assert by_tenant(batch) == {None: 5, "acme": 5}


async def test_f2_tenants_take_turns_past_max_tenants(clock, job_backend_factory):
    """F2: with five tenants and max_tenants=2, each claim serves two tenants and the next
    claim starts after the last one served, wrapping round: every tenant comes in turn."""
    backend = job_backend_factory(clock)
    job = define_job("f2.turns", noop, payload=dict, fairness=Fairness(max_tenants=2))
    for tenant in ("t1", "t2", "t3", "t4", "t5"):
        await fill(backend, job, tenant, 10)
    served = []
    for _ in range(5):
        batch = await backend.claim(claim_request(job, worker="w", limit=2))
        served.append(sorted(str(tenant) for tenant in by_tenant(batch)))
    assert served == [["t1", "t2"], ["t3", "t4"], ["t1", "t5"], ["t2", "t3"], ["t4", "t5"]]


async def test_f2_a_cap_cuts_every_tenants_share_alike(clock, job_backend_factory):
    """F2, F1: with Concurrency(max=4) a fair claim of 10 over two tenants with backlogs takes
    two of each: the cap cuts by rank, not oldest first."""
    backend = job_backend_factory(clock)
    job = define_job(
        "f2.capped",
        noop,
        payload=dict,
        fairness=Fairness(),
        concurrency=Concurrency(max=4),
    )
    await fill(backend, job, "old", 20)
    await fill(backend, job, "new", 20)
    batch = await backend.claim(claim_request(job, worker="w", limit=10))
    assert by_tenant(batch) == {"old": 2, "new": 2}


def test_f2_fair_shares_water_fill() -> None:
    """F2: the kernel's rule: fewest due per weight first, each at most its weighted share of
    what is left, the rest passed on; never more than the room."""
    assert fair_shares([(50, 1), (2, 1), (3, 1)], 12) == [7, 2, 3]
    assert fair_shares([(100, 3), (100, 1)], 8) == [6, 2]
    assert fair_shares([(1, 1), (0, 1)], 10) == [1, 0]
    assert sum(fair_shares([(5, 1)] * 7, 9)) == 9


@pytest.mark.parametrize(
    "options",
    [{"weights": {"a": 0}}, {"weights": {"": 2}}, {"default_weight": True}, {"max_tenants": 0}],
)
def test_f2_bad_fairness_is_refused(options: dict[str, Any]) -> None:
    """F2: weights are ints from 1 to 1,000 keyed by non-blank tenants; max_tenants 1..1,000."""
    with pytest.raises(ConfigurationError, match="fairness"):
        Fairness(**options)
