"""F8/F9: how many partitions a partitioned claim visits (kernel.partition_walk)."""

from __future__ import annotations

from ship_sqla.jobs import Fairness
from ship_sqla.kernel._jobs import (
    DEFAULT_PARTITION_WALK,
    PARTITION_WALK_FLOOR,
    PARTITION_WALK_WIDEST,
    partition_walk,
    partition_walk_widest,
)


def test_f8_f9_the_walk_is_the_limit_within_the_floor_and_max_tenants() -> None:
    """F8, F9: a claim visits min(max_tenants, max(limit, floor)) partitions: no more than it
    can take from, at least the floor, at most the walk's width."""
    assert partition_walk(None, 1_000) == DEFAULT_PARTITION_WALK
    assert partition_walk(None, 1) == PARTITION_WALK_FLOOR
    assert partition_walk(None, 40) == 40
    assert partition_walk(Fairness(max_tenants=3), 1) == 3
    assert partition_walk(Fairness(max_tenants=500), 300) == 300


def test_f8_f9_f2_the_walk_goes_on_to_the_claims_size_only_without_fairness() -> None:
    """F8, F9, F2: without a Fairness a claim's walk may go on past partition_walk, up to
    max(limit, floor) partitions and PARTITION_WALK_WIDEST (while those visited hold fewer due
    runs than its room); with one, max_tenants stays a hard bound (partition_walk's)."""
    assert partition_walk_widest(None, 1_000) == PARTITION_WALK_WIDEST == 256
    assert partition_walk_widest(None, 200) == 200
    assert partition_walk_widest(None, 40) == 40 == partition_walk(None, 40)
    assert partition_walk_widest(None, 1) == PARTITION_WALK_FLOOR
    assert partition_walk_widest(Fairness(max_tenants=64), 1_000) == 64
    assert partition_walk_widest(Fairness(max_tenants=500), 300) == 300
    for limit in (1, 16, 64, 65, 1_000):
        assert partition_walk_widest(None, limit) >= partition_walk(None, limit)
