"""F6, issue 27 item 8: which jobs the live workers serve, as enqueue, jobs stats and the
dashboard read the worker registry (``kernel/_serving.py``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ship_sqla.jobs import WorkerRecord
from ship_sqla.kernel._serving import serving_of
from ship_sqla.kernel._workers import WORKER_STALE_AFTER

NOW = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)


def _worker(worker_id: str, jobs: tuple[str, ...], *, seen_ago: float, draining: bool = False):
    return WorkerRecord(
        worker_id=worker_id,
        host="h",
        pid=1,
        started_at=NOW - timedelta(hours=1),
        last_seen_at=NOW - timedelta(seconds=seen_ago),
        job_ids=jobs,
        in_flight=0,
        draining=draining,
    )


def test_f6_only_fresh_running_workers_serve_a_job() -> None:
    """F6: a worker serves its jobs while it is not draining and was seen within
    WORKER_STALE_AFTER; each live worker counts once per job; a job none of them declares is
    unserved (with the closest served id as the likely intent), and with no live worker at
    all nothing is unserved (the workers may not have started yet)."""
    records = [
        _worker("a", ("mail.send", "mail.send", "report"), seen_ago=1),
        _worker("b", ("mail.send",), seen_ago=WORKER_STALE_AFTER - 1),
        _worker("stale", ("billing",), seen_ago=WORKER_STALE_AFTER + 1),
        _worker("leaving", ("billing",), seen_ago=1, draining=True),
    ]
    served = serving_of(records, now=NOW)
    assert served.live_workers == 2
    assert (served.workers_for("mail.send"), served.workers_for("report")) == (2, 1)
    assert served.workers_for("billing") == 0
    assert served.unserved("billing")
    assert not served.unserved("mail.send")
    assert served.closest("mail.sned") == "mail.send"
    assert served.closest("zzz") is None
    nobody = serving_of(records[2:], now=NOW)
    assert nobody.live_workers == 0
    assert not nobody.unserved("billing")
