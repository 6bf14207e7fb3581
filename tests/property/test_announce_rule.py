"""K1 and K8 against the kernel's announce rule (``AnnouncePlan``), without a database.

A discrete-event simulation of several senders (each an ``AnnouncePlan`` driven as the
``Announcer`` drives it: fold before the statement, ``committed`` after the commit, one send in
flight at a time, each send taking a random round trip), one listener that looks for a key's
runs whenever an announcement of it arrives and polls every ``POLL`` seconds, notifications
lost at random, and enqueues that roll back. Time is the simulation's: every decision of the
rule takes it as an argument.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from ship_sqla.kernel._plans.announce import (
    BUDGET_KNEE,
    MAX_GAP,
    NOTIFY_BUDGET,
    AnnouncePlan,
    bound,
)

POLL = 1.0
RTT_MAX = 0.004
"""Seconds: the longest a send (a notify-only statement) takes in the simulation."""


@dataclass(frozen=True)
class Enqueue:
    sender: int
    key: str
    start: float
    duration: float
    """Seconds from the statement's start to the commit (a unit of work's length)."""
    rolled_back: bool


@dataclass
class Delivery:
    key: str
    covers: float
    """Every commit of ``key`` at or before this time is seen by the claim it causes."""
    at: float
    lost: bool


@dataclass
class World:
    plans: list[AnnouncePlan]
    round_trips: Iterator[float]
    losses: Iterator[bool]
    committed_runs: int = 0
    deliveries: list[Delivery] = field(default_factory=list)
    commits: list[tuple[str, float]] = field(default_factory=list)
    announcements: list[float] = field(default_factory=list)
    """When each notifying transaction (a fold's commit, a send) happened."""


def simulate(enqueues: list[Enqueue], plans: list[AnnouncePlan], world: World) -> World:
    order = itertools.count()
    events: list[tuple[float, int, str, object]] = []
    for enqueue in enqueues:
        heapq.heappush(events, (enqueue.start, next(order), "start", enqueue))
    folds: dict[int, bool] = {}
    samples: dict[int, bool] = {}
    scheduled = [False] * len(plans)

    def schedule_send(sender: int, now: float) -> None:
        if scheduled[sender]:
            return
        at = plans[sender].next_send_at(now)
        if at is not None:
            scheduled[sender] = True
            heapq.heappush(events, (at, next(order), "send", sender))

    while events:
        now, _, kind, data = heapq.heappop(events)
        if kind == "start":
            assert isinstance(data, Enqueue)
            plan = plans[data.sender]
            folds[id(data)] = plan.fold(now)
            samples[id(data)] = folds[id(data)] or plan.wants_fleet_sample(now)
            heapq.heappush(events, (now + data.duration, next(order), "commit", data))
        elif kind == "commit":
            assert isinstance(data, Enqueue)
            if data.rolled_back:
                continue
            world.committed_runs += 1
            world.commits.append((data.key, now))
            folded = folds[id(data)]
            # A folded or sampling enqueue's INSERT reads the table's sequence (RETURNING seq).
            seq = world.committed_runs if samples[id(data)] else None
            plans[data.sender].committed(data.key, now, folded=folded, fleet_seq=seq)
            if folded:
                world.announcements.append(now)
                world.deliveries.append(Delivery(data.key, now, now, next(world.losses)))
            schedule_send(data.sender, now)
        elif kind == "send":
            assert isinstance(data, int)
            scheduled[data] = False
            keys = plans[data].take(now)
            rtt = next(world.round_trips)
            world.announcements.append(now)
            heapq.heappush(events, (now + rtt, next(order), "sent", (data, keys, now)))
        else:  # "sent": the notify-only transaction committed, its notifications go out
            sender, keys, started = data  # type: ignore[misc]
            for key in keys:
                world.deliveries.append(Delivery(key, started, now, next(world.losses)))
            plans[sender].sent(keys, ok=True)
            schedule_send(sender, now)
    return world


class Heard:
    """When the listener first looked for a run: the first announcement of its key that covers
    it and arrived, else the first poll after it (an index over the deliveries)."""

    def __init__(self, deliveries: list[Delivery]) -> None:
        self._covers: dict[str, list[float]] = {}
        self._first_at: dict[str, list[float]] = {}
        for key in {d.key for d in deliveries}:
            heard = sorted((d.covers, d.at) for d in deliveries if d.key == key and not d.lost)
            earliest, suffix = math.inf, []
            for _, at in reversed(heard):
                earliest = min(earliest, at)
                suffix.append(earliest)
            self._covers[key] = [covers for covers, _ in heard]
            self._first_at[key] = suffix[::-1]

    def looked_for(self, key: str, committed: float) -> float:
        polled = (int(committed / POLL) + 1) * POLL
        covers = self._covers.get(key, [])
        index = bisect.bisect_left(covers, committed)
        heard = self._first_at[key][index] if index < len(covers) else math.inf
        return min(heard, polled)


def slowest(world: World) -> float:
    """The longest any committed enqueue waited to be looked for."""
    heard = Heard(world.deliveries)
    return max((heard.looked_for(key, at) - at for key, at in world.commits), default=0.0)


@st.composite
def enqueue_streams(draw: st.DrawFn) -> list[Enqueue]:
    senders = draw(st.integers(min_value=1, max_value=4))
    enqueues = []
    for sender in range(senders):
        count = draw(st.integers(min_value=1, max_value=40))
        gaps = draw(st.lists(st.floats(0.0, 0.03), min_size=count, max_size=count))
        start = draw(st.floats(0.0, 0.05))
        for gap in gaps:
            start += gap
            enqueues.append(
                Enqueue(
                    sender=sender,
                    key=draw(st.sampled_from(["job.a", "job.b", "job.c"])),
                    start=start,
                    duration=draw(st.sampled_from([0.0005, 0.001, 0.003]))
                    + draw(
                        st.sampled_from([0.0, 0.0, 0.0, 0.05])  # now and then a long unit of work
                    ),
                    rolled_back=draw(st.integers(0, 9)) == 0,
                )
            )
    return enqueues


@given(
    enqueues=enqueue_streams(),
    round_trips=st.lists(st.floats(0.0001, RTT_MAX), min_size=1),
)
@settings(max_examples=300, deadline=None)
def test_k8_every_committed_enqueue_is_looked_for_within_the_bound(
    enqueues: list[Enqueue], round_trips: list[float]
) -> None:
    """K1, K8: with notifications delivered, every committed enqueue of due work (several
    senders, random statement and send durations, long units of work, rollbacks) is looked for
    by the listener within ``bound(RTT_MAX)`` (MAX_GAP plus two round trips) of its commit;
    a rolled-back enqueue is never announced."""
    senders = max(e.sender for e in enqueues) + 1
    plans = [AnnouncePlan() for _ in range(senders)]
    world = simulate(
        enqueues,
        plans,
        World(plans, itertools.cycle(round_trips), itertools.repeat(False)),
    )
    assert slowest(world) <= bound(RTT_MAX) + 1e-9
    assert len(world.commits) == sum(not e.rolled_back for e in enqueues)
    assert all(plan.pending == () for plan in plans)


@given(
    enqueues=enqueue_streams(),
    round_trips=st.lists(st.floats(0.0001, RTT_MAX), min_size=1),
    losses=st.lists(st.booleans(), min_size=1),
)
@settings(max_examples=300, deadline=None)
def test_k1_with_notifications_lost_a_run_waits_at_most_one_poll(
    enqueues: list[Enqueue], round_trips: list[float], losses: list[bool]
) -> None:
    """K1: whatever notifications are lost, every committed enqueue is looked for within one
    poll interval of its commit (the listener's poll is the fallback)."""
    senders = max(e.sender for e in enqueues) + 1
    plans = [AnnouncePlan() for _ in range(senders)]
    world = simulate(
        enqueues, plans, World(plans, itertools.cycle(round_trips), itertools.cycle(losses))
    )
    assert slowest(world) <= POLL


@given(
    rates=st.lists(st.sampled_from([20.0, 100.0, 400.0, 1500.0]), min_size=1, max_size=6),
    round_trip=st.floats(0.0002, 0.002),
)
@settings(max_examples=25, deadline=None)
def test_k8_notifying_commits_stay_within_the_budget_fleet_wide(
    rates: list[float], round_trip: float
) -> None:
    """K8: however many senders enqueue, at whatever rates, the table's notifying commits (folds
    and sends of every sender) stay within the budget (NOTIFY_BUDGET, shrunk in proportion above
    BUDGET_KNEE enqueues a second; +10 % for the rates' one-second estimates), plus 1 /
    MAX_GAP a second from each sender whose share is too small for a gap of its own; and every
    commit is still looked for within the bound."""
    seconds = 3.0
    enqueues = [
        Enqueue(sender, "job.a", n / rate, 0.0005, rolled_back=False)
        for sender, rate in enumerate(rates)
        for n in range(int(seconds * rate))
    ]
    plans = [AnnouncePlan() for _ in rates]
    world = simulate(
        enqueues, plans, World(plans, itertools.repeat(round_trip), itertools.repeat(False))
    )
    late = [at for at in world.announcements if 1.0 <= at < seconds]
    budget = NOTIFY_BUDGET * min(1.0, BUDGET_KNEE / sum(rates))
    allowed = (1.1 * budget + len(rates) / MAX_GAP) * (seconds - 1.0)
    assert len(late) <= allowed
    if sum(rates) <= NOTIFY_BUDGET / 2:  # room to spare: every commit announced on its own
        assert len(world.announcements) >= len(enqueues) * 0.9
    assert slowest(world) <= bound(round_trip) + 1e-9
