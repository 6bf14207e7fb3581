"""The search form and the bulk-by-filter form, read for a page (issue 36 items 4-5; S1, S2).

What a search page needs from a request, pure (tested without a server): :func:`read_search`
reads the form's fields (``id``, ``job``, ``tenant``, ``state``, ``from``, ``to``, ``worker``,
``error``, ``payload`` (repeatable), ``limit``, ``cursor``) into a :class:`SearchForm` that keeps
every value as typed, so the page renders the form again as the operator left it, and either a
checked :class:`~ship_sqla.jobs.RunFilter` or the :class:`~ship_sqla.errors.RunFilterError`
naming the field and the fix (the page shows it beside that field, on the same page, no 400).
:func:`search_query` is a link back to a search (the audit entry's ``links.search``, a "next
page" link). The operator surface does the rest: ``ops.search_runs(form.run_filter, ...)``,
``ops.preview_matching(action, form.run_filter)``, then ``ops.<action>_filtered(form.run_filter,
token=...)`` from the confirmation form (its hidden ``token`` and the same filter fields).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final
from urllib.parse import urlencode

import attrs

from ship_sqla.kernel._search import (
    MAX_PAGE_SIZE,
    MIN_PAGE_SIZE,
    RunFilter,
    RunFilterError,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["FIELDS", "PAGE_SIZES", "SearchForm", "read_search", "search_query"]

FIELDS: Final = RunFilter.FIELDS
PAGE_SIZES: Final = (20, 50, 100, 200)
"""The page sizes a search page offers (issue 36: 20-200)."""
DEFAULT_PAGE_SIZE: Final = 50


@attrs.frozen
class SearchForm:
    """A search form as the operator typed it (``values``: field to its values, as strings),
    and what it means: ``run_filter`` (None when ``error``), the page size and cursor."""

    values: dict[str, tuple[str, ...]]
    run_filter: RunFilter | None
    error: RunFilterError | None
    limit: int
    cursor: str | None

    def value(self, field: str) -> str:
        """The first value typed for ``field`` ("" for none): what the form's input shows."""
        return next(iter(self.values.get(field, ())), "")


def read_search(items: Iterable[tuple[str, str]]) -> SearchForm:
    """A :class:`SearchForm` from a request's ``(name, value)`` pairs (a query string's or a
    form's ``multi_items()``); names that are not search fields are ignored."""
    values: dict[str, list[str]] = {}
    limit_text, cursor = "", None
    for name, value in items:
        if name in FIELDS:
            values.setdefault(name, []).append(value)
        elif name == "limit":
            limit_text = value.strip()
        elif name == "cursor" and value.strip():
            cursor = value.strip()
    kept = {name: tuple(found) for name, found in values.items()}
    limit, error = DEFAULT_PAGE_SIZE, None
    if limit_text:
        digits = limit_text.isascii() and limit_text.isdigit() and len(limit_text) <= 3  # noqa: PLR2004
        if digits and MIN_PAGE_SIZE <= int(limit_text) <= MAX_PAGE_SIZE:
            limit = int(limit_text)
        else:
            error = RunFilterError(
                "limit",
                f"{limit_text[:40]!r} rows per page.",
                fix=f"pick one of {', '.join(map(str, PAGE_SIZES))}"
                f" (or {MIN_PAGE_SIZE}..{MAX_PAGE_SIZE}).",
            )
    run_filter = None
    if error is None:
        try:
            run_filter = RunFilter.parse({name: list(found) for name, found in kept.items()})
        except RunFilterError as exc:
            error = exc
    return SearchForm(kept, run_filter, error, limit, None if error else cursor)


def search_query(
    run_filter: RunFilter, *, limit: int | None = None, cursor: str | None = None
) -> str:
    """The query string of a search for ``run_filter`` (``job=mail&state=dead``), with a page
    size and a cursor when given."""
    pairs = run_filter.as_fields()
    if limit is not None:
        pairs.append(("limit", str(limit)))
    if cursor:
        pairs.append(("cursor", cursor))
    return urlencode(pairs)
