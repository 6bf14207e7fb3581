"""Enqueue inputs and the J2 cap, run against every backend (in-memory reference, PostgreSQL).

Both backends refuse bad requests through the one kernel check (``prepare_run``) with the same
typed errors, and store nothing of a call that holds one. "Nothing stored" is read through
``queue_depths`` (both backends answer it), not through a claim.
"""

from __future__ import annotations

from datetime import date, timedelta

import anyio
import pytest

from ship_sqla import define_job
from ship_sqla.errors import ConfigurationError, InvalidPayloadError
from ship_sqla.jobs import EnqueueRequest, IdempotencyPolicy
from ship_sqla.kernel._errors import PayloadTooLargeError
from ship_sqla.kernel._keys import MAX_KEY_CHARS, InvalidKeyError


async def _noop(ctx, payload):
    return None


JOB = define_job("conf.inputs", _noop, payload=dict, max_payload_bytes=64)


async def depth(backend, job=JOB):
    return (await backend.queue_depths([job.id]))[job.id].depth


BAD_REQUESTS = [
    (EnqueueRequest({"t": "a\x00"}), InvalidPayloadError),  # NUL in a string
    (EnqueueRequest({"k\x00": [1]}), InvalidPayloadError),  # NUL in a key
    (EnqueueRequest({"deep": [{"t": "\x00"}]}), InvalidPayloadError),  # NUL, nested
    (EnqueueRequest({"t": "\ud800"}), InvalidPayloadError),  # a lone surrogate (issue 25 D6)
    (EnqueueRequest({"deep": [{"k\udfff": 1}]}), InvalidPayloadError),  # one in a key, nested
    (EnqueueRequest({"t": "x" * 64}), PayloadTooLargeError),  # over max_payload_bytes
    (EnqueueRequest({"n": float("inf")}), InvalidPayloadError),  # not JSON
    (EnqueueRequest({}, run_at="2030-01-01"), ConfigurationError),
    (EnqueueRequest({}, run_at=1_900_000_000), ConfigurationError),
    (EnqueueRequest({}, run_at=date(2030, 1, 1)), ConfigurationError),
    (EnqueueRequest({}, run_id=""), InvalidKeyError),
    (EnqueueRequest({}, run_id="r" * 256), InvalidKeyError),
    (EnqueueRequest({}, run_id="a\x00"), InvalidKeyError),
    (EnqueueRequest({}, dedupe_key=""), InvalidKeyError),
    (EnqueueRequest({}, dedupe_key="d" * 256), InvalidKeyError),
    (EnqueueRequest({}, dedupe_key="a\x00"), InvalidKeyError),
    (EnqueueRequest({}, run_id="a\ud800"), InvalidKeyError),  # not UTF-8 (issue 25 D6)
    (EnqueueRequest({}, dedupe_key="\udc80"), InvalidKeyError),
]


@pytest.mark.parametrize("limit", [None, 100], ids=["uncapped", "capped"])
async def test_bad_input_is_a_typed_error_and_stores_nothing(clock, job_backend_factory, limit):
    """Each bad input (NUL or a surrogate code point in the payload, a payload over
    max_payload_bytes, a run_at that is not a datetime, an empty / over-long / NUL / surrogate
    run id or dedupe key) is refused with its typed
    error, alone (enqueue) or among good requests (enqueue_many: nothing of the batch is
    stored), with a queue_depth_limit (J2's gated path) or without (the plain path)."""
    backend = job_backend_factory(clock, queue_depth_limit=limit)
    for request, error in BAD_REQUESTS:
        with pytest.raises(error):
            await backend.enqueue(
                JOB,
                request.payload,
                dedupe_key=request.dedupe_key,
                run_at=request.run_at,
                run_id=request.run_id,
            )
        with pytest.raises(error):
            await backend.enqueue_many(JOB, [EnqueueRequest({"n": 1}), request])
    assert await depth(backend) == 0


async def test_keys_at_the_bound_are_stored(clock, job_backend_factory):
    """A run id and a dedupe key of exactly 255 four-byte characters are accepted and stored
    (PostgreSQL's indexes hold them) and deduplicate as usual (J1)."""
    backend = job_backend_factory(clock)
    long_key = "\U0001f600" * MAX_KEY_CHARS
    first = await backend.enqueue(JOB, {"n": 1}, run_id=long_key, dedupe_key=long_key)
    assert first.run_id == long_key
    again = await backend.enqueue(JOB, {"n": 2}, dedupe_key=long_key)
    assert again.deduplicated
    assert again.run_id == long_key


async def test_a_policy_dedupe_key_is_checked_on_every_backend(clock, job_backend_factory):
    backend = job_backend_factory(clock)
    job = define_job(
        "conf.policy", _noop, payload=dict, idempotency=IdempotencyPolicy(key=lambda p: p["k"])
    )
    with pytest.raises(InvalidKeyError, match="idempotency policy"):
        await backend.enqueue(job, {"k": "k" * 300})
    assert await depth(backend, job) == 0


async def test_j2_concurrent_enqueues_never_pass_the_limit(clock, job_backend_factory):
    """J2 (hard cap): many concurrent tasks enqueueing one at a time and in batches accept
    exactly queue_depth_limit runs in all, on every backend."""
    backend = job_backend_factory(clock, queue_depth_limit=7)
    job = define_job("conf.capped", _noop, payload=dict)
    accepted: list[bool] = []
    go = anyio.Event()

    async def one(n):
        await go.wait()
        accepted.append((await backend.enqueue(job, {"n": n})).accepted)

    async def batch(n):
        await go.wait()
        results = await backend.enqueue_many(
            job, [EnqueueRequest({"n": n, "i": i}) for i in range(3)]
        )
        accepted.extend(r.accepted for r in results)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for n in range(12):
                group.start_soon(one, n)
                group.start_soon(batch, n)
            go.set()
    assert sum(accepted) == 7
    assert await depth(backend, job) == 7
    later = clock.now() + timedelta(hours=1)
    assert (await backend.enqueue(job, {"late": 1}, run_at=later)).rejected == "queue-full"
