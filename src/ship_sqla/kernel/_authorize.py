"""The one permission gate of every operator surface (jobs J8, outbox, later the dashboard).

An operator operation first asks the application's ``authorizer(permission, operation)``
(sync or async); anything but ``True`` raises :class:`PermissionDeniedError` before any
statement runs, so a refusal changes nothing. Fail closed: a truthy mistake (``1``, ``"yes"``)
never grants access.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TypeAlias

from ship_sqla.kernel._errors import ConfigurationError, PermissionDeniedError

__all__ = ["Authorizer", "authorize", "check_authorizer"]

Authorizer: TypeAlias = Callable[[str, str], "bool | Awaitable[bool]"]
"""``authorizer(permission, operation) -> bool`` (or an awaitable of it), e.g.
``lambda permission, operation: user.can(permission)``."""


def check_authorizer(authorizer: object) -> Authorizer:
    """``authorizer`` when it is callable, else a :class:`ConfigurationError` at build time."""
    if not callable(authorizer):
        raise ConfigurationError(
            f"authorizer must be callable, got {type(authorizer).__name__}.",
            fix="pass authorizer=lambda permission, operation: user.can(permission).",
        )
    return authorizer


async def authorize(authorizer: Authorizer, permission: str, operation: str) -> None:
    """Raise :class:`PermissionDeniedError` unless ``authorizer(permission, operation)`` is
    exactly ``True``."""
    answer = authorizer(permission, operation)
    if inspect.isawaitable(answer):
        answer = await answer
    if answer is not True:
        raise PermissionDeniedError(
            f"the authorizer refused permission {permission!r} for operation {operation!r};"
            " nothing was changed.",
            fix=f"grant {permission!r} to this caller in the application's authorizer (it must"
            " return True).",
        )
