"""Issue 36 item 4 (S2): the search form keeps what the operator typed and says which field is
wrong, with the fix, instead of replacing the page with an error; a search's link reads back
as the same filter. Pure: no server."""

from __future__ import annotations

from urllib.parse import parse_qsl

from ship_sqla._dashboard._search import read_search, search_query
from ship_sqla.kernel._search import RunFilter


def test_a_good_form_is_a_filter_and_its_link_reads_back() -> None:
    """A form's fields become a RunFilter; its query string reads back as the same filter."""
    form = read_search(
        [
            ("job", "mail"),
            ("state", "dead"),
            ("payload", "order.id=7"),
            ("payload", 'customer="Ann"'),
            ("limit", "100"),
            ("cursor", "abc"),
            ("csrf", "ignored"),
        ]
    )
    assert form.error is None
    assert form.run_filter == RunFilter.parse(
        ["job=mail", "state=dead", "payload=order.id=7", 'payload=customer="Ann"']
    )
    assert (form.limit, form.cursor) == (100, "abc")
    query = search_query(form.run_filter, limit=20)
    again = read_search(parse_qsl(query))
    assert again.run_filter == form.run_filter
    assert again.limit == 20


def test_a_bad_field_is_named_and_the_form_is_kept() -> None:
    """A bad date: the error names ``from`` with the fix; every value typed is kept as typed
    (the page renders the form again), and the cursor is dropped."""
    form = read_search([("job", "mail"), ("from", "last tuesday"), ("cursor", "abc")])
    assert form.run_filter is None
    assert form.error is not None
    assert form.error.field == "from"
    assert "ISO 8601" in (form.error.fix or "")
    assert form.value("from") == "last tuesday"
    assert form.value("job") == "mail"
    assert form.cursor is None
    bad_size = read_search([("limit", "5000")])
    assert bad_size.error is not None
    assert bad_size.error.field == "limit"
