"""How an attempt ends (K4) and the per-run timeout (K5), on every backend: the stores record
each outcome's kind and snooze without spending an attempt; the runtime turns what a handler
raised into those settlements, cancels a handler at its timeout and keeps the lease of one that
ignores it.

Waits are on events with ``anyio.fail_after``; time moves only through the FrozenClock.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import anyio
import pytest
from job_helpers import (
    ErrorLog,
    advance_until,
    advance_until_awaited,
    claim_request,
    record_of,
    settle_loop,
)
from spy_backend import SpyBackend

from ship_sqla import define_job, start_job_runtime
from ship_sqla.errors import (
    ConfigurationError,
    JobSnoozeLimitError,
    JobTimeoutError,
    JobTimeoutIgnoredError,
    RetryAfter,
    Snooze,
    TerminalError,
)
from ship_sqla.jobs import Concurrency, RetryPolicy
from ship_sqla.kernel import LEASE_LAPSED, completed, failed, released, snoozed

LEASE = 30.0


async def noop(ctx, payload):
    return None


def plain_job(attempts: int = 3, *, max_snoozes: int = 100):
    return define_job(
        "conf.outcome",
        noop,
        payload=dict,
        concurrency=Concurrency(max=5, lease=LEASE),
        retry=RetryPolicy(attempts=attempts, max_snoozes=max_snoozes),
    )


def kinds(record):
    return [entry.get("kind") for entry in record.history]


# --- the stores --------------------------------------------------------------------------------


async def test_k4_every_history_entry_records_its_kind(clock, job_backend_factory):
    """K4: a failure's history entry carries the kind the kernel chose ("failure", "retry-after",
    "timeout", "terminal"), a release with an error "released", a lapsed attempt "lapsed"; the
    entries keep their keys attempt, at, error, and (J18) the attempt's start and worker."""
    backend = job_backend_factory(clock)
    job = plain_job(attempts=10)
    result = await backend.enqueue(job, {})
    for kind in ("failure", "retry-after", "timeout"):
        [claimed] = await backend.claim(claim_request(job, worker="A"))
        assert await backend.settle([failed(claimed, f"e-{kind}", clock.now(), kind)]) == [
            "retrying"
        ]
    [claimed] = await backend.claim(claim_request(job, worker="A"))
    assert await backend.settle(
        [released(claimed, clock.now(), reason="lock-held", error="drained")]
    ) == ["released"]
    [claimed] = await backend.claim(claim_request(job, worker="A"))
    clock.advance(LEASE + 1)
    [retaken] = await backend.claim(claim_request(job, worker="B"))
    assert await backend.settle([failed(retaken, "poison", None, "terminal")]) == ["dead"]
    record = await record_of(backend, result.run_id)
    assert record.state == "dead"
    assert kinds(record) == ["failure", "retry-after", "timeout", "released", "lapsed", "terminal"]
    assert [entry["attempt"] for entry in record.history] == [1, 2, 3, 4, 4, 5]
    assert record.history[4]["error"].startswith(LEASE_LAPSED)
    keys = {"attempt", "at", "error", "kind", "started", "worker"}  # J18: start and worker
    assert all(set(entry) == keys for entry in record.history)
    assert [entry["worker"] for entry in record.history] == ["A"] * 5 + ["B"]
    # terminal: dead on this attempt, the attempts left unspent
    assert (record.attempt, record.max_attempts) == (5, 10)


