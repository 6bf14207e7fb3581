"""The scaleout benchmark's latency proxy (benchmarks/_proxy.py) in front of an echo server: bytes
arrive whole and in order, EOF is passed on, and nothing arrives before its delay. No database."""

from __future__ import annotations

import asyncio
import time

import pytest

from benchmarks._proxy import DelayProxy

DELAY = 0.02


async def _echo_server() -> tuple[asyncio.Server, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_chunks_come_back_whole_in_order_and_at_eof_the_connection_ends() -> None:
    server, port = await _echo_server()
    proxy = DelayProxy("127.0.0.1", port, DELAY)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", await proxy.start())
        sent = b"".join(f"{n:06d}".encode() * 50 for n in range(400))
        for start in range(0, len(sent), 7_000):  # many writes, while earlier ones are delayed
            writer.write(sent[start : start + 7_000])
            await writer.drain()
        writer.write_eof()
        received = await asyncio.wait_for(reader.read(), timeout=10)  # until EOF
        assert received == sent
        writer.close()
        assert proxy.connections == 1
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()


async def test_a_round_trip_takes_at_least_the_delay_each_way() -> None:
    server, port = await _echo_server()
    proxy = DelayProxy("127.0.0.1", port, DELAY)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", await proxy.start())
        began = time.perf_counter()
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), timeout=10) == b"ping"
        assert time.perf_counter() - began >= 2 * DELAY
        writer.close()
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()


async def test_closing_the_proxy_ends_its_open_connections() -> None:
    server, port = await _echo_server()
    proxy = DelayProxy("127.0.0.1", port, 0.0)
    reader, writer = await asyncio.open_connection("127.0.0.1", await proxy.start())
    writer.write(b"x")
    assert await asyncio.wait_for(reader.readexactly(1), timeout=10) == b"x"
    await asyncio.wait_for(proxy.close(), timeout=10)
    assert await asyncio.wait_for(reader.read(), timeout=10) == b""
    writer.close()
    server.close()
    await server.wait_closed()


def test_a_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="delay"):
        DelayProxy("127.0.0.1", 5432, -0.001)
