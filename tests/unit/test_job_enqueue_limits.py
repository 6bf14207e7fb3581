"""The enqueue input checks of ``prepare_run`` (the one kernel function the enqueue front of every
backend calls for every request): each a typed error naming the field and the bound, raised
before anything is stored. Pure: no database (tests/conformance runs the same refusals on both
backends)."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime

import attrs
import pytest

from ship_sqla import define_job
from ship_sqla.errors import ConfigurationError, InvalidPayloadError
from ship_sqla.jobs import Concurrency, EnqueueRequest, IdempotencyPolicy, RetryPolicy
from ship_sqla.kernel._errors import PayloadTooLargeError
from ship_sqla.kernel._jobs import DEFAULT_MAX_PAYLOAD_BYTES
from ship_sqla.kernel._json_text import encode_compact_json, unstorable_json
from ship_sqla.kernel._keys import MAX_KEY_CHARS, InvalidKeyError
from ship_sqla.kernel._plans.prepare import PreparedRun, prepare_run, prepare_runs


async def _noop(ctx, payload):
    return None


JOB = define_job("limits.job", _noop, payload=dict)
AT = datetime(2030, 1, 1, tzinfo=UTC)


def test_a_valid_request_is_prepared_once_for_every_backend():
    """prepare_run returns what a backend stores: JSON text, keys, the due time, the job's
    attempts, and the run id (the caller's, durable; else a new UUIDv7): no backend derives any
    of them."""
    keyed = define_job(
        "limits.keyed",
        _noop,
        payload=dict,
        concurrency=Concurrency(single_runner=True, key=lambda p: p["account"]),
        retry=RetryPolicy(attempts=4),
        idempotency=IdempotencyPolicy(key=lambda p: f"order:{p['order']}"),
    )
    prepared = prepare_run(keyed, EnqueueRequest({"account": "é", "order": 7}, run_at=AT))
    assert prepared == PreparedRun(
        run_id=prepared.run_id,
        durable_id=False,
        payload_json='{"account":"\\u00e9","order":7}',
        dedupe_key="order:7",
        key="é",
        run_at=AT,
        max_attempts=4,
        priority=0,
        trace_context=None,
    )
    assert uuid.UUID(prepared.run_id).version == 7
    given = prepare_run(keyed, EnqueueRequest({"account": "a", "order": 1}, dedupe_key="mine"))
    assert given.dedupe_key == "mine"
    durable = prepare_run(keyed, EnqueueRequest({"account": "a", "order": 1}, run_id="fixed"))
    assert (durable.run_id, durable.durable_id) == ("fixed", True)
    batch = prepare_runs(
        JOB, [EnqueueRequest({}), EnqueueRequest({}, run_id="x"), EnqueueRequest({})]
    )
    assert [run.durable_id for run in batch] == [False, True, False]
    assert len({run.run_id for run in batch}) == 3


# --- the payload ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        {"text": "a\x00b"},
        {"key\x00": 1},
        {"deep": [1, {"er": ["\x00"]}]},
        {"nested": {"k": {"\x00": None}}},
    ],
)
def test_a_nul_anywhere_in_the_payload_is_refused(payload):
    """NUL characters (\\u0000) in keys or strings, at any depth, are refused as the outbox
    refuses them: jsonb cannot store them."""
    with pytest.raises(InvalidPayloadError, match="NUL") as caught:
        prepare_run(JOB, EnqueueRequest(payload))
    assert caught.value.code == "SHIP_SQLA_JOB_PAYLOAD_INVALID"
    assert caught.value.fix


def test_the_text_backslash_u0000_is_not_a_nul():
    payload = {"text": "\\u0000", "k\\\\u0000": 1}
    prepared = prepare_run(JOB, EnqueueRequest(payload))
    assert unstorable_json(payload, prepared.payload_json) is None


def test_nul_detection_reads_escapes_right():
    for value, has_nul in [
        ("\x00", True),
        ("\\\x00", True),
        ("\\u0000", False),
        ("\\\\u0000", False),
        ("a\\", False),
    ]:
        found = unstorable_json([value], encode_compact_json([value]))
        assert (found is not None) is has_nul, value


@pytest.mark.parametrize("payload", [{"n": float("nan")}, {"n": {1, 2}}, {"n": object()}])
def test_a_payload_that_is_not_json_is_refused(payload):
    with pytest.raises(InvalidPayloadError, match="not JSON"):
        prepare_run(JOB, EnqueueRequest(payload))


def test_a_circular_payload_is_refused_as_not_json():
    circular: dict[str, object] = {}
    circular["self"] = circular
    with pytest.raises(InvalidPayloadError, match="not JSON"):
        prepare_run(JOB, EnqueueRequest(circular))


def test_the_payload_size_limit_is_bytes_of_encoded_json():
    """A payload of exactly max_payload_bytes of encoded JSON passes; one byte more is
    PayloadTooLargeError (an InvalidPayloadError) with its own code; nothing is truncated."""
    small = define_job("limits.small", _noop, payload=dict, max_payload_bytes=20)
    fits = {"t": "x" * 12}  # {"t":"xxxxxxxxxxxx"} is 20 bytes
    assert len(prepare_run(small, EnqueueRequest(fits)).payload_json) == 20
    with pytest.raises(PayloadTooLargeError, match="21 bytes") as caught:
        prepare_run(small, EnqueueRequest({"t": "x" * 13}))
    assert isinstance(caught.value, InvalidPayloadError)
    assert caught.value.code == "SHIP_SQLA_JOB_PAYLOAD_TOO_LARGE"
    assert "max_payload_bytes (20)" in caught.value.message
    # Non-ASCII counts as its \\uXXXX escape: the bytes stored, whatever the text's encoding.
    with pytest.raises(PayloadTooLargeError):
        prepare_run(small, EnqueueRequest({"t": "é" * 3}))


def test_the_default_payload_limit_is_one_mebibyte():
    assert JOB.max_payload_bytes == DEFAULT_MAX_PAYLOAD_BYTES == 1024 * 1024
    overhead = len('{"t":""}')
    prepare_run(JOB, EnqueueRequest({"t": "x" * (DEFAULT_MAX_PAYLOAD_BYTES - overhead)}))
    with pytest.raises(PayloadTooLargeError):
        prepare_run(JOB, EnqueueRequest({"t": "x" * (DEFAULT_MAX_PAYLOAD_BYTES - overhead + 1)}))


@pytest.mark.parametrize("bound", [0, -1, True, 1.5, "1024", 2**40])
def test_max_payload_bytes_is_validated_at_declaration(bound):
    with pytest.raises(ConfigurationError, match="max_payload_bytes"):
        define_job("limits.bad", _noop, payload=dict, max_payload_bytes=bound)


def test_the_attrs_codec_payload_is_checked_after_encoding():
    @attrs.frozen
    class Note:
        text: str

    job = define_job("limits.note", _noop, payload=Note)
    with pytest.raises(InvalidPayloadError, match="NUL"):
        prepare_run(job, EnqueueRequest(Note("a\x00")))


# --- run_at ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "run_at", ["2030-01-01T00:00:00+00:00", 1_900_000_000, date(2030, 1, 1), 1.5]
)
def test_a_run_at_that_is_not_a_datetime_is_a_typed_error(run_at):
    """A str, int or date run_at is a ConfigurationError naming run_at, not AttributeError."""
    with pytest.raises(ConfigurationError, match="run_at must be a timezone-aware datetime"):
        prepare_run(JOB, EnqueueRequest({}, run_at=run_at))


def test_a_naive_run_at_is_refused():
    with pytest.raises(ConfigurationError, match="run_at must be timezone-aware"):
        prepare_run(JOB, EnqueueRequest({}, run_at=datetime(2030, 1, 1)))  # noqa: DTZ001


# --- run ids, dedupe keys, single-runner keys -----------------------------------------------

FIELDS = ["run_id", "dedupe_key"]


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("", "must not be empty"),
        ("x" * (MAX_KEY_CHARS + 1), f"at most {MAX_KEY_CHARS} characters, got 256"),
        ("a\x00b", "NUL"),
        (42, "must be text, got int"),
        (b"bytes", "must be text, got bytes"),
    ],
)
def test_run_ids_and_dedupe_keys_are_bounded_text(field, value, says):
    """Run ids and dedupe keys: non-empty text, no NUL, at most 255 characters; the typed
    error names the field (and the bound)."""
    with pytest.raises(InvalidKeyError, match=says) as caught:
        prepare_run(JOB, EnqueueRequest({}, **{field: value}))
    assert caught.value.code == "SHIP_SQLA_KEY_INVALID"
    assert caught.value.message.startswith(field)


@pytest.mark.parametrize("field", FIELDS)
def test_a_key_of_exactly_the_bound_passes(field):
    value = "\U0001f600" * MAX_KEY_CHARS  # 255 characters, 1,020 bytes of UTF-8
    prepared = prepare_run(JOB, EnqueueRequest({}, **{field: value}))
    assert getattr(prepared, field) == value


def test_a_dedupe_key_from_the_idempotency_policy_is_checked_too():
    job = define_job(
        "limits.policy", _noop, payload=dict, idempotency=IdempotencyPolicy(key=lambda p: p["k"])
    )
    with pytest.raises(InvalidKeyError, match="idempotency policy") as caught:
        prepare_run(job, EnqueueRequest({"k": "x" * 300}))
    assert "at most 255 characters" in caught.value.message


def test_a_single_runner_key_with_a_nul_is_refused():
    job = define_job(
        "limits.single",
        _noop,
        payload=dict,
        concurrency=Concurrency(single_runner=True, key=lambda p: p["k"] and f"{p['k']}\x00"),
    )
    with pytest.raises(InvalidKeyError, match="single-runner key"):
        prepare_run(job, EnqueueRequest({"k": "a"}))
    with pytest.raises(InvalidKeyError, match="must be text"):
        prepare_run(job, EnqueueRequest({"k": 0}))
    unkeyed = define_job(
        "limits.one", _noop, payload=dict, concurrency=Concurrency(single_runner=True)
    )
    assert prepare_run(unkeyed, EnqueueRequest({})).key == ""
