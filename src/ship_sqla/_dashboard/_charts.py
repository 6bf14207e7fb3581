"""The job history's charts (issue 36, item 2): a :class:`~ship_sqla.kernel._stats.StatsSeries`
as server-side SVG (``templates/pages/series_chart.svg``: stacked bars or lines, no JavaScript)
and as a uPlot data island (the stacked throughput chart, drawn by ``dashboard.js`` over its
SVG when scripts run). Pure: tested alone."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import attrs
from markupsafe import Markup, escape

from ship_sqla._dashboard._html import render
from ship_sqla._outbox._stats import outbox_stats_id
from ship_sqla.kernel._stats import range_buckets, series_from_rows

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ship_sqla.kernel._stats import JobStatsStore, StatsBucket, StatsRow, StatsSeries

__all__ = [
    "OUTCOMES",
    "bars_chart",
    "lines_chart",
    "outbox_trend",
    "outcome_island",
    "overview_history",
    "series_charts",
]

_WIDTH: Final = 720
_HEIGHT: Final = 140
_PAD: Final = 24

OUTCOMES: Final = (
    ("completed", "#2e7d32"),
    ("retried", "#ef6c00"),
    ("dead", "#c62828"),
    ("cancelled", "#757575"),
)
"""The throughput chart's outcomes (bottom band first) and their colours."""


def _label(series: StatsSeries, bucket: StatsBucket) -> str:
    return f"{bucket.start:%Y-%m-%d %H:%M} UTC (+{int(series.step.total_seconds() // 60)} min)"


def bars_chart(series: StatsSeries, title: str) -> Markup:
    """Stacked bars per bucket, one band per outcome (:data:`OUTCOMES`), with a hover title.
    The bars are formatted here, one string each, not through the template (the overview's 72
    bars of 4 bands were 2,000 template expressions a render)."""
    buckets = series.buckets
    n = max(len(buckets), 1)
    peak = max((sum(getattr(b, o) for o, _ in OUTCOMES) for b in buckets), default=0) or 1
    slot = (_WIDTH - 2 * _PAD) / n
    inner = _HEIGHT - 2 * _PAD
    width = max(slot - 1, 1)
    bars = []
    for i, b in enumerate(buckets):
        x = _PAD + i * slot
        y = float(_HEIGHT - _PAD)
        rects = []
        counts = []
        for outcome, colour in OUTCOMES:
            value = getattr(b, outcome)
            counts.append(f"{value} {outcome}")
            h = inner * value / peak
            y -= h
            if h > 0:
                rects.append(
                    f'<rect class="{outcome}" x="{x:.1f}" y="{y:.1f}" width="{width:.1f}"'
                    f' height="{h:.1f}" fill="{colour}"/>'
                )
        label = escape(f"{_label(series, b)}: {', '.join(counts)}")
        bars.append(f"\n<g><title>{label}</title>{''.join(rects)}</g>")
    return _svg(series, title, f"peak {peak} per bucket", bars=Markup("".join(bars)))  # noqa: S704


def lines_chart(
    series: StatsSeries,
    title: str,
    lines: Sequence[tuple[str, str, Callable[[StatsBucket], float | None]]],
    unit: str,
) -> Markup:
    """One polyline per ``(name, colour, value of a bucket)``; a bucket with no value (no
    finished attempt, no sample) breaks the line."""
    buckets = series.buckets
    n = max(len(buckets), 1)
    values = [[f(b) for b in buckets] for _, _, f in lines]
    peak = max((v for vs in values for v in vs if v is not None), default=0.0) or 1.0
    slot = (_WIDTH - 2 * _PAD) / n
    inner = _HEIGHT - 2 * _PAD
    drawn = []
    for (name, colour, _), vs in zip(lines, values, strict=True):
        runs: list[list[str]] = [[]]
        for i, v in enumerate(vs):
            if v is None:
                if runs[-1]:
                    runs.append([])
                continue
            x = _PAD + (i + 0.5) * slot
            runs[-1].append(f"{x:.1f},{_HEIGHT - _PAD - inner * v / peak:.1f}")
        drawn.append({"name": name, "colour": colour, "paths": [" ".join(r) for r in runs if r]})
    return _svg(series, title, f"peak {peak:.3g} {unit}", lines=drawn)


def _svg(series: StatsSeries, title: str, peak: str, **parts: Any) -> Markup:  # noqa: ANN401
    first = series.buckets[0].start if series.buckets else None
    return Markup(  # noqa: S704 - rendered by the template (autoescaped)
        render(
            "pages/series_chart.svg",
            width=_WIDTH,
            height=_HEIGHT,
            pad=_PAD,
            title=title,
            peak=peak,
            first="" if first is None else f"{first:%m-%d %H:%M}",
            last=f"{series.end:%m-%d %H:%M}",
            bars=parts.get("bars", ""),
            lines=parts.get("lines", ()),
        )
    )


def outcome_island(series: StatsSeries) -> dict[str, Any]:
    """The throughput chart's uPlot data island (``dashboard.js`` stacks its series)."""
    return {
        "series": [{"label": o, "color": c} for o, c in OUTCOMES],
        "data": [
            [int(b.start.timestamp()) for b in series.buckets],
            *([getattr(b, o) for b in series.buckets] for o, _ in OUTCOMES),
        ],
    }


