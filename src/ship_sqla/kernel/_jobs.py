"""Job definitions: what a job is, declared once, validated at declaration time.

A definition is plain data (attrs, frozen) plus the handler. Backends store runs of it; the
runtime executes them. Nothing here touches a database.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Generic,
    Literal,
    Protocol,
    TypeAlias,
    TypeVar,
    cast,
    runtime_checkable,
)

import attrs

from ship_sqla.kernel._durations import (
    MAX_JOB_TIMEOUT,
    MAX_LEASE,
    MAX_RETRY_DELAY,
    require_duration,
)
from ship_sqla.kernel._errors import (
    ConfigurationError,
    InvalidPayloadError,
    RefusedError,
)
from ship_sqla.kernel._outcomes import RetryAfter, Snooze
from ship_sqla.kernel._plans.backoff import Backoff, BackoffKind, Jitter
from ship_sqla.kernel._plans.schedule import validate_schedule
from ship_sqla.kernel._priority import DEFAULT_PRIORITY, Aging, check_priority_field

if TYPE_CHECKING:
    from ship_sqla.kernel._job_context import JobContext
    from ship_sqla.kernel._transactional import Inbox
    from ship_sqla.kernel._workflows import UnitOfWorkLike

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_PARTITION_WALK",
    "MAX_SNOOZES",
    "PARTITION_WALK_FLOOR",
    "PARTITION_WALK_WIDEST",
    "Concurrency",
    "IdempotencyPolicy",
    "JobDefinition",
    "PartitionBy",
    "PayloadCodec",
    "Retention",
    "RetryPolicy",
    "Schedule",
    "define_job",
    "partition_walk",
    "partition_walk_widest",
]

P = TypeVar("P")


class JobVersionUnavailableError(RefusedError, RuntimeError):
    """D9: a worker claimed a run enqueued under a handler version it does not register; it
    handed the run back unexecuted, its attempt unspent, due again after
    :data:`VERSION_RECHECK` seconds (a worker that has the version executes it). Reported to
    ``on_error`` and recorded in the run's history."""

    code = "SHIP_SQLA_JOB_VERSION_UNAVAILABLE"


VERSION_RECHECK: Final = 60.0
"""D9: seconds a run handed back for want of its handler version waits before any worker may
claim it again (so a worker without the version does not spin on it)."""


_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


def is_job_id(value: object) -> bool:
    """True when ``value`` is a job id ``define_job`` accepts (the operator surface refuses any
    other before it runs a statement)."""
    return isinstance(value, str) and _JOB_ID.fullmatch(value) is not None


DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
"""A job's default ``max_payload_bytes``: 1 MiB of encoded JSON per run."""
_JSONB_MAX_BYTES = 255 * 1024 * 1024
"""About the most PostgreSQL's jsonb holds in one value: a larger limit could never be met."""


@runtime_checkable
class PayloadCodec(Protocol[P]):
    """Turns a payload into JSON-able data and back, validating on the way in."""

    def encode(self, value: P) -> Any: ...  # noqa: ANN401 - JSON-able by contract

    def decode(self, data: Any) -> P: ...  # noqa: ANN401 - JSON-able by contract


def _positive(name: str) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(_instance: Any, _attribute: attrs.Attribute[Any], value: Any) -> None:  # noqa: ANN401
        if value is not None and value <= 0:
            raise ConfigurationError(f"{name} must be positive, got {value!r}.")

    return check


def _duration(name: str, maximum: float) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(_instance: Any, _attribute: attrs.Attribute[Any], value: Any) -> None:  # noqa: ANN401
        require_duration(value, name, maximum=maximum)

    return check


MAX_CONCURRENCY: Final = 1_000_000
"""The largest ``Concurrency.max``: a capped claim counts up to that many running runs."""


def _int_within(
    name: str, low: int, high: int, fix: str, *, optional: bool = False
) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    """An attrs validator: ``name`` is an int (never a bool) from ``low`` to ``high`` (or None
    when ``optional``); else :class:`ConfigurationError` naming it, the bounds and ``fix``."""

    def check(_instance: Any, _attribute: attrs.Attribute[Any], value: Any) -> None:  # noqa: ANN401
        if optional and value is None:
            return
        require_int_within(value, name, low, high, fix)

    return check


