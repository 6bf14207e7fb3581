"""W1 under a crash (SPEC §16, issue 29's fault test, without the PostgreSQL restart: the
server is shared here): a worker process is killed with SIGKILL while its deliveries are in
flight to a real receiver; a second worker retakes them once their leases lapse. Every
delivery arrives at least once, every one ends delivered, and the receiver's dedupe by
webhook-id sees duplicates only for the sends that were in flight at the kill."""

from __future__ import annotations

import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
from sqlalchemy import MetaData, func, select
from webhook_receiver import Receiver, serve

from ship_sqla import (
    create_job_backend,
    create_unit_of_work,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_workers_table,
)
from ship_sqla.webhooks import (
    create_webhook_sender,
    new_webhook_secret,
    ship_webhook_deliveries_table,
    ship_webhook_endpoints_table,
)

WORKER = Path(__file__).parents[1] / "support" / "webhook_worker_process.py"
COUNT = 30


async def _start_worker(url: str) -> Any:
    process = await anyio.open_process([sys.executable, str(WORKER), url])
    assert process.stdout is not None
    with anyio.fail_after(30):
        line = b""
        async for chunk in process.stdout:
            line += chunk
            if b"\n" in line:
                break
    assert b'"ready"' in line, line
    return process


async def test_w1_a_worker_killed_mid_send_loses_nothing_and_duplicates_only_in_flight(
    ship_engine: Any, ship_engine_url: str
) -> None:
    """W1: a worker killed (SIGKILL) with sends in flight loses no delivery: another worker
    retakes the lapsed runs and every delivery arrives at least once and ends delivered; a
    webhook-id arrives twice only if it was in flight at the kill (the receiver's dedupe
    key)."""
    metadata = MetaData()
    ship_job_runs_table(metadata)
    ship_job_state_table(metadata)
    ship_job_workers_table(metadata)
    deliveries = ship_webhook_deliveries_table(metadata)
    ship_webhook_endpoints_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(database=ship_engine)
    sender = create_webhook_sender(database=ship_engine, backend=backend)
    secret = new_webhook_secret()
    receiver = Receiver([secret])
    receiver.hold = anyio.Event()  # answers wait: the first worker dies with sends in flight
    async with serve(receiver):
        await sender.add_endpoint(receiver.url, ["order.paid"], secret=secret)
        uow = create_unit_of_work(ship_engine, repositories=lambda scope: scope)

        async def send_all(scope: Any) -> list[str]:
            ids: list[str] = []
            for n in range(COUNT):
                ids += await sender.send("order.paid", {"order": n}, scope=scope)
            return ids

        ids = await uow.run(send_all)
        first = await _start_worker(ship_engine_url)
        await receiver.wait_for(3, limit=30)
        first.send_signal(signal.SIGKILL)
        await first.wait()
        # Every request the first worker made arrived (recorded before the held answer).
        in_flight = {r.headers["webhook-id"] for r in receiver.requests}
        receiver.hold.set()
        second = await _start_worker(ship_engine_url)
        try:

            async def all_delivered() -> bool:
                async with ship_engine.connect() as connection:
                    query = select(func.count()).where(deliveries.c.state == "delivered")
                    return await connection.scalar(query) == COUNT

            with anyio.fail_after(60):
                while not await all_delivered():
                    await anyio.lowlevel.checkpoint()
        finally:
            second.send_signal(signal.SIGKILL)
            await second.wait()
    seen = Counter(r.headers["webhook-id"] for r in receiver.requests)
    assert set(seen) == set(ids)
    duplicated = {webhook_id for webhook_id, n in seen.items() if n > 1}
    # The held sends never got their answer to the killed worker: each is sent again, and
    # nothing else is (max_in_flight=5: 5 in flight at the kill, in the runs measured).
    assert in_flight
    assert duplicated == in_flight
    assert all(r.verified_by == [0] for r in receiver.requests)
    await sender.aclose()
