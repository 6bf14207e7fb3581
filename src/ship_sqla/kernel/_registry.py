"""The set of jobs one application declares: each job id names exactly one definition."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from ship_sqla.kernel._errors import ConfigurationError, UsageError
from ship_sqla.kernel._jobs import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Concurrency,
    Determinism,
    Fairness,
    Handler,
    IdempotencyPolicy,
    JobDefinition,
    OnDivergence,
    PayloadCodec,
    RateLimit,
    Retention,
    RetryPolicy,
    Schedule,
    TransactionalHandler,
    define_job,
)
from ship_sqla.kernel._lifespan import require_lifespan
from ship_sqla.kernel._priority import DEFAULT_PRIORITY, Aging

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping
    from datetime import timedelta

    from ship_sqla.kernel._lifespan import Lifespan
    from ship_sqla.kernel._transactional import Inbox
    from ship_sqla.kernel._workflows import UnitOfWorkLike

__all__ = ["DuplicateJobError", "JobRegistry", "UnknownJobError"]

P = TypeVar("P")


class DuplicateJobError(ConfigurationError):
    """Two definitions were registered under one job id."""

    code = "SHIP_SQLA_JOB_DUPLICATE"


class UnknownJobError(UsageError, KeyError):
    """A job id was looked up that no definition in the registry declares."""

    code = "SHIP_SQLA_JOB_UNKNOWN"

    def __str__(self) -> str:  # KeyError would repr() the message; keep it readable.
        return Exception.__str__(self)


class JobRegistry:
    """Job definitions by id, in registration order.

    A job id is registered at most once: a second definition under the same id (even an equal
    one) raises :class:`DuplicateJobError`, because two handlers for one stored run would make
    which one executes depend on import order.

    ``lifespan`` (optional): the application's resources for these jobs' handlers, an async
    context manager factory whose yielded value handlers read as ``ctx.resources``; every
    worker runtime started with this registry (``start_job_runtime``, ``ship-sqla worker``)
    enters it before its first claim and exits it after its drain.
    """

    __slots__ = ("_definitions", "lifespan")

    def __init__(
        self, definitions: Iterable[JobDefinition[Any]] = (), *, lifespan: Lifespan | None = None
    ) -> None:
        if lifespan is not None:
            require_lifespan(lifespan, "JobRegistry")
        self.lifespan = lifespan
        self._definitions: dict[str, JobDefinition[Any]] = {}
        for definition in definitions:
            self.register(definition)

    def register(self, definition: JobDefinition[P]) -> JobDefinition[P]:
        """Add ``definition``; returns it so registration can wrap a module-level assignment."""
        if not isinstance(definition, JobDefinition):
            raise ConfigurationError(
                f"can only register JobDefinition objects, got {type(definition).__name__}.",
                fix="build the definition with define_job(id, handler, ...).",
            )
        if definition.id in self._definitions:
            raise DuplicateJobError(
                f"job id {definition.id!r} is already registered.",
                fix="give each job a unique id, or register the definition only once.",
            )
        self._definitions[definition.id] = definition
        return definition

    def job(
        self,
        id: str,  # noqa: A002 - the seed's name for it
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
    ) -> Callable[[Handler[P] | TransactionalHandler[P]], JobDefinition[P]]:
        """Decorator form: ``@registry.job("emails.send", payload=SendEmail)`` on the handler
        defines and registers the job; the decorated name becomes the definition. It takes
        every option :func:`~ship_sqla.define_job` takes, with the same defaults."""

        def decorate(handler: Handler[P] | TransactionalHandler[P]) -> JobDefinition[P]:
            return self.register(
                define_job(
                    id,
                    handler,
                    payload=payload,
                    concurrency=concurrency,
                    retry=retry,
                    retention=retention,
                    schedule=schedule,
                    idempotency=idempotency,
                    max_payload_bytes=max_payload_bytes,
                    priority=priority,
                    timeout=timeout,
                    rate_limit=rate_limit,
                    fairness=fairness,
                    transaction=transaction,
                    inbox=inbox,
                    aging=aging,
                    determinism=determinism,
                    partition_key=partition_key,
                    version=version,
                    previous=previous,
                    on_divergence=on_divergence,
                )
            )

        return decorate

    def get(self, job_id: str) -> JobDefinition[Any]:
        """The definition of ``job_id``; raises :class:`UnknownJobError` when none is registered."""
        try:
            return self._definitions[job_id]
        except KeyError:
            known = ", ".join(sorted(self._definitions)) or "none"
            raise UnknownJobError(
                f"no job {job_id!r} is registered (registered: {known}).",
                fix="register the job's definition in the registry the runtime was started with.",
            ) from None

    def find(self, job_id: str) -> JobDefinition[Any] | None:
        """The definition of ``job_id``, or None."""
        return self._definitions.get(job_id)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._definitions)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._definitions

    def __iter__(self) -> Iterator[JobDefinition[Any]]:
        return iter(tuple(self._definitions.values()))

    def __len__(self) -> int:
        return len(self._definitions)

    def __repr__(self) -> str:
        return f"JobRegistry({list(self._definitions)!r})"
