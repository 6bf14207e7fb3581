"""F8/F9: how many partitions a partitioned claim visits (kernel.partition_walk)."""

from __future__ import annotations

from ship_sqla.jobs import Fairness
from ship_sqla.kernel._jobs import DEFAULT_PARTITION_WALK, PARTITION_WALK_FLOOR, partition_walk


def test_f8_f9_the_walk_is_the_limit_within_the_floor_and_max_tenants() -> None:
    """F8, F9: a claim visits min(max_tenants, max(limit, floor)) partitions: no more than it
    can take from, at least the floor, at most the walk's width."""
    assert partition_walk(None, 1_000) == DEFAULT_PARTITION_WALK
    assert partition_walk(None, 1) == PARTITION_WALK_FLOOR
    assert partition_walk(None, 40) == 40
    assert partition_walk(Fairness(max_tenants=3), 1) == 3
    assert partition_walk(Fairness(max_tenants=500), 300) == 300