async def test_k4_snooze_waits_again_without_spending_an_attempt(clock, job_backend_factory):
    """K4: a snooze puts the run back to waiting at its time, the attempt unspent, one more
    snooze counted (the next claim's ClaimedRun.snoozes, RunRecord.snoozes), the snooze's text
    in the history with kind "snooze"; it is not claimable before its time."""
    backend = job_backend_factory(clock)
    job = plain_job(attempts=1)
    result = await backend.enqueue(job, {})
    [claimed] = await backend.claim(claim_request(job, worker="A"))
    assert (claimed.attempt, claimed.snoozes) == (1, 0)
    wake_at = clock.now() + timedelta(seconds=20)
    assert await backend.settle([snoozed(claimed, wake_at, "not ready")]) == ["snoozed"]
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt, record.snoozes, record.run_at) == (
        "waiting",
        0,
        1,
        wake_at,
    )
    assert [(e["attempt"], e["error"], e["kind"]) for e in record.history] == [
        (1, "not ready", "snooze")
    ]
    assert record.last_error == "not ready"
    assert await backend.claim(claim_request(job, worker="A")) == []
    clock.advance(20)
    [again] = await backend.claim(claim_request(job, worker="A"))
    assert (again.attempt, again.snoozes) == (1, 1)  # the same attempt number, on its only one
    assert again.token > claimed.token
    assert await backend.settle([snoozed(again, clock.now(), "still not")]) == ["snoozed"]
    [third] = await backend.claim(claim_request(job, worker="A"))
    assert third.snoozes == 2
    assert await backend.settle([completed(third)]) == ["completed"]
    assert (await record_of(backend, result.run_id)).snoozes == 2


async def test_k4_a_stale_snooze_changes_nothing(clock, job_backend_factory):
    """K4/J5: a snooze carrying a superseded token answers "stale" and leaves the row as it
    was (no snooze counted, no history)."""
    backend = job_backend_factory(clock)
    job = plain_job()
    result = await backend.enqueue(job, {})
    [old] = await backend.claim(claim_request(job, worker="A"))
    clock.advance(LEASE + 1)
    [current] = await backend.claim(claim_request(job, worker="B"))
    before = await record_of(backend, result.run_id)
    assert await backend.settle([snoozed(old, clock.now(), "zombie")]) == ["stale"]
    assert await record_of(backend, result.run_id) == before
    assert await backend.settle([snoozed(current, clock.now(), "fresh")]) == ["snoozed"]


async def test_k4_mixed_batch_settles_every_kind_in_one_call(clock, job_backend_factory):
    """K4: one settle call with a complete, a retry-after fail, a terminal fail, a snooze and a
    release answers each in order (one statement on PostgreSQL)."""
    backend = job_backend_factory(clock)
    job = plain_job(attempts=3)
    ids = [(await backend.enqueue(job, {"n": n})).run_id for n in range(5)]
    claimed = await backend.claim(claim_request(job, worker="A", limit=5))
    by_id = {run.run_id: run for run in claimed}
    runs = [by_id[run_id] for run_id in ids]
    later = clock.now() + timedelta(seconds=5)
    answers = await backend.settle(
        [
            completed(runs[0]),
            failed(runs[1], "slow down", later, "retry-after"),
            failed(runs[2], "bad input", None, "terminal"),
            snoozed(runs[3], later, "wait"),
            released(runs[4], later, reason="lock-held"),
        ]
    )
    assert answers == ["completed", "retrying", "dead", "snoozed", "released"]
    records = [await record_of(backend, run_id) for run_id in ids]
    assert [r.state for r in records] == ["completed", "waiting", "dead", "waiting", "waiting"]
    assert [r.attempt for r in records] == [1, 1, 1, 0, 0]
    assert [r.snoozes for r in records] == [0, 0, 0, 1, 0]
    assert [kinds(r) for r in records] == [[], ["retry-after"], ["terminal"], ["snooze"], []]


async def test_k4_an_unknown_failure_kind_is_refused_before_the_store(clock, job_backend_factory):
    """K4: a failure whose kind is none of FailureKind is a ConfigurationError when it is built,
    and a batch holding anything but settlements is refused whole: nothing of it is settled."""
    backend = job_backend_factory(clock)
    job = plain_job()
    result = await backend.enqueue(job, {})
    [claimed] = await backend.claim(claim_request(job, worker="A"))
    with pytest.raises(ConfigurationError, match=r"failure's kind 'oops' is unknown"):
        failed(claimed, "x", None, "oops")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="is not a settlement"):
        await backend.settle([completed(claimed), ("fail", claimed)])  # type: ignore[list-item]
    assert (await record_of(backend, result.run_id)).state == "running"


