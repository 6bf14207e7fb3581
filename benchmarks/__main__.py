"""``python -m benchmarks [names...] [--quick] [--rounds N] [--json-only]``.

Prints the machine and a table of figures for people, then one JSON line per figure for scripts
(``--json-only``: only the JSON lines, the first describing the run and the machine). With no
names it runs every benchmark but the opt-in ones (``ablations``, ``peers``, ``scaleout``,
``pools``, ``history``, ``dashboard``...), which run only when named.
Progress goes to stderr. Missed targets do not change the exit status (benchmarks are not tests); a
benchmark that could not run does (status 1).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
import time
import traceback
from datetime import UTC, datetime
from typing import Any, Protocol

from benchmarks._harness import Bench, Figure, Settings
from benchmarks._machine import describe_machine
from benchmarks._report import json_line, render_table
from ship_sqla.testing import ResolvedServer, resolve_server

BENCHMARKS: dict[str, str] = {
    "process": "benchmarks.process",
    "enqueue": "benchmarks.enqueue",
    "claim": "benchmarks.claim",
    "relay": "benchmarks.relay",
    "uow": "benchmarks.uow",
    "wake": "benchmarks.wake",
    "cancel": "benchmarks.cancel",
    "workflows": "benchmarks.workflows",
    "transactional": "benchmarks.transactional",
    "consumer": "benchmarks.consumer",
    "backfill": "benchmarks.backfill",
    "ablations": "benchmarks.ablations",
    "peers": "benchmarks.peers",
    "scaleout": "benchmarks.scaleout",
    "pools": "benchmarks.pools",
    "webhooks": "benchmarks.webhooks",
    "aging": "benchmarks.aging",
    "partitions": "benchmarks.partitions",
    "synchronous_claims": "benchmarks.synchronous_claims",
    "sql_enqueue": "benchmarks.sql_enqueue",
    "history": "benchmarks.history",
    "dashboard": "benchmarks.dashboard",
    "steady": "benchmarks.steady",
}
"""Name -> module. A module is imported only when its benchmark runs, so one whose code is
unfinished (or broken) is reported as failed without keeping the others from running."""

OPT_IN = frozenset(
    {
        "ablations",
        "peers",
        "scaleout",
        "pools",
        "webhooks",
        "synchronous_claims",
        "sql_enqueue",
        "history",
        "dashboard",
        "steady",
    }
)
"""Run only when named: not part of ``python -m benchmarks`` with no names."""
DEFAULT_BENCHMARKS = [name for name in BENCHMARKS if name not in OPT_IN]

DEFAULT_ROUNDS = 5
QUICK_ROUNDS = 3


class _Benchmark(Protocol):
    async def run(self, bench: Bench) -> list[Figure]: ...


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="ship_sqla benchmarks beside raw asyncpg baselines (medians of rounds).",
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="name",
        help=f"benchmarks to run (default: {', '.join(DEFAULT_BENCHMARKS)}); opt-in, only"
        f" when named: {', '.join(sorted(OPT_IN))} (ablations: each optimisation ON vs OFF;"
        " peers: beside pgqueuer and procrastinate; scaleout: 1-8 worker processes through a"
        " latency-injecting proxy; pools: plain enqueues on each engine pool shape)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller sizes: the whole suite in under a minute"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"rounds per figure (default {DEFAULT_ROUNDS}, {QUICK_ROUNDS} with --quick)",
    )
    parser.add_argument("--json-only", action="store_true", help="print only JSON lines on stdout")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


async def _run_all(
    server: ResolvedServer, settings: Settings, names: list[str], *, json_only: bool
) -> tuple[dict[str, Any], list[Figure], list[str]]:
    started = datetime.now(UTC)
    machine = await describe_machine(server)
    record = {
        "kind": "run",
        "started_at": started.isoformat(timespec="seconds"),
        "mode": settings.mode,
        "rounds": settings.rounds,
        "benchmarks": names,
        "machine": machine,
    }
    if json_only:
        print(json_line(record), flush=True)
    bench = Bench(server, settings, verbose=True)
    figures: list[Figure] = []
    failed: list[str] = []
    for name in names:
        print(f"[{name}]", file=sys.stderr, flush=True)
        began = time.perf_counter()
        try:
            module: _Benchmark = importlib.import_module(BENCHMARKS[name])
            produced = await module.run(bench)
        except Exception:  # noqa: BLE001 - one broken benchmark must not hide the others' figures
            traceback.print_exc()
            failed.append(name)
            continue
        figures.extend(produced)
        if json_only:
            for figure in produced:
                print(json_line(figure.to_json()), flush=True)
        print(f"  ({time.perf_counter() - began:.1f} s)", file=sys.stderr, flush=True)
    return record, figures, failed


def _print_human(record: dict[str, Any], figures: list[Figure], failed: list[str]) -> None:
    machine = record["machine"]
    out = sys.stdout
    out.write(
        f"ship_sqla benchmarks, {record['mode']} mode, median of {record['rounds']} rounds"
        f" ({record['started_at']})\n"
        f"machine: {machine['cpu_count']} x {machine['cpu_model']}; {machine['python']};"
        f" {machine['postgresql'].split(' on ')[0]} ({machine['server_source']});"
        f" load {machine['load_average_at_start']}\n\n"
    )
    render_table(figures, out)
    if failed:
        out.write(f"\nFAILED to run: {', '.join(failed)} (see stderr)\n")
    out.write("\n")
    out.write(json_line(record) + "\n")
    for figure in figures:
        out.write(json_line(figure.to_json()) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS)
    settings = Settings(quick=args.quick, rounds=rounds)
    names = args.names or list(DEFAULT_BENCHMARKS)
    server = resolve_server()
    record, figures, failed = asyncio.run(
        _run_all(server, settings, names, json_only=args.json_only)
    )
    if not args.json_only:
        _print_human(record, figures, failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
