"""Outbound webhooks (SPEC §16, W1-W5) against a REAL HTTP receiver: an ASGI app served by
uvicorn on 127.0.0.1, answering scripted statuses, delays and Retry-After, verifying every
signature with the reference library ``standardwebhooks``.

Most tests run one delivery's job handler on a run claimed from the in-memory backend (the
store is the in-memory model), so each attempt's outcome is read as the runtime would get it;
the PostgreSQL tests at the end send through a unit of work and the worker runtime. DNS is a
stub resolver: no test leaves the machine.
"""

from __future__ import annotations

import email.utils
import json
import logging
import socket
from datetime import UTC, datetime, timedelta
from typing import Any, Self

import anyio
import anyio.lowlevel
import pytest
from job_helpers import claim_request
from sqlalchemy import MetaData, select, text
from webhook_receiver import Answer, Receiver, serve

from ship_sqla import JobContext, create_unit_of_work, start_job_runtime
from ship_sqla.errors import (
    RetryAfter,
    TerminalError,
    WebhookDeliveryFailedError,
    WebhookEndpointUnknownError,
)
from ship_sqla.jobs import RetryPolicy
from ship_sqla.kernel import InMemoryJobBackend, InMemoryWebhookDeliveryStore
from ship_sqla.kernel._settlement import completed, failed
from ship_sqla.testing import FrozenClock
from ship_sqla.webhooks import (
    create_webhook_delivery_store,
    create_webhook_sender,
    new_webhook_secret,
    ship_webhook_deliveries_table,
    ship_webhook_endpoints_table,
)

LOOPBACK = ["127.0.0.1/32"]


def _clock() -> FrozenClock:
    # The reference library checks the signed timestamp against the real time (5 minutes).
    return FrozenClock(datetime.now(UTC))