def series_charts(series: StatsSeries) -> list[tuple[str, Markup]]:
    """The job page's charts below throughput: run time, queue wait, failure rate, backlog."""
    return [
        (
            "Run time (s)",
            lines_chart(
                series,
                "run time p50, p95, p99",
                [
                    ("p50", "#1565c0", lambda b: b.run_p50),
                    ("p95", "#ef6c00", lambda b: b.run_p95),
                    ("p99", "#c62828", lambda b: b.run_p99),
                ],
                "s",
            ),
        ),
        (
            "Queue wait p95 (s)",
            lines_chart(series, "queue wait p95", [("p95", "#6a1b9a", lambda b: b.wait_p95)], "s"),
        ),
        (
            "Failure rate",
            lines_chart(
                series,
                "failed attempts over finished attempts",
                [("rate", "#c62828", lambda b: b.failure_rate)],
                "",
            ),
        ),
        (
            "Backlog",
            lines_chart(
                series,
                "waiting runs, oldest due age (s)",
                [
                    ("waiting", "#1565c0", lambda b: None if b.waiting is None else b.waiting),
                    ("oldest due age", "#ef6c00", lambda b: b.oldest_due_age),
                ],
                "",
            ),
        ),
    ]


OVERVIEW_HISTORY_RANGE: Final = "6h"
"""The overview's history chart: the last 6 hours in 5-minute buckets, clock-aligned."""
OVERVIEW_HISTORY_JOBS: Final = 100
"""Jobs whose history the overview sums (on PostgreSQL one statement, a primary-key range per
job of at most 360 minutes, summed into 72 bucket rows): past them the chart says it shows
the first 100 jobs (by id)."""


async def overview_history(
    stats: JobStatsStore, job_ids: Sequence[str], *, now: datetime | None = None
) -> tuple[StatsSeries, int]:
    """Every listed job's history summed over :data:`OVERVIEW_HISTORY_RANGE` (the first
    :data:`OVERVIEW_HISTORY_JOBS` jobs), and how many jobs were summed: one statement over the
    stats table's primary key that sums the jobs' minutes per 5-minute bucket
    (``read_stats_buckets``: 72 rows, not a row per job and minute; a store without it: a
    read per job).
    The backlog figures are not summed (a job's own page shows its backlog)."""
    now = now if now is not None else datetime.now(UTC)
    start, end, step = range_buckets(OVERVIEW_HISTORY_RANGE, now)
    summed = list(job_ids)[:OVERVIEW_HISTORY_JOBS]
    rows: list[StatsRow] = []
    read_buckets = getattr(stats, "read_stats_buckets", None)
    if read_buckets is not None:  # PostgreSQL: one statement summing every job per bucket
        found = await read_buckets(summed, start, end, step)
        rows = [attrs.evolve(row, waiting=None, oldest_due_age=None) for row in found]
    else:
        for job_id in summed:
            found = await stats.read_stats(job_id, start, end)
            rows.extend(attrs.evolve(row, waiting=None, oldest_due_age=None) for row in found)
    series = series_from_rows(
        "*", OVERVIEW_HISTORY_RANGE, now, rows, loss_bound=stats.flush_interval
    )
    return series, len(summed)


OUTBOX_TREND_RANGE: Final = "6h"
"""The outbox page's trend: the last 6 hours in 5-minute buckets, clock-aligned."""


async def outbox_trend(
    stats: JobStatsStore, outbox_id: str, *, now: datetime | None = None
) -> dict[str, Any]:
    """``outbox_id``'s trend over :data:`OUTBOX_TREND_RANGE` (one read of the stats table's
    primary key, at most 360 minute rows): the messages its relays delivered per bucket and the
    pending backlog they sampled (:mod:`ship_sqla._outbox._stats`), as two SVG charts and the
    JSON twin's buckets. ``sampled`` is False when no relay given ``stats=`` wrote any."""
    now = now if now is not None else datetime.now(UTC)
    start, end, _ = range_buckets(OUTBOX_TREND_RANGE, now)
    rows = await stats.read_stats(outbox_stats_id(outbox_id), start, end)
    series = series_from_rows(
        outbox_stats_id(outbox_id), OUTBOX_TREND_RANGE, now, rows, loss_bound=stats.flush_interval
    )
    step = int(series.step.total_seconds() // 60)
    return {
        "range": OUTBOX_TREND_RANGE,
        "step_minutes": step,
        "sampled": bool(rows),
        "delivered_total": series.total.completed,
        "delivered": lines_chart(
            series,
            f"messages delivered per {step} min",
            [("delivered", "#2e7d32", lambda b: b.completed)],
            "",
        ),
        "pending": lines_chart(
            series,
            "pending messages (sampled by the relays)",
            [("pending", "#1565c0", lambda b: b.waiting)],
            "",
        ),
        "buckets": [
            {"start": b.start, "delivered": b.completed, "pending": b.waiting}
            for b in series.buckets
        ],
    }
