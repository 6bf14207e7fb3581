"""J3 at a large backlog: a claim is planned once. On a backend whose clock is the database's, the
claim statements say ``now()``, bound their index scans by MAX_CLAIM_BATCH (a constant) and
carry no key filter unless keys are excluded, so their estimates do not depend on the
parameters and PostgreSQL's plan cache keeps one generic plan after its first custom ones
(before, at 100,000 waiting runs every claim was planned afresh: about 1 ms each)."""

from __future__ import annotations

from typing import Any, Final

import pytest
from seeded_template import SeedStep
from sqlalchemy import MetaData, text
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._sql.claim import (
    CLAIM_FAIR_GATED_KEYED,
    CLAIM_GATED,
    CLAIM_UNCAPPED,
    CLAIM_UNCAPPED_KEYED,
)
from ship_sqla._jobs._sql.settle import SETTLE_IF_TOKEN_CURRENT
from ship_sqla._sql import ASYNCPG_CACHEABLE, compact
from ship_sqla.errors import ConfigurationError
from ship_sqla.jobs import Fairness, RateLimit
from ship_sqla.kernel import completed
from ship_sqla.kernel._ports import MAX_CLAIM_BATCH, ClaimRequest
from ship_sqla.testing import FrozenClock

metadata = MetaData()
runs = ship_job_runs_table(metadata, fair_claims=True)
state = ship_job_state_table(metadata)
BACKLOG = 100_000
CLAIMS = 12


SEED = SeedStep(
    name="job_claim_plan",
    metadata=metadata,
    statements=[
        (
            "INSERT INTO ship_job_runs (id, job_id, payload, max_attempts)"
            f" SELECT 'r' || g, 'plan.job', '{{}}', 5 FROM generate_series(1, {BACKLOG}) g"
        )
    ],
)
"""The module's data set in the session's seeded template (tests/support/seeded_template.py)."""


@pytest.fixture
async def one_connection(seeded_engine: AsyncEngine) -> Any:
    """An engine on the test database whose pool holds one connection, with 100,000 waiting
    runs of ``plan.job`` loaded and analyzed (the module's copy of the seeded template: each
    case settles the 600 runs it claims, so a later case finds 99,400 or fewer waiting runs
    of the same job, the same plan shape)."""
    single = create_async_engine(
        seeded_engine.url,
        pool_size=1,
        max_overflow=0,
        connect_args={"server_settings": {"search_path": f'"{SEED.schema}"'}},
    )
    try:
        yield single
    finally:
        await single.dispose()


async def _plans(engine: AsyncEngine) -> list[tuple[int, int]]:
    async with engine.connect() as connection:
        found = await connection.execute(
            text(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE '%WITH RECURSIVE paused AS%'"
                " AND statement NOT LIKE '%pg_prepared_statements%'"
            )
        )
        return [(int(row.generic_plans), int(row.custom_plans)) for row in found]


@pytest.mark.parametrize(
    ("max_running", "rate_limit", "fairness"),
    [
        (None, None, None),
        (500, None, None),
        (None, RateLimit(1_000_000, 1.0), None),
        (500, RateLimit(10**6, 1.0), None),
        (None, None, Fairness()),
        (500, None, Fairness()),
    ],
)
async def test_j3_a_claim_keeps_one_generic_plan_at_a_large_backlog(
    one_connection: AsyncEngine,
    max_running: int | None,
    rate_limit: RateLimit | None,
    fairness: Fairness | None,
) -> None:
    """J3: twelve claims of 50 at 100,000 waiting runs (uncapped, and through the gate of a
    capped job), each settled, on one pooled connection: PostgreSQL runs the claim's generic
    plan once its first custom plans are behind it (its plan cache's counters say so)."""
    backend = create_job_backend(
        database=one_connection, table=runs, state_table=state, listen=False
    )
    for _ in range(CLAIMS):
        batch = await backend.claim(
            ClaimRequest(
                job_id="plan.job",
                worker="w",
                limit=50,
                max_running=max_running,
                lease=30.0,
                rate_limit=rate_limit,
                fairness=fairness,
            )
        )
        assert len(batch) == 50
        assert await backend.settle([completed(run) for run in batch]) == ["completed"] * 50
    [(generic, custom)] = await _plans(one_connection)
    assert (
        generic + custom >= CLAIMS
    )  # a capped job's first claim makes its gate, then claims again
    assert generic >= CLAIMS - 6, (generic, custom)


def test_the_server_clock_claims_say_now_and_a_frozen_clock_gives_its_time() -> None:
    """On the database's clock a claim reads ``now()``; on a frozen clock (tests) it reads the
    clock's instant (``coalesce(:now, now())``), as every other statement does."""
    server = create_job_backend(database=create_async_engine("postgresql+asyncpg://x/y"))
    frozen = create_job_backend(
        database=create_async_engine("postgresql+asyncpg://x/y"), clock=FrozenClock()
    )
    assert ":now" not in server.statements[CLAIM_GATED].text
    assert ":now" in frozen.statements[CLAIM_GATED].text
    assert ":now" in server.statements[SETTLE_IF_TOKEN_CURRENT].text
    assert ":exclude_keys" not in server.statements[CLAIM_UNCAPPED].text
    assert ":exclude_keys" in server.statements[CLAIM_UNCAPPED_KEYED].text
    assert f"LIMIT {MAX_CLAIM_BATCH}" in server.statements[CLAIM_UNCAPPED].text


def test_a_claim_asks_at_most_max_claim_batch() -> None:
    """A ClaimRequest for more than MAX_CLAIM_BATCH runs is refused with the bound named (the
    runtime asks at most that many and claims again)."""
    with pytest.raises(ConfigurationError, match="MAX_CLAIM_BATCH"):
        ClaimRequest(
            job_id="j", worker="w", limit=MAX_CLAIM_BATCH + 1, max_running=None, lease=30.0
        )


NAME_ROOM: Final = 512
"""Characters kept free under asyncpg's limit for table names longer than the defaults (the
longest claims name their tables 17-18 times: about 30 more characters a name)."""


def test_every_job_statement_fits_asyncpgs_statement_cache() -> None:
    """J3: asyncpg keeps no statement longer than its ``max_cacheable_statement_size`` (15 KiB
    by default, ``len()`` of the query it is given) prepared, and PostgreSQL then plans it at
    every execution: the statements are sent without their comments and indentation
    (``compact``), each bind as ``$n`` (what asyncpg is given: the asyncpg dialect's text, not
    the template's ``:name``), every one within that size less NAME_ROOM (the fair, gated,
    keyed claim is the longest)."""
    statements = create_job_backend(
        database=create_async_engine("postgresql+asyncpg://x/y")
    ).statements
    dialect = asyncpg_dialect()
    sizes = {
        name: len(str(text(statement.text).compile(dialect=dialect)))
        for name, statement in statements.every_statement().items()
    }
    assert sizes
    assert max(sizes.values()) <= ASYNCPG_CACHEABLE - NAME_ROOM, sizes
    assert "--" not in statements[CLAIM_FAIR_GATED_KEYED].text
    assert (
        compact("SELECT '--kept' -- dropped\n  -- gone\n  FROM t\n") == "SELECT '--kept'\nFROM t\n"
    )
