"""Output: a table for people, JSON lines for scripts (one run record, then one per figure)."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from collections.abc import Sequence

    from benchmarks._harness import Figure

__all__ = ["json_line", "render_table"]

_HEADERS = ("figure", "median", "baseline (median)", "ratio", "target", "met")


def json_line(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=False, separators=(", ", ": "))


def _number(value: float | None, unit: str = "") -> str:
    if value is None or not math.isfinite(value):
        return "-"
    magnitude = abs(value)
    if magnitude >= 1000:
        text = f"{value:,.0f}"
    elif magnitude >= 100:
        text = f"{value:.0f}"
    elif magnitude >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}".rstrip()


def _row(figure: Figure) -> tuple[str, ...]:
    baseline = "-"
    if figure.baseline is not None:
        baseline = f"{_number(figure.baseline, figure.unit)} ({figure.baseline_label})"
    ratio = "-" if figure.ratio is None else f"{figure.ratio:.2f}x"
    met = {True: "yes", False: "NO", None: ""}[figure.met]
    return (
        figure.name,
        _number(figure.value, figure.unit),
        baseline,
        ratio,
        figure.target or "",
        met,
    )


def render_table(figures: Sequence[Figure], out: TextIO) -> None:
    rows = [_HEADERS, *(_row(figure) for figure in figures)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADERS))]
    for index, row in enumerate(rows):
        out.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        out.write("\n")
        if index == 0:
            out.write("  ".join("-" * width for width in widths) + "\n")
    notes = [(figure.name, figure.note) for figure in figures if figure.note]
    if notes:
        out.write("\n")
        out.writelines(f"{name}: {note}\n" for name, note in notes)
