"""The one hook the test plugin's history recorder uses (D11, ``pytest
--ship-record-histories DIR``): a wrapper around the workflow store each run's context is bound
to, so the recorder sees what each execution loaded and stored. None is installed outside that
option: :func:`recorded_store` then returns the store itself."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Callable

    from ship_sqla.kernel._ports import ClaimedRun
    from ship_sqla.kernel._workflows import WorkflowStore

__all__ = ["StoreWrapper", "install_store_wrapper", "recorded_store"]

StoreWrapper: TypeAlias = "Callable[[ClaimedRun, WorkflowStore], WorkflowStore]"

_installed: list[StoreWrapper] = []


def install_store_wrapper(wrapper: StoreWrapper | None) -> None:
    """Install ``wrapper`` (None: remove the installed one)."""
    _installed.clear()
    if wrapper is not None:
        _installed.append(wrapper)


def recorded_store(run: ClaimedRun, store: WorkflowStore) -> WorkflowStore:
    """``store``, wrapped by the installed recorder, if any."""
    return _installed[0](run, store) if _installed else store
