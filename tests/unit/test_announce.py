"""The announce throttle and the listener's pure parts (K1), without a database."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from job_helpers import settle_loop

from ship_sqla._notify import (
    Listener,
    Recheck,
    announced_key,
    announcement,
    announcing,
    channel_name,
    check_listen,
    sender_token,
)
from ship_sqla.kernel import ConfigurationError, FrozenClock, InMemoryJobBackend, WakeSource
from ship_sqla.kernel._plans.announce import (
    ANNOUNCE_WINDOW,
    RECHECKS,
    AnnounceThrottle,
    due_now,
)

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def test_k1_a_key_is_announced_at_most_once_per_window_from_its_commit() -> None:
    """K1 (SPEC §10): after a committed announcement of a key, enqueues of that key within the
    window skip theirs; other keys are not affected; the window counts from the commit."""
    throttle = AnnounceThrottle()
    assert throttle.wanted("a", 10.0)
    assert throttle.wanted("a", 10.0)  # nothing committed yet: a rollback silences nobody
    throttle.announced("a", 10.0)
    assert not throttle.wanted("a", 10.0 + ANNOUNCE_WINDOW / 2)
    assert throttle.wanted("b", 10.0)
    assert throttle.wanted("a", 10.0 + ANNOUNCE_WINDOW)
    throttle.announced("a", 9.0)  # an older commit landing late never moves the window back
    assert throttle.wanted("a", 10.0 + ANNOUNCE_WINDOW)


@given(st.lists(st.tuples(st.integers(0, 3000), st.booleans()), max_size=60))
def test_k1_throttle_property_no_two_announcements_of_a_key_within_a_window(
    steps: list[tuple[int, bool]],
) -> None:
    """K1: whatever the sequence of enqueues (each committing or not), two committed
    announcements of one key are never closer than the window."""
    throttle = AnnounceThrottle()
    committed: list[float] = []
    now = 0.0
    for gap_ms, commits in steps:
        now += gap_ms / 1000
        if throttle.wanted("k", now) and commits:
            throttle.announced("k", now)
            committed.append(now)
    assert all(b - a >= ANNOUNCE_WINDOW for a, b in itertools.pairwise(committed))


def test_k1_the_memory_of_announced_keys_is_bounded() -> None:
    """K1: keys older than the window are forgotten once many keys were announced."""
    throttle = AnnounceThrottle()
    for n in range(5000):
        throttle.announced(f"k{n}", n * 1.0)
    assert len(throttle._last) <= 1025


def test_k1_only_due_work_is_announced() -> None:
    """K1: a run stored without run_at, or due by now, is announced; a delayed one is not."""
    assert due_now([None], NOW)
    assert due_now([NOW + timedelta(hours=1), NOW], NOW)
    assert not due_now([NOW + timedelta(seconds=1)], NOW)
    assert not due_now([], NOW)


def test_k1_a_store_recognises_its_own_announcements() -> None:
    """K1: an announcement names its sender; the sender itself ignores it (its commit woke
    its own waiters), everyone else reads the key, which may contain slashes."""
    me, other = sender_token(), sender_token()
    assert "/" not in me
    assert announced_key(announcement(me, "billing/invoice"), me) is None
    assert announced_key(announcement(other, "billing/invoice"), me) == "billing/invoice"
    assert announced_key("garbage", me) is None


def test_k1_channel_names_fit_postgresql_and_agree_across_processes() -> None:
    """K1: a channel is derived from the table's name, the same in every process, never over
    the 63 bytes pg_notify accepts; distinct long names stay distinct."""
    assert channel_name("ship_sqla.jobs", "ship_job_runs") == "ship_sqla.jobs:ship_job_runs"
    long_a = channel_name("ship_sqla.jobs", '"tenant_schema"."' + "x" * 60 + '"')
    long_b = channel_name("ship_sqla.jobs", '"tenant_schema"."' + "y" * 60 + '"')
    assert long_a == channel_name("ship_sqla.jobs", '"tenant_schema"."' + "x" * 60 + '"')
    assert long_a != long_b
    assert len(long_a.encode()) <= 63


def test_k1_an_announced_insert_is_one_statement() -> None:
    """K1: the plain insert and its NOTIFY are one statement (no round trip added)."""
    sql = announcing("INSERT INTO t (x) SELECT 1\n")
    assert sql.strip().startswith("WITH ship_enqueued AS (INSERT INTO t (x) SELECT 1")
    assert sql.rstrip().endswith("SELECT pg_notify(CAST(:channel AS text), CAST(:payload AS text))")
    assert ";" not in sql


@pytest.mark.parametrize("bad", [None, 0, 1.5, "", "sqlite:///x.db", "::not a url::"])
def test_k1_listen_must_be_a_bool_or_a_postgresql_url(bad: object) -> None:
    """K1: ``listen=`` is refused before anything runs unless it is a bool or a PostgreSQL URL."""
    with pytest.raises(ConfigurationError, match="listen="):
        check_listen(bad, "create_job_backend")
    assert check_listen(False, "x") is False
    assert check_listen("postgresql://u@h:5432/db", "x") == "postgresql://u@h:5432/db"


async def test_k1_a_recheck_wakes_soon_and_at_the_window_then_starts_over_on_a_new_arm() -> None:
    """K1: after an announcement the listener looks again at each RECHECKS offset (on the
    injected clock); an announcement while they are pending restarts them from it."""
    clock = FrozenClock()
    woken: list[float] = []
    recheck = Recheck(lambda: woken.append(clock.monotonic()), clock)
    recheck.arm()
    await settle_loop()
    assert woken == []
    clock.advance(RECHECKS[0])
    await settle_loop()
    assert woken == [RECHECKS[0]]
    recheck.arm()  # a new announcement at RECHECKS[0]
    clock.advance(RECHECKS[0])
    await settle_loop()
    clock.advance(RECHECKS[1])
    await settle_loop()
    assert woken == [RECHECKS[0], 2 * RECHECKS[0], 2 * RECHECKS[0] + RECHECKS[1]]
    recheck.arm()
    await recheck.close()
    clock.advance(ANNOUNCE_WINDOW * 4)
    await settle_loop()
    assert len(woken) == 3


async def test_k1_listeners_debounce_a_burst_to_one_call_per_payload() -> None:
    """K1: notifications read together reach a subscriber once per distinct payload, after
    the burst, in arrival order."""
    never = asyncio.Event()

    async def connect_never() -> object:
        await never.wait()
        raise AssertionError

    errors: list[BaseException] = []
    listener = Listener(connect_never, name="test", report_error=errors.append)  # type: ignore[arg-type]
    heard: list[str] = []
    listener.subscribe("ch", heard.append)
    for payload in ("x", "x", "y", "x"):
        listener._on_notification(None, 0, "ch", payload)  # type: ignore[arg-type]
    assert heard == []
    await anyio.lowlevel.checkpoint()
    assert heard == ["x", "y"]
    await listener.close()
    assert errors == []


async def test_k1_a_subscriber_that_raises_is_reported_and_the_others_still_hear() -> None:
    """K1 (J11's rule): a subscriber's exception goes to report_error; nothing raises out."""
    never = asyncio.Event()

    async def connect_never() -> object:
        await never.wait()
        raise AssertionError

    errors: list[BaseException] = []
    listener = Listener(connect_never, name="test", report_error=errors.append)  # type: ignore[arg-type]
    heard: list[str] = []

    def boom(_payload: str) -> None:
        raise RuntimeError("subscriber bug")

    listener.subscribe("ch", boom)
    listener.subscribe("ch", heard.append)
    listener._on_notification(None, 0, "ch", "x")  # type: ignore[arg-type]
    await anyio.lowlevel.checkpoint()
    assert heard == ["x"]
    assert [str(e) for e in errors] == ["subscriber bug"]
    await listener.close()


@pytest.mark.parametrize("channel", ["", "c" * 64])
def test_k1_a_channel_pg_notify_would_refuse_is_refused_at_subscribe(channel: str) -> None:
    """K1: an empty channel, or one over 63 bytes, is refused before anything runs."""
    listener = Listener(lambda: None, name="test", report_error=lambda _e: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigurationError, match="channel"):
        listener.subscribe(channel, lambda _p: None)


async def test_k1_the_in_memory_backend_is_a_wake_source_with_nothing_to_listen_to() -> None:
    """K1: the in-memory model's enqueuers are all local (their commit wakes it at once), so
    listening is a no-op there; a runtime may call it on any backend."""
    backend = InMemoryJobBackend()
    assert isinstance(backend, WakeSource)
    backend.start_listening(["a"])
    await backend.stop_listening(["a"])
