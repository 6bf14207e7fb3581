"""Where the figures were measured: CPU, PostgreSQL, Python and the libraries in the path."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg

from benchmarks._harness import asyncpg_dsn

if TYPE_CHECKING:
    from ship_sqla.testing import ResolvedServer

__all__ = ["describe_machine"]

_CPUINFO = Path("/proc/cpuinfo")


def _cpu_model() -> str:
    try:
        lines = _CPUINFO.read_text(encoding="utf-8").splitlines()
    except OSError:
        return platform.processor() or "unknown"
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return platform.processor() or "unknown"


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


async def describe_machine(server: ResolvedServer) -> dict[str, Any]:
    connection = await asyncpg.connect(asyncpg_dsn(server.url))
    try:
        postgres = await connection.fetchval("SELECT version()")
        settings = {
            name: await connection.fetchval(f"SHOW {name}")
            for name in ("shared_buffers", "synchronous_commit", "fsync", "max_connections")
        }
    finally:
        await connection.close()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "os": platform.platform(),
        "load_average_at_start": [round(x, 2) for x in load],
        "postgresql": postgres,
        "postgresql_settings": settings,
        "server_source": server.source,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "libraries": {
            name: _version(name) for name in ("ship-sqla", "sqlalchemy", "asyncpg", "anyio")
        },
    }
