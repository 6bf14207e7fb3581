"""A real HTTP receiver for the outbound webhooks' tests (SPEC §16): an ASGI app served by
uvicorn on 127.0.0.1 (a port the OS picks), answering scripted statuses, delays and headers, and
verifying every delivery's signature with the reference library ``standardwebhooks``."""

from __future__ import annotations

import socket
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import attrs
import uvicorn
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from ship_sqla.errors import WebhookVerificationError as ShipWebhookVerificationError
from ship_sqla.webhooks import verify_webhook

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@attrs.define
class Answer:
    status: int = 200
    headers: dict[str, str] = attrs.Factory(dict)
    delay: float = 0.0
    body: bytes = b"ok"


@attrs.define
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    verified_by: list[int]
    """Indexes of the receiver's secrets that verify this delivery (standardwebhooks)."""


class Receiver:
    """The ASGI app: answers ``script`` in order (then 200), records every request."""

    def __init__(self, secrets: list[str]) -> None:
        self.secrets = secrets
        self.script: list[Answer] = []
        self.requests: list[Received] = []
        self.disagreements: list[tuple[int, str]] = []
        self.hold: anyio.Event | None = None
        """While set to an unset event, every answer waits for it (sends stay in flight)."""
        self._arrived = anyio.Event()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    async def wait_for(self, count: int, limit: float = 10.0) -> None:
        with anyio.fail_after(limit):
            while len(self.requests) < count:
                await self._arrived.wait()

    def _verify(self, headers: dict[str, str], body: bytes) -> list[int]:
        """The secrets the reference library verifies the delivery with; the library's own
        verify_webhook (the receiving direction) must agree on each, else it is recorded in
        ``disagreements``."""
        verified = []
        for index, secret in enumerate(self.secrets):
            try:
                Webhook(secret).verify(body, headers)
                reference = True
            except WebhookVerificationError:
                reference = False
            try:
                verify_webhook(headers, body, secrets=[secret], now=datetime.now(UTC))
                ours = True
            except ShipWebhookVerificationError:
                ours = False
            if ours != reference:
                self.disagreements.append((index, headers.get("webhook-id", "")))
            if reference:
                verified.append(index)
        return verified

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                # The sender went away before its body was whole (a worker killed mid-send): the
                # request never arrived, so it is not recorded (its sender will send it again).
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        self.requests.append(Received(scope["path"], headers, body, self._verify(headers, body)))
        self._arrived.set()
        self._arrived = anyio.Event()
        if self.hold is not None:
            await self.hold.wait()
        answer = self.script.pop(0) if self.script else Answer()
        if answer.delay:
            await anyio.sleep(answer.delay)  # the scripted slow answer, not a wait for an event
        await send(
            {
                "type": "http.response.start",
                "status": answer.status,
                "headers": [(k.encode(), v.encode()) for k, v in answer.headers.items()],
            }
        )
        await send({"type": "http.response.body", "body": answer.body})


@asynccontextmanager
async def serve(receiver: Receiver) -> AsyncIterator[Receiver]:
    """Serve ``receiver`` on 127.0.0.1 for the block. The socket is bound and listening before
    the block starts, so no wait for the server is needed: connections queue until it accepts."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    receiver.port = sock.getsockname()[1]
    config = uvicorn.Config(
        receiver, lifespan="off", log_level="warning", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve, [sock])
        try:
            yield receiver
        finally:
            server.should_exit = True
    sock.close()
