"""Message ids that sort in the order they were generated in this process (UUID version 7).

The ordered claim breaks ties on ``(created_at, id)``. ``created_at`` is the transaction's time, so
every row enqueued in one transaction shares it; a random uuid4 would then order them by chance.
A version 7 id (RFC 9562: 48-bit Unix milliseconds, then a counter, then random bits) generated
under a lock is strictly increasing within the process, so rows enqueued in one transaction, or in
transactions that share a frozen test clock, keep their enqueue order.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid

__all__ = ["new_message_id", "uuid7_from_parts"]

_COUNTER_BITS = 42  # RFC 9562 method 1: 12 bits of rand_a and the top 30 bits of rand_b
_COUNTER_MAX = (1 << _COUNTER_BITS) - 1
_RANDOM_BITS = 32

_lock = threading.Lock()
_last_ms = -1
_counter = 0


def uuid7_from_parts(unix_ms: int, counter: int, random_tail: int) -> uuid.UUID:
    """Assemble a version 7 UUID; pure, so its ordering is testable without a clock."""
    rand_a = counter >> 30  # 12 bits
    rand_b = ((counter & ((1 << 30) - 1)) << _RANDOM_BITS) | (random_tail & 0xFFFFFFFF)  # 62 bits
    value = (unix_ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= rand_a << 64
    value |= 0b10 << 62
    value |= rand_b
    return uuid.UUID(int=value)


def new_message_id() -> uuid.UUID:
    """A version 7 UUID greater than every one this process generated before."""
    global _last_ms, _counter  # noqa: PLW0603 - process-wide monotonic state, guarded by _lock
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms > _last_ms:
            _last_ms = now_ms
            # A random start in the lower half leaves room to count within one millisecond.
            _counter = secrets.randbits(_COUNTER_BITS - 1)
        else:  # same millisecond, or the wall clock stepped back: keep counting from the last id
            _counter += 1
            if _counter > _COUNTER_MAX:
                _last_ms += 1
                _counter = 0
        return uuid7_from_parts(_last_ms, _counter, secrets.randbits(_RANDOM_BITS))
