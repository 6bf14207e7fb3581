# ruff: noqa: ANN401, ARG002, PLR0917 - a benchmark script over untyped ASGI and store handles
"""webhooks: outbound webhook deliveries (SPEC §16, issue 29) to a local receiver.

``webhooks.deliver.cN`` (deliveries/s): N deliveries to one endpoint, written and enqueued in
one unit of work, then sent by a worker runtime (``max_in_flight=c``) through the sender's own
pooled httpx client (W5's resolution and pin, W2's signing, each attempt recorded) to an ASGI
receiver served by uvicorn on 127.0.0.1 that answers 200 at once; timed from the runtime's
start to the receiver's N-th request. Baseline: a raw httpx loop (one client, ``c`` tasks)
posting the same signed bodies to the same receiver.

``webhooks.enqueue`` (ms per send): ``sender.send(topic, payload)`` to one subscribed endpoint
inside a unit of work, sequentially, beside a plain ``backend.enqueue`` of a job run with the
same payload inside the same kind of unit of work.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import httpx
import uvicorn
from sqlalchemy import MetaData

from benchmarks._harness import Bench, Figure, paired_rounds
from ship_sqla import create_job_backend, create_unit_of_work, define_job, start_job_runtime
from ship_sqla.webhooks import (
    create_webhook_delivery_store,
    create_webhook_sender,
    new_webhook_secret,
    ship_webhook_deliveries_table,
    ship_webhook_endpoints_table,
    webhook_headers,
)

__all__ = ["NAME", "run"]

NAME = "webhooks"
CONCURRENCY = (1, 10, 100)
PAYLOAD = {"order": 42, "status": "paid", "lines": [{"sku": "a-1", "qty": 2}]}


class _Receiver:
    def __init__(self) -> None:
        self.count = 0
        self.target = 0
        self.done = asyncio.Event()

    def expect(self, target: int) -> None:
        self.count, self.target = 0, target
        self.done = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        self.count += 1
        if self.count >= self.target:
            self.done.set()


async def _ship_round(
    engine: Any, backend: Any, sender: Any, receiver: _Receiver, n: int, c: int
) -> float:
    uow = create_unit_of_work(engine, repositories=lambda scope: scope)

    async def send_all(scope: Any) -> None:
        for _ in range(n):
            await sender.send("order.paid", PAYLOAD, scope=scope)

    await uow.run(send_all)
    receiver.expect(n)
    started = time.perf_counter()
    async with await start_job_runtime(sender.jobs, backend=backend, max_in_flight=c):
        await asyncio.wait_for(receiver.done.wait(), 600)
        elapsed = time.perf_counter() - started
    return n / elapsed


async def _raw_round(url: str, secret: str, receiver: _Receiver, n: int, c: int) -> float:
    receiver.expect(n)
    body = httpx.Request("POST", url, json=PAYLOAD).content
    queue = list(range(n))
    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:

        async def worker() -> None:
            while queue:
                index = queue.pop()
                headers = webhook_headers(secret, f"msg_{index}", int(time.time()), body)
                headers["content-type"] = "application/json"
                response = await client.post(url, content=body, headers=headers)
                response.raise_for_status()

        await asyncio.gather(*(worker() for _ in range(c)))
    return n / (time.perf_counter() - started)


async def _enqueue_round(
    engine: Any, backend: Any, sender: Any, job: Any, m: int
) -> tuple[float, float]:
    uow = create_unit_of_work(engine, repositories=lambda scope: scope)
    started = time.perf_counter()
    for _ in range(m):
        await uow.run(lambda scope: sender.send("order.paid", PAYLOAD, scope=scope))
    ours = (time.perf_counter() - started) / m * 1000
    started = time.perf_counter()
    for _ in range(m):
        await uow.run(lambda scope: backend.enqueue(job, PAYLOAD, scope=scope))
    theirs = (time.perf_counter() - started) / m * 1000
    return ours, theirs


async def _noop(_ctx: Any, _payload: Any) -> None:
    return None


async def run(bench: Bench) -> list[Figure]:
    n = 200 if bench.quick else 1000
    m = 100 if bench.quick else 500
    figures: list[Figure] = []
    receiver = _Receiver()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/hooks"
    server = uvicorn.Server(
        uvicorn.Config(receiver, lifespan="off", log_level="warning", access_log=False)
    )
    serving = asyncio.ensure_future(server.serve([sock]))
    try:
        async with bench.database(NAME) as db:
            await db.create_job_tables()
            metadata = MetaData()
            endpoints = ship_webhook_endpoints_table(metadata)
            deliveries = ship_webhook_deliveries_table(metadata)
            async with db.engine.begin() as connection:
                await connection.run_sync(metadata.create_all)
            backend = create_job_backend(database=db.engine)
            store = create_webhook_delivery_store(
                database=db.engine, endpoints_table=endpoints, deliveries_table=deliveries
            )
            sender = create_webhook_sender(store=store, backend=backend, allow=["127.0.0.1/32"])
            secret = new_webhook_secret()
            await sender.add_endpoint(url, ["order.paid"], secret=secret)
            for c in CONCURRENCY:
                bench.log(f"webhooks: {n} deliveries at concurrency {c}")
                ours, theirs = await paired_rounds(
                    bench.rounds,
                    lambda c=c: _ship_round(db.engine, backend, sender, receiver, n, c),
                    lambda c=c: _raw_round(url, secret, receiver, n, c),
                )
                figures.append(
                    Figure.from_rounds(
                        f"webhooks.deliver.c{c}",
                        "deliveries/s",
                        ours,
                        theirs,
                        baseline_label=f"raw httpx loop, {c} tasks, same signed bodies",
                        note=f"{n} deliveries, one endpoint, receiver answering 200 at once",
                    )
                )
            job = define_job("bench.webhooks.plain", _noop, payload=dict)
            pairs = [
                await _enqueue_round(db.engine, backend, sender, job, m)
                for _ in range(bench.rounds)
            ]
            figures.append(
                Figure.from_rounds(
                    "webhooks.enqueue",
                    "ms/send",
                    [p[0] for p in pairs],
                    [p[1] for p in pairs],
                    baseline_label="a plain job enqueue in a unit of work, same payload",
                    note=f"{m} sequential units of work, one subscribed endpoint",
                )
            )
            await sender.aclose()
    finally:
        server.should_exit = True
        await serving
        sock.close()
    return figures
