"""A backfill's declaration (C4, C5): refused at definition when it could not run as declared;
its job is single-runner (one pass fleet-wide) and what a start enqueues without the definition
(the shell's stand-in) stores the same enqueue-time values."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from backfill_kit import ListSource

from ship_sqla.backfills import define_backfill
from ship_sqla.errors import ConfigurationError
from ship_sqla.kernel import InMemoryBackfillLedger
from ship_sqla.kernel._backfills import (
    BACKFILL_RETRY,
    MIN_STALL_AFTER,
    backfill_dedupe_key,
    backfill_job_stand_in,
)
from ship_sqla.kernel._plans.prepare import prepare_runs
from ship_sqla.kernel._ports import EnqueueRequest


async def _handle(ctx: Any, rows: Any) -> None:
    return None


def _declare(**overrides: Any) -> Any:
    options: dict[str, Any] = {
        "source": ListSource([1, 2, 3]),
        "handle": _handle,
        "pace": 5.0,
        "ledger": InMemoryBackfillLedger(),
    }
    options.update(overrides)
    return define_backfill(options.pop("id", "bf.users"), **options)


@pytest.mark.parametrize("pace", [0, -1, 0.0, math.nan, math.inf, True, "5", None, 1_000.5])
def test_c4_a_pace_must_be_a_positive_rate_there_is_no_unthrottled_mode(pace: Any) -> None:
    """C4: ``pace`` is pages per second, > 0 and finite (and at most MAX_PACE): zero, a
    negative, infinity ("as fast as it goes") and non-numbers are refused at definition."""
    with pytest.raises(ConfigurationError, match="pace") as caught:
        _declare(pace=pace)
    assert "no unthrottled mode" in (caught.value.fix or "")


@pytest.mark.parametrize(
    ("overrides", "word"),
    [
        ({"id": "-bad"}, "backfill id"),
        ({"source": object()}, "source="),
        ({"handle": "not callable"}, "handle="),
        ({"ledger": object()}, "ledger="),
        ({"page_size": 0}, "page_size"),
        ({"page_size": True}, "page_size"),
        ({"transaction": object()}, "transaction="),
        ({"required_by": "  "}, "required_by"),
        ({"stall_after": 0}, "stall_after"),
    ],
)
def test_c4_c5_a_declaration_that_could_not_run_is_refused(
    overrides: dict[str, Any], word: str
) -> None:
    """C4, C5: every knob is checked at definition, with the fix."""
    with pytest.raises(ConfigurationError, match=word):
        _declare(**overrides)


def test_c4_the_stalled_threshold_defaults_to_ten_intervals_with_a_floor() -> None:
    """C4: without ``stall_after`` a backfill is stalled after max(300 s, 10 page intervals)
    without a checkpoint; a given one (seconds or a timedelta) wins."""
    assert _declare(pace=5.0).stall_after == MIN_STALL_AFTER
    assert _declare(pace=0.01).stall_after == pytest.approx(1000.0)
    assert _declare(stall_after=timedelta(minutes=2)).stall_after == 120.0


def test_c4_a_backfill_runs_as_one_single_runner_job_and_the_stand_in_enqueues_alike() -> None:
    """C4: the backfill's job is single-runner on one key (one pass at a time, fleet-wide),
    retried by BACKFILL_RETRY (each attempt resumes from the last checkpoint), no timeout; the
    stand-in ``ship-sqla backfill start`` enqueues stores the same key, attempts and dedupe."""
    backfill = _declare()
    job = backfill.job
    assert job.id == backfill_job_stand_in(backfill.id).id == "bf.users"
    assert job.concurrency.single_runner
    assert job.retry == BACKFILL_RETRY
    assert job.timeout is None
    stand_in = backfill_job_stand_in("bf.users")
    request = (EnqueueRequest({}, dedupe_key=backfill_dedupe_key("bf.users")),)
    [real] = prepare_runs(job, request, trace_context=None, tenant=None)
    [alike] = prepare_runs(stand_in, request, trace_context=None, tenant=None)
    for field in ("key", "max_attempts", "dedupe_key", "priority", "payload_json"):
        assert getattr(real, field) == getattr(alike, field), field
    assert job.concurrency.lease == 30.0


def test_c4_the_pass_lease_is_declared() -> None:
    """C4: ``lease=`` sets the pass's job lease (how soon another worker resumes a pass whose
    worker died); a bad one is refused at definition."""
    assert _declare(lease=timedelta(seconds=5)).job.concurrency.lease == 5.0
    with pytest.raises(ConfigurationError, match="lease"):
        _declare(lease=0)
