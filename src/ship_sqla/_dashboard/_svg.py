"""The overview's throughput chart as inline SVG (no JavaScript; ``templates/throughput.svg``).
Pure: tested alone."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ship_sqla._dashboard._html import render

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
    inner = _HEIGHT - 2 * _PAD
    bars = [
        {
            "x": _PAD + i * slot,
            "done": inner * b.completed / peak,
            "dead": inner * b.dead / peak,
            "capped": b.capped,
            "label": f"{b.start:%Y-%m-%d %H:%M} UTC: {b.completed} completed, {b.dead} dead"
            + (" (capped: at least)" if b.capped else ""),
        }
        for i, b in enumerate(buckets)
    ]
    return render(
        "throughput.svg",
        width=_WIDTH,
        height=_HEIGHT,
        pad=_PAD,
        base=_HEIGHT - _PAD,
        minutes=bucket_seconds // 60,
        peak=peak,
        bars=bars,
        bar_width=max(slot - 2, 1),
        first=f"{buckets[0].start:%H:%M}" if buckets else "",
        last=f"{buckets[-1].start:%H:%M}" if buckets else "",
    )