def require_int_within(value: Any, name: str, low: int, high: int, fix: str) -> None:  # noqa: ANN401
    """``value`` is an int (never a bool) from ``low`` to ``high``, else ConfigurationError."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigurationError(
            f"{name} must be an int from {low:,} to {high:,}, got {value!r}.", fix=fix
        )


PartitionBy: TypeAlias = Literal["tenant", "key"]
"""What a partitioned limit (F8, F9) is partitioned by: ``"tenant"``, the tenant the run was
enqueued for (F2), or ``"key"``, the partition key stored with the run at enqueue (the
enqueue's ``partition_key=``, else the job's ``partition_key`` function of the payload). Runs
without one (untenanted, or with no key) are one partition more."""

PARTITIONS: Final = ("tenant", "key")

DEFAULT_PARTITION_WALK: Final = 64
"""How many partitions one partitioned claim visits (F8, F9) when the job has no ``Fairness``
(whose ``max_tenants`` it uses otherwise); claims take turns past them, as fair ones do."""

PARTITION_WALK_FLOOR: Final = 16
"""A partitioned claim of fewer runs than this still visits up to this many partitions
(:func:`partition_walk`), so a partition at its limit does not leave a small claim empty."""


PARTITION_WALK_WIDEST: Final = 256
"""The most partitions a partitioned claim without a ``Fairness`` visits when it walks on past
:data:`DEFAULT_PARTITION_WALK` (:func:`partition_walk_widest`): its gates' upsert finds each
existing gate's partition among the visited ones by a scan of them (the statement's ``found``),
so that part of a claim grows with the square of the partitions it visits (about 60 ns a pair:
4 ms a claim at 256, 60 ms at 1,000, against 15-25 ms for the rest of a claim of 256)."""


def partition_walk(fairness: Fairness | None, limit: int) -> int:
    """How many partitions a partitioned claim of ``limit`` runs visits (F8, F9): the walk's
    width (``max_tenants``, else :data:`DEFAULT_PARTITION_WALK`), but no more than the claim
    can take from (``limit``, at least :data:`PARTITION_WALK_FLOOR`). A claim of a few runs
    (the runtime claims as slots free) so reads a few partitions, not the walk's width: each
    partition visited costs its walk probe, its counts and its gate row whatever it yields."""
    most = DEFAULT_PARTITION_WALK if fairness is None else fairness.max_tenants
    return min(most, max(limit, PARTITION_WALK_FLOOR))


def partition_walk_widest(fairness: Fairness | None, limit: int) -> int:
    """How far past :func:`partition_walk` a partitioned claim of ``limit`` runs walks while
    the partitions it visited hold fewer due runs than its room (F8, F9): without a
    ``Fairness``, up to ``max(limit, 16)`` partitions (no more than it could take one run
    from), at most :data:`PARTITION_WALK_WIDEST`, so a claim over many small partitions fills
    its room in one statement rather than coming back short and claiming again (each claim
    and each settle batch costs its own round trip and statement, whatever it took); with
    one, its ``max_tenants`` is a hard bound (the walk is :func:`partition_walk`'s). The
    first :func:`partition_walk` partitions are always visited (when there are that many), so
    every partition comes round at least as often as without the extension (F2)."""
    if fairness is not None:
        return partition_walk(fairness, limit)
    return max(min(limit, PARTITION_WALK_WIDEST), partition_walk(None, limit))


def _require_partition(name: str, value: object) -> None:
    if value is None or value in PARTITIONS:
        return
    raise ConfigurationError(
        f"{name} must be None, 'tenant' or 'key', got {value!r}.",
        fix="pass partition='tenant' for a limit per tenant (the tenant a run was enqueued"
        " for), partition='key' for a limit per partition key (enqueue(...,"
        " partition_key=...) or define_job(..., partition_key=fn)), or omit it for one limit"
        " for the whole job.",
    )


@attrs.frozen
class Concurrency:
    """How many runs of a job may execute at once, across every process (``max``; None, the
    default: no fleet-wide cap, each process runs at most its ``max_in_flight``), how long a
    claim lasts without a heartbeat (``lease``, seconds), and single-runner exclusion.

    A cap is exact across processes (F1) and costs its claims one row lock each, the job's
    claim gate, for one statement; uncapped claims take no exclusion at all, so set ``max``
    only where the work needs a bound (a rate-limited API, a small pool of something).

    ``single_runner=True`` with ``key=None`` allows one run of the job at a time; with ``key``
    (a function of the payload) one run per key. Exclusion across processes comes from the
    backend's ``LockProvider`` (J4).
    """

    max: int | None = attrs.field(
        default=None,
        validator=_int_within(
            "concurrency.max",
            1,
            MAX_CONCURRENCY,
            "omit it (None) for no fleet-wide cap (each process is bounded by max_in_flight),"
            " or pass the most runs of the job that may execute at once across every process.",
            optional=True,
        ),
    )
    lease: float = attrs.field(default=30.0, validator=_duration("concurrency.lease", MAX_LEASE))
    single_runner: bool = False
    key: Callable[[Any], str] | None = None
    partition: PartitionBy | None = attrs.field(default=None)
    """F9: ``"tenant"`` or ``"key"``: ``max`` is per partition, the run's tenant or partition
    key (at most ``max`` running runs of each, fleet-wide and exact); None: one cap for the
    whole job."""

    @partition.validator
    def _check_partition(self, _attribute: attrs.Attribute[Any], value: object) -> None:
        _require_partition("concurrency.partition", value)
        if value is not None and self.max is None:
            raise ConfigurationError(
                "concurrency.partition is set but concurrency.max is None: there is no cap to"
                " partition.",
                fix="pass Concurrency(max=N, partition='tenant') for at most N running runs per"
                " tenant, or drop partition=.",
            )

    @property
    def heartbeat_interval(self) -> float:
        """Every third of the lease (J5): two heartbeats can fail before the lease lapses."""
        return self.lease / 3


MAX_RATE_LIMIT: Final = 1_000_000
"""The most starts a ``RateLimit`` may allow per period."""
MAX_RATE_PERIOD: Final = 86_400.0
"""The longest ``RateLimit.period``: a day (the gate keeps one entry per claim in a period)."""


def _seconds(value: Any) -> Any:  # noqa: ANN401 - checked by the validator that follows
    return value.total_seconds() if isinstance(value, timedelta) else value


@attrs.frozen
class RateLimit:
    """At most ``limit`` runs of the job start in any window of ``period`` seconds, across
    every process (F3): a start is a claim of the run, a retaken lapsed lease included.

    Enforced by the backend's claim (on PostgreSQL, the job's claim gate with the database's
    clock), exactly: no window of ``period`` sees more than ``limit`` starts. A claim that finds
    the window full starts nothing more and tells the runtime when the window frees, so the
    job is claimed again then rather than at its next poll.

    ``partition="tenant"`` (F8) makes it a limit per tenant: no window of ``period`` sees more
    than ``limit`` starts of runs enqueued for one tenant (untenanted runs are one more
    partition), while the other tenants' runs go on being claimed. ``partition="key"``: per
    partition key, the one stored with each run at enqueue (``enqueue(...,
    partition_key=...)``, else ``define_job(..., partition_key=fn)`` of the payload).
    """

    limit: int = attrs.field(
        validator=_int_within(
            "rate_limit.limit",
            1,
            MAX_RATE_LIMIT,
            "pass how many runs of the job may start per period, e.g. RateLimit(100, 1.0).",
        )
    )
    period: float = attrs.field(
        converter=_seconds, validator=_duration("rate_limit.period", MAX_RATE_PERIOD)
    )
    partition: PartitionBy | None = attrs.field(default=None)
    """F8: ``"tenant"`` or ``"key"``: the limit holds per partition, the run's tenant or
    partition key (each partition's own window); None: one window for the whole job."""

    @partition.validator
    def _check_partition(self, _attribute: attrs.Attribute[Any], value: object) -> None:
        _require_partition("rate_limit.partition", value)


MAX_FAIR_WEIGHT: Final = 1_000
"""The largest weight a tenant may have in a ``Fairness``."""
MAX_FAIR_TENANTS: Final = 1_000
"""The most tenants one fair claim may visit (``Fairness.max_tenants``)."""


_WEIGHT_FIX: Final = "give each tenant a positive whole weight (its share is weight / total)."


def _frozen_weights(value: Any) -> tuple[tuple[str, int], ...]:  # noqa: ANN401 - checked here
    if value is None:
        return ()
    items = value.items() if hasattr(value, "items") else value
    weights = []
    for tenant, weight in items:
        if not isinstance(tenant, str) or not tenant.strip():
            raise ConfigurationError(
                f"fairness.weights names tenant {tenant!r}; tenants are non-blank text.",
                fix="key the weights by tenant id, e.g. Fairness(weights={'acme': 3}).",
            )
        require_int_within(weight, f"fairness.weights[{tenant!r}]", 1, MAX_FAIR_WEIGHT, _WEIGHT_FIX)
        weights.append((tenant, weight))
    return tuple(sorted(weights))


@attrs.frozen
class Fairness:
    """Claims of the job shared fairly across tenants (F2): each claim splits what it may take
    among the tenants that have due runs (the tenant each run was enqueued for; untenanted runs
    count as one more tenant), by ``weights`` (tenant -> weight; others ``default_weight``),
    work-conserving: what a tenant with few due runs leaves goes to the rest. So a tenant's
    backlog never holds back another tenant's due runs by more than its share.

    Within a tenant runs go oldest due first; priorities (K6) are not used by fair claims. One
    claim visits at most ``max_tenants`` tenants, taking turns from where the backend's last
    claim of the job stopped, so with more tenants than that each still comes round in turn.
    """

    weights: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=_frozen_weights)
    default_weight: int = attrs.field(
        default=1,
        validator=_int_within("fairness.default_weight", 1, MAX_FAIR_WEIGHT, _WEIGHT_FIX),
    )
    max_tenants: int = attrs.field(
        default=64,
        validator=_int_within(
            "fairness.max_tenants", 1, MAX_FAIR_TENANTS, "omit it for the default (64)."
        ),
    )

    def weight_of(self, tenant: str | None) -> int:
        """``tenant``'s weight (untenanted runs, None, have the default)."""
        for name, weight in self.weights:
            if name == tenant:
                return weight
        return self.default_weight


