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

__all__ = ["Authorizer", "authorize", "authorize_read", "check_authorizer", "granted"]

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


async def authorize_read(authorizer: Authorizer, manage: str, read: str, operation: str) -> None:
    """A read of an operator surface: ``manage`` (which implies read), else ``read``; when both
    are refused, :class:`PermissionDeniedError` naming both."""
    try:
        await authorize(authorizer, manage, operation)
    except PermissionDeniedError:
        try:
            await authorize(authorizer, read, operation)
        except PermissionDeniedError:
            raise PermissionDeniedError(
                f"the authorizer refused both {read!r} and {manage!r} for operation"
                f" {operation!r}; nothing was read.",
                fix=f"grant {read!r} (read only) or {manage!r} to this caller in the"
                " application's authorizer (it must return True).",
            ) from None


async def granted(authorizer: Authorizer, permission: str, operation: str) -> bool:
    """Whether ``authorizer`` grants ``permission`` for ``operation`` (what a page asks before it
    shows an action; the action still asks for itself)."""
    try:
        await authorize(authorizer, permission, operation)
    except PermissionDeniedError:
        return False
    return True
