"""S3: the worker's log lines, written once from the runtime's outcome hook (kernel/_runtime/
run_log.py), on the in-memory backend with a frozen clock."""

from __future__ import annotations

import logging

import anyio
import pytest
from job_helpers import advance_until, advance_until_awaited
from spy_backend import SpyBackend

from ship_sqla import define_job, start_job_runtime
from ship_sqla.errors import ConfigurationError
from ship_sqla.jobs import RetryPolicy
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.kernel._runtime.run_log import LOGGER_NAME, RECORD_FIELD, error_summary
from ship_sqla.testing import FrozenClock

SECRET = "hunter2-payload-secret"  # noqa: S105 - a payload value that must never be logged


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
def backend(clock: FrozenClock) -> InMemoryJobBackend:
    return InMemoryJobBackend(clock=clock, on_error=lambda _exc: None)


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger=LOGGER_NAME)
    return caplog


def _events(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [
        {**getattr(r, RECORD_FIELD), "level": r.levelname}
        for r in caplog.records
        if r.name == LOGGER_NAME and hasattr(r, RECORD_FIELD)
    ]


async def test_s3_retry_then_dead_letter_lines_name_run_attempt_and_error(
    clock: FrozenClock, backend: InMemoryJobBackend, lines: pytest.LogCaptureFixture
) -> None:
    """S3: a failed attempt logs one WARNING "retry" line and the last one an ERROR "dead"
    line, each with job id, run id, attempt/max_attempts and the error's summary; never the
    payload; the traceback only at DEBUG."""
    spy = SpyBackend(backend)

    async def handler(ctx: object, payload: object) -> None:
        message = "card declined"
        raise ValueError(message)

    job = define_job(
        "s3.fails",
        handler,
        payload=dict,
        retry=RetryPolicy(attempts=2, backoff="fixed", base_delay=5, jitter="none"),
    )
    result = await backend.enqueue(job, {"card": SECRET})
    async with await start_job_runtime(job, backend=spy):
        await advance_until_awaited(clock, lambda: spy.wait_settled("fail", 2), step=1.0)
    failures = [e for e in _events(lines) if e["event"] in {"retry", "dead"}]
    assert [(e["event"], e["level"], e["attempt"]) for e in failures] == [
        ("retry", "WARNING", 1),
        ("dead", "ERROR", 2),
    ]
    for event in failures:
        assert event["job_id"] == "s3.fails"
        assert event["run_id"] == result.run_id
        assert event["max_attempts"] == 2
        assert event["error"] == "ValueError: card declined"
        assert "Traceback (most recent call last)" in str(event["traceback"])
    assert failures[0]["retry_at"] is not None
    text = lines.text
    assert SECRET not in text
    assert f"run failed, will retry job_id=s3.fails run_id={result.run_id} attempt=1/2" in text
    assert 'error="ValueError: card declined"' in text


async def test_s3_drain_lines(
    clock: FrozenClock, backend: InMemoryJobBackend, lines: pytest.LogCaptureFixture
) -> None:
    """S3, J12: the drain's start and end at INFO; a run the drain deadline cut short is one
    WARNING "drain" line (its attempt unspent)."""
    spy = SpyBackend(backend)
    started = anyio.Event()

    async def handler(ctx: object, payload: object) -> None:
        started.set()
        await anyio.sleep_forever()

    job = define_job("s3.slow", handler, payload=dict)
    result = await backend.enqueue(job, {"card": SECRET})
    runtime = await start_job_runtime(job, backend=spy)
    with anyio.fail_after(5):
        await started.wait()
    await runtime.stop(drain_timeout=0)
    assert spy.settled("release")
    events = _events(lines)
    assert [e["event"] for e in events if e["event"] in {"draining", "drain", "stopped"}] == [
        "draining",
        "drain",
        "stopped",
    ]
    [drain] = [e for e in events if e["event"] == "drain"]
    assert (drain["level"], drain["run_id"], drain["attempt"]) == ("WARNING", result.run_id, 1)
    assert "drain" in str(drain["error"])
    assert SECRET not in lines.text


async def test_s3_summary_counts_runs_and_failures(
    clock: FrozenClock, backend: InMemoryJobBackend, lines: pytest.LogCaptureFixture
) -> None:
    """S3: with summary_interval, one INFO "summary" line per interval: runs, runs/s, failures
    and in flight since the previous one; a last one at stop."""
    spy = SpyBackend(backend)

    async def ok(ctx: object, payload: object) -> None:
        return None

    job = define_job("s3.ok", ok, payload=dict)
    for i in range(3):
        await backend.enqueue(job, {"i": i})
    summarized = anyio.Event()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if getattr(record, RECORD_FIELD, {}).get("event") == "summary":
                summarized.set()

    watch = Watch()
    logging.getLogger(LOGGER_NAME).addHandler(watch)
    try:
        async with await start_job_runtime(job, backend=spy, summary_interval=10):
            await spy.wait_settled(None, 3)
            await advance_until(clock, summarized, step=1.0)
    finally:
        logging.getLogger(LOGGER_NAME).removeHandler(watch)
    summaries = [e for e in _events(lines) if e["event"] == "summary"]
    first = summaries[0]
    assert (first["level"], first["runs"], first["completed"], first["failed"]) == (
        "INFO",
        3,
        3,
        0,
    )
    assert first["in_flight"] == 0
    assert first["runs_per_s"] == pytest.approx(3 / float(str(first["interval_s"])), rel=0.01)
    assert len(summaries) >= 2  # the last one at stop


async def test_summary_interval_is_a_checked_duration(backend: InMemoryJobBackend) -> None:
    async def ok(ctx: object, payload: object) -> None:
        return None

    job = define_job("s3.any", ok)
    with pytest.raises(ConfigurationError, match="summary_interval"):
        await start_job_runtime(job, backend=backend, summary_interval=float("nan"))


def test_error_summary_splits_off_the_traceback() -> None:
    assert error_summary(None) == (None, None)
    assert error_summary("ValueError: x") == ("ValueError: x", None)
    summary, traceback = error_summary(
        "ValueError: x\nsecond line\n\nTraceback (most recent call last):\n  File ..."
    )
    assert summary == "ValueError: x\nsecond line"
    assert traceback is not None
    assert traceback.startswith("Traceback (most recent call last):")