MAX_SNOOZES: Final = 10_000
"""The most ``RetryPolicy.max_snoozes`` may allow: each snooze adds a history entry to the run."""
MAX_LAPSES: Final = 1_000_000
"""The most ``RetryPolicy.max_lapses`` may allow (each lapse adds a history entry to the run)."""


def _as_exception_types(value: Any) -> tuple[type[BaseException], ...]:  # noqa: ANN401
    """``non_retryable=`` as a tuple of exception types; one type alone is accepted too."""
    types = (value,) if isinstance(value, type) else tuple(value)
    for kind in types:
        if not (isinstance(kind, type) and issubclass(kind, BaseException)):
            raise ConfigurationError(
                f"retry.non_retryable must name exception types, got {kind!r}.",
                fix="pass a tuple of exception classes, e.g. non_retryable=(ValueError,).",
            )
        if issubclass(kind, (RetryAfter, Snooze)):
            raise ConfigurationError(
                f"retry.non_retryable names {kind.__name__}, an outcome a handler chooses, not a"
                " failure to classify.",
                fix="drop it from non_retryable; raise TerminalError to end a run at once.",
            )
    return types


@attrs.frozen
class RetryPolicy:
    """``attempts`` is the total number of runs (the first included) before a run is dead; the
    other fields are the backoff between them, the package's one backoff (``Backoff``, built
    as :attr:`plan`): ``backoff`` is its kind, ``base_delay`` its base, ``factor`` its growth
    (exponential), ``max_delay`` its cap, ``jitter`` its jitter.

    How a failed attempt is classified (K4, :mod:`ship_sqla.kernel._outcomes`):
    ``non_retryable`` names exception types (subclasses included) that end the run at once,
    dead on the attempt they were raised in, like :class:`~ship_sqla.errors.TerminalError`;
    ``max_snoozes`` bounds how many times a run may :class:`~ship_sqla.errors.Snooze` without
    spending an attempt (default 100); past it a snooze is a failed attempt
    (:class:`~ship_sqla.errors.JobSnoozeLimitError`), retried with the backoff until the
    attempts are spent (or dead at once when ``non_retryable`` names ``JobSnoozeLimitError``).

    ``max_lapses`` ends a crash loop (J15): a run whose lease lapses (its worker died while it
    ran, and a claim found it) that many times in a row, with no settle by its handler between,
    is dead-lettered at that lapse (``SHIP_SQLA_JOB_CRASH_LOOP``), attempts left or not. None
    (the default): only ``attempts`` bounds it (each lapse spends an attempt, J6). Releases (a
    drain, a held lock) are not lapses and do not end the streak; any settle by the handler
    (completed, failed, snoozed, suspended) does."""

    attempts: int = attrs.field(default=5, validator=_positive("retry.attempts"))
    backoff: BackoffKind = "exponential"
    base_delay: float = attrs.field(
        default=1.0, validator=_duration("retry.base_delay", MAX_RETRY_DELAY)
    )
    max_delay: float = attrs.field(
        default=3600.0, validator=_duration("retry.max_delay", MAX_RETRY_DELAY)
    )
    jitter: Jitter = "full"
    factor: float = 2.0
    non_retryable: tuple[type[BaseException], ...] = attrs.field(
        default=(), converter=_as_exception_types
    )
    max_snoozes: int = attrs.field(
        default=100,
        validator=_int_within(
            "retry.max_snoozes",
            0,
            MAX_SNOOZES,
            "omit it for the default (100), or pass 0 to make every snooze a failed attempt.",
        ),
    )
    max_lapses: int | None = attrs.field(
        default=None,
        validator=_int_within(
            "retry.max_lapses",
            1,
            MAX_LAPSES,
            "pass the number of lapses in a row that dead-letter a run (at least 1), or None"
            " (the default) to let retry.attempts alone bound them.",
            optional=True,
        ),
    )
    plan: Backoff = attrs.field(init=False, eq=False, repr=False)
    """The backoff these fields describe (built, and so checked, with the policy)."""

    def __attrs_post_init__(self) -> None:
        if self.backoff not in ("exponential", "linear", "fixed"):
            raise ConfigurationError(
                f"retry.backoff {self.backoff!r} is unknown.",
                fix="use 'exponential', 'linear' or 'fixed'.",
            )
        if self.jitter not in ("full", "equal", "none"):
            raise ConfigurationError(
                f"retry.jitter {self.jitter!r} is unknown.", fix="use 'full', 'equal' or 'none'."
            )
        plan = Backoff(
            kind=self.backoff,
            base=self.base_delay,
            factor=self.factor,
            max_delay=self.max_delay,
            jitter=self.jitter,
        )
        object.__setattr__(self, "plan", plan)  # a derived field of a frozen class