class Kit:
    def __init__(self, *, allow: list[str] = LOOPBACK, attempts: int = 3, **options: Any) -> None:
        self.clock = _clock()
        self.store = InMemoryWebhookDeliveryStore(self.clock)
        self.backend = InMemoryJobBackend(clock=self.clock)
        self.resolved: list[str] = []
        self.dns: dict[str, list[str]] = {}
        self.sender = create_webhook_sender(
            store=self.store,
            backend=self.backend,
            allow=allow,
            clock=self.clock,
            resolver=self._resolve,
            retry=RetryPolicy(attempts=attempts, base_delay=1.0, max_delay=60.0),
            **options,
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.sender.aclose()

    async def _resolve(self, host: str, _port: int) -> list[str]:
        self.resolved.append(host)
        return self.dns[host]

    async def attempt(self) -> BaseException | None:
        """Claim the next due delivery run and run its handler once: what it raised."""
        [run] = await self.backend.claim(claim_request(self.sender.job, worker="w"))
        payload = json.loads(run.payload) if isinstance(run.payload, str) else run.payload
        outcome: BaseException | None = None
        try:
            await self.sender.job.handler(JobContext.standalone(run), payload)
        except Exception as exc:
            outcome = exc
        # Settled as the runtime would, so a later claim takes the next due run.
        if outcome is None:
            settlement = completed(run)
        elif isinstance(outcome, TerminalError):
            settlement = failed(run, str(outcome), None)
        else:
            delay = float(getattr(outcome, "delay", 1.0))
            settlement = failed(run, str(outcome), self.clock.now() + timedelta(seconds=delay))
        await self.backend.settle([settlement])
        return outcome


async def _endpoint(kit: Kit, url: str, secret: str, **options: Any) -> str:
    endpoint = await kit.sender.add_endpoint(url, ["order.paid"], secret=secret, **options)
    return endpoint.id


async def test_w2_every_signature_verifies_and_the_webhook_id_is_stable_across_retries() -> None:
    """W2: every delivery is signed with Standard Webhooks and verified by the reference
    library (100% of those sent); a retry carries the same webhook-id (the delivery id, W1's
    dedupe key) with a fresh signature; the body is the payload's JSON."""
    secret = new_webhook_secret()
    kit = Kit()
    async with kit, serve(Receiver([secret])) as receiver:
        await _endpoint(kit, receiver.url, secret)
        receiver.script = [Answer(503)]
        [first] = await kit.sender.send("order.paid", {"order": 1, "name": "café"})
        ids = [first]
        for n in range(2, 6):
            ids += await kit.sender.send("order.paid", {"order": n})
        assert isinstance(await kit.attempt(), WebhookDeliveryFailedError)
        kit.clock.advance(120)
        for _ in ids:
            assert await kit.attempt() is None
    assert len(receiver.requests) == 6
    assert all(r.verified_by == [0] for r in receiver.requests)
    assert receiver.disagreements == []  # the library's own verify_webhook agrees
    seen = [r.headers["webhook-id"] for r in receiver.requests]
    assert seen[0] == first
    assert sorted(seen) == sorted([*ids, first])  # the retry: the same webhook-id again
    assert json.loads(receiver.requests[0].body) == {"order": 1, "name": "café"}
    assert receiver.requests[0].headers["host"] == f"127.0.0.1:{receiver.port}"
    delivery = await kit.store.get_delivery(first)
    assert [a.status for a in delivery.attempts] == [503, 200]
    assert delivery.state == "delivered"


async def test_w2_a_rotation_window_signs_with_both_secrets() -> None:
    """W2: after a rotation every delivery carries one signature per secret in force, so a
    receiver holding either the old or the new secret verifies it; after the window, only the
    new one signs."""
    old, new = new_webhook_secret(), new_webhook_secret()
    kit = Kit()
    async with kit, serve(Receiver([old, new])) as receiver:
        endpoint = await _endpoint(kit, receiver.url, old)
        await kit.sender.send("order.paid", {"order": 1})
        assert await kit.attempt() is None
        assert await kit.sender.rotate_secret(endpoint, secret=new, overlap=timedelta(minutes=2))
        await kit.sender.send("order.paid", {"order": 2})
        assert await kit.attempt() is None
        kit.clock.advance(180)
        await kit.sender.send("order.paid", {"order": 3})
        assert await kit.attempt() is None
    assert [r.verified_by for r in receiver.requests] == [[0], [0, 1], [1]]
    assert receiver.disagreements == []
    assert len(receiver.requests[1].headers["webhook-signature"].split()) == 2


@pytest.mark.parametrize("status", [408, 409, 425, 429, 500, 502, 503])
async def test_w3_retryable_answers_are_retried_with_the_attempt_recorded(status: int) -> None:
    """W3: 408, 409, 425, 429 and 5xx are retried with the job backoff; the attempt (status,
    duration, bounded body excerpt) is recorded before the next one is planned."""
    secret = new_webhook_secret()
    kit = Kit()
    async with kit, serve(Receiver([secret])) as receiver:
        await _endpoint(kit, receiver.url, secret)
        receiver.script = [Answer(status, body=b"x" * 5000)]
        [delivery_id] = await kit.sender.send("order.paid", {"order": 1})
        outcome = await kit.attempt()
    assert isinstance(outcome, WebhookDeliveryFailedError)
    delivery = await kit.store.get_delivery(delivery_id)
    assert delivery.state == "pending"
    [attempt] = delivery.attempts
    assert attempt.status == status
    assert attempt.duration > 0
    assert attempt.body.startswith("x" * 1024)
    assert attempt.body.endswith("more characters]")
    assert len(attempt.body) < 1100


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 422, 301, 302, 307])
async def test_w3_other_4xx_and_redirects_are_terminal(status: int) -> None:
    """W3: a 4xx other than 408/409/425/429 ends the delivery (failed, the run dead at once);
    a redirect is not followed (the receiver sees one request) and is terminal too."""
    secret = new_webhook_secret()
    kit = Kit()
    async with kit, serve(Receiver([secret])) as receiver:
        await _endpoint(kit, receiver.url, secret)
        receiver.script = [Answer(status, headers={"location": receiver.url + "/elsewhere"})]
        [delivery_id] = await kit.sender.send("order.paid", {"order": 1})
        outcome = await kit.attempt()
    assert isinstance(outcome, TerminalError)
    assert len(receiver.requests) == 1
    delivery = await kit.store.get_delivery(delivery_id)
    assert (delivery.state, [a.status for a in delivery.attempts]) == ("failed", [status])
    assert (await kit.store.get_endpoint(delivery.endpoint_id)).consecutive_failures == 1