# --- the runtime: what a handler raises --------------------------------------------------------


async def test_k4_terminal_error_dead_letters_on_its_attempt(clock, job_backend_factory):
    """K4 through the runtime: a handler raising TerminalError is dead on that attempt, the
    remaining attempts unspent, its history entry kind "terminal"; nothing is reported."""
    errors = ErrorLog()
    backend = SpyBackend(job_backend_factory(clock, on_error=errors))
    calls: list[int] = []

    async def handler(ctx, payload):
        calls.append(ctx.attempt)
        raise TerminalError("the card was declined")

    job = define_job("conf.terminal", handler, payload=dict, retry=RetryPolicy(attempts=5))
    result = await backend.enqueue(job, {})
    async with await start_job_runtime([job], backend=backend):
        await backend.wait_settled("fail", 1)
    [(fail, outcome)] = backend.settled("fail")
    assert (fail.failure_kind, fail.run_at, outcome) == ("terminal", None, "dead")
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt, record.max_attempts) == ("dead", 1, 5)
    assert kinds(record) == ["terminal"]
    assert "SHIP_SQLA_JOB_TERMINAL: the card was declined" in record.last_error
    assert calls == [1]
    assert errors.errors == []


async def test_k4_non_retryable_exception_types_are_terminal(clock, job_backend_factory):
    """K4: an exception of a type RetryPolicy.non_retryable names ends the run at once; another
    type raised by the same job is retried."""
    backend = SpyBackend(job_backend_factory(clock))

    async def handler(ctx, payload):
        raise (KeyError if payload["fatal"] else ValueError)("boom")

    job = define_job(
        "conf.nonretryable",
        handler,
        payload=dict,
        retry=RetryPolicy(attempts=4, non_retryable=(LookupError,)),
    )
    fatal = await backend.enqueue(job, {"fatal": True})
    transient = await backend.enqueue(job, {"fatal": False})
    async with await start_job_runtime([job], backend=backend):
        await backend.wait_settled("fail", 2)
    by_run = {
        fail.run.run_id: (fail.failure_kind, outcome) for fail, outcome in backend.settled("fail")
    }
    assert by_run == {fatal.run_id: ("terminal", "dead"), transient.run_id: ("failure", "retrying")}
    assert (await record_of(backend, fatal.run_id)).state == "dead"
    assert (await record_of(backend, transient.run_id)).state == "waiting"


async def test_k4_retry_after_overrides_the_backoff_and_spends_the_attempt(
    clock, job_backend_factory
):
    """K4: RetryAfter(delay) retries after the named delay, not the (much longer) backoff; it
    counts an attempt; the history records kind "retry-after"."""
    backend = SpyBackend(job_backend_factory(clock))
    seen: list[int] = []
    done = anyio.Event()

    async def handler(ctx, payload):
        seen.append(ctx.attempt)
        if ctx.attempt == 1:
            raise RetryAfter(7, "rate limited")
        done.set()

    job = define_job(
        "conf.retryafter",
        handler,
        payload=dict,
        concurrency=Concurrency(lease=600),
        retry=RetryPolicy(attempts=3, backoff="fixed", base_delay=3600, jitter="none"),
    )
    result = await backend.enqueue(job, {})
    async with await start_job_runtime([job], backend=backend):
        await backend.wait_settled("fail", 1)
        [(fail, outcome)] = backend.settled("fail")
        assert (fail.failure_kind, outcome) == ("retry-after", "retrying")
        assert fail.run_at == clock.now() + timedelta(seconds=7)
        await advance_until(clock, done, step=1.0)
        await backend.wait_settled("complete", 1)
    assert seen == [1, 2]
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt) == ("completed", 2)
    assert kinds(record) == ["retry-after"]
    assert "retry after 7 s: rate limited" in record.history[0]["error"]


