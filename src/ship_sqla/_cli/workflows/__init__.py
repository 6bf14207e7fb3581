"""``ship-sqla workflows ...``: durable workflows' evolution (SPEC §13, D7-D11), through the one
operator surface (:mod:`ship_sqla._cli._operator`).

The group is assembled here from its modules, none of which imports this one: ``patches``
(D8: per patch, the live runs holding or lacking its marker), ``history`` (export: runs'
histories to files; replay: histories against a registry's handlers, D11) and ``versions``
(D9: the deploy gate of handler versions; D10: parked runs, unpark).
"""

from __future__ import annotations

import click

from ship_sqla._cli._options import OPERATOR_NOTE
from ship_sqla._cli.workflows import history, patches, versions

__all__ = ["workflows"]


@click.group(short_help="Check workflow changes before a deploy (D7-D11).", epilog=OPERATOR_NOTE)
def workflows() -> None:
    """What to check before changing a workflow's code while runs are in flight
    (docs/workflows-evolution.md): per patch, the live runs holding or lacking its marker
    (D8); export runs' histories to files and replay histories (exported, recorded by tests,
    or sampled from live runs) against a registry's handlers before a deploy (D11); whether a
    registry would strand live runs of a handler version (D9); runs parked on a divergence
    (D10). Each works
    on the runs table ship_job_runs and the steps table ship_job_steps unless --runs-table /
    --schema (or their environment variables) name others."""


for _command in (*patches.COMMANDS, *history.COMMANDS, *versions.COMMANDS):
    workflows.add_command(_command)