@attrs.frozen
class Retention:
    """How long finished runs are kept before ``cleanup`` deletes them.

    With a history table (J16, J18): ``completed=timedelta(0)`` deletes a completed run at its
    settle and writes no history row (failures are still kept); ``completed_payload=True``
    keeps a completed run's payload in its history row (a slim row has none; dead, cancelled
    and discarded runs always keep theirs, and so do workflow runs with stored steps)."""

    completed: timedelta = timedelta(days=1)
    dead: timedelta = timedelta(days=30)
    discarded: timedelta = timedelta(days=7)
    cancelled: timedelta = timedelta(days=7)
    completed_payload: bool = False


KEEP_NONE: Final = 0
"""A completed run leaves no history row (J18, ``Retention(completed=timedelta(0))``)."""
KEEP_ROW: Final = 1
"""A completed run's history row is slim (J18): the default keep code."""
KEEP_PAYLOAD: Final = 2
"""A completed run's history row keeps its payload (J18, ``completed_payload=True``)."""


def history_keep(retention: Retention) -> int:
    """What a job's completed runs leave in history (J16, J18), as the stores' keep code: 0,
    no row (``Retention(completed=timedelta(0))``); 2, a row with the payload
    (``Retention(completed_payload=True)``); else 1 (:data:`KEEP_ROW`), a slim row."""
    if retention.completed <= timedelta(0):
        return KEEP_NONE
    return KEEP_PAYLOAD if retention.completed_payload else KEEP_ROW


@attrs.frozen
class Schedule:
    """Either a cron expression in a time zone, or a fixed interval (J9)."""

    cron: str | None = None
    timezone: str = "UTC"
    interval: timedelta | None = None

    def __attrs_post_init__(self) -> None:
        if (self.cron is None) == (self.interval is None):
            raise ConfigurationError(
                "a schedule needs exactly one of cron= or interval=.",
                fix="Schedule(cron='0 3 * * *', timezone='Europe/Berlin') or"
                " Schedule(interval=timedelta(minutes=5)).",
            )
        if self.interval is not None and self.interval <= timedelta(0):
            raise ConfigurationError(f"schedule interval must be positive, got {self.interval}.")
        validate_schedule(self)

    @property
    def trigger(self) -> str:
        """A stable text of the trigger, stored so an unchanged trigger keeps its ``next_at``."""
        if self.cron is not None:
            return f"cron:{self.cron}@{self.timezone}"
        assert self.interval is not None  # noqa: S101 - guaranteed by __attrs_post_init__
        return f"interval:{self.interval.total_seconds()}"


@attrs.frozen
class IdempotencyPolicy:
    """Runs whose ``dedupe_key`` (from the payload) matches a non-terminal run are deduplicated
    (J1). ``key`` derives the dedupe key when the caller gives none."""

    key: Callable[[Any], str]


class _IdentityCodec:
    """For ``payload=dict`` (or ``None``): JSON objects pass through, anything else is refused."""

    def __init__(self, expected: type[Any] | None) -> None:
        self._expected = expected

    def encode(self, value: Any) -> Any:  # noqa: ANN401
        return self.decode(value)

    def decode(self, data: Any) -> Any:  # noqa: ANN401
        if self._expected is not None and not isinstance(data, self._expected):
            raise InvalidPayloadError(
                f"payload must be a {self._expected.__name__}, got {type(data).__name__}.",
                fix=f"pass a {self._expected.__name__} (the job's payload= type), or declare the"
                " job's payload type as what you send.",
            )
        return data


