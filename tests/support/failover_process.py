"""One process of the failover test (tests/integration/test_failover.py), run until SIGTERM:
``python failover_process.py worker|relay|writer URL CONFIG_JSON``.

Every role uses the package's public API only, on a plain engine over the multi-host URL (J24),
with no restart and no configuration beyond the URL:

- ``writer``: a unit of work committing, per transaction, one ``fo_app`` row, one outbox
  message (O1) and one run of job ``failover.work`` (K1: its wake is sent in the same
  transaction), all carrying the transaction's key. The run and the message are due
  ``config["due_after"]`` seconds later: work committed before a fault falls due after the
  promote, so workers and relay show that they follow even while the writer does not. Each
  acknowledged commit (``uow.run`` returned) is one ``{"event": "ack", "key": ...}`` line; a
  call that raised is one ``error`` line and the writer goes on (an application would);
- ``worker``: the job runtime executing ``failover.work`` (J5 leases, J11 ``on_error``); each
  handler start is one ``{"event": "exec", "key": ..., "attempt": ...}`` line;
- ``relay``: an outbox relay; each message given to the sink is one ``publish`` line.

Every line carries ``at`` (``time.time()``, the test's clock). Every exception that reaches the
writer, or an ``on_error`` (the job backend's, the outbox's), is one ``{"event": "error", ...}``
line saying whether it is a ``ShipError`` with a Fix line. ``{"event": "ready"}`` once running;
on SIGTERM ``{"event": "stopped", "running": ...}`` (whether the loop was still running), then a
graceful stop and exit 0. SIGUSR1 prints every asyncio task's stack on stderr.

``config["synchronous_claims"]``: the job backend's option making claims and settles commit
synchronously (J24; the outbox's always are); ``config["operation_timeout"]``: the bound of
every operation of the backend, the outbox and the unit of work on the server (J24).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Column, MetaData, Table, Text, insert
from sqlalchemy.ext.asyncio import create_async_engine

from ship_sqla import (
    create_job_backend,
    create_outbox,
    create_unit_of_work,
    define_job,
    ship_job_runs_table,
    ship_job_state_table,
    ship_outbox_table,
    start_job_runtime,
    start_outbox_relay,
)
from ship_sqla.errors import ShipError
from ship_sqla.jobs import Concurrency, RetryPolicy

OUTBOX_ID = "failover"
JOB_ID = "failover.work"

metadata = MetaData()
runs_table = ship_job_runs_table(metadata)
state_table = ship_job_state_table(metadata)
outbox_table = ship_outbox_table(metadata)
app_table = Table("fo_app", metadata, Column("key", Text, primary_key=True))


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps({**fields, "at": time.time()}) + "\n")
    sys.stdout.flush()


def report(role: str, error: BaseException) -> None:
    """One ``error`` line: its type, and whether it is a ShipError with a Fix line."""
    fixed = isinstance(error, ShipError) and bool(error.fix)
    emit(event="error", role=role, type=type(error).__name__, fixed=fixed, text=str(error)[:400])


def engine_of(url: str) -> Any:
    return create_async_engine(url, pool_size=4, max_overflow=2)


def backend_of(engine: Any, config: dict[str, Any], role: str) -> Any:
    return create_job_backend(
        database=engine,
        table=runs_table,
        state_table=state_table,
        on_error=lambda error: report(role, error),
        operation_timeout=config["operation_timeout"],
        synchronous_claims=config["synchronous_claims"],
    )


def outbox_of(engine: Any, config: dict[str, Any], role: str) -> Any:
    return create_outbox(
        database=engine,
        table=outbox_table,
        on_error=lambda error: report(role, error),
        operation_timeout=config["operation_timeout"],
    )


def job_of(config: dict[str, Any], handler: Any) -> Any:
    return define_job(
        JOB_ID,
        handler,
        payload=dict,
        concurrency=Concurrency(max=config["max_in_flight"], lease=config["lease"]),
        retry=RetryPolicy(attempts=config["attempts"], base_delay=0.05),
    )


async def executed_elsewhere(ctx: Any, payload: dict[str, Any]) -> None:
    """The writer only enqueues: the workers execute."""
    raise AssertionError(ctx)


async def writer(url: str, config: dict[str, Any], stop: asyncio.Event) -> None:
    engine = engine_of(url)
    backend = backend_of(engine, config, "writer")
    outbox = outbox_of(engine, config, "writer")
    job = job_of(config, executed_elsewhere)
    uow = create_unit_of_work(
        engine,
        repositories=lambda scope: scope,
        operation_timeout=config["operation_timeout"],
    )
    emit(event="ready")
    for n in range(10**9):
        if stop.is_set():
            break
        key = f"{os.getpid()}-{n}"

        async def write(scope: Any, key: str = key) -> None:
            due = datetime.now(UTC) + timedelta(seconds=config["due_after"])
            await scope.connection.execute(insert(app_table).values(key=key))
            await outbox.enqueue(
                OUTBOX_ID, "failover.write", {"key": key}, available_at=due, scope=scope
            )
            await backend.enqueue(job, {"key": key}, run_at=due, scope=scope)

        try:
            await uow.run(write)
        except Exception as error:
            report("writer", error)
            await asyncio.sleep(config["writer_backoff"])  # an application's retry pause
            continue
        emit(event="ack", key=key)
        await asyncio.sleep(config["writer_pace"])
    emit(event="stopped", running=True)
    await engine.dispose()


async def worker(url: str, config: dict[str, Any], stop: asyncio.Event) -> None:
    engine = engine_of(url)
    backend = backend_of(engine, config, "worker")

    async def work(ctx: Any, payload: dict[str, Any]) -> None:
        emit(event="exec", key=payload["key"], attempt=ctx.attempt)
        await asyncio.sleep(config["work_seconds"])  # the handler's work

    runtime = await start_job_runtime(
        [job_of(config, work)],
        backend=backend,
        drain_timeout=5,
        poll_interval=config["poll_interval"],
        max_in_flight=config["max_in_flight"],
    )
    emit(event="ready")
    await stop.wait()
    emit(event="stopped", running=runtime.running)
    await runtime.stop()
    await engine.dispose()


async def relay(url: str, config: dict[str, Any], stop: asyncio.Event) -> None:
    engine = engine_of(url)
    outbox = outbox_of(engine, config, "relay")

    async def sink(message: Any) -> None:
        emit(event="publish", key=message.payload["key"], attempt=message.attempt)

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
    emit(event="stopped", running=the_relay.running)
    await the_relay.stop()
    await engine.dispose()


def dump_tasks() -> None:
    """SIGUSR1: every task's stack on stderr (what a process that stopped following waits on),
    then a ``tasks dumped`` line the test waits for."""
    for task in asyncio.all_tasks():
        sys.stderr.write(f"--- task {task.get_name()} ---\n")
        awaited: Any = task.get_coro()
        while awaited is not None:  # the whole await chain, not the outermost frame alone
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
            if frame is not None:
                sys.stderr.write(
                    f"  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}\n"
                )
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
    sys.stderr.write("tasks dumped\n")
    sys.stderr.flush()


async def main(role: str, url: str, config: dict[str, Any]) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump_tasks)
    await {"worker": worker, "relay": relay, "writer": writer}[role](url, config, stop)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))
