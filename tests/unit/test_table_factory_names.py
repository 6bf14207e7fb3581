"""Every ship table factory refuses names PostgreSQL cannot hold as given, when the table is
declared (issue #10 item 6; T1): one check, in ``ship_sqla._naming``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import MetaData

from ship_sqla import (
    ship_idempotency_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_outbox_table,
    ship_webhook_events_table,
)
from ship_sqla.errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy import Table

FACTORIES: list[Callable[..., Table]] = [
    ship_outbox_table,
    ship_idempotency_table,
    ship_webhook_events_table,
    ship_job_runs_table,
    ship_job_state_table,
]


@pytest.mark.parametrize("factory", FACTORIES, ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"name": ""}, "table name '' is empty or blank"),
        ({"name": "   "}, "is empty or blank"),
        ({"name": "ship\x00jobs"}, "contains a NUL character"),
        ({"name": 7}, "is a int, not text"),
        ({"schema": ""}, "table schema '' is empty or blank"),
        ({"schema": " "}, "is empty or blank"),
        ({"schema": "s" * 64}, "is 64 bytes, over PostgreSQL's 63"),
    ],
)
def test_factories_refuse_unusable_names(
    factory: Callable[..., Table], options: dict[str, Any], message: str
) -> None:
    """T1: name="" / schema="" (and blank, NUL, over-long, non-text) are ConfigurationError
    at declaration, not SQL errors at the first statement; schema=None stays "search_path"."""
    with pytest.raises(ConfigurationError, match=message) as raised:
        factory(MetaData(), **options)
    assert raised.value.fix
    assert factory(MetaData(), schema=None).schema is None
    assert factory(MetaData(), schema="app").schema == "app"
