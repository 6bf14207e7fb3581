"""``ship-sqla demo``: the README demo, on SHIP_SQLA_DATABASE_URL or the embedded server."""

from __future__ import annotations

import asyncio
import importlib
import inspect
from typing import Any, Final

import click

from ship_sqla._cli._exits import EXIT_OK
from ship_sqla._server import clean_embedded, embedded_dir

__all__ = ["demo"]

DEMO_MODULE: Final = "ship_sqla._demo"


@click.command(short_help="Run the README demo (no configuration needed).")
@click.option(
    "--clean",
    is_flag=True,
    help="Run no demo: stop the embedded server and remove its data directory (its cache,"
    " about 40 MB) and runtime directory.",
)
@click.pass_context
def demo(ctx: click.Context, clean: bool) -> None:
    """Run the README demo: two tenants' rows through a unit of work, an outbox message relayed
    to a printing sink, a job run by a worker, and a rollback that leaves none of them, in a
    scratch database dropped afterwards. The server is SHIP_SQLA_DATABASE_URL when set, else
    the embedded one (the `embedded` extra; a local server is not probed, so the demo runs the
    same on every machine). The embedded server keeps its data in ~/.cache/ship_sqla/embedded
    (as root: under the temporary directory, after printing what pgserver changes outside it)
    for the next run; `ship-sqla demo --clean` removes it. A generic DATABASE_URL is not read."""
    if clean:
        done = clean_embedded()
        if not any(line.startswith("removed") for line in done):
            click.echo(f"nothing to remove: {embedded_dir()} does not exist.")
        for line in done:
            click.echo(line)
        ctx.exit(EXIT_OK)
    # Imported on use: the demo pulls in every store, which the other commands do not need.
    result = importlib.import_module(DEMO_MODULE).main()
    if inspect.isawaitable(result):
        result = asyncio.run(_awaited(result))
    ctx.exit(result if isinstance(result, int) else EXIT_OK)


async def _awaited(awaitable: Any) -> Any:  # noqa: ANN401 - whatever the demo returns
    return await awaitable
