"""The dashboard's HTML (issue 36): Jinja2 templates with autoescape, one layout
(``templates/layout.html``), the building blocks as macros (``templates/macros.html``) and a
template per page (``templates/pages/``). A value reaches a page escaped unless it is
:class:`~markupsafe.Markup` built by a macro or a template.

The functions here are the Python side of the macros (the pages' rows are built in Python from
the operator surfaces' records, each cell rendered by its macro), and :func:`render` renders a
page's template. The templates ship in the wheel as package data (``templates/`` beside this
module). No inline style; the scripts carry the response's CSP nonce (:mod:`._security`).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup, escape

from ship_sqla._dashboard._static import asset_name

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "ENV",
    "PARTS",
    "Html",
    "ago",
    "at",
    "button_form",
    "error_summary",
    "health_banner",
    "hidden",
    "href",
    "link",
    "pre_json",
    "render",
    "state",
    "table",
    "text",
]

Html = str
"""Markup already escaped (a macro's or a template's output, as text: the pages join pieces
of it; :func:`render` and :func:`table` mark it safe again for the templates)."""


def _utc(value: datetime) -> str:
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def _iso_utc(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _duration(value: timedelta) -> str:
    """A retention or an age: whole days as ``7 d``, else hours, minutes or seconds."""
    seconds = value.total_seconds()
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size:.0f} {unit}"
    return f"{seconds:g} s"


def _pretty_json(value: Any) -> str:  # noqa: ANN401 - any JSON value
    return json.dumps(value, indent=2, sort_keys=True, default=str)


ENV = Environment(
    loader=PackageLoader("ship_sqla._dashboard", "templates"),
    autoescape=select_autoescape(["html"], default_for_string=True, default=True),
    undefined=StrictUndefined,
    extensions=["jinja2.ext.do"],
    auto_reload=False,  # the templates are package data: no stat of each one per page
    trim_blocks=False,
    keep_trailing_newline=False,
)
ENV.filters["utc"] = _utc
ENV.filters["isoutc"] = _iso_utc
ENV.filters["pretty_json"] = _pretty_json
ENV.filters["duration"] = _duration
ENV.globals["static"] = lambda relative: relative  # replaced per render: see render()

_M: Any = ENV.get_template("macros.html").module
"""The macros, called from Python (each returns Markup)."""
PARTS: Any = ENV.get_template("parts.html").module
"""The pages' row parts (``templates/parts.html``), called from the row builders."""


def render(template: str, /, **context: Any) -> Html:  # noqa: ANN401 - template values
    """``template`` rendered with ``context`` (autoescaped) as Markup."""
    return ENV.get_template(template).render(**context)


def static_url(base: str, relative: str) -> str:
    """The URL of a static file under its content-hashed name (:mod:`._static`)."""
    return f"{base}/static/{asset_name(relative)}"


def text(value: object) -> Html:
    return str(escape("" if value is None else str(value)))


def error_summary(error: str | None, width: int = 160) -> Html:
    """An error in one table cell: its first line (the exception and its message, never the
    traceback that follows it), cut at ``width`` characters with an ellipsis; the run's page
    shows the whole text. The cell's title holds the whole first line."""
    return str(_M.error_summary(error, width))


def at(value: datetime | None) -> Html:
    """A time as ``<time datetime=ISO>`` reading in UTC; the page's script shows it in the
    browser's zone (or UTC, by the header's toggle)."""
    return str(_M.at(value))


def ago(seconds: float | None) -> Html:
    if seconds is None:
        return "—"
    if seconds < 120:  # noqa: PLR2004 - display thresholds
        return f"{seconds:.0f} s"
    if seconds < 7200:  # noqa: PLR2004
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def href(base: str, path: str, params: Mapping[str, Any] | None = None) -> str:
    query = {k: v for k, v in (params or {}).items() if v not in (None, "")}
    return base + path + ("?" + urlencode(query) if query else "")


def link(base: str, path: str, label: object, params: Mapping[str, Any] | None = None) -> Html:
    return str(_M.link(href(base, path, params), label))


def state(name: str | None) -> Html:
    return str(_M.state(name))


def pre_json(value: Any) -> Html:  # noqa: ANN401 - any JSON value
    return str(_M.pre_json(value))


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], *, empty: str) -> Html:
    cells = [[Markup(cell) for cell in row] for row in rows]  # noqa: S704 - escaped cells
    return str(_M.table(list(headers), cells, empty))


def hidden(name: str, value: object) -> Html:
    return str(_M.hidden(name, value))


def button_form(
    action: str, label: str, *, csrf: str, back: str, fields: Mapping[str, object] | None = None
) -> Html:
    """A one-button POST form (an action on one run or job)."""
    return str(_M.button_form(action, label, csrf, back, dict(fields or {})))


def health_banner(alarms: Sequence[tuple[str, str]]) -> Html:
    """J22: the storage-health alarms (kind, message with its fix) as one small banner on every
    page; nothing while the database is healthy (or its health unknown)."""
    return str(_M.health_banner(list(alarms)))


def layout(
    base: str,
    current: str,
    title: str,
    body: Html,
    *,
    nav: Sequence[tuple[str, str]],
    actor: str,
    can_manage: bool,
    nonce: str,
    here: str = "",
    flash: str | None = None,
    error: str | None = None,
    poll_ms: int | None = None,
    refresh: str = "",
    refresh_choices: Sequence[str] = (),
    banner: Html = "",
    charts: bool = False,
    fragment: bool = False,
) -> Html:
    """The page (``templates/layout.html``), or only ``<main>``'s content when ``fragment``
    (the live refresh's swap)."""
    return render(
        "fragment.html" if fragment else "layout.html",
        base=base,
        current=current,
        title=title,
        content=Markup(body),  # noqa: S704 - built by the templates and macros
        nav=nav,
        actor=actor,
        can_manage=can_manage,
        nonce=nonce,
        here=here,
        flash=flash,
        error=error,
        poll_ms=poll_ms,
        refresh=refresh,
        refresh_choices=refresh_choices,
        banner=Markup(banner),  # noqa: S704 - the macro's output
        charts=charts,
        static=lambda relative: static_url(base, relative),
    )
