"""``ship-sqla workflows export|replay`` (D11): runs' histories to files, and histories replayed
against a registry's handlers without any effect (:mod:`ship_sqla.kernel._replay`).

Both are reads through the one operator surface (``JobOperations.export_histories``: keyset
pages, one steps read per run); neither changes a run. ``replay`` exits 1 when any history
diverges (or its handler fails before the history's frontier), naming the run and the position:
the pre-deploy gate.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import click

from ship_sqla._cli._exits import OperationFailedError
from ship_sqla._cli._operator import operate
from ship_sqla._cli._options import (
    DATABASE_URL_ENV,
    OPERATOR_NOTE,
    database_url_option,
    job_tables_options,
    json_option,
)
from ship_sqla._cli._params import REGISTRY, DatabaseUrl, ObjectReference
from ship_sqla.kernel._history import read_histories, write_history
from ship_sqla.kernel._operations import MAX_PAGE_LIMIT
from ship_sqla.kernel._ports import RUN_STATES
from ship_sqla.kernel._replay import Replayer

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from ship_sqla._cli._tables import JobTables
    from ship_sqla.kernel._history import History, Redactor
    from ship_sqla.kernel._operations import JobOperations
    from ship_sqla.kernel._ports import RunState
    from ship_sqla.kernel._registry import JobRegistry
    from ship_sqla.kernel._replay import ReplayResult

__all__ = ["COMMANDS"]

MAX_EXPORT: Final = 100_000
"""The most histories one ``workflows export`` writes (each is one steps read)."""
MAX_SAMPLE: Final = 10_000
_LIVE_STATES: Final[tuple[RunState, ...]] = ("waiting", "running")
_SCAN_FACTOR: Final = 10
"""``replay --sample N`` reads at most this many times N live runs per job looking for N that
stored a step (runs not yet started have nothing to replay)."""


class RedactorReference(ObjectReference):
    """``module:attr`` naming a redactor: ``redact(where, value) -> value`` (D11)."""

    def __init__(self) -> None:
        super().__init__(object, "redactor", "myapp.export:redact")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:  # noqa: ANN401
        found = value if callable(value) else self._load(value, param, ctx)
        if not callable(found):
            self.fail(
                f"{value} is a {type(found).__name__}, not a redactor: name a module-level"
                " function redact(where, value) returning the JSON value to write.",
                param,
                ctx,
            )
        return found


async def _export(
    ops: JobOperations,
    *,
    out: Path,
    states: tuple[RunState, ...],
    job_id: str | None,
    limit: int,
    redact: Redactor | None,
) -> tuple[list[Path], bool]:
    """Write at most ``limit`` histories, page by page; the files, and whether runs were left."""
    written: list[Path] = []
    for state in states:
        cursor: str | None = None
        while True:
            left = limit - len(written)
            if left <= 0:
                return written, True
            page = await ops.export_histories(
                state=state,
                job_id=job_id,
                limit=min(left, MAX_PAGE_LIMIT),
                cursor=cursor,
                redact=redact,
            )
            written.extend(write_history(out, history) for history in page.items)
            cursor = page.next_cursor
            if cursor is None:
                break
    return written, False


@click.command("export", epilog=OPERATOR_NOTE)
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The directory to write one <job>__<run>.json file per run into (created if missing).",
)
@click.option("--job", "job_id", metavar="JOB_ID", help="Only runs of this job.")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(RUN_STATES),
    help="Only runs in this state (repeatable). Default: every state.",
)
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_EXPORT),
    default=100,
    show_default=True,
    help="The most histories to write (read in keyset pages of up to 500).",
)
@click.option(
    "--redact",
    metavar="MODULE:FUNC",
    type=RedactorReference(),
    help="A function redact(where, value) applied to every payload (where='payload') and"
    " step result (where='result:<step>') before it is written.",
)
@database_url_option
@job_tables_options(with_state_table=False)
@json_option
def workflows_export(
    *,
    out: Path,
    job_id: str | None,
    states: tuple[RunState, ...],
    limit: int,
    redact: Redactor | None,
    database_url: URL,
    tables: JobTables,
    as_json: bool,
) -> None:
    """Export runs' histories (D11): one versioned JSON file (ship_sqla.history/1) per run,
    its payload and its steps in position order, for `workflows replay --histories` and the
    pytest plugin's ship_replay marker."""

    async def call(ops: JobOperations) -> tuple[list[Path], bool]:
        return await _export(
            ops,
            out=out,
            states=states or RUN_STATES,
            job_id=job_id,
            limit=limit,
            redact=redact,
        )

    written, more = operate(database_url, call, tables, as_json=as_json)
    if as_json:
        files = [str(path) for path in written]
        click.echo(json.dumps({"exported": len(written), "files": files, "more": more}))
        return
    click.echo(f"exported {len(written)} history file(s) to {out}.")
    if more:
        click.echo(f"more runs match: the export stopped at --limit {limit}.")


