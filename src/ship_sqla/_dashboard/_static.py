"""The dashboard's static files (issue 36): its stylesheet and script, and the vendored htmx,
idiomorph (the morphing swap), the htmx SSE extension and uPlot (``static/vendor/README.md``
names their versions and sources). No build step: the files are served as they are.

Each file is served under a content-hashed name, ``<stem>.<sha256[:10]>.<ext>``
(``htmx-2.0.11.min.1a2b3c4d5e.js``), with ``Cache-Control: public, max-age=31536000,
immutable``: a browser fetches it once, and a changed file is a new name. :class:`StaticAssets`
is a thin wrapper over Starlette's :class:`~starlette.staticfiles.StaticFiles`: it answers only
the hashed names of :data:`ASSETS` (a stale or unknown name is a 404, never another file) and
serves a gzip copy (compressed once, in memory) to a browser that accepts it.

The pages carry no inline style and no script without the request's CSP nonce
(:mod:`._security`).
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Final

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse, Response
from starlette.staticfiles import StaticFiles

if TYPE_CHECKING:
    from starlette.types import Message, Receive, Scope, Send

__all__ = ["ASSETS", "IMMUTABLE", "STATIC_DIR", "StaticAssets", "asset_name"]

STATIC_DIR: Final = Path(__file__).parent / "static"
IMMUTABLE: Final = "public, max-age=31536000, immutable"

_FILES: Final = (
    "dashboard.css",
    "dashboard.js",
    "vendor/htmx-2.0.11.min.js",
    "vendor/idiomorph-ext-0.8.0.min.js",
    "vendor/htmx-ext-sse-2.2.4.min.js",
    "vendor/uplot-1.6.32.min.js",
    "vendor/uplot-1.6.32.min.css",
)
_TYPES: Final = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}


def _hashed(relative: str, content: bytes) -> str:
    stem, _, ext = relative.rpartition(".")
    return f"{stem}.{hashlib.sha256(content).hexdigest()[:10]}.{ext}"


def _read_assets() -> dict[str, tuple[str, str]]:
    found: dict[str, tuple[str, str]] = {}
    for relative in _FILES:
        content = (STATIC_DIR / relative).read_bytes()
        found[relative] = (_hashed(relative, content), relative)
    return found


ASSETS: Final = _read_assets()
"""File (``vendor/htmx-2.0.11.min.js``) -> (its hashed name, the file)."""
_BY_HASHED: Final = dict(ASSETS.values())


def asset_name(relative: str) -> str:
    """The hashed name under which ``relative`` (one of the files above) is served."""
    return ASSETS[relative][0]


class StaticAssets:
    """ASGI app for ``<base>/static``: the hashed names only, immutable, gzip when accepted."""

    def __init__(self) -> None:
        self._files = StaticFiles(directory=STATIC_DIR)
        self._gzipped: dict[str, bytes] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        root = str(scope.get("root_path", ""))
        hashed = path[len(root) :].lstrip("/") if path.startswith(root) else path.lstrip("/")
        relative = _BY_HASHED.get(hashed)
        if relative is None or scope.get("method") not in ("GET", "HEAD"):
            await PlainTextResponse(
                f"404 {hashed[:200]!r}: no such asset. Fix: reload the page (its assets are"
                " named by their content).",
                404,
            )(scope, receive, send)
            return
        media_type = _TYPES[Path(relative).suffix]
        if "gzip" in Headers(scope=scope).get("accept-encoding", ""):
            body = self._gzipped.get(relative)
            if body is None:
                raw = (STATIC_DIR / relative).read_bytes()
                body = self._gzipped[relative] = gzip.compress(raw, 9, mtime=0)
            response = Response(
                body,
                media_type=media_type,
                headers={
                    "Content-Encoding": "gzip",
                    "Vary": "Accept-Encoding",
                    "Cache-Control": IMMUTABLE,
                },
            )
            await response(scope, receive, send)
            return

        async def immutable(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.lower() not in (b"cache-control", b"content-type")
                ]
                headers += [
                    (b"cache-control", IMMUTABLE.encode()),
                    (b"content-type", media_type.encode()),
                    (b"vary", b"Accept-Encoding"),
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self._files({**scope, "path": "/" + relative, "root_path": ""}, receive, immutable)
