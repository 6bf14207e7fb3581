"""Plain ASGI plumbing shared by the webhook receiver and the Idempotency-Key middleware.

Pure ASGI (no framework dependency): both mount in Starlette, FastAPI or any ASGI server.
Requests are read whole, within a byte limit; responses are built here or recorded from the
wrapped application so they can be stored and replayed.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeAlias

from ship_sqla._idempotency._types import StoredResponse

__all__ = [
    "PROBLEM_JSON",
    "ASGIApp",
    "BodyTooLargeError",
    "ClientDisconnectedError",
    "Message",
    "Receive",
    "ResponseRecorder",
    "Scope",
    "Send",
    "header_map",
    "header_values",
    "json_response",
    "problem_response",
    "read_body",
    "replaying_receive",
    "scope_without_send_extensions",
    "send_response",
    "send_stored",
    "serve_lifespan",
]

Scope: TypeAlias = MutableMapping[str, Any]
Message: TypeAlias = MutableMapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]
ASGIApp: TypeAlias = Callable[[Scope, Receive, Send], Awaitable[None]]

PROBLEM_JSON = "application/problem+json"

# Connection-level headers describe one hop, not the response: never stored or replayed.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


class BodyTooLargeError(Exception):
    """The request body exceeded the configured limit (answer 413)."""


class ClientDisconnectedError(Exception):
    """The client went away before sending its whole body."""


def header_values(scope: Scope, name: str) -> list[str]:
    """Every value of header ``name`` (lower-case), in order; ASGI headers are latin-1 bytes."""
    wanted = name.encode("latin-1")
    return [v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == wanted]


def header_map(scope: Scope) -> dict[str, str]:
    """Headers as one lower-case mapping; repeated headers are joined with ', ' (RFC 9110)."""
    merged: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        merged[name] = f"{merged[name]}, {value}" if name in merged else value
    return merged


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole request body, refusing more than ``limit`` bytes before reading them all."""
    declared = header_values(scope, "content-length")
    if declared and declared[0].strip().isdigit() and int(declared[0]) > limit:
        raise BodyTooLargeError
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnectedError
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLargeError
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replaying_receive(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the already-read body to the wrapped app, then defers to the
    server's (which reports the disconnect the app may be listening for)."""
    sent = False

    async def receive_again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return receive_again


async def send_response(
    send: Send, status: int, headers: list[tuple[str, str]], body: bytes
) -> None:
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    if not any(k == b"content-length" for k, _ in raw):
        raw.append((b"content-length", str(len(body)).encode("ascii")))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def json_response(status: int, content: dict[str, Any]) -> StoredResponse:
    body = json.dumps(content, separators=(",", ":")).encode()
    return StoredResponse(status=status, headers=[("content-type", "application/json")], body=body)


def problem_response(
    status: int, *, title: str, code: str, detail: str, fix: str | None = None
) -> StoredResponse:
    """An RFC 9457 problem document, with ship's stable ``code`` and the ``fix``."""
    content: dict[str, Any] = {"title": title, "status": status, "code": code, "detail": detail}
    if fix:
        content["fix"] = fix
    body = json.dumps(content, separators=(",", ":")).encode()
    return StoredResponse(status=status, headers=[("content-type", PROBLEM_JSON)], body=body)


async def send_stored(
    send: Send, response: StoredResponse, extra: list[tuple[str, str]] | None = None
) -> None:
    await send_response(send, response.status, [*response.headers, *(extra or [])], response.body)


class ResponseRecorder:
    """Captures the wrapped app's response (start + every body chunk) instead of sending it."""

    def __init__(self) -> None:
        self.status: int | None = None
        self._headers: list[tuple[str, str]] = []
        self._chunks: list[bytes] = []
        self.complete = False

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = int(message["status"])
            self._headers = [
                (k.decode("latin-1").lower(), v.decode("latin-1"))
                for k, v in message.get("headers", ())
            ]
        elif kind == "http.response.body":
            self._chunks.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                self.complete = True
        else:  # trailers and extensions are stripped from the scope we pass, so this is a bug
            msg = f"the wrapped application sent an unsupported ASGI message {kind!r}"
            raise RuntimeError(msg)

    def response(self) -> StoredResponse:
        if self.status is None or not self.complete:
            msg = (
                "the wrapped application returned without sending a complete response;"
                " an ASGI app must send http.response.start and a final http.response.body"
            )
            raise RuntimeError(msg)
        headers = [(k, v) for k, v in self._headers if k not in HOP_BY_HOP]
        return StoredResponse(status=self.status, headers=headers, body=b"".join(self._chunks))


def scope_without_send_extensions(scope: Scope) -> Scope:
    """The scope minus the extensions (pathsend, zerocopysend, trailers) that would let the app
    bypass ``http.response.body``: the recorder must see every byte it stores."""
    extensions = scope.get("extensions")
    if not extensions:
        return scope
    kept = {
        k: v
        for k, v in extensions.items()
        if k
        not in {"http.response.pathsend", "http.response.zerocopysend", "http.response.trailers"}
    }
    return {**scope, "extensions": kept}


async def serve_lifespan(receive: Receive, send: Send) -> None:
    """Answer the lifespan protocol for an app that needs no startup or shutdown work."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
