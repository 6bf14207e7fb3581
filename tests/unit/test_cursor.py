"""Page cursors without a database: round trip, signature, reuse on another query."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.property.strategies import cursor_values, same_cursor_value

from ship_sqla.errors import ConfigurationError, InvalidCursorError
from ship_sqla.kernel._browse import (
    ClaimPosition,
    CreatedPosition,
    FinishedPosition,
    LeasePosition,
    RunPosition,
    position_cursor_values,
    position_from_cursor_values,
    run_order,
)
from ship_sqla.kernel._cursor import (
    MAX_CURSOR_CHARS,
    PROCESS_SECRET,
    KeysetPosition,
    decode_cursor,
    encode_cursor,
    query_fingerprint,
    resolve_secret,
)
from ship_sqla.kernel._ports import RunState
from ship_sqla.kernel._priority import MAX_PRIORITY, MIN_PRIORITY

SECRET = b"k" * 32
QUERY = query_fingerprint(["orders", "tenant=a", "rows", "-created_at,id"])
positions = st.builds(
    KeysetPosition, query=st.just(QUERY), values=st.lists(cursor_values, max_size=4).map(tuple)
)


@given(positions)
def test_round_trip_keeps_values_and_their_types(position: KeysetPosition) -> None:
    """A cursor gives back exactly the ordering values it was made from, types included."""
    token = encode_cursor(position, SECRET)
    decoded = decode_cursor(token, secret=SECRET, query=QUERY)
    assert len(decoded) == len(position.values)
    assert all(same_cursor_value(a, b) for a, b in zip(decoded, position.values, strict=True))


@given(positions)
def test_cursor_is_url_safe(position: KeysetPosition) -> None:
    token = encode_cursor(position, SECRET)
    assert token.isascii()
    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


@given(positions, st.data())
def test_any_byte_flip_is_rejected(position: KeysetPosition, data: st.DataObject) -> None:
    """Tampering: changing any bit of any byte of a cursor makes it invalid."""
    token = encode_cursor(position, SECRET).encode("ascii")
    index = data.draw(st.integers(min_value=0, max_value=len(token) - 1), label="index")
    mask = data.draw(st.integers(min_value=1, max_value=255), label="mask")
    flipped = bytearray(token)
    flipped[index] ^= mask
    with pytest.raises(InvalidCursorError):
        decode_cursor(flipped.decode("latin-1"), secret=SECRET, query=QUERY)


@given(positions, st.data())
def test_truncated_or_extended_cursor_is_rejected(
    position: KeysetPosition, data: st.DataObject
) -> None:
    token = encode_cursor(position, SECRET)
    cut = data.draw(st.integers(min_value=0, max_value=len(token) - 1), label="cut")
    extra = data.draw(st.text(min_size=1, max_size=3), label="extra")
    for altered in (token[:cut], token + extra):
        with pytest.raises(InvalidCursorError):
            decode_cursor(altered, secret=SECRET, query=QUERY)


def test_cursor_for_another_query_is_rejected() -> None:
    """A genuine cursor reused on a different query (tenant, filter, order) is refused."""
    token = encode_cursor(KeysetPosition(QUERY, (1,)), SECRET)
    other = query_fingerprint(["orders", "tenant=b", "rows", "-created_at,id"])
    with pytest.raises(InvalidCursorError, match="different query"):
        decode_cursor(token, secret=SECRET, query=other)


def test_cursor_signed_with_another_secret_is_rejected() -> None:
    token = encode_cursor(KeysetPosition(QUERY, (1,)), SECRET)
    with pytest.raises(InvalidCursorError, match="cursor_secret"):
        decode_cursor(token, secret=b"x" * 32, query=QUERY)


@pytest.mark.parametrize("token", ["", "not a cursor", "%%%", "A" * (MAX_CURSOR_CHARS + 4), "AQ"])
def test_garbage_is_rejected(token: str) -> None:
    with pytest.raises(InvalidCursorError):
        decode_cursor(token, secret=SECRET, query=QUERY)


def test_non_string_is_rejected() -> None:
    with pytest.raises(InvalidCursorError):
        decode_cursor(b"AQ", secret=SECRET, query=QUERY)  # type: ignore[arg-type]


def test_fingerprint_parts_are_unambiguous() -> None:
    assert query_fingerprint(["ab", "c"]) != query_fingerprint(["a", "bc"])
    assert query_fingerprint(["a", "b"]) == query_fingerprint(["a", "b"])


def test_typical_values_round_trip() -> None:
    values = (
        datetime(2024, 5, 1, 12, 30, 1, 5, tzinfo=UTC),
        Decimal("10.50"),
        UUID(int=7),
        b"\x00\xff",
        True,
        2**70,
        "zoë",
    )
    token = encode_cursor(KeysetPosition(QUERY, values), SECRET)
    assert decode_cursor(token, secret=SECRET, query=QUERY) == values


def test_unsupported_value_type_is_a_clear_error() -> None:
    with pytest.raises(ConfigurationError, match="cannot be carried in a page cursor"):
        encode_cursor(KeysetPosition(QUERY, (object(),)), SECRET)


def test_secret_resolution() -> None:
    assert resolve_secret(None) is PROCESS_SECRET
    assert resolve_secret("s" * 16) == b"s" * 16
    with pytest.raises(ConfigurationError, match="at least 16 bytes"):
        resolve_secret(b"short")


run_positions = st.one_of(
    st.builds(
        ClaimPosition,
        priority=st.integers(MIN_PRIORITY, MAX_PRIORITY),
        run_at=st.datetimes(timezones=st.just(UTC)),
        seq=st.integers(1, 2**63 - 1),
    ),
    st.builds(
        LeasePosition,
        lease_expires_at=st.datetimes(timezones=st.just(UTC)),
        run_id=st.text(min_size=1),
    ),
    st.builds(
        CreatedPosition,
        created_at=st.datetimes(timezones=st.just(UTC)),
        run_id=st.text(min_size=1),
    ),
    st.builds(
        FinishedPosition,
        finished_at=st.datetimes(timezones=st.just(UTC)),
        run_id=st.text(min_size=1),
    ),
)
_STATE_OF_KIND: dict[type, RunState] = {
    ClaimPosition: "waiting",
    LeasePosition: "running",
    CreatedPosition: "dead",
    FinishedPosition: "completed",
}


@given(run_positions)
def test_a_list_runs_position_round_trips_through_a_cursor(position: RunPosition) -> None:
    """S2, J18: a page of runs' position (completed runs' in finish order) comes back from its
    cursor as it was, kind included, for a state of its kind, and is refused, naming both
    kinds, for a state of any other kind."""
    state = _STATE_OF_KIND[type(position)]
    token = encode_cursor(KeysetPosition(QUERY, position_cursor_values(position)), SECRET)
    values = decode_cursor(token, secret=SECRET, query=QUERY)
    assert position_from_cursor_values(values, state) == position
    kinds = ("waiting", "running", "dead", "completed")
    others = [s for s in kinds if run_order(s) != run_order(state)]
    assert len(others) == 3
    for other in others:
        with pytest.raises(InvalidCursorError) as caught:
            position_from_cursor_values(values, other)
        assert f"{run_order(other)!r} order" in str(caught.value)
        assert f"{run_order(state)!r} position" in str(caught.value)


def test_a_list_runs_cursor_from_before_position_kinds_is_refused_clearly() -> None:
    """S2: a bare (created_at, run_id) cursor (issued before positions had kinds) is refused
    for every state with an error that says so and to restart from the first page; so is a
    signed cursor holding anything else."""
    bare = (datetime(2026, 1, 1, tzinfo=UTC), "run-1")
    states: tuple[RunState, ...] = ("waiting", "running", "completed", "dead", "cancelled")
    for state in states:
        with pytest.raises(InvalidCursorError) as caught:
            position_from_cursor_values(bare, state)
        assert "older ship_sqla" in str(caught.value)
        assert "cursor=None" in str(caught.value)
    naive = datetime(2026, 1, 1)  # noqa: DTZ001 - a naive time is what is refused
    for values in ((), ("claim", 0, naive, 1), ("claim", "x", bare[0], 1), (1, 2)):
        with pytest.raises(InvalidCursorError):
            position_from_cursor_values(values, "waiting")