async def test_w3_retry_after_in_seconds_or_as_a_date_is_honoured() -> None:
    """W3: a Retry-After in seconds, or as an HTTP date, becomes the kernel's RetryAfter (its
    delay clamped by the policy's max_delay when the run is planned)."""
    secret = new_webhook_secret()
    kit = Kit()
    async with kit, serve(Receiver([secret])) as receiver:
        await _endpoint(kit, receiver.url, secret)
        when = kit.clock.now() + timedelta(seconds=90)
        receiver.script = [
            Answer(429, headers={"retry-after": "30"}),
            Answer(503, headers={"retry-after": email.utils.format_datetime(when, usegmt=True)}),
        ]
        await kit.sender.send("order.paid", {"order": 1})
        first = await kit.attempt()
        assert isinstance(first, RetryAfter)
        assert first.delay == 30
        kit.clock.advance(30)
        second = await kit.attempt()
    assert isinstance(second, RetryAfter)
    assert 55 <= second.delay <= 60


async def test_w3_no_answer_and_a_slow_answer_are_retried() -> None:
    """W3: a refused connection and an answer slower than the timeout are retried, the
    attempt recording the error and no status; on the final attempt the delivery fails."""
    secret = new_webhook_secret()
    kit = Kit(attempts=2, timeout=0.3)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead_url = f"http://127.0.0.1:{closed.getsockname()[1]}/hooks"
    async with kit, serve(Receiver([secret])) as receiver:
        await _endpoint(kit, dead_url, secret, endpoint_id="dead")
        [refused] = await kit.sender.send("order.paid", {"order": 1}, endpoint="dead")
        assert isinstance(await kit.attempt(), WebhookDeliveryFailedError)
        await _endpoint(kit, receiver.url, secret, endpoint_id="slow")
        receiver.script = [Answer(200, delay=1.0)]
        [slow] = await kit.sender.send("order.paid", {"order": 2}, endpoint="slow")
        assert isinstance(await kit.attempt(), WebhookDeliveryFailedError)
        kit.clock.advance(120)
        assert isinstance(await kit.attempt(), WebhookDeliveryFailedError)  # final: failed
    first = await kit.store.get_delivery(refused)
    assert first.state == "failed"
    assert [a.status for a in first.attempts] == [None, None]
    assert "ConnectError" in first.attempts[0].error
    slow_delivery = await kit.store.get_delivery(slow)
    assert slow_delivery.state == "pending"
    assert "Timeout" in slow_delivery.attempts[0].error


