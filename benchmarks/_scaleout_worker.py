"""One worker process of ``benchmarks/scaleout.py``: a ship_sqla worker runtime on its own engine.

``python -m benchmarks._scaleout_worker URL JOB_ID CONFIG_JSON``. ``CONFIG_JSON`` is
``{"runtime": {...}, "job": {...}, "handler_ms": N}``: keyword arguments of
``start_job_runtime`` and of ``define_job`` (a ``"concurrency"`` entry is ``Concurrency``'s
keyword arguments), and how long each handler awaits (0: a noop). The lines on
stdin and stdout are the protocol with the parent:

1. it makes the engine (to ``URL``, the proxy's), opens ``WARM`` pooled connections so the
   timed part does not pay their handshakes, makes the backend and the job, prints ``ready``;
2. on ``go`` it starts the runtime (``start_job_runtime``): the parent's clock is running;
3. on ``stop`` (or EOF) it stops the runtime and prints ``done <handled> <errors> <cpu>``: how
   many handler calls it ran, how many errors the backend reported (``on_error``) and the CPU
   seconds this process used from ``go`` until the runtime stopped; then it exits.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from ship_sqla import JobContext, define_job, start_job_runtime
from ship_sqla._jobs import create_job_backend
from ship_sqla.jobs import Concurrency, JobDefinition

__all__ = ["WARM", "main"]

WARM = 5
"""Connections opened before ``ready``: SQLAlchemy's default ``pool_size``."""


async def _line(reader: asyncio.StreamReader) -> str:
    return (await reader.readline()).decode().strip()


async def _run(url: str, job_id: str, config: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    handled = 0
    errors: list[BaseException] = []

    pause = float(config.get("handler_ms", 0.0)) / 1000.0

    async def handler(_ctx: JobContext, _payload: dict[str, Any]) -> None:
        nonlocal handled
        handled += 1
        if pause:
            await asyncio.sleep(pause)

    job_kwargs = dict(config.get("job", {}))
    if isinstance(job_kwargs.get("concurrency"), dict):
        job_kwargs["concurrency"] = Concurrency(**job_kwargs["concurrency"])
    job: JobDefinition[dict[str, Any]] = define_job(job_id, handler, payload=dict, **job_kwargs)
    engine = create_async_engine(url)
    try:
        connections = [await engine.connect() for _ in range(WARM)]
        for connection in connections:
            await connection.execute(text("SELECT 1"))
        for connection in connections:
            await connection.close()
        backend = create_job_backend(database=engine, on_error=errors.append)
        print("ready", flush=True)
        if await _line(reader) != "go":
            return
        cpu = time.process_time()
        runtime = await start_job_runtime(job, backend=backend, **config.get("runtime", {}))
        try:
            await _line(reader)  # "stop", or "" at EOF
        finally:
            await runtime.stop()
        cpu = time.process_time() - cpu
        print(f"done {handled} {len(errors)} {cpu:.3f}", flush=True)
    finally:
        await engine.dispose()


def main() -> None:
    url, job_id, config = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    asyncio.run(_run(url, job_id, config))


if __name__ == "__main__":
    main()