async def test_k4_snooze_spends_no_attempt_and_is_bounded(clock, job_backend_factory):
    """K4: a handler that snoozes goes back to waiting for the delay without spending its
    attempt (ctx.attempt stays 1, ctx.snoozes counts); past retry.max_snoozes a snooze is a
    failed attempt (JobSnoozeLimitError, kind "failure") retried with the backoff, and the run
    is dead once the attempts are spent: the bound holds."""
    backend = SpyBackend(job_backend_factory(clock))
    seen: list[tuple[int, int]] = []

    async def handler(ctx, payload):
        seen.append((ctx.attempt, ctx.snoozes))
        raise Snooze(timedelta(seconds=5), "export not ready")

    job = define_job(
        "conf.snooze",
        handler,
        payload=dict,
        concurrency=Concurrency(lease=600),
        retry=RetryPolicy(attempts=2, backoff="fixed", base_delay=5, jitter="none", max_snoozes=2),
    )
    result = await backend.enqueue(job, {})
    async with await start_job_runtime([job], backend=backend):
        await advance_until_awaited(
            clock, lambda: backend.wait_settled("fail", 2, limit=30), step=1.0, limit=30
        )
    assert seen == [(1, 0), (1, 1), (1, 2), (2, 2)]
    assert [outcome for _, outcome in backend.settled("snooze")] == ["snoozed", "snoozed"]
    assert [(f.failure_kind, o) for f, o in backend.settled("fail")] == [
        ("failure", "retrying"),
        ("failure", "dead"),
    ]
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt, record.snoozes) == ("dead", 2, 2)
    assert kinds(record) == ["snooze", "snooze", "failure", "failure"]
    assert record.history[0]["error"] == ("SHIP_SQLA_JOB_SNOOZE: snoozed for 5 s: export not ready")
    assert JobSnoozeLimitError.code in record.history[2]["error"]


# --- the runtime: the per-run timeout ----------------------------------------------------------


async def test_k5_timeout_cancels_the_handler_and_fails_the_attempt(clock, job_backend_factory):
    """K5: at the job's timeout the handler's cancellation fires; the attempt is a failure with
    code SHIP_SQLA_JOB_TIMEOUT (kind "timeout") and the retry policy decides what follows (here
    a retry, which completes). A handler that stops at once is not reported."""
    errors = ErrorLog()
    backend = SpyBackend(job_backend_factory(clock, on_error=errors))
    started = anyio.Event()
    cancelled = anyio.Event()
    done = anyio.Event()

    async def handler(ctx, payload):
        if ctx.attempt == 1:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                assert ctx.cancel_reason == "timeout"
                cancelled.set()
                raise
        done.set()

    job = define_job(
        "conf.timeout",
        handler,
        payload=dict,
        timeout=5,
        # A long lease: time is pumped forward while the database answers.
        concurrency=Concurrency(lease=600),
        retry=RetryPolicy(attempts=3, backoff="fixed", base_delay=2, jitter="none"),
    )
    result = await backend.enqueue(job, {})
    async with await start_job_runtime([job], backend=backend):
        with anyio.fail_after(10):
            await started.wait()
        await advance_until(clock, cancelled, step=1.0)
        await backend.wait_settled("fail", 1)
        [(fail, outcome)] = backend.settled("fail")
        assert (fail.failure_kind, outcome) == ("timeout", "retrying")
        assert f"{JobTimeoutError.code}: attempt 1 of job 'conf.timeout'" in fail.entry.error
        await advance_until(clock, done, step=1.0)
        await backend.wait_settled("complete", 1)
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt) == ("completed", 2)
    assert kinds(record) == ["timeout"]
    assert errors.errors == []


async def test_k5_a_timeout_the_policy_names_non_retryable_is_dead(clock, job_backend_factory):
    """K5: the retry policy decides what follows a timeout: with JobTimeoutError non-retryable
    the run is dead on that attempt (kind "timeout")."""
    backend = SpyBackend(job_backend_factory(clock))
    started = anyio.Event()

    async def handler(ctx, payload):
        started.set()
        await asyncio.Event().wait()

    job = define_job(
        "conf.timeout.fatal",
        handler,
        payload=dict,
        timeout=timedelta(seconds=3),
        concurrency=Concurrency(lease=600),
        retry=RetryPolicy(attempts=5, non_retryable=(JobTimeoutError,)),
    )
    result = await backend.enqueue(job, {})
    async with await start_job_runtime([job], backend=backend):
        with anyio.fail_after(10):
            await started.wait()
        await advance_until_awaited(clock, lambda: backend.wait_settled("fail", 1), step=1.0)
    [(fail, outcome)] = backend.settled("fail")
    assert (fail.failure_kind, fail.run_at, outcome) == ("timeout", None, "dead")
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt, kinds(record)) == ("dead", 1, ["timeout"])


