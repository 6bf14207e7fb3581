"""``ship-sqla jobs ...``: the operator's verbs on job runs (J8), through the one operator
surface (:mod:`ship_sqla._cli._operator`).

The group is assembled here from its modules, none of which imports this one: ``runs`` (one
run: dead, show, retry, discard, rerun), ``control`` (a whole job: pause, resume, paused,
demand), ``upkeep`` (stats, cleanup, events-purge), ``maintain`` (the run history, J17),
``definitions`` (sync-definitions, E8), ``errors`` (dead runs grouped by error, issue 36),
``bulk`` (retry-dead, discard-dead, cancel: one run, several, or --all with a filter) and
``matching`` (find by any filter, and retry, cancel or discard what matches, issue 36). Every
verb that changes state is audited (S1; ``--no-audit`` is the explicit opt-out).
"""

from __future__ import annotations

import click

from ship_sqla._cli._options import OPERATOR_NOTE
from ship_sqla._cli.jobs import (
    bulk,
    control,
    definitions,
    errors,
    maintain,
    matching,
    runs,
    upkeep,
)

__all__ = ["jobs"]


@click.group(short_help="Operator operations on job runs (J8).", epilog=OPERATOR_NOTE)
def jobs() -> None:
    """Operator operations on job runs: list dead runs, show one, retry, discard, cancel (K2),
    pause / resume a job (K3), counts by state, retention cleanup (J8). Each works on the runs
    table ship_job_runs (pause, resume and paused also on ship_job_state) unless --runs-table /
    --state-table / --schema (or their environment variables) name others."""


for _command in (
    *runs.COMMANDS,
    *control.COMMANDS,
    *upkeep.COMMANDS,
    *maintain.COMMANDS,
    *bulk.COMMANDS,
    *matching.COMMANDS,
    *definitions.COMMANDS,
    *errors.COMMANDS,
):
    jobs.add_command(_command)
