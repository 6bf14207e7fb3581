"""A worker process sending webhooks (tests/integration/test_webhooks_out_faults.py), run until
killed: ``python webhook_worker_process.py URL``. The public API only: the job backend, the
delivery store and the sender (allow: loopback; the delivery job's lease 1 s, so a killed
worker's runs are retaken quickly), served by a worker runtime. Prints ``{"event": "ready"}``
once running."""

from __future__ import annotations

import asyncio
import json
import sys

from sqlalchemy.ext.asyncio import create_async_engine

from ship_sqla import create_job_backend, start_job_runtime
from ship_sqla.jobs import Concurrency, RetryPolicy
from ship_sqla.webhooks import create_webhook_sender


async def main(url: str) -> None:
    engine = create_async_engine(url)
    backend = create_job_backend(database=engine)
    sender = create_webhook_sender(
        database=engine,
        backend=backend,
        allow=["127.0.0.1/32"],
        retry=RetryPolicy(attempts=10, base_delay=0.1, max_delay=0.5),
        concurrency=Concurrency(lease=1.0),
        timeout=30.0,
    )
    async with await start_job_runtime(
        sender.jobs, backend=backend, poll_interval=0.1, max_in_flight=5
    ):
        sys.stdout.write(json.dumps({"event": "ready"}) + "\n")
        sys.stdout.flush()
        await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
