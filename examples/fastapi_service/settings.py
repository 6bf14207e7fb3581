"""The one settings module the web app, the worker and the relay share.

One variable: ``SHIP_SQLA_DATABASE_URL`` (``postgresql://`` or ``postgresql+asyncpg://``), the
one ``ship-sqla worker`` reads too, so the three processes always meet in the same database.
Unset, the settings start (or join) the embedded PostgreSQL of the ``embedded`` extra and use
its ``postgres`` database, kept across runs in ``~/.cache/ship_sqla/embedded``; without that
extra they refuse with ``NoServerError`` saying how to get a server. ``SHIP_SQLA_REDIS_URL``
(optional) is where ``relay.py --redis`` publishes.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING, Final

import attrs

from ship_sqla import create_engine
from ship_sqla.testing import resolve_server

if TYPE_CHECKING:
    from sqlalchemy.engine import URL
    from sqlalchemy.ext.asyncio import AsyncEngine

DATABASE_URL_ENV: Final = "SHIP_SQLA_DATABASE_URL"
REDIS_URL_ENV: Final = "SHIP_SQLA_REDIS_URL"
OUTBOX_ID: Final = "orders"
"""The logical outbox the app writes and the relay drains."""
REDIS_STREAM: Final = "orders.events"
DEFAULT_REDIS_URL: Final = "redis://127.0.0.1:6379/0"


@attrs.frozen
class Settings:
    database_url: URL
    source: str  # "environment" or "embedded"
    redis_url: str = DEFAULT_REDIS_URL
    outbox_id: str = OUTBOX_ID
    redis_stream: str = REDIS_STREAM
    # The app's pool: one connection per request in flight behind the Idempotency-Key
    # middleware (it holds its transaction while the route runs), the rest wait for one.
    pool_size: int = 5
    max_overflow: int = 10

    def engine(self, **options: object) -> AsyncEngine:
        """A new engine on the database (each process, each lifespan builds its own)."""
        return create_engine(self.database_url, **options)


@functools.cache
def get_settings() -> Settings:
    """The settings of this process: read once from the environment."""
    server = resolve_server(prefer_embedded=True)  # the variable, else the embedded server
    settings = Settings(
        database_url=server.url,
        source=server.source,
        redis_url=os.environ.get(REDIS_URL_ENV) or DEFAULT_REDIS_URL,
    )
    if server.source == "embedded":
        url = server.url.set(drivername="postgresql").render_as_string(hide_password=False)
        print(  # the worker command reads only the variable: say what to export
            f"fastapi_service: {DATABASE_URL_ENV} is not set; using the embedded PostgreSQL."
            f" For `ship-sqla worker`: export {DATABASE_URL_ENV}='{url}'",
            file=sys.stderr,
            flush=True,
        )
    return settings