async def test_k5_a_handler_ignoring_its_timeout_keeps_its_lease_visibly(
    clock, job_backend_factory
):
    """K5: a handler that swallows its cancellation at the timeout keeps its run's lease:
    heartbeats go on until it has really stopped (no other worker retakes the run, three
    leases later), it is reported once to on_error (JobTimeoutIgnoredError, a heartbeat
    interval after the timeout), and once it stops the attempt settles as a timeout failure."""
    errors = ErrorLog()
    inner = job_backend_factory(clock, on_error=errors)
    backend = SpyBackend(inner)
    started = anyio.Event()
    cancelled = anyio.Event()
    release = asyncio.Event()

    async def handler(ctx, payload):
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
        await release.wait()  # ignores the cancellation: goes on working

    lease = 60.0
    job = define_job(
        "conf.timeout.ignored",
        handler,
        payload=dict,
        timeout=4,
        concurrency=Concurrency(lease=lease),
        # The retry is due an hour after the timeout failure, never within the steps below: a
        # default backoff (up to 1 s, full jitter) let a slow settle's frozen-time steps reach
        # a second attempt, which timed out too (two "fail" settlements).
        retry=RetryPolicy(attempts=3, base_delay=3600, jitter="none"),
    )
    result = await backend.enqueue(job, {})
    runtime = await start_job_runtime([job], backend=backend)
    try:
        # Time moves only once the database answered what was asked: no lease lapses because
        # frozen time ran ahead of a round trip.
        with anyio.fail_after(10):
            await started.wait()
        clock.advance(4)
        with anyio.fail_after(10):
            await cancelled.wait()
        clock.advance(lease / 3)
        await errors.wait_for(lambda e: isinstance(e, JobTimeoutIgnoredError))
        for _ in range(9):  # three more leases
            beats = len(backend.calls.get("heartbeat", ()))
            # Small steps, each only once every call in flight answered: the test depends
            # neither on when the heartbeat loop parked nor on how long a round trip takes.
            with anyio.fail_after(10):
                while len(backend.calls.get("heartbeat", ())) <= beats:
                    clock.advance(1.0)
                    await settle_loop()
                    await backend.wait_idle()
        assert len(backend.answered("heartbeat")) >= 9
        assert all(all(call.result) for call in backend.answered("heartbeat"))
        assert await inner.claim(claim_request(job, worker="other", limit=5)) == []
        record = await record_of(inner, result.run_id)
        assert (record.state, record.attempt) == ("running", 1)
        release.set()
        # At most half a lease past the last heartbeat: on a slow machine the settle's round
        # trip outlasted 60 one-second steps, the lease lapsed in frozen time and the settle
        # was refused as stale. Past that bound time stands still while the settle lands.
        await advance_until_awaited(
            clock, lambda: backend.wait_settled("fail", 1), step=1.0, most=lease / 2
        )
    finally:
        # A failed assertion must not leave the stop waiting on frozen time or the handler.
        release.set()
        await runtime.stop(drain_timeout=0)
    [(fail, outcome)] = backend.settled("fail")
    assert (fail.failure_kind, outcome) == ("timeout", "retrying")
    ignored = [e for e in errors.errors if isinstance(e, JobTimeoutIgnoredError)]
    assert len(ignored) == 1
    assert ignored[0].code == "SHIP_SQLA_JOB_TIMEOUT_IGNORED"
    assert result.run_id in str(ignored[0])
    assert all(isinstance(e, JobTimeoutIgnoredError) for e in errors.errors)
    assert kinds(await record_of(inner, result.run_id)) == ["timeout"]
