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
    Announcer,
    Listener,
    Recheck,
    announced_key,
    announcement,
    channel_name,
    check_listen,
    sender_token,
)
from ship_sqla._sql.notify import announcing
from ship_sqla.errors import ConfigurationError
from ship_sqla.kernel import InMemoryJobBackend, WakeSource
from ship_sqla.kernel._plans.announce import (
    ANNOUNCE_WINDOW,
    BUDGET_KNEE,
    MAX_GAP,
    MIN_GAP,
    RECHECKS,
    AnnouncePlan,
    AnnounceThrottle,
    due_now,
)
from ship_sqla.testing import FrozenClock

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


# -- the announce plan and the announcer (K8) -----------------------------------------------------


def test_k8_an_isolated_enqueue_folds_those_right_behind_it_wait_for_one_send() -> None:
    """K8: the first enqueue after a quiet gap announces in its own transaction; enqueues
    committed within the gap wait and go out together in ONE send, no earlier than the gap
    after the fold; a send in flight holds the next back until it ends."""
    plan = AnnouncePlan()
    assert plan.fold(0.0)
    plan.committed("a", 0.001, folded=True)
    assert plan.next_send_at(0.001) is None  # nothing waits
    assert not plan.fold(0.0005)  # within the gap of the fold
    plan.committed("a", 0.0008, folded=False)
    plan.committed("b", 0.0009, folded=False)
    assert not plan.fold(0.01)  # something waits: it goes with the send
    assert plan.next_send_at(0.001) == pytest.approx(MIN_GAP)
    assert plan.take(MIN_GAP) == ("a", "b")
    plan.committed("c", 0.003, folded=False)
    assert plan.next_send_at(0.003) is None  # a send is in flight
    later = 2 * MIN_GAP + 0.001
    plan.sent(("a", "b"), ok=True)
    assert plan.next_send_at(later) == pytest.approx(later)  # the gap has passed already


def test_k8_a_failed_send_keeps_its_keys_waiting_first() -> None:
    """K1, K8: a send that failed gives its keys back, ahead of those committed meanwhile."""
    plan = AnnouncePlan()
    plan.committed("a", 0.0, folded=False)
    keys = plan.take(0.0)
    plan.committed("b", 0.001, folded=False)
    plan.sent(keys, ok=False)
    assert plan.pending == ("a", "b")


def test_k8_the_gap_is_the_senders_share_of_the_budget() -> None:
    """K8: alone, a sender may announce every MIN_GAP; when the table's sequence shows the
    fleet enqueuing ten times its own rate, its gap is ten times longer; never over MAX_GAP.
    Above BUDGET_KNEE enqueues a second the table's budget shrinks in proportion: a lone sender
    at four times the knee has a quarter of the budget (a gap four times MIN_GAP, each
    announcement covering sixteen times as many enqueues)."""
    alone, shared, tiny, fast = AnnouncePlan(), AnnouncePlan(), AnnouncePlan(), AnnouncePlan()
    for n in range(100):  # 100 commits over one second, each
        at = n / 100
        for plan, fleet in ((alone, n), (shared, 10 * n), (tiny, 1000 * n)):
            plan.committed("a", at, folded=True, fleet_seq=fleet)
    for n in range(4000):
        fast.committed("a", n / 4000, folded=True, fleet_seq=n)
    assert alone.gap(0.99) == pytest.approx(MIN_GAP)
    assert shared.gap(0.99) == pytest.approx(10 * MIN_GAP, rel=0.05)
    assert tiny.gap(0.99) == MAX_GAP
    assert BUDGET_KNEE == 1000.0
    assert fast.gap(0.999) == pytest.approx(4 * MIN_GAP, rel=0.05)


async def test_k8_the_announcer_sends_what_waits_in_one_statement_and_retries_a_failure() -> None:
    """K8, J11: committed keys that did not fold go out after their commit, several in one
    send with the sender's payloads; a failed send is reported and retried after the error
    backoff; nothing is sent for folded keys, and nothing at all on a non-concurrent store."""
    sends: list[list[str]] = []
    errors: list[BaseException] = []
    clock = FrozenClock()

    async def send(payloads: list[str]) -> int | None:
        sends.append(payloads)
        if len(sends) == 2:
            raise RuntimeError("the database went away")
        return None

    announcer = Announcer(
        channel="c", sender="me", send=send, report_error=errors.append, clock=clock
    )
    assert announcer.fold("a") == ("c", "me/a")
    announcer.committed("a", folded=True)
    assert announcer.fold("b") is None  # within the gap
    announcer.committed("b", folded=False)
    announcer.committed("c", folded=False)
    await settle_loop()
    clock.advance(MIN_GAP)
    await settle_loop()
    assert sends == [["me/b", "me/c"]]
    announcer.committed("d", folded=False)
    await settle_loop()
    clock.advance(MIN_GAP)
    await settle_loop()
    assert sends[1] == ["me/d"]
    assert [str(e) for e in errors] == ["the database went away"]
    clock.advance(10.0)  # past the error backoff
    await settle_loop()
    await announcer.flush()
    assert sends[2] == ["me/d"]
    await announcer.close()

    quiet = Announcer(
        channel="c", sender="me", send=send, report_error=errors.append, concurrent=False
    )
    quiet.committed("x", folded=False)
    await quiet.flush()
    assert len(sends) == 3


def test_k8_an_old_burst_never_widens_todays_gap() -> None:
    """K8: the rates are measured over the last RATE_SPAN only: a second after a burst that
    shared the table with a busy fleet, a lone enqueue's gap is back to MIN_GAP."""
    plan = AnnouncePlan()
    for n in range(100):
        plan.committed("a", n / 1000, folded=True, fleet_seq=100 * n)
    assert plan.gap(0.1) == MAX_GAP
    plan.committed("a", 5.0, folded=False)
    assert plan.gap(5.0) == MIN_GAP


async def test_k8_what_was_committed_before_a_dispose_is_not_sent_after_it() -> None:
    """K1, K8: the announcer never sends on an engine disposed after the commits it would
    announce (that would give the engine a new pool nobody disposes): they are dropped, and
    the listeners' polls find them; commits after the dispose are announced again."""
    sends: list[list[str]] = []
    pool = [object()]

    async def send(payloads: list[str]) -> None:
        sends.append(payloads)

    announcer = Announcer(
        channel="c", sender="me", send=send, report_error=print, pool=lambda: pool[0]
    )
    assert announcer.fold("a") is not None
    announcer.committed("a", folded=True)
    announcer.committed("b", folded=False)
    pool[0] = object()  # engine.dispose(): a new pool
    await announcer.flush()
    assert sends == []
    announcer.committed("c", folded=False)
    await announcer.flush()
    assert sends == [["me/c"]]
