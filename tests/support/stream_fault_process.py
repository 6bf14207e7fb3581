"""One worker process of the consumer and backfill fault test
(tests/integration/test_consumer_backfill_faults.py), run until SIGTERM or SIGKILL:
``python stream_fault_process.py URL CONFIG_JSON``.

It runs the job runtime (``start_job_runtime`` on ``create_job_backend``, the public API only)
with two things to do:

- the consumer ``faults.stream`` (its per-key job and its supervisor) over the table
  ``fc_stream`` (one stream per key, items in id order). Each batch inserts one ``fc_effects``
  row per item, tagged with the batch's token, and the cursor past it goes to ``fc_cursors``, in
  the batch's one transaction (C1);
- the backfill ``faults.backfill`` over ``bf_items`` with ``transaction=``: each page inserts one
  ``bf_visits`` row per row and one ``bf_pages`` row, tagged with the page's token, in the page's
  transaction with its checkpoint (C4).

No table has a unique constraint on what it records: a duplicate commit would show.

Each batch and page writes its rows first, then prints one JSON line (``{"event": "batch",
"token": ..., "pid": ..., "key": ..., "ids": [...]}`` or ``{"event": "page", "token": ...,
"pid": ..., "ids": [...]}``),
then waits for the test's ``go TOKEN`` line on stdin before it returns (and its transaction
commits): the test kills a process instead of answering, so the kill lands mid-batch, with the
batch's rows written and not committed, every time. ``{"event": "ready"}`` once running; on
SIGTERM it drains and exits 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from typing import Any

import attrs
from sqlalchemy import Column, Integer, MetaData, Table, select, text
from sqlalchemy.ext.asyncio import create_async_engine

from ship_sqla import (
    create_job_backend,
    create_unit_of_work,
    ship_job_runs_table,
    ship_job_state_table,
    start_job_runtime,
)
from ship_sqla.backfills import (
    create_backfill_ledger,
    define_backfill,
    selectable_source,
    ship_backfills_table,
)
from ship_sqla.consumers import define_consumer
from ship_sqla.jobs import Concurrency, RetryPolicy

CONSUMER_ID = "faults.stream"
BACKFILL_ID = "faults.backfill"

metadata = MetaData()
runs_table = ship_job_runs_table(metadata)
state_table = ship_job_state_table(metadata)
ledger_table = ship_backfills_table(metadata)
bf_items = Table("bf_items", metadata, Column("id", Integer, primary_key=True))

READ_PAGE = text(
    "SELECT id FROM fc_stream WHERE key = :key AND id > :after ORDER BY id LIMIT 100"
)  # served by fc_stream_key_id_idx
ADD_EFFECTS = text(
    "INSERT INTO fc_effects (key, item_id, token)"
    " SELECT :key, unnest(CAST(:ids AS bigint[])), :token"
)
LOAD_CURSOR = text("SELECT position FROM fc_cursors WHERE key = :key")
SAVE_CURSOR = text(
    "INSERT INTO fc_cursors (key, position) VALUES (:key, :position)"
    " ON CONFLICT (key) DO UPDATE SET position = excluded.position"
)
ADD_VISITS = text(
    "INSERT INTO bf_visits (item_id, token) SELECT unnest(CAST(:ids AS int[])), :token"
)
ADD_PAGE = text("INSERT INTO bf_pages (first_id, last_id, token) VALUES (:first, :last, :token)")


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


class Gate:
    """The test's answers on stdin: ``go TOKEN`` releases the batch or page ``TOKEN``."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[None]] = {}

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            verb, token = line.decode().split()
            assert verb == "go", line
            self._waiting.setdefault(token, loop.create_future()).set_result(None)

    async def passed(self, token: str, **line: Any) -> None:
        """Print ``line`` with ``token`` and wait for the test's go."""
        waiting = self._waiting.setdefault(token, asyncio.get_running_loop().create_future())
        emit(token=token, pid=os.getpid(), **line)
        try:
            await waiting
        finally:
            del self._waiting[token]


class Cursors:
    """The consumer's cursor seam over ``fc_cursors`` (the repositories are the scope)."""

    async def load(self, key: str, scope: Any) -> int | None:
        row = (await scope.connection.execute(LOAD_CURSOR, {"key": key})).first()
        return None if row is None else int(row.position)

    async def save(self, key: str, cursor: int, scope: Any) -> None:
        await scope.connection.execute(SAVE_CURSOR, {"key": key, "position": cursor})


async def main(url: str, config: dict[str, Any]) -> None:
    engine = create_async_engine(url, pool_size=8)
    uow = create_unit_of_work(engine, repositories=lambda scope: scope)
    backend = create_job_backend(database=engine, table=runs_table, state_table=state_table)
    lease = float(config["lease"])
    gate = Gate()
    answers = asyncio.create_task(gate.serve())
    keys_list = list(config["keys"])

    async def keys(_ctx: Any) -> list[str]:
        return keys_list

    async def read(_ctx: Any, key: str, cursor: int | None) -> Any:
        # One short read per page: no snapshot is held between batches.
        after = cursor or 0
        while True:
            async with engine.connect() as connection:
                ids = [
                    row.id
                    for row in await connection.execute(READ_PAGE, {"key": key, "after": after})
                ]
            if not ids:
                return
            for item_id in ids:
                after = item_id
                yield item_id

    async def handle(_ctx: Any, key: str, ids: list[int], scope: Any) -> int:
        token = uuid.uuid4().hex
        await scope.connection.execute(ADD_EFFECTS, {"key": key, "ids": ids, "token": token})
        await asyncio.sleep(config["work_seconds"])  # the rest of the batch's work
        await gate.passed(token, event="batch", key=key, ids=ids)  # a kill lands here
        return ids[-1]

    consumer = define_consumer(
        CONSUMER_ID,
        keys=keys,
        open=read,
        handle=handle,
        cursor=Cursors(),
        transaction=uow,
        batch=config["batch"],
        lease=lease,
        retry=RetryPolicy(attempts=100, base_delay=0.05, max_delay=0.5),
    )

    async def visit(_ctx: Any, rows: Any, scope: Any) -> None:
        token = uuid.uuid4().hex
        ids = [row.id for row in rows]
        await scope.connection.execute(ADD_VISITS, {"ids": ids, "token": token})
        await scope.connection.execute(ADD_PAGE, {"first": ids[0], "last": ids[-1], "token": token})
        await gate.passed(token, event="page", ids=ids)  # a kill lands here

    backfill = define_backfill(
        BACKFILL_ID,
        source=selectable_source(engine, select(bf_items.c.id), key=[bf_items.c.id]),
        handle=visit,
        pace=config["pace"],
        page_size=config["page_size"],
        ledger=create_backfill_ledger(database=engine, table=ledger_table),
        transaction=uow,
    )
    # The backfill job's backoff is BACKFILL_RETRY's (from 1 s) and its lease is set here with
    # it (define_backfill(lease=) sets the lease alone): a killed holder's run is retaken in
    # seconds (J6), not minutes.
    backfill_job = attrs.evolve(
        backfill.job,
        concurrency=Concurrency(single_runner=True, lease=lease),
        retry=RetryPolicy(attempts=100, base_delay=0.05, max_delay=0.5),
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    runtime = await start_job_runtime(
        [*consumer.jobs, backfill_job],
        backend=backend,
        worker_id=f"w{os.getpid()}",
        poll_interval=0.1,
        max_in_flight=8,
    )
    emit(event="ready")
    await stop.wait()
    await runtime.stop(drain_timeout=10)
    answers.cancel()
    await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))