class _AttrsCodec(Generic[P]):
    """For attrs classes: encode with ``asdict``, decode by calling the class (validators run)."""

    def __init__(self, cls: type[P]) -> None:
        self._cls = cls

    def encode(self, value: P) -> Any:  # noqa: ANN401
        if not isinstance(value, self._cls):
            raise InvalidPayloadError(
                f"payload must be a {self._cls.__name__}, got {type(value).__name__}.",
                fix=f"pass {self._cls.__name__}(...) to enqueue.",
            )
        return attrs.asdict(value)  # type: ignore[arg-type]

    def decode(self, data: Any) -> P:  # noqa: ANN401
        if not isinstance(data, Mapping):
            raise InvalidPayloadError(f"stored payload for {self._cls.__name__} is not an object.")
        try:
            return self._cls(**data)
        except (TypeError, ValueError) as exc:
            raise InvalidPayloadError(f"payload does not fit {self._cls.__name__}: {exc}") from exc


def codec_for(payload: type[Any] | PayloadCodec[Any] | None) -> PayloadCodec[Any]:
    """The codec for a ``payload=`` declaration: a codec, an attrs class, ``dict`` or ``None``."""
    if payload is None:
        return _IdentityCodec(None)
    if isinstance(payload, type) and attrs.has(payload):
        return _AttrsCodec(payload)
    if isinstance(payload, type) and hasattr(payload, "model_validate"):
        return _PydanticCodec(payload)
    if isinstance(payload, type):
        return _IdentityCodec(payload)
    if isinstance(payload, PayloadCodec):
        return payload
    raise ConfigurationError(
        f"payload={payload!r} is neither a type nor a codec.",
        fix="pass an attrs class, a pydantic model, dict, or an object with encode/decode.",
    )


class _PydanticCodec(Generic[P]):
    def __init__(self, cls: type[P]) -> None:
        self._cls: Any = cls

    def encode(self, value: P) -> Any:  # noqa: ANN401
        return self._cls.model_validate(value).model_dump(mode="json")

    def decode(self, data: Any) -> P:  # noqa: ANN401
        try:
            return self._cls.model_validate(data)  # type: ignore[no-any-return]
        except ValueError as exc:
            raise InvalidPayloadError(f"payload does not fit {self._cls.__name__}: {exc}") from exc


Handler = Callable[["JobContext", P], Awaitable[None]]
TransactionalHandler = Callable[["JobContext", P, Any], Awaitable[None]]
"""J13: a handler declared with ``transaction=``: ``handler(ctx, payload, repositories)``."""

Determinism = Literal["strict", "by-name"]
"""D7: how a workflow's calls are matched to stored steps (:attr:`JobDefinition.determinism`)."""
_DETERMINISMS: Final = ("strict", "by-name")


def _check_determinism(
    instance: JobDefinition[Any], _attribute: attrs.Attribute[Any], value: object
) -> None:
    if value not in _DETERMINISMS:
        raise ConfigurationError(
            f"job {instance.id!r}: determinism must be 'strict' or 'by-name', got {value!r}.",
            fix="omit it (strict: calls checked by position, D7), or pass determinism='by-name'"
            " to keep matching stored steps by name while live runs are checked"
            " (docs/workflows-evolution.md).",
        )


OnDivergence = Literal["park", "fail"]
"""D10: what a workflow run whose handler diverged from its history becomes
(:attr:`JobDefinition.on_divergence`)."""


def _check_on_divergence(
    instance: JobDefinition[Any], _attribute: attrs.Attribute[Any], value: object
) -> None:
    if value not in ("park", "fail"):
        raise ConfigurationError(
            f"job {instance.id!r}: on_divergence must be 'park' or 'fail', got {value!r}.",
            fix="omit it (park: the run waits for an operator or a fix, D10), or pass"
            " on_divergence='fail' to dead-letter a diverging run at once.",
        )


def _check_payload_bound(
    instance: JobDefinition[Any], _attribute: attrs.Attribute[Any], value: object
) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= _JSONB_MAX_BYTES:
        raise ConfigurationError(
            f"job {instance.id!r}: max_payload_bytes must be an int from 1 to"
            f" {_JSONB_MAX_BYTES}, got {value!r}.",
            fix=f"omit it for the default ({DEFAULT_MAX_PAYLOAD_BYTES} bytes), or pass a"
            " positive int.",
        )


def _optional_timeout(
    instance: JobDefinition[Any], _attribute: attrs.Attribute[Any], value: object
) -> None:
    if value is not None:
        require_duration(value, f"job {instance.id!r}: timeout", maximum=MAX_JOB_TIMEOUT)