async def test_w4_disabled_after_n_failed_deliveries_and_enabling_resumes_them() -> None:
    """W4: N consecutive failed deliveries disable the endpoint (the streak reset by a
    delivered one); a delivery of a disabled endpoint waits (paused: no request, no attempt
    recorded, none spent); enabling resumes it (pending and enqueued again) and it is sent."""
    secret = new_webhook_secret()
    kit = Kit(disable_after=2)
    async with kit, serve(Receiver([secret])) as receiver:
        endpoint = await _endpoint(kit, receiver.url, secret)
        receiver.script = [Answer(400), Answer(200), Answer(400), Answer(410)]
        for n in range(4):
            await kit.sender.send("order.paid", {"order": n})
            await kit.attempt()
        disabled = await kit.store.get_endpoint(endpoint)
        assert (disabled.state, disabled.consecutive_failures) == ("disabled", 2)
        assert disabled.disabled_reason == "2 consecutive failed deliveries"
        # Sent to explicitly: a disabled endpoint's delivery waits.
        [waiting] = await kit.sender.send("order.paid", {"order": 9}, endpoint=endpoint)
        assert await kit.attempt() is None
        assert len(receiver.requests) == 4
        paused = await kit.store.get_delivery(waiting)
        assert (paused.state, paused.attempts) == ("paused", ())
        assert await kit.sender.send("order.paid", {"order": 10}) == []  # not subscribed now
        assert await kit.sender.enable_endpoint(endpoint) == [waiting]
        assert await kit.attempt() is None
    assert len(receiver.requests) == 5
    assert receiver.requests[-1].headers["webhook-id"] == waiting
    assert (await kit.store.get_delivery(waiting)).state == "delivered"
    enabled = await kit.store.get_endpoint(endpoint)
    assert (enabled.state, enabled.consecutive_failures) == ("enabled", 0)


REFUSED = [
    ("http://127.0.0.1:{port}/hooks", {}, "loopback"),
    ("http://10.1.2.3/hooks", {}, "private"),
    ("http://169.254.169.254/latest/meta-data", {}, "link-local"),
    ("http://[::1]:{port}/hooks", {}, "loopback"),
    ("http://hooks.example.test:{port}/hooks", {"hooks.example.test": ["127.0.0.1"]}, "loopback"),
    ("http://meta.example.test/", {"meta.example.test": ["169.254.169.254"]}, "link-local"),
    (
        "http://mixed.example.test/",
        {"mixed.example.test": ["93.184.216.34", "10.0.0.7"]},
        "private",
    ),
    ("http://[::ffff:10.0.0.1]/", {}, "private"),
    ("http://0.0.0.0/", {}, "unspecified"),
    ("http://224.0.0.1/", {}, "multicast"),
]


@pytest.mark.parametrize(("url", "dns", "kind"), REFUSED)
async def test_w5_destinations_that_are_not_public_are_refused(
    url: str, dns: Any, kind: str
) -> None:
    """W5: loopback, private (10/8), link-local (the 169.254.169.254 metadata address), [::1],
    unspecified, multicast, and a DNS name resolving to any of them (one refused address is
    enough) are refused without the allowlist: no request, the delivery failed with the
    reason recorded. DNS goes through the resolver stub (no outside traffic)."""
    secret = new_webhook_secret()
    kit = Kit(allow=[])
    kit.dns.update(dns)
    async with kit, serve(Receiver([secret])) as receiver:
        await _endpoint(kit, url.format(port=receiver.port), secret)
        [delivery_id] = await kit.sender.send("order.paid", {"order": 1})
        outcome = await kit.attempt()
    assert isinstance(outcome, TerminalError)
    assert kind in str(outcome)
    assert receiver.requests == []
    delivery = await kit.store.get_delivery(delivery_id)
    assert delivery.state == "failed"
    assert kind in delivery.attempts[0].error
    assert kit.resolved == list(dns)


async def test_w5_the_allowlist_lets_a_name_through_and_the_checked_address_is_used() -> None:
    """W5: with the allowlist naming the network, a DNS name resolving to loopback is sent;
    the name is resolved once per attempt and the connection goes to the checked address
    (the resolver's answer: the name itself resolves nowhere), with the Host header naming
    the endpoint's host."""
    secret = new_webhook_secret()
    kit = Kit(allow=LOOPBACK)
    kit.dns["hooks.invalid"] = ["127.0.0.1"]
    async with kit, serve(Receiver([secret])) as receiver:
        await _endpoint(kit, f"http://hooks.invalid:{receiver.port}/hooks", secret)
        receiver.script = [Answer(503)]
        await kit.sender.send("order.paid", {"order": 1})
        assert isinstance(await kit.attempt(), WebhookDeliveryFailedError)
        kit.clock.advance(120)
        assert await kit.attempt() is None
    assert kit.resolved == ["hooks.invalid", "hooks.invalid"]
    assert [r.headers["host"] for r in receiver.requests] == [f"hooks.invalid:{receiver.port}"] * 2
    assert all(r.verified_by == [0] for r in receiver.requests)


