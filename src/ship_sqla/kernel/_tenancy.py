"""The ambient tenant (F2): the tenant a run enqueued here is recorded under, and the tenant a
unit of work opened here defaults to.

Two places set it, each for the code it runs: ``uow.run(tenant=...)`` while its handler runs
(so an enqueue inside a tenant-scoped unit of work records that tenant), and the job runtime
while a run's handler runs (so the handler's own units of work and enqueues default to its
run's tenant). A context variable: each task sees what its own caller set, never another
task's.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from ship_sqla.kernel._errors import TenantViolationError

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = [
    "MAX_TENANT_BYTES",
    "ambient_tenant",
    "check_tenant",
    "enter_tenant",
    "tenant_ambient",
]

MAX_TENANT_BYTES = 255
"""A tenant is at most 255 bytes of UTF-8: it is part of the key of indexed rows (the
idempotency table's primary key holds prefix, tenant and key), and PostgreSQL refuses an index
row over about 2.7 kB with "index row requires N bytes" instead of a typed error."""


_AMBIENT: ContextVar[str | None] = ContextVar("ship_sqla_ambient_tenant", default=None)


def ambient_tenant() -> str | None:
    """The tenant the current code runs for (see the module docstring), or None."""
    return _AMBIENT.get()


def enter_tenant(tenant: str) -> None:
    """Make ``tenant`` the ambient tenant for the rest of the current task (a run's own task:
    its context is a copy, so nothing leaks to the task that started it)."""
    _AMBIENT.set(tenant)


@contextmanager
def tenant_ambient(tenant: str | None) -> Iterator[None]:
    """Run the block with ``tenant`` as the ambient tenant (None: leaves it as it is)."""
    if tenant is None:
        yield
        return
    token = _AMBIENT.set(tenant)
    try:
        yield
    finally:
        _AMBIENT.reset(token)


def check_tenant(tenant: object, *, operation: str) -> str | None:
    """``tenant``, unless it is no tenant at all (R2): ``None`` means "no tenant"; anything else
    must be 1 to :data:`MAX_TENANT_BYTES` bytes of printable text, not only whitespace.

    The one check for ``uow.run``, every store and the job operations' tenant filter (F2):
    ``""`` or ``" "`` would alias "no tenant" wherever "no tenant" is stored as ``''`` (the
    idempotency table's key), and replay or read what was stored for untenanted requests.
    """
    if tenant is None:
        return None
    if not isinstance(tenant, str):
        raise TenantViolationError(
            f"{operation} was given tenant {tenant!r}, a {type(tenant).__name__}, not text.",
            fix="pass the tenant's id as a str, or tenant=None for work of no tenant.",
        )
    problem = None
    if not tenant.strip():
        problem = "is empty or blank, which would alias 'no tenant'"
    elif not tenant.isprintable():
        problem = "contains control or non-printable characters"
    elif len(tenant.encode()) > MAX_TENANT_BYTES:
        problem = f"is {len(tenant.encode())} bytes of UTF-8, over {MAX_TENANT_BYTES}"
    if problem is not None:
        raise TenantViolationError(
            f"{operation} was given tenant {tenant[:60]!r}, which {problem}.",
            fix="pass tenant=None for work that belongs to no tenant, else the tenant's id"
            f" (1 to {MAX_TENANT_BYTES} bytes of printable text).",
        )
    return tenant