@attrs.frozen
class JobDefinition(Generic[P]):
    """A declared job. Build it with :func:`define_job`."""

    id: str
    handler: Handler[P]
    codec: PayloadCodec[P]
    concurrency: Concurrency = Concurrency()
    retry: RetryPolicy = RetryPolicy()
    retention: Retention = Retention()
    schedule: Schedule | None = None
    idempotency: IdempotencyPolicy | None = None
    max_payload_bytes: int = attrs.field(
        default=DEFAULT_MAX_PAYLOAD_BYTES, validator=_check_payload_bound
    )
    """The longest encoded payload a run of this job may carry: bytes of its compact ASCII JSON
    text (:func:`ship_sqla.kernel._plans.prepare.prepare_run` checks it for every backend)."""
    timeout: float | None = attrs.field(default=None, validator=_optional_timeout)
    """Seconds one attempt's handler may run (K5); None: no limit. At the timeout the runtime
    cancels the handler and the attempt is a failure
    (:class:`~ship_sqla.errors.JobTimeoutError`)."""

    priority: int = attrs.field(default=DEFAULT_PRIORITY, validator=check_priority_field)
    """Its runs' priority unless an enqueue names one (K6): higher first, from ``MIN_PRIORITY``
    to ``MAX_PRIORITY`` (:mod:`ship_sqla.kernel._priority`)."""

    rate_limit: RateLimit | None = None
    """At most so many starts per period across every process (F3); None: no rate limit."""

    fairness: Fairness | None = None
    """Claims shared fairly across tenants (F2); None: oldest due first (by priority, K6)."""

    aging: Aging | None = None
    """F10: waiting runs rise in priority with their wait (an :class:`Aging`); None: strict
    priorities (K6)."""

    transaction: UnitOfWorkLike | None = None
    """J13: the unit of work the handler runs in, fenced on the claim and completing the run in
    the same transaction; the handler is then ``handler(ctx, payload, repositories)``. None: a
    plain handler ``handler(ctx, payload)``, completed after it returns."""

    inbox: Inbox | None = None
    """J13: the inbox key marked in the handler's transaction (only with ``transaction``)."""
    determinism: Determinism = attrs.field(default="strict", validator=_check_determinism)
    """D7: how a workflow run's calls are matched to its stored steps: ``"strict"`` by position
    (a different step there is a divergence), ``"by-name"`` by name (the pre-D7 matching, one
    warning per out-of-order step)."""

    partition_key: Callable[[Any], str] | None = None
    """F8/F9: the partition key of a run, from its payload, for limits with
    ``partition="key"`` (an enqueue's ``partition_key=`` wins); None: only the enqueue's."""

    on_divergence: OnDivergence = attrs.field(default="park", validator=_check_on_divergence)
    """D10: a diverging run is ``"park"``ed (waiting for an operator or a fix, no attempt spent)
    or, ``"fail"``, dead-lettered at once."""

    version: int | None = None
    """D9: the version of ``handler``, recorded on every run enqueued from this definition;
    None: an unversioned job (its runs record none, and any worker executes them)."""

    previous: Mapping[int, Handler[P]] = attrs.field(factory=dict, eq=False)
    """D9: earlier handler versions still needed by live runs, by version (each below
    ``version``); a run recorded under one of them is executed by it, never by ``handler``."""

    @property
    def served_versions(self) -> frozenset[int]:
        """D9: the versions this definition executes (empty for an unversioned job)."""
        if self.version is None:
            return frozenset()
        return frozenset((self.version, *self.previous))

    def at_version(self, version: int | None) -> JobDefinition[P] | None:
        """D9: the definition that executes a run recorded under ``version``: this one for its
        own version; for an earlier one it keeps, this one with that handler; for a run recorded
        before versions existed (None), the lowest version it serves. None when it does not
        serve ``version``: the claimer hands the run back, its attempt unspent."""
        if version == self.version:
            return self
        if version is None:
            return self.at_version(min(self.served_versions))
        handler = self.previous.get(version)
        if handler is None:
            return None
        return attrs.evolve(self, handler=handler, version=version, previous={})

    def encode(self, payload: P) -> Any:  # noqa: ANN401 - JSON-able
        """Validate and encode ``payload`` for storage; raises :class:`InvalidPayloadError`."""
        return self.codec.encode(payload)

    def decode(self, data: Any) -> P:  # noqa: ANN401 - JSON-able
        return self.codec.decode(data)

    @property
    def partition(self) -> PartitionBy | None:
        """F8/F9: what the job's limits are partitioned by (every partitioned limit of a job
        uses the same one), or None: the job's limits, if any, hold for the whole job."""
        rate = self.rate_limit
        return self.concurrency.partition or (None if rate is None else rate.partition)

    def key_of(self, payload: P) -> str | None:
        """The single-runner key of a payload (None when the job is not keyed)."""
        if not self.concurrency.single_runner:
            return None
        if self.concurrency.key is None:
            return ""
        return self.concurrency.key(payload)


def _require_async_handler(job_id: str, handler: object) -> None:
    """A handler is an ``async def`` function (or a callable whose ``__call__`` is one, or a
    ``functools.partial`` of one). A plain function is refused here, at definition: run as a job
    its body would run on every attempt and each attempt would then fail (``None`` cannot be
    awaited). Sync handlers are not run in a thread pool on purpose: a thread cannot be
    cancelled, so the job's timeout (K5), an operator's cancel (K2) and the drain (J12) could
    not stop it."""
    if not callable(handler):
        raise ConfigurationError(
            f"job {job_id!r}: the handler must be an async function, got"
            f" {type(handler).__name__} {handler!r}.",
            fix="pass the handler itself: async def handler(ctx, payload): ...",
        )
    call = getattr(handler, "__call__", None)  # noqa: B004 - a callable object's own method
    if not (inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)):
        raise ConfigurationError(
            f"job {job_id!r}: the handler {handler!r} is a plain function, not an async one;"
            " every attempt would run its body and then fail.",
            fix="declare it with async def; run blocking work inside it with"
            " await asyncio.to_thread(blocking_fn, ...).",
        )


