"""One process of the fault suite (tests/integration/test_fault_suite.py), run until SIGTERM:
``python fault_process.py worker|relay URL CONFIG_JSON``.

- ``worker``: the job runtime (``start_job_runtime``) on a ``create_job_backend`` over URL,
  executing the preloaded runs of job ``faults.work``;
- ``relay``: an outbox relay (``start_outbox_relay``) publishing outbox ``faults``.

Both use the package's public API only, on a plain engine (a pool without pre-ping, as an
application has). Each side effect is one JSON line on stdout, written when it happens, so the
test counts executions without asking the database that is being restarted:

- ``{"event": "ready"}`` once running;
- ``{"event": "run", "id": ..., "attempt": ...}`` at the end of each handler execution;
- ``{"event": "message", "id": ..., "attempt": ...}`` for each message the sink published;
- on SIGTERM ``{"event": "stopped", "running": ..., "errors": {...}}``: whether the runtime or
  relay was still running when asked to stop (its loop never died), and the errors its
  ``on_error`` received, by type. Then it stops gracefully and exits 0.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections import Counter
from typing import Any

from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import create_async_engine

from ship_sqla import (
    create_job_backend,
    create_outbox,
    define_job,
    ship_job_runs_table,
    ship_job_state_table,
    ship_outbox_table,
    start_job_runtime,
    start_outbox_relay,
)
from ship_sqla.jobs import Concurrency, RetryPolicy

OUTBOX_ID = "faults"
JOB_ID = "faults.work"


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


class Errors:
    """The ``on_error`` of the process: counts what the loops absorbed, by type."""

    def __init__(self) -> None:
        self.by_type: Counter[str] = Counter()
        self.samples: dict[str, str] = {}

    def __call__(self, error: BaseException) -> None:
        name = type(error).__name__
        self.by_type[name] += 1
        self.samples.setdefault(name, str(error)[:300])


async def worker(url: str, config: dict[str, Any], stop: asyncio.Event) -> None:
    engine = create_async_engine(url)
    errors = Errors()
    metadata = MetaData()
    backend = create_job_backend(
        database=engine,
        table=ship_job_runs_table(metadata),
        state_table=ship_job_state_table(metadata),
        on_error=errors,
    )

    async def work(ctx: Any, payload: Any) -> None:
        await asyncio.sleep(config["work_seconds"])  # the handler's work
        emit(event="run", id=ctx.run_id, attempt=ctx.attempt)

    job = define_job(
        JOB_ID,
        work,
        payload=dict,
        concurrency=Concurrency(max=config["max_in_flight"], lease=config["lease"]),
        retry=RetryPolicy(attempts=config["attempts"], base_delay=0.05),
    )
    runtime = await start_job_runtime(
        [job],
        backend=backend,
        drain_timeout=10,
        poll_interval=config["poll_interval"],
        max_in_flight=config["max_in_flight"],
    )
    emit(event="ready")
    await stop.wait()
    emit(event="stopped", running=runtime.running, errors=errors.by_type, samples=errors.samples)
    await runtime.stop()
    await engine.dispose()


async def relay(url: str, config: dict[str, Any], stop: asyncio.Event) -> None:
    engine = create_async_engine(url)
    errors = Errors()
    outbox = create_outbox(database=engine, table=ship_outbox_table(MetaData()), on_error=errors)

    async def sink(message: Any) -> None:
        await asyncio.sleep(config["work_seconds"])  # the publish to a broker
        emit(event="message", id=str(message.id), attempt=message.attempt)

    the_relay = await start_outbox_relay(
        outbox,
        OUTBOX_ID,
        sink,
        batch_size=config["batch_size"],
        lease=config["lease"],
        poll_interval=config["poll_interval"],
    )
    emit(event="ready")
    await stop.wait()
    emit(event="stopped", running=the_relay.running, errors=errors.by_type, samples=errors.samples)
    await the_relay.stop()
    await engine.dispose()


async def main(role: str, url: str, config: dict[str, Any]) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await {"worker": worker, "relay": relay}[role](url, config, stop)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))