async def _sample(
    ops: JobOperations, replayer: Replayer, job_id: str, sample: int
) -> list[ReplayResult]:
    """Replay up to ``sample`` live runs of ``job_id`` that stored a step (waiting ones first,
    in claim order, then running ones), reading at most ``sample * 10`` runs."""
    results: list[ReplayResult] = []
    scanned = 0
    budget = sample * _SCAN_FACTOR
    for state in _LIVE_STATES:
        cursor: str | None = None
        while len(results) < sample and scanned < budget:
            page = await ops.export_histories(
                state=state,
                job_id=job_id,
                limit=min(budget - scanned, MAX_PAGE_LIMIT),
                cursor=cursor,
            )
            scanned += len(page.items)
            for history in page.items:
                if history.steps and len(results) < sample:
                    results.append(await replayer.replay(history))
            cursor = page.next_cursor
            if cursor is None:
                break
    return results


def _replay_files(replayer: Replayer, folder: Path, jobs: tuple[str, ...]) -> list[ReplayResult]:
    histories: list[tuple[Path, History]] = read_histories(folder, "**/*.json")
    if not histories:
        raise OperationFailedError(f"no history files (*.json) under {folder}.")

    async def replay_all() -> list[ReplayResult]:
        return [
            await replayer.replay(history, origin=str(path))
            for path, history in histories
            if not jobs or history.job_id in jobs
        ]

    return asyncio.run(replay_all())


def _report(results: list[ReplayResult], *, as_json: bool) -> None:
    bad = [result for result in results if not result.clean]
    if as_json:
        rows = [
            {
                "run_id": r.run_id,
                "job_id": r.job_id,
                "clean": r.clean,
                "stopped": r.stopped,
                "replayed": r.replayed,
                "frontier": r.frontier,
                "divergence": None if r.divergence is None else r.divergence.to_json(),
                "failure": r.failure,
                "origin": r.origin,
            }
            for r in results
        ]
        click.echo(json.dumps({"replayed": len(results), "diverged": len(bad), "runs": rows}))
    else:
        for result in bad:
            click.echo(result.describe())
        click.echo(
            f"replayed {len(results)} history(ies): {len(results) - len(bad)} clean,"
            f" {len(bad)} not."
        )
    if bad:
        raise click.exceptions.Exit(1)


@click.command("replay", epilog=OPERATOR_NOTE)
@click.option(
    "--registry",
    "registry",
    required=True,
    metavar="APP:REGISTRY",
    type=REGISTRY,
    help="The job registry of the code about to be deployed (a JobRegistry, a job definition"
    " or a list of them).",
)
@click.option(
    "--job",
    "jobs",
    multiple=True,
    metavar="JOB_ID",
    help="Only this job (repeatable). Default: every workflow job of the registry.",
)
@click.option(
    "--sample",
    type=click.IntRange(1, MAX_SAMPLE),
    default=20,
    show_default=True,
    help="Live runs (waiting, then running) to replay per job, among those that stored a step.",
)
@click.option(
    "--histories",
    "folder",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Replay the history files under this directory instead of live runs (no database).",
)
@click.option(
    "--database-url",
    type=DatabaseUrl(),
    envvar=DATABASE_URL_ENV,
    show_envvar=True,
    help="PostgreSQL URL of the live runs to sample (not needed with --histories).",
)
@job_tables_options(with_state_table=False)
@json_option
def workflows_replay(
    *,
    registry: JobRegistry,
    jobs: tuple[str, ...],
    sample: int,
    folder: Path | None,
    database_url: URL | None,
    tables: JobTables,
    as_json: bool,
) -> None:
    """Replay histories against the registry's handlers, read-only (D11): a sample of live
    runs (or the files under --histories), each to its first divergence (D7) or its frontier.
    Exit 1 when any diverged, naming the run and the position: run it before a deploy."""
    replayer = Replayer(registry)
    if folder is not None:
        _report(_replay_files(replayer, folder, jobs), as_json=as_json)
        return
    if database_url is None:
        raise click.UsageError("pass --database-url (or SHIP_SQLA_DATABASE_URL), or --histories.")
    # A transactional job (transaction=) makes no workflow calls: nothing to sample.
    job_ids = jobs or tuple(d.id for d in registry if d.transaction is None)

    async def call(ops: JobOperations) -> list[ReplayResult]:
        results: list[ReplayResult] = []
        for job_id in job_ids:
            results.extend(await _sample(ops, replayer, job_id, sample))
        return results

    _report(operate(database_url, call, tables, as_json=as_json), as_json=as_json)


COMMANDS: Final = (workflows_export, workflows_replay)
