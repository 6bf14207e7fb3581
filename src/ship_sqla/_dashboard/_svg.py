"""Inline SVG charts for the overview (no JavaScript, no build step). Pure: tested alone."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ship_sqla.kernel._browse import ThroughputBucket

__all__ = ["throughput_chart"]

_WIDTH = 720
_HEIGHT = 160
_PAD = 24


def throughput_chart(buckets: Sequence[ThroughputBucket], *, bucket_seconds: int) -> str:
    """Stacked bars per bucket: completed (green) under dead (red), with a hover title per
    bar; a capped bucket is outlined (its true count may be higher)."""
    n = max(len(buckets), 1)
    peak = max((b.completed + b.dead for b in buckets), default=0) or 1
    slot = (_WIDTH - 2 * _PAD) / n
    bar = max(slot - 2, 1)
    inner = _HEIGHT - 2 * _PAD
    parts = [
        (
            f'<svg class="chart" role="img" viewBox="0 0 {_WIDTH} {_HEIGHT}" width="100%"'
            f' aria-label="runs completed and dead per {bucket_seconds // 60} minutes">'
        ),
        (
            f'<line x1="{_PAD}" y1="{_HEIGHT - _PAD}" x2="{_WIDTH - _PAD}" y2="{_HEIGHT - _PAD}"'
            ' stroke="#999"/>'
        ),
        f'<text x="{_PAD}" y="14" font-size="11">peak {peak} per bucket</text>',
    ]
    for i, b in enumerate(buckets):
        x = _PAD + i * slot
        done_h = inner * b.completed / peak
        dead_h = inner * b.dead / peak
        base = _HEIGHT - _PAD
        label = escape(
            f"{b.start:%Y-%m-%d %H:%M} UTC: {b.completed} completed, {b.dead} dead"
            + (" (capped: at least)" if b.capped else "")
        )
        outline = ' stroke="#000" stroke-dasharray="2"' if b.capped else ""
        parts.append(
            f"<g><title>{label}</title>"
            f'<rect class="completed" x="{x:.1f}" y="{base - done_h:.1f}" width="{bar:.1f}"'
            f' height="{done_h:.1f}" fill="#2e7d32"{outline}/>'
            f'<rect class="dead" x="{x:.1f}" y="{base - done_h - dead_h:.1f}" width="{bar:.1f}"'
            f' height="{dead_h:.1f}" fill="#c62828"{outline}/></g>'
        )
    if buckets:
        first, last = buckets[0].start, buckets[-1].start
        parts.append(
            f'<text x="{_PAD}" y="{_HEIGHT - 6}" font-size="11">{first:%H:%M}</text>'
            f'<text x="{_WIDTH - _PAD}" y="{_HEIGHT - 6}" font-size="11"'
            f' text-anchor="end">{last:%H:%M} UTC</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
