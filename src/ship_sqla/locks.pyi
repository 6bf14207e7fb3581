from ship_sqla._locks import AdvisoryLock as AdvisoryLock
from ship_sqla._locks import AdvisoryLockProvider as AdvisoryLockProvider
from ship_sqla._locks import advisory_lock_key as advisory_lock_key
from ship_sqla.kernel._fences import FencedLock as FencedLock
from ship_sqla.kernel._fences import FencingLockProvider as FencingLockProvider

__all__ = (
    "AdvisoryLock",
    "AdvisoryLockProvider",
    "FencedLock",
    "FencingLockProvider",
    "advisory_lock_key",
)
