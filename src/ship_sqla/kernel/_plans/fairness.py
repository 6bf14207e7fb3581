"""Fair claims across tenants (F2): how one claim's room is shared among the tenants that have
due runs. The in-memory backend runs this function; the PostgreSQL claim (CLAIM_FAIR) computes
the same water-filling in SQL.

Tenants are served fewest due runs per weight first; each gets at most its weighted share of the
room still left (rounded up, never more than it has due, never more than is left), and what it
leaves passes on to the tenants after it. So the split is weighted and work-conserving: a lone
tenant gets the whole room, and a tenant with a large backlog never takes the room of the
others' due runs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["fair_shares"]


def fair_shares(due: Sequence[tuple[int, int]], room: int) -> list[int]:
    """Each tenant's share of ``room``: ``due`` is (due runs, weight) per tenant, in the order
    the claim found them (that order breaks ties). The shares sum to at most ``room``."""
    order = sorted(
        (index for index, (count, _) in enumerate(due) if count > 0),
        key=lambda index: (due[index][0] / due[index][1], index),
    )
    shares = [0] * len(due)
    left_room = room
    left_weight = sum(due[index][1] for index in order)
    for index in order:
        count, weight = due[index]
        share = min(count, math.ceil(left_room * weight / left_weight), left_room)
        shares[index] = share
        left_room -= share
        left_weight -= weight
    return shares
