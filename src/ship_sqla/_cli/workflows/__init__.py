"""``ship-sqla workflows ...``: durable workflows' evolution (SPEC §13, D7-D11), through the one
operator surface (:mod:`ship_sqla._cli._operator`).

The group is assembled here from its modules, none of which imports this one: ``history``
(export: runs' histories to files; replay: histories against a registry's handlers, D11).
"""

from __future__ import annotations

import click

from ship_sqla._cli._options import OPERATOR_NOTE
from ship_sqla._cli.workflows import history

__all__ = ["workflows"]


@click.group(short_help="Workflow histories and evolution (D7-D11).", epilog=OPERATOR_NOTE)
def workflows() -> None:
    """Durable workflows as their code changes: export runs' histories to files and replay
    histories (exported, recorded by tests, or sampled from live runs) against a registry's
    handlers before a deploy (D11). Each works on the runs table ship_job_runs and the steps
    table ship_job_steps unless --runs-table / --schema (or their environment variables) name
    others."""


for _command in history.COMMANDS:
    workflows.add_command(_command)
