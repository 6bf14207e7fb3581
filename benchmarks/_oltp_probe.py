"""The OLTP probe of ``benchmarks/backfill.py``, in a process of its own so the backfill's worker
runtime (in the benchmark's process) does not share its event loop.

``python -m benchmarks._oltp_probe DSN SECONDS ROWS RATE``: one asyncpg connection running, for
SECONDS, RATE probes a second (each starts at its slot, or at once when late), one transaction
each: a primary-key SELECT of a random row of ``bench_accounts`` (ids 1..ROWS) and a one-row
UPDATE of its balance. Prints one JSON line: the probes' latencies in milliseconds.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

import asyncpg

SELECT = "SELECT id, balance FROM bench_accounts WHERE id = $1"  # bench_accounts_pkey
UPDATE = "UPDATE bench_accounts SET balance = balance + 1 WHERE id = $1"


async def probe(dsn: str, seconds: float, rows: int, rate: float) -> list[float]:
    connection = await asyncpg.connect(dsn)
    rng = random.Random(28)
    latencies: list[float] = []
    try:
        for _ in range(50):  # warm the connection's statement cache, not measured
            async with connection.transaction():
                await connection.fetchrow(SELECT, 1)
                await connection.execute(UPDATE, 1)
        start = time.perf_counter()
        ends = start + seconds
        for n in range(int(seconds * rate)):
            await asyncio.sleep(max(0.0, start + n / rate - time.perf_counter()))
            began = time.perf_counter()
            if began >= ends:
                break
            account = rng.randint(1, rows)
            async with connection.transaction():
                await connection.fetchrow(SELECT, account)
                await connection.execute(UPDATE, account)
            latencies.append((time.perf_counter() - began) * 1000)
    finally:
        await connection.close()
    return latencies


if __name__ == "__main__":
    measured = asyncio.run(
        probe(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    )
    sys.stdout.write(json.dumps(measured) + "\n")