def define_job(
    id: str,  # noqa: A002 - the seed's name for it
    handler: Handler[P] | TransactionalHandler[P],
    *,
    payload: type[P] | PayloadCodec[P] | None = None,
    concurrency: Concurrency | None = None,
    retry: RetryPolicy | None = None,
    retention: Retention | None = None,
    schedule: Schedule | None = None,
    idempotency: IdempotencyPolicy | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    priority: int = DEFAULT_PRIORITY,
    timeout: float | timedelta | None = None,
    rate_limit: RateLimit | None = None,
    fairness: Fairness | None = None,
    transaction: UnitOfWorkLike | None = None,
    inbox: Inbox | None = None,
    aging: Aging | None = None,
    determinism: Determinism = "strict",
    partition_key: Callable[[P], str] | None = None,
    version: int | None = None,
    previous: Mapping[int, Handler[P] | TransactionalHandler[P]] | None = None,
    on_divergence: OnDivergence = "park",
) -> JobDefinition[P]:
    """Declare a job. ``payload`` is an attrs class, a pydantic model, ``dict`` or a codec.

    ``max_payload_bytes``: the longest payload one run may carry, in bytes of its compact JSON
    (non-ASCII escaped); larger: :class:`PayloadTooLargeError` at enqueue. Default 1 MiB: queue
    rows are rewritten at every claim and settle; keep large data elsewhere, enqueue a reference.

    ``priority`` (an int from -10 to 10, default 0; K6): its runs' priority unless an enqueue
    names one; claims take due runs higher priority first, then by ``run_at``, then in creation
    order (``aging``, an :class:`~ship_sqla.jobs.Aging`: by a priority that rises with the
    wait, F10); a bad one raises :class:`~ship_sqla.errors.InvalidPriorityError`.

    ``timeout`` (seconds or a ``timedelta``): how long one attempt's handler may run (K5); then
    it is cancelled and the attempt fails (``SHIP_SQLA_JOB_TIMEOUT``). None: each of these off.
    ``rate_limit`` (a :class:`RateLimit`): at most ``limit`` runs start in any window of
    ``period`` seconds, across every process (F3). ``fairness`` (a :class:`Fairness`): claims
    shared across tenants by weight (F2). ``partition_key`` (a function of the payload): each
    run's partition key for a limit with ``partition="key"`` (F8, F9); an enqueue's wins.

    ``transaction`` (a unit of work; None: none) makes the handler transactional (J13): it is
    called as ``handler(ctx, payload, repositories)`` inside ``transaction.run``, whose first
    statement fences the claim and whose last completes the run; its writes, outbox messages,
    enqueued runs, published events, the ``inbox`` mark (an :class:`~ship_sqla.jobs.Inbox`) and
    the completion commit together or not at all, and a stale holder's transaction rolls back
    whole (J14). It makes no workflow calls.

    ``determinism`` (D7, a workflow's): ``"strict"`` (the default) checks each workflow call
    against the step stored at its position (docs/workflows-evolution.md); ``"by-name"`` keeps
    the earlier matching by step name, logging a warning per out-of-order step. ``version`` (an
    int from 1, never hashed from source) pins each run to the handler version it was enqueued
    under (D9); ``previous`` (``{version: handler}``) keeps older handlers live runs need;
    ``on_divergence`` (D10): ``"park"`` (default) or ``"fail"`` (dead-letter) a diverging run."""
    _check_declaration(id, handler, transaction, inbox)
    _check_limits(id, concurrency, rate_limit, fairness, partition_key)
    return JobDefinition(
        id=id,
        # A transactional handler takes the repositories too; the executor calls it so.
        handler=cast("Handler[P]", handler),
        codec=codec_for(payload),
        concurrency=concurrency or Concurrency(),
        retry=retry or RetryPolicy(),
        retention=retention or Retention(),
        schedule=schedule,
        idempotency=idempotency,
        max_payload_bytes=max_payload_bytes,
        priority=priority,
        timeout=timeout.total_seconds() if isinstance(timeout, timedelta) else timeout,
        rate_limit=_as_rate_limit(rate_limit),
        fairness=_as_fairness(fairness),
        transaction=transaction,
        inbox=inbox,
        aging=_as_aging(aging),
        determinism=determinism,
        partition_key=partition_key,
        on_divergence=on_divergence,
        **_versions(id, version, previous),
    )


def _check_declaration(job_id: str, handler: object, transaction: object, inbox: object) -> None:
    """define_job's checks of the job id, the handler (async) and a transactional declaration."""
    if not _JOB_ID.match(job_id):
        raise ConfigurationError(
            f"job id {job_id!r} is not valid.",
            fix="use 1-128 characters: letters, digits and _ . : - (not starting with a symbol).",
        )
    _require_async_handler(job_id, handler)
    _check_transactional(job_id, transaction, inbox)


def _check_limits(
    job_id: str,
    concurrency: Concurrency | None,
    rate_limit: RateLimit | None,
    fairness: Fairness | None,
    partition_key: object,
) -> None:
    """F8/F9: the job's partitioned limits and partition key, as declared."""
    _check_partitions(job_id, concurrency, rate_limit)
    _check_partition_key(job_id, concurrency, rate_limit, fairness, partition_key)


MAX_HANDLER_VERSION: Final = 2**31 - 1
"""The largest handler version (D9): the runs table stores it as an integer."""


def _versions(job_id: str, version: object, previous: object) -> dict[str, Any]:
    """D9: ``define_job``'s ``version`` and ``previous`` fields, checked."""
    return {"version": version, "previous": _check_versions(job_id, version, previous)}


