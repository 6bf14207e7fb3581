"""The dashboard's HTML: one layout, tables, forms. Every value is escaped here; no template
engine, no JavaScript beyond the live-update poll (a fetch of the same page, every few
seconds, replacing ``<main>``; pages with forms do not poll, so a selection is never lost)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from html import escape
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "Html",
    "ago",
    "at",
    "button_form",
    "hidden",
    "layout",
    "link",
    "pre_json",
    "table",
    "text",
]

Html = str
"""Markup already escaped."""

_NAV = (
    ("", "Overview"),
    ("/runs", "Runs"),
    ("/dead", "Dead letters"),
    ("/schedules", "Schedules"),
    ("/workers", "Workers"),
    ("/outbox", "Outbox"),
    ("/audit", "Audit log"),
)

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#263238;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
header a{color:#cfd8dc;text-decoration:none}header a.on{color:#fff;font-weight:600}
main{padding:16px}table{border-collapse:collapse;width:100%;background:#fff;margin:8px 0}
th,td{border-bottom:1px solid #e0e0e0;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eceff1}pre{background:#f5f5f5;padding:8px;overflow:auto;max-height:320px}
.flash{background:#e8f5e9;border:1px solid #a5d6a7;padding:6px 10px}
.error{background:#ffebee;border:1px solid #ef9a9a;padding:6px 10px}
.state-dead{color:#c62828}.state-completed{color:#2e7d32}.state-running{color:#1565c0}
form.inline{display:inline}button{margin:2px}.muted{color:#777}
.filters label{margin-right:8px}.timeline li{margin-bottom:8px}
"""

_POLL = """<script>
setInterval(function(){fetch(location.href,{headers:{'X-Ship-Fragment':'1'}})
.then(function(r){return r.ok?r.text():null}).then(function(h){if(h!==null){
document.querySelector('main').innerHTML=h}})},%d);
</script>"""


def text(value: object) -> Html:
    return escape("" if value is None else str(value))


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


def layout(
    base: str,
    current: str,
    title: str,
    body: Html,
    *,
    actor: str,
    can_manage: bool,
    flash: str | None = None,
    error: str | None = None,
    poll_ms: int | None = None,
) -> Html:
    nav = "".join(
        f'<a class="{"on" if path == current else ""}" href="{text(base + (path or "/"))}">'
        f"{text(label)}</a>"
        for path, label in _NAV
    )
    role = "manage" if can_manage else "read only"
    notes = ""
    if flash:
        notes += f'<p class="flash" id="flash">{text(flash)}</p>'
    if error:
        notes += f'<p class="error" id="error">{text(error)}</p>'
    poll = _POLL % poll_ms if poll_ms else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{text(title)} · ship_sqla</title><style>{_CSS}</style></head><body>"
        f'<header><strong>ship_sqla</strong>{nav}<span class="muted" style="margin-left:auto">'
        f"{text(actor)} ({role})</span></header><main>{notes}<h1>{text(title)}</h1>{body}</main>"
        f"{poll}</body></html>"
    )
