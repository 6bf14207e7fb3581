"""F4 with a real paused process: a holder SIGSTOPped while it holds a fenced advisory lock,
whose session the server then ends (as ``idle_in_transaction_session_timeout`` would), loses the
lock to another holder; resumed, it still believes it holds the lock, and 100% of its fenced
writes are refused while the new holder's land (tests/support/fenced_holder.py)."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import anyio
from fenced_holder import fences, metadata, writes
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla import TransactionScope, advisory_lock_provider, create_unit_of_work

HOLDER = Path(__file__).parents[1] / "support" / "fenced_holder.py"
WRITES = 50


async def _line(stream: anyio.abc.ByteReceiveStream, buffer: bytearray) -> dict[str, object]:
    with anyio.fail_after(30):
        while b"\n" not in buffer:
            buffer.extend(await stream.receive())
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return json.loads(line)  # type: ignore[no-any-return]


async def test_f4_a_sigstopped_holder_has_all_its_fenced_writes_refused(
    ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """F4: fence f1 for the paused holder, f2 > f1 for the one that took the lock after its
    session ended; after SIGCONT every one of the paused holder's WRITES fenced writes raises
    StaleFenceError and none lands; the new holder's write lands."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    process = await anyio.open_process(
        [sys.executable, str(HOLDER), ship_engine_url, "ledger", str(WRITES)]
    )
    buffer = bytearray()
    try:
        assert process.stdout is not None
        assert process.stdin is not None
        held = await _line(process.stdout, buffer)
        assert held["event"] == "held"
        process.send_signal(signal.SIGSTOP)
        async with ship_engine.connect() as connection:
            ended = await connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid, 10000) FROM pg_locks"
                    " WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database"
                    " WHERE datname = current_database())"
                )
            )
            # With a timeout, pg_terminate_backend returns once the session has ended, and
            # with it the transaction holding the advisory lock.
            assert ended.scalars().all() == [True]
            await connection.commit()
        provider = advisory_lock_provider(ship_engine, fence_table=fences)
        uow = create_unit_of_work(ship_engine, repositories=lambda scope: scope)
        async with provider.with_lock("ledger", 60.0) as fresh:
            assert fresh.fence > held["fence"]  # type: ignore[operator]

            async def fenced_write(scope: TransactionScope) -> None:
                await provider.check_fence("ledger", fresh.fence)
                await scope.connection.execute(
                    writes.insert().values(key="ledger", fence=fresh.fence)
                )

            await uow.run(fenced_write)
            process.send_signal(signal.SIGCONT)
            await process.stdin.send(b"go\n")
            wrote = await _line(process.stdout, buffer)
        assert wrote == {"event": "wrote", "landed": 0, "refused": WRITES}
        with anyio.fail_after(30):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGCONT)
            process.kill()
            await process.wait()
    async with ship_engine.connect() as connection:
        rows = (
            await connection.execute(
                select(writes.c.fence, func.count())
                .group_by(writes.c.fence)
                .order_by(writes.c.fence)
            )
        ).all()
    assert [tuple(row) for row in rows] == [(held["fence"], 1), (fresh.fence, 1)]
