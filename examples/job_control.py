"""Job control on PostgreSQL: outcome kinds, a per-run timeout, priorities, cancel, pause/resume.

    python examples/job_control.py        # or: python -m examples.job_control

Extras: the ``embedded`` extra unless ``SHIP_SQLA_DATABASE_URL`` names a server, which it then
uses, in a scratch database it drops at the end. Each section prints what happened and the
run's history kinds (``ship-sqla jobs show RUN_ID`` prints the same).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from sqlalchemy import MetaData

from ship_sqla import (
    JobContext,
    create_job_backend,
    create_job_operations,
    define_job,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_workers_table,
    start_job_runtime,
)
from ship_sqla.errors import RetryAfter, Snooze, TerminalError
from ship_sqla.jobs import Concurrency, RetryPolicy
from ship_sqla.testing import DatabaseFactory, resolve_server

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ship_sqla.jobs import JobDefinition, JobOperations

metadata = MetaData()
job_runs = ship_job_runs_table(metadata)
job_state = ship_job_state_table(metadata)
job_workers = ship_job_workers_table(metadata)
FAST = RetryPolicy(attempts=3, base_delay=0.05, max_delay=0.2)


async def allow_everything(_permission: str, _operation: str) -> bool:
    return True  # an application checks its operator's role here


async def main() -> None:
    factory = DatabaseFactory(resolve_server(prefer_embedded=True))
    async with factory.private(name="ship_sqla_job_control_example") as (_, engine):
        await run(engine)


async def until(ops: JobOperations, run_id: str | None, *states: str) -> dict[str, Any]:
    """Wait (at most 30 s) until the run is in one of ``states``; its state and history kinds."""
    assert run_id is not None
    async with asyncio.timeout(30):
        while True:
            record = await ops.get_run(run_id)
            assert record is not None
            if record.state in states:
                kinds = [entry.get("kind") for entry in record.history]
                return {"state": record.state, "attempt": record.attempt, "history": kinds}
            await asyncio.sleep(0.02)


class Handlers:
    """The example's handlers, and what the cancelled and the prioritised ones observed."""

    def __init__(self) -> None:
        self.encoding = asyncio.Event()
        self.observed_cancel = asyncio.Event()
        self.emails_sent = asyncio.Event()
        self.order: list[str] = []

    # --- K4: how a handler ends an attempt ---------------------------------------------------
    async def build_export(self, ctx: JobContext, _payload: dict[str, Any]) -> None:
        if ctx.snoozes < 2:
            raise Snooze(0.05, "the export is not ready yet")  # no attempt spent

    async def call_partner(self, ctx: JobContext, _payload: dict[str, Any]) -> None:
        if ctx.attempt == 1:
            raise RetryAfter(0.05, "429 Too Many Requests")  # spends the attempt, no backoff

    async def charge_card(self, _ctx: JobContext, _payload: dict[str, Any]) -> None:
        raise TerminalError("card declined")  # dead now, whatever attempts are left

    async def parse_feed(self, _ctx: JobContext, _payload: dict[str, Any]) -> None:
        raise ValueError("malformed feed")  # named non-retryable below: dead now too

    # --- K5: a per-run timeout -----------------------------------------------------------------
    async def slow_report(self, _ctx: JobContext, _payload: dict[str, Any]) -> None:
        await asyncio.sleep(3600)  # cancelled at the timeout; the attempt is a timeout failure

    # --- K2: a long handler an operator cancels ----------------------------------------------
    async def encode_video(self, _ctx: JobContext, _payload: dict[str, Any]) -> None:
        self.encoding.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.observed_cancel.set()  # clean up here; the run ends cancelled, not retried
            raise

    # --- K6: priorities --------------------------------------------------------------------------
    async def send_email(self, _ctx: JobContext, payload: dict[str, Any]) -> None:
        self.order.append(payload["to"])
        if len(self.order) == 3:
            self.emails_sent.set()

    def jobs(self) -> dict[str, JobDefinition[dict[str, Any]]]:
        jobs = [
            define_job("exports.build", self.build_export, payload=dict, retry=FAST),
            define_job("partner.call", self.call_partner, payload=dict, retry=FAST),
            define_job("billing.charge", self.charge_card, payload=dict, retry=FAST),
            define_job(
                "feeds.parse",
                self.parse_feed,
                payload=dict,
                retry=RetryPolicy(attempts=5, non_retryable=(ValueError,)),
            ),
            define_job("reports.slow", self.slow_report, payload=dict, timeout=0.2, retry=FAST),
            define_job("videos.encode", self.encode_video, payload=dict),
            # One at a time, so the claim order is visible.
            define_job(
                "emails.send", self.send_email, payload=dict, concurrency=Concurrency(max=1)
            ),
        ]
        return {job.id: job for job in jobs}


async def run(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    handlers = Handlers()
    by_id = handlers.jobs()
    backend = create_job_backend(
        database=engine,
        table=job_runs,
        state_table=job_state,
        workers_table=job_workers,
    )
    ops = create_job_operations(backend, authorizer=allow_everything)

    # K3: pause before the worker starts, so the emails queue up and their order shows K6.
    await ops.pause("emails.send")
    runtime = await start_job_runtime(list(by_id.values()), backend=backend, poll_interval=0.2)
    try:
        enqueued = {
            job_id: (await runtime.enqueue(by_id[job_id], {})).run_id
            for job_id in (
                "exports.build",
                "partner.call",
                "billing.charge",
                "feeds.parse",
                "reports.slow",
            )
        }
        print("snooze     ", await until(ops, enqueued["exports.build"], "completed"))
        print("retry-after", await until(ops, enqueued["partner.call"], "completed"))
        print("terminal   ", await until(ops, enqueued["billing.charge"], "dead"))
        print("non-retry  ", await until(ops, enqueued["feeds.parse"], "dead"))
        print("timeout    ", await until(ops, enqueued["reports.slow"], "dead"))

        # K2: cancel a running run; its handler observes the cancellation at once.
        video = await runtime.enqueue(by_id["videos.encode"], {})
        await asyncio.wait_for(handlers.encoding.wait(), 30)
        assert video.run_id is not None
        result = await ops.cancel(video.run_id)
        print(f"cancel     : {result.outcome} (the run was {result.record.state})")
        await asyncio.wait_for(handlers.observed_cancel.wait(), 30)
        print("cancelled  ", await until(ops, video.run_id, "cancelled"))
        again = await ops.cancel(video.run_id)
        print(f"cancel again: {again.outcome}, changed={again.changed}")

        # K3 + K6: the paused job's runs wait; resumed, they run higher priority first.
        for to, priority in (("low@example.com", -5), ("vip@example.com", 10), ("hi@x.io", 5)):
            await runtime.enqueue(by_id["emails.send"], {"to": to}, priority=priority)
        print("paused jobs:", [paused.job_id for paused in await ops.paused()])
        await ops.resume("emails.send")
        await asyncio.wait_for(handlers.emails_sent.wait(), 30)
        print("emails sent in order:", handlers.order)
    finally:
        await runtime.stop()


if __name__ == "__main__":
    asyncio.run(main())
