"""Hypothesis strategies shared by the property and unit tests, and the harness that lets
synchronous Hypothesis tests drive ship_sqla's async code against a real database.

Hypothesis has no async rules in state machines (hypothesis #4107), so a property test keeps ONE
event loop for its whole run (an anyio blocking portal), one engine on a private database, and
resets the tables between examples (TRUNCATE).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, TypeVar

import attrs
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import strategies as st
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ship_sqla.testing import DatabaseFactory, ResolvedServer

# Private on purpose: databases made here carry the pytest plugin's own prefix
# (ship_sqla_test_), so any left behind are recognisable as test databases.
from ship_sqla.testing._databases import new_database_name

T = TypeVar("T")

# -- values ---------------------------------------------------------------------------------------

offsets = st.builds(
    timezone,
    st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59).map(
        lambda minutes: timedelta(minutes=minutes)
    ),
)
"""Fixed UTC offsets in whole minutes (what PostgreSQL's timestamptz and isoformat carry)."""

aware_datetimes = st.datetimes(timezones=st.just(UTC) | offsets)

cursor_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(),
    st.binary(),
    st.decimals(allow_nan=False),
    st.uuids(),
    st.datetimes(),
    aware_datetimes,
    st.dates(),
    st.times(),
)
"""Every ordering value a page cursor must carry with its exact type (NaN aside: it is not equal
to itself, and PostgreSQL sorts it as one value anyway)."""


def same_cursor_value(a: object, b: object) -> bool:
    """Equal, of the same type, and (datetimes) with the same offset."""
    if type(a) is not type(b) or a != b:
        return False
    if isinstance(a, datetime | time) and isinstance(b, datetime | time):
        return a.utcoffset() == b.utcoffset()
    return True


# -- repository rows ------------------------------------------------------------------------------

TENANTS = ("tenant-a", "tenant-b")
tenants = st.sampled_from(TENANTS)
statuses = st.sampled_from(("draft", "open", "paid", "void"))
"""Few distinct values, so ordering columns repeat and the key must break the ties."""
amounts = st.sampled_from([Decimal("0.00"), Decimal("9.99"), Decimal("10.00"), Decimal("250.50")])
EPOCH = datetime(2024, 1, 1, tzinfo=UTC)
created_ats = st.integers(min_value=0, max_value=3).map(
    lambda hours: EPOCH + timedelta(hours=hours)
)
days = st.integers(min_value=0, max_value=2).map(lambda n: date(2024, 1, 1) + timedelta(days=n))


def order_specs(columns: tuple[str, ...]) -> st.SearchStrategy[tuple[str, ...]]:
    """An ordering over distinct ``columns``, each ascending or descending ("-name")."""
    return st.lists(
        st.tuples(st.sampled_from(columns), st.booleans()),
        unique_by=lambda term: term[0],
        max_size=len(columns),
    ).map(lambda terms: tuple(("-" if desc else "") + name for name, desc in terms))


# -- database harness -----------------------------------------------------------------------------


@attrs.frozen
class PortalDatabase:
    """An engine on a private database, and the one event loop every call of the test runs on."""

    portal: BlockingPortal
    engine: AsyncEngine
    metadata: MetaData

    def run(self, function: Callable[[], Awaitable[T]]) -> T:
        """Run ``function()`` on the test's event loop and return its result (or raise)."""

        async def call() -> T:
            return await function()

        return self.portal.call(call)

    def truncate(self) -> None:
        names = ", ".join(f'"{t.name}"' for t in self.metadata.sorted_tables)

        async def truncate() -> None:
            async with self.engine.begin() as connection:
                await connection.execute(text(f"TRUNCATE {names}"))

        self.run(truncate)


@contextmanager
def portal_database(server: ResolvedServer, metadata: MetaData) -> Iterator[PortalDatabase]:
    """A private database holding ``metadata``'s tables, dropped afterwards (WITH (FORCE))."""
    factory = DatabaseFactory(server)
    name = new_database_name("prop")
    with start_blocking_portal(backend="asyncio") as portal:
        url = portal.call(factory.create, name)
        try:
            engine = create_async_engine(url, pool_size=2)
            try:

                async def create_all() -> None:
                    async with engine.begin() as connection:
                        await connection.run_sync(metadata.create_all)

                portal.call(create_all)
                yield PortalDatabase(portal, engine, metadata)
            finally:
                portal.call(engine.dispose)
        finally:
            portal.call(factory.drop, name)


def rows_of(result: Any) -> list[dict[str, Any]]:
    """Plain dicts of a result's rows (for comparing with a model)."""
    return [dict(row) for row in result.mappings()]


# -- condition trees over a table's columns -------------------------------------------------------

small_ints = st.integers(min_value=-2, max_value=3)
short_texts = st.text(alphabet="abAB", max_size=2)
like_patterns = st.text(alphabet="ab%_", max_size=3)
"""LIKE patterns without backslashes (PostgreSQL's default escape character)."""
COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")
comparisons = st.sampled_from(COMPARISONS)

Tree = tuple[Any, ...]
"""A condition as plain data, e.g. ``("and", (("cmp", "<", "a", ("val", 1)), ("null", "s",
True)))``: printable in a falsifying example, and read by two interpreters (SQL and Python)."""


def condition_trees(
    int_columns: tuple[str, ...], text_columns: tuple[str, ...]
) -> st.SearchStrategy[Tree]:
    """Random boolean conditions: comparisons (with values or other columns), IN / NOT IN
    (lists may hold NULL or be empty), BETWEEN, [I]LIKE / NOT [I]LIKE, IS [NOT] NULL, arithmetic,
    coalesce() and lower(), nested under AND / OR / NOT."""
    ints, texts = st.sampled_from(int_columns), st.sampled_from(text_columns)
    leaves = st.one_of(
        st.tuples(st.just("cmp"), comparisons, ints, st.tuples(st.just("val"), small_ints)),
        st.tuples(st.just("cmp"), comparisons, ints, st.tuples(st.just("col"), ints)),
        st.tuples(st.just("cmp"), comparisons, texts, st.tuples(st.just("val"), short_texts)),
        st.tuples(
            st.just("in"),
            ints,
            st.lists(st.none() | small_ints, max_size=3).map(tuple),
            st.booleans(),
        ),
        st.tuples(
            st.just("in"),
            texts,
            st.lists(st.none() | short_texts, max_size=3).map(tuple),
            st.booleans(),
        ),
        st.tuples(st.just("between"), ints, small_ints, small_ints),
        st.tuples(st.just("like"), texts, like_patterns, st.booleans(), st.booleans()),
        st.tuples(st.just("null"), st.sampled_from(int_columns + text_columns), st.booleans()),
        st.tuples(st.just("add"), ints, ints, comparisons, small_ints),
        st.tuples(st.just("coalesce"), ints, small_ints, comparisons, small_ints),
        st.tuples(st.just("lower"), texts, short_texts),
    )
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.tuples(st.just("and"), st.lists(children, min_size=1, max_size=3).map(tuple)),
            st.tuples(st.just("or"), st.lists(children, min_size=1, max_size=3).map(tuple)),
            st.tuples(st.just("not"), children),
        ),
        max_leaves=8,
    )
