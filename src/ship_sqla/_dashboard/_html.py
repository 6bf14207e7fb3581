"""The dashboard's HTML: one layout, tables, forms. Every value is escaped here; no template
engine, no JavaScript beyond the live-update poll (a fetch of the same page, every few
seconds, replacing ``<main>``; pages with forms do not poll, so a selection is never lost).
No inline style or script either: the stylesheet and the poll are static assets
(:mod:`._static`), so the Content-Security-Policy needs no ``'unsafe-inline'``."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from html import escape
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from ship_sqla._dashboard._static import SCRIPT, STYLESHEET

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "Html",
    "ago",
    "at",
    "button_form",
    "error_summary",
    "health_banner",
    "hidden",
    "layout",
    "link",
    "pre_json",
    "table",
    "text",
]

Html = str
"""Markup already escaped."""


def text(value: object) -> Html:
    return escape("" if value is None else str(value))


def error_summary(error: str | None, width: int = 160) -> Html:
    """An error in one table cell: its first line (the exception and its message, never the
    traceback that follows it), cut at ``width`` characters with an ellipsis; the run's page
    shows the whole text. The cell's title holds the whole first line."""
    if not error:
        return ""
    line = error.splitlines()[0]
    shown = line if len(line) <= width else f"{line[: width - 1]}…"
    return f'<span title="{text(line)}">{text(shown)}</span>'


def at(value: datetime | None) -> Html:
    return "—" if value is None else text(f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC")


def ago(seconds: float | None) -> Html:
    if seconds is None:
        return "—"
    if seconds < 120:  # noqa: PLR2004 - display thresholds
        return f"{seconds:.0f} s"
    if seconds < 7200:  # noqa: PLR2004
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def link(base: str, path: str, label: object, params: Mapping[str, Any] | None = None) -> Html:
    query = {k: v for k, v in (params or {}).items() if v not in (None, "")}
    href = base + path + ("?" + urlencode(query) if query else "")
    return f'<a href="{escape(href)}">{text(label)}</a>'


def pre_json(value: Any) -> Html:  # noqa: ANN401 - any JSON value
    return f"<pre>{text(json.dumps(value, indent=2, sort_keys=True, default=str))}</pre>"


def table(headers: Sequence[str], rows: Iterable[Sequence[Html]], *, empty: str) -> Html:
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    if not body:
        body = f'<tr><td colspan="{len(headers)}" class="muted">{text(empty)}</td></tr>'
    head = "".join(f"<th>{text(h)}</th>" for h in headers)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def hidden(name: str, value: object) -> Html:
    return f'<input type="hidden" name="{text(name)}" value="{text(value)}">'


def button_form(
    action: str, label: str, *, csrf: str, back: str, fields: Mapping[str, object] | None = None
) -> Html:
    """A one-button POST form (an action on one run or job)."""
    inputs = "".join(hidden(k, v) for k, v in (fields or {}).items())
    return (
        f'<form class="inline" method="post" action="{text(action)}">{hidden("csrf_token", csrf)}'
        f'{hidden("next", back)}{inputs}<button type="submit" name="do" value="{text(label)}">'
        f"{text(label)}</button></form>"
    )


def health_banner(alarms: Sequence[tuple[str, str]]) -> Html:
    """J22: the storage-health alarms (kind, message with its fix) as one small banner on every
    page; nothing while the database is healthy (or its health unknown)."""
    if not alarms:
        return ""
    items = "".join(
        f'<li data-alarm="{text(kind)}">{text(message)}</li>' for kind, message in alarms
    )
    return (
        '<div class="error banner" id="health-banner" role="alert"><strong>Database'
        f" health</strong> (<code>ship-sqla jobs health</code>)<ul>{items}</ul></div>"
    )


def layout(
    base: str,
    current: str,
    title: str,
    body: Html,
    *,
    nav: Sequence[tuple[str, str]],
    actor: str,
    can_manage: bool,
    flash: str | None = None,
    error: str | None = None,
    poll_ms: int | None = None,
    banner: Html = "",
) -> Html:
    links = "".join(
        f'<a class="{"on" if path == current else ""}" href="{text(base + (path or "/"))}">'
        f"{text(label)}</a>"
        for path, label in nav
    )
    role = "manage" if can_manage else "read only"
    notes = ""
    if flash:
        notes += f'<p class="flash" id="flash">{text(flash)}</p>'
    if error:
        notes += f'<p class="error" id="error">{text(error)}</p>'
    notes += banner
    static = f"{base}/static"
    script = f'<script src="{text(static)}/{SCRIPT}" defer></script>' if poll_ms else ""
    polled = f' data-poll-ms="{int(poll_ms)}"' if poll_ms else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{text(title)} · ship_sqla</title>"
        f'<link rel="stylesheet" href="{text(static)}/{STYLESHEET}">{script}</head><body>'
        f'<header><strong>ship_sqla</strong>{links}<span class="muted who">'
        f"{text(actor)} ({role})</span></header><main{polled}>{notes}<h1>{text(title)}</h1>"
        f"{body}</main></body></html>"
    )
