"""Issue 27, item 12: the tutorial (docs/tutorial/) runs as written, every code block of it
(issue 28 added its step 5: a consumer over a table-backed stream, a backfill of a new column).

The pages are followed as a newcomer follows them, in order, in one folder and on one empty
database: a ``python`` block whose first line is ``# file: NAME`` starts the file NAME in that
folder and the blocks after it continue it; every line of an ``sh`` block is run as typed
(``ship-sqla ...`` and ``uvicorn ...`` through this interpreter), except the setup lines the
test makes itself (the virtualenv, the install, the database and its URL), which must be exactly
the ones listed in ``SETUP``. What the pages say a command prints is checked, and a Python
script the tutorial runs writes nothing to stderr (no warning, no log of a lost connection).
A server the tutorial starts (``ship-sqla dashboard``, ``uvicorn``) is run on a free port until
its first page answers, then stopped.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import sys
from pathlib import Path

import anyio
import httpx
import pytest
from anyio.abc import Process
from sqlalchemy.engine import make_url

from ship_sqla.testing import DatabaseFactory, ResolvedServer

pytestmark = pytest.mark.anyio

TUTORIAL = Path(__file__).parents[2] / "docs" / "tutorial"
PAGES = sorted(p for p in TUTORIAL.glob("[0-9]-*.md"))

SETUP = {
    "python3 -m venv .venv && . .venv/bin/activate",
    'pip install -e "$HOME/src/ship_sqla[dashboard]"',
    "createdb -h 127.0.0.1 -U postgres ship_tutorial",
    "export SHIP_SQLA_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/ship_tutorial",
}

# What the pages say these commands print (in their prose), checked on stdout.
PRINTS = {
    "python first_job.py": ["hello, Ada (run ", ", attempt 1)"],
    "python place_order.py": ["order 1 placed, its message waits in the outbox"],
    "python relay.py": ["relayed message ", ": order.placed {'order_id': 1}"],
    "ship-sqla worker worker:registry --burst": ["receipt for order "],
    "python more_orders.py": ["twenty more orders placed"],
    "ship-sqla worker sales:registry --burst": [
        "acme: orders 1-10 tallied",
        "acme: orders 11-20 tallied",
        "acme: orders 21-21 tallied",
    ],
    "python migrate_0002.py": ["orders.total_cents added"],
    "ship-sqla worker fill_cents:registry --burst": [
        "filled 10 orders up to acme/10",
        "filled 10 orders up to acme/20",
        "filled 1 orders up to acme/21",
    ],
    "ship-sqla backfill start shop.orders.total_cents": [
        "backfill shop.orders.total_cents started"
    ],
    "ship-sqla backfill status": [
        (
            "shop.orders.total_cents  completed  pages 3  rows 21  pace 5/s"
            " required by 0002_orders_total_cents"
        )
    ],
    "ship-sqla backfill verify --required-by 0002_orders_total_cents": [
        "every required backfill is completed."
    ],
}
# ... and what the whole session prints, in this order (step 3's two worker runs).
TRANSCRIPT = [
    "receipt for order 1 (run shop.send_receipt/outbox-",
    "receipt for order 2 (run ",
]
# The servers the pages start, and the page each serves (with what it must show).
SERVERS = {
    "ship-sqla dashboard": {
        "/": ["Overview"],
        "/runs?state=completed": ["tutorial.greet", "shop.send_receipt"],
    },
    "uvicorn ops_app:app": {"/ops/": ["shop.send_receipt"], "/ops/outbox": ["orders"]},
}

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks(page: Path) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(page.read_text(encoding="utf-8"))]


def _argv(line: str) -> list[str]:
    words = shlex.split(line)
    if words[0] == "ship-sqla":
        return [sys.executable, "-m", "ship_sqla", *words[1:]]
    if words[0] in {"python", "python3"}:
        return [sys.executable, *words[1:]]
    if words[0] == "uvicorn":
        return [sys.executable, "-m", "uvicorn", *words[1:]]
    pytest.fail(f"the tutorial runs {line!r}: teach this test how to run it, or add it to SETUP")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _run(line: str, folder: Path, env: dict[str, str]) -> str:
    result = await anyio.run_process(_argv(line), cwd=folder, env=env, check=False)
    out, err = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 0, f"{line}: exit {result.returncode}\n{out}\n{err}"
    if line.startswith("python "):
        assert err == "", f"{line} wrote to stderr:\n{err}"
    for expected in PRINTS.get(line, []):
        assert expected in out, f"{line}: {expected!r} not in its output:\n{out}"
    return out


async def _wait_listening(process: Process, marker: str) -> None:
    """Read the server's output until the line saying it listens (both streams: uvicorn logs on
    stderr)."""
    seen = ""
    streams = [s for s in (process.stdout, process.stderr) if s is not None]
    with anyio.fail_after(30):
        while marker not in seen:
            async with anyio.create_task_group() as group:
                # one read of whichever stream speaks first
                chunks: list[bytes] = []

                async def read(stream, chunks=chunks, group=group) -> None:
                    chunks.append(await stream.receive())
                    group.cancel_scope.cancel()

                for stream in streams:
                    group.start_soon(read, stream)
            seen += b"".join(chunks).decode()
            assert process.returncode is None, f"the server exited:\n{seen}"


async def _serve(line: str, folder: Path, env: dict[str, str]) -> None:
    pages = next(v for k, v in SERVERS.items() if line.startswith(k))
    port = _free_port()
    line = re.sub(r"--port \d+", f"--port {port}", line)
    marker = f"127.0.0.1:{port}"
    async with await anyio.open_process(_argv(line), cwd=folder, env=env) as process:
        try:
            await _wait_listening(process, marker)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                for path, shows in pages.items():
                    response = await client.get(path, timeout=30)
                    assert response.status_code == 200, f"{line}: {path} {response.status_code}"
                    for expected in shows:
                        assert expected in response.text, f"{line}: {path} lacks {expected!r}"
        finally:
            process.send_signal(signal.SIGINT)
            with anyio.fail_after(30):
                await process.wait()


async def test_friction_12_the_tutorial_runs_as_written(
    ship_server: ResolvedServer, tmp_path: Path
) -> None:
    """Issue 27 item 12: every code block of docs/tutorial/*.md, in order, on an empty database
    (the ship tables come from the page's own ``ship-sqla schema apply``): J3, O1, U1; step 5,
    C1 (a consumer's batches and cursor), C4 and C5 (a paced backfill and the deploy gate)."""
    assert [p.name[:2] for p in PAGES] == ["1-", "2-", "3-", "4-", "5-"]
    factory = DatabaseFactory(ship_server)
    async with factory.private(name="ship_sqla_test_tutorial") as (url, _engine):
        plain = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHIP_SQLA_")}
        env |= {"SHIP_SQLA_DATABASE_URL": plain, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(
            [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        skipped: set[str] = set()
        ran: list[str] = []
        transcript = ""
        for page in PAGES:
            current: Path | None = None
            for kind, body in _blocks(page):
                if kind == "python":
                    first = body.splitlines()[0]
                    if first.startswith("# file: "):
                        current = tmp_path / first.removeprefix("# file: ").strip()
                        current.write_text("", encoding="utf-8")
                    assert current is not None, f"{page.name}: a python block before any file"
                    with current.open("a", encoding="utf-8") as file:
                        file.write(body + "\n\n")
                elif kind == "sh":
                    for line in filter(None, (raw.strip() for raw in body.splitlines())):
                        if line in SETUP:
                            skipped.add(line)
                        elif any(line.startswith(server) for server in SERVERS):
                            await _serve(line, tmp_path, env)
                            ran.append(line)
                        else:
                            transcript += await _run(line, tmp_path, env)
                            ran.append(line)
        assert skipped == SETUP
        positions = [transcript.find(expected) for expected in TRANSCRIPT]
        assert -1 not in positions, f"{TRANSCRIPT} not all printed:\n{transcript}"
        assert positions == sorted(positions), transcript
        assert set(PRINTS) <= set(ran), "a checked command is no longer in the tutorial"
        assert all(any(r.startswith(s) for r in ran) for s in SERVERS)