# --- PostgreSQL: the unit of work and the worker runtime --------------------------------------


async def _postgres(ship_engine: Any, clock: FrozenClock) -> Any:
    from ship_sqla import (  # noqa: PLC0415
        create_job_backend,
        ship_job_runs_table,
        ship_job_state_table,
        ship_job_workers_table,
    )

    metadata = MetaData()
    runs = ship_job_runs_table(metadata)
    state = ship_job_state_table(metadata)
    workers = ship_job_workers_table(metadata)
    endpoints = ship_webhook_endpoints_table(metadata)
    deliveries = ship_webhook_deliveries_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(
        database=ship_engine, table=runs, state_table=state, workers_table=workers, clock=clock
    )
    store = create_webhook_delivery_store(
        database=ship_engine, endpoints_table=endpoints, deliveries_table=deliveries, clock=clock
    )
    return backend, store, runs, deliveries


async def _until(check: Any, clock: FrozenClock | None = None, limit: float = 20.0) -> None:
    """Until ``await check()`` is true, moving frozen time a second a step (each check is a
    database round trip, no sleep)."""
    with anyio.fail_after(limit):
        while not await check():
            if clock is not None:
                clock.advance(1)
            await anyio.lowlevel.checkpoint()


async def test_w1_w2_sent_from_a_unit_of_work_by_the_worker_runtime_secrets_never_stored(
    ship_engine: Any, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """W1: deliveries are written and enqueued in the application's unit of work: a rollback
    sends nothing, a commit sends once per subscribed endpoint, through the worker runtime,
    retried after a 503 with the same webhook-id; W2: the secret appears in no run payload,
    run history, delivery row, log line or captured output."""
    caplog.set_level(logging.DEBUG)
    clock = _clock()
    backend, store, runs, deliveries = await _postgres(ship_engine, clock)
    secret = new_webhook_secret()
    sender = create_webhook_sender(
        store=store,
        backend=backend,
        allow=LOOPBACK,
        clock=clock,
        retry=RetryPolicy(attempts=3, base_delay=2.0, max_delay=10.0, jitter="none"),
    )
    uow = create_unit_of_work(ship_engine, repositories=lambda scope: scope)

    class BoomError(Exception):
        pass

    async with serve(Receiver([secret])) as receiver:
        endpoint = await sender.add_endpoint(receiver.url, ["order.paid"], secret=secret)

        async def rolled_back(scope: Any) -> None:
            assert await sender.send("order.paid", {"order": 1}) != []
            raise BoomError

        with pytest.raises(BoomError):
            await uow.run(rolled_back)
        async with ship_engine.connect() as connection:
            assert await connection.scalar(select(text("count(*)")).select_from(deliveries)) == 0
            assert await connection.scalar(select(text("count(*)")).select_from(runs)) == 0

        receiver.script = [Answer(503)]
        ids = await uow.run(lambda scope: sender.send("order.paid", {"order": 2}, scope=scope))
        [delivery_id] = ids
        async with await start_job_runtime(
            sender.jobs, backend=backend, clock=clock, poll_interval=1.0
        ):
            await receiver.wait_for(1)

            async def retry_planned() -> bool:
                async with ship_engine.connect() as connection:
                    query = select(runs.c.state, runs.c.attempt)
                    return (await connection.execute(query)).all() == [("waiting", 1)]

            async def delivered() -> bool:
                found = await store.get_delivery(delivery_id)
                return found is not None and found.state == "delivered"

            await _until(retry_planned)
            clock.advance(3)  # past the first retry's delay (2 s, no jitter): W3's backoff
            # J3: the worker polls within a second of runtime clock after its pass began, so the
            # advance made the retry's claim due at once, whenever the pass was.
            await receiver.wait_for(2)
            await _until(delivered)
        await sender.aclose()
    assert [r.headers["webhook-id"] for r in receiver.requests] == [delivery_id] * 2
    assert all(r.verified_by == [0] for r in receiver.requests)
    assert (await store.get_endpoint(endpoint.id)).consecutive_failures == 0

    async with ship_engine.connect() as connection:
        # Every row of every table (runs, their history, deliveries...), as text.
        names = (
            await connection.execute(
                text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
            )
        ).scalars()
        dumped = [
            row[0]
            for name in list(names)
            for row in await connection.execute(text(f'SELECT t::text FROM "{name}" t'))
        ]
    dumped = [d for d in dumped if not d.startswith(f"({endpoint.id},")]  # its own table
    everything = "\n".join([*dumped, caplog.text, *capsys.readouterr()])
    assert delivery_id in everything
    key = secret.removeprefix("whsec_")
    assert secret not in everything
    assert key not in everything


async def test_w1_outside_a_unit_of_work_the_runs_follow_the_committed_deliveries(
    ship_engine: Any,
) -> None:
    """W1: sent outside any unit of work, the deliveries are written in a transaction of
    their own and each run is enqueued after it commits (payload: the delivery id only);
    ``endpoint=`` sends to that endpoint alone, another tenant's is unknown."""
    clock = _clock()
    backend, store, runs, deliveries = await _postgres(ship_engine, clock)
    sender = create_webhook_sender(store=store, backend=backend, clock=clock)
    for name in ("a", "b"):
        await sender.add_endpoint(f"https://{name}.example.test/h", ["*"], endpoint_id=name)
    await sender.add_endpoint("https://t.example.test/h", ["*"], endpoint_id="t", tenant="t1")
    ids = await sender.send("order.paid", {"order": 1})
    [only] = await sender.send("order.paid", {"order": 2}, endpoint="b")
    with pytest.raises(WebhookEndpointUnknownError):
        await sender.send("order.paid", {"order": 3}, endpoint="t")
    async with ship_engine.connect() as connection:
        payloads = (await connection.execute(select(runs.c.payload))).scalars().all()
        targets = (await connection.execute(select(deliveries.c.endpoint_id))).scalars().all()
    assert sorted(p["delivery_id"] for p in payloads) == sorted([*ids, only])
    assert sorted(targets) == ["a", "b", "b"]
    await sender.aclose()


async def test_w5_the_senders_client_connects_only_to_checked_addresses() -> None:
    """W5: the sender's own client connects a (host, port) only to the address checked for
    the attempt in hand: used outside an attempt it connects nowhere; a client of the
    application's (``http_client=``) is sent to the checked address by URL, with the Host
    header naming the endpoint's host."""
    import httpx  # noqa: PLC0415

    secret = new_webhook_secret()
    kit = Kit()
    async with kit, serve(Receiver([secret])) as receiver:
        with pytest.raises(httpx.ConnectError, match="W5-checked"):
            await kit.sender._http().post(receiver.url)
        assert receiver.requests == []
    async with httpx.AsyncClient() as client:
        theirs = Kit(http_client=client)
        theirs.dns["hooks.invalid"] = ["127.0.0.1"]
        async with theirs, serve(Receiver([secret])) as receiver:
            await _endpoint(theirs, f"http://hooks.invalid:{receiver.port}/hooks", secret)
            await theirs.sender.send("order.paid", {"order": 1})
            assert await theirs.attempt() is None
    [request] = receiver.requests
    assert request.headers["host"] == f"hooks.invalid:{receiver.port}"
    assert request.verified_by == [0]