def _check_versions(job_id: str, version: object, previous: object) -> dict[int, object]:
    """D9's declaration: ``version`` an int from 1 (or None), ``previous`` a mapping of lower
    versions to async handlers, and only with a ``version``; the previous handlers, copied."""
    fix = "pass version=2, previous={1: old_handler} (ints from 1, each previous one lower)."
    if version is not None:
        require_int_within(version, f"job {job_id!r}: version", 1, MAX_HANDLER_VERSION, fix)
    if previous is None:
        return {}
    if not isinstance(previous, Mapping):
        raise ConfigurationError(
            f"job {job_id!r}: previous= must be a mapping of versions to handlers, got"
            f" {type(previous).__name__}.",
            fix=fix,
        )
    if previous and version is None:
        raise ConfigurationError(
            f"job {job_id!r}: previous= needs version=: earlier handlers are kept beside a"
            " versioned current one.",
            fix=fix,
        )
    kept: dict[int, object] = {}
    for old, handler in previous.items():
        require_int_within(old, f"job {job_id!r}: a previous version", 1, MAX_HANDLER_VERSION, fix)
        if version is not None and old >= version:
            raise ConfigurationError(
                f"job {job_id!r}: previous version {old} is not below version {version}.",
                fix=fix,
            )
        _require_async_handler(job_id, handler)
        kept[old] = handler
    return kept


def require_unit_of_work(
    owner: str, transaction: object, error: type[ConfigurationError] = ConfigurationError
) -> None:
    """The one check of a ``transaction=`` declaration (a job's J13, a consumer's C1, a
    backfill's C4): a unit of work, i.e. an object with an async ``run(handler)``; else
    ``error`` naming ``owner`` and the fix."""
    if not callable(getattr(transaction, "run", None)):
        raise error(
            f"{owner}: transaction= must be a unit of work (an object with an async"
            f" run(handler)), got {type(transaction).__name__}.",
            fix="pass transaction=create_unit_of_work(engine, repositories=...).",
        )


def _check_transactional(job_id: str, transaction: object, inbox: object) -> None:
    """J13's declaration: a unit of work (anything with an async ``run``), and an inbox only
    with one (its mark must commit with something)."""
    if transaction is not None:
        require_unit_of_work(f"job {job_id!r}", transaction)
    if inbox is None:
        return
    from ship_sqla.kernel._transactional import Inbox  # noqa: PLC0415 - cycle: it imports errors

    if not isinstance(inbox, Inbox):
        raise ConfigurationError(
            f"job {job_id!r}: inbox= must be an Inbox, got {type(inbox).__name__}.",
            fix="pass inbox=Inbox(store, key=lambda payload: ...).",
        )
    if transaction is None:
        raise ConfigurationError(
            f"job {job_id!r}: an inbox needs transaction=: its mark commits with the handler's"
            " writes, and a plain handler has no transaction to commit it in.",
            fix="pass transaction=uow (the handler becomes handler(ctx, payload, repositories)),"
            " or drop inbox= and use the idempotency store inside the handler's uow.run.",
        )


def _check_partitions(
    job_id: str, concurrency: Concurrency | None, rate_limit: RateLimit | None
) -> None:
    """F8/F9: a job's limits are all partitioned alike, or none is: one claim serves either
    the job's one gate or its partitions' gates, not both (not supported yet)."""
    if concurrency is None or concurrency.max is None or not isinstance(rate_limit, RateLimit):
        return
    cap, rate = concurrency.partition, rate_limit.partition
    if cap != rate:
        raise ConfigurationError(
            f"job {job_id!r}: concurrency.partition is {cap!r} but rate_limit.partition is"
            f" {rate!r}; a job's limits are either all partitioned the same way or none is"
            " (a per-job cap beside a per-tenant limit is not supported yet).",
            fix="give both the same partition= (e.g. 'tenant'), or drop one of the limits.",
        )


def _check_partition_key(
    job_id: str,
    concurrency: Concurrency | None,
    rate_limit: RateLimit | None,
    fairness: Fairness | None,
    partition_key: object,
) -> None:
    """F8/F9: a ``partition_key`` function only for a job whose limits are per key, and fair
    claims (shares by tenant) not with limits per key (not supported yet)."""
    by_key = (concurrency is not None and concurrency.partition == "key") or (
        isinstance(rate_limit, RateLimit) and rate_limit.partition == "key"
    )
    if partition_key is not None and not (by_key and callable(partition_key)):
        raise ConfigurationError(
            f"job {job_id!r}: partition_key= is given but"
            + (" is not callable." if by_key else " no limit of the job has partition='key'."),
            fix="pass partition_key=lambda payload: ... with RateLimit(..., partition='key')"
            " or Concurrency(max=N, partition='key'), or drop partition_key=.",
        )
    if by_key and fairness is not None:
        raise ConfigurationError(
            f"job {job_id!r}: fairness= shares claims across tenants, and its limits are per"
            " partition key: the two together are not supported yet.",
            fix="drop fairness= (a partitioned claim already takes the partitions in turn,"
            " sharing its room equally), or partition the limits by 'tenant'.",
        )


def _as_fairness(value: object) -> Fairness | None:
    if value is None or isinstance(value, Fairness):
        return value
    raise ConfigurationError(
        f"fairness must be a Fairness, got {type(value).__name__}.",
        fix="pass fairness=Fairness() (optionally with weights={tenant: weight}), or omit it.",
    )


def _as_aging(value: object) -> Aging | None:
    if value is None or isinstance(value, Aging):
        return value
    raise ConfigurationError(
        f"aging must be an Aging, got {type(value).__name__}.",
        fix="pass aging=Aging(step=1, every=30.0) (optionally ceiling=...), or omit it.",
    )


def _as_rate_limit(value: object) -> RateLimit | None:
    if value is None or isinstance(value, RateLimit):
        return value
    raise ConfigurationError(
        f"rate_limit must be a RateLimit, got {type(value).__name__}.",
        fix="pass rate_limit=RateLimit(limit, period_seconds), or omit it.",
    )
