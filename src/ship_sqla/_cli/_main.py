"""The root ``ship-sqla`` group, assembled from the command groups; nothing imports this module
but the package's ``__init__``, so no command module can import back into it."""

from __future__ import annotations

import click

from ship_sqla._cli._exits import ShipGroup
from ship_sqla._cli.backfill import backfill
from ship_sqla._cli.dashboard import dashboard
from ship_sqla._cli.demo import demo
from ship_sqla._cli.enqueue import enqueue
from ship_sqla._cli.jobs import jobs
from ship_sqla._cli.outbox import outbox
from ship_sqla._cli.relay import relay
from ship_sqla._cli.schema import schema
from ship_sqla._cli.webhooks import webhooks
from ship_sqla._cli.worker import worker, workers
from ship_sqla._cli.workflows import workflows

__all__ = ["cli", "main"]


@click.group(cls=ShipGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ship-sqla", prog_name="ship-sqla")
def cli() -> None:
    """ship_sqla operations: schema check and DDL, the demo, workers, outbox relays and
    job operations.

    Exit codes: 0 success; 1 the check found differences or the operation failed; 2 bad input
    (usage error, malformed option, MODULE:ATTR that cannot be loaded). The database URL may
    come from SHIP_SQLA_DATABASE_URL (a generic DATABASE_URL is not read). 130: interrupted
    (Ctrl-C).
    """


for _command in (
    schema,
    demo,
    worker,
    workers,
    jobs,
    outbox,
    enqueue,
    dashboard,
    backfill,
    webhooks,
    workflows,
):
    cli.add_command(_command)
# The relay is a verb of the outbox group, in a module of its own (a process, not an operation).
outbox.add_command(relay)


def main(argv: list[str] | None = None) -> None:
    """The ``ship-sqla`` console script: ``[project.scripts] ship-sqla = "ship_sqla._cli:main"``."""
    cli.main(args=argv, prog_name="ship-sqla")
