"""A latency-injecting TCP proxy on 127.0.0.1, for benchmarks that need a network between a
worker and PostgreSQL (``benchmarks/scaleout.py``).

``python -m benchmarks._proxy --upstream-host H --upstream-port P --delay-ms D [--port N]``
listens on 127.0.0.1 (a free port unless ``--port``), prints ``ready <port>`` on stdout and
forwards every connection to the upstream (a TCP host, or a directory holding PostgreSQL's Unix
socket when the host starts with ``/``). Every chunk read in either direction is delivered
``D`` ms after it was read: each direction is a FIFO of ``(deliver_at, bytes)`` filled by a
reader that never waits for the writer, and drained by a writer that sleeps until the head's
``deliver_at``. So a round trip gains ``2 D`` ms while throughput is not serialised (bytes keep
being read during the delay): latency, not a bandwidth limit. ``D`` = 0 runs the same path with
no sleep, so the proxy's own cost is the same with and without added latency.

The event loop uses ``select()`` rather than epoll: epoll's timeout is whole milliseconds, so a
0.5 ms sleep would last 1 ms; ``select()`` takes microseconds. It runs in a process of its own
(as the CLI above) so its CPU is not taken from the event loops it serves. It stops at EOF on
stdin or at SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import selectors
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["DelayProxy", "main"]

CHUNK = 256 * 1024
"""Bytes per read: large enough that a COPY or a big result crosses in few chunks."""
HOST = "127.0.0.1"


class DelayProxy:
    """Listens on 127.0.0.1 and forwards to the upstream, each chunk ``delay`` seconds late."""

    def __init__(self, upstream_host: str, upstream_port: int, delay: float) -> None:
        if delay < 0:
            raise ValueError(f"delay must be >= 0, got {delay}")
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.delay = delay
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._closing = False
        self._serving: set[asyncio.Task[None]] = set()
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self, port: int = 0) -> int:
        """Start listening; returns the port."""
        self._server = await asyncio.start_server(self._serve, HOST, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening and end every connection (its pipes are cancelled, its sockets
        closed). The connection handlers themselves are not cancelled: asyncio's stream server
        logs a cancelled handler as an error on 3.11."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.upstream_host.startswith("/"):
            path = f"{self.upstream_host}/.s.PGSQL.{self.upstream_port}"
            return await asyncio.open_unix_connection(path, limit=CHUNK)
        return await asyncio.open_connection(self.upstream_host, self.upstream_port, limit=CHUNK)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        serving = asyncio.current_task()
        if serving is not None:
            self._serving.add(serving)
        self.connections += 1
        upstream_w: asyncio.StreamWriter | None = None
        try:
            upstream_r, upstream_w = await self._open_upstream()
            if self._closing:
                return
            pipes = {
                asyncio.create_task(self._pipe(client_r, upstream_w)),
                asyncio.create_task(self._pipe(upstream_r, client_w)),
            }
            self._pipes |= pipes
            try:
                # Both directions until both ended, or until one failed (a side went away).
                await asyncio.wait(pipes, return_when=asyncio.FIRST_EXCEPTION)
            finally:
                for pipe in pipes:
                    pipe.cancel()
                await asyncio.gather(*pipes, return_exceptions=True)
                self._pipes -= pipes
        except OSError:
            pass  # the upstream refused: the client sees its connection closed
        finally:
            for writer in (client_w, upstream_w):
                if writer is not None:
                    writer.close()
            if serving is not None:
                self._serving.discard(serving)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One direction: the reader fills the queue, the writer delivers each chunk on time."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                deliver_at, data = await queue.get()
                if not data:  # EOF from the reader, delivered in order
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                wait = deliver_at - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        delivering = loop.create_task(deliver())
        try:
            while True:
                data = await reader.read(CHUNK)
                queue.put_nowait((loop.time() + self.delay, data))
                if not data:
                    break
            await delivering
        finally:
            if not delivering.done():
                delivering.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await delivering


async def _serve_until_stdin_closes(args: argparse.Namespace) -> None:
    proxy = DelayProxy(args.upstream_host, args.upstream_port, args.delay_ms / 1000.0)
    port = await proxy.start(args.port)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(f"ready {port}", flush=True)

    async def watch_stdin() -> None:
        await reader.read()  # EOF: the parent closed our stdin (or died)
        stop.set()

    watcher = loop.create_task(watch_stdin())
    try:
        await stop.wait()
    finally:
        watcher.cancel()
        await proxy.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._proxy", description=__doc__)
    parser.add_argument("--upstream-host", default="127.0.0.1")
    parser.add_argument("--upstream-port", type=int, default=5432)
    parser.add_argument("--port", type=int, default=0, help="listen port (0: a free one)")
    parser.add_argument(
        "--delay-ms", type=float, default=0.0, help="one-way delay per direction, ms"
    )
    args = parser.parse_args(argv)
    with asyncio.Runner(
        loop_factory=lambda: asyncio.SelectorEventLoop(selectors.SelectSelector())
    ) as runner:
        runner.run(_serve_until_stdin_closes(args))


if __name__ == "__main__":
    main()
