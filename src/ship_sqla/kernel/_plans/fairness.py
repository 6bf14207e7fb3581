"""Fair claims across tenants (F2): how one claim's room is shared among the tenants that have
due runs. The in-memory backend runs this function; the PostgreSQL claim (CLAIM_FAIR) computes
the same water-filling in SQL.

Tenants are served fewest due runs per weight first; each gets at most its weighted share of the
room still left (rounded up, never more than it has due, never more than is left), and what it
leaves passes on to the tenants after it. So the split is weighted and work-conserving: a lone
tenant gets the whole room, and a tenant with a large backlog never takes the room of the
others' due runs.

A claim does not count every visited tenant's due runs up to what its limits allow before it
shares the room (:func:`counted_for_shares`): when the tenants share one weight it counts each
up to an equal share of the room plus one, and only when some tenants hold fewer than their
share, the tenants that held more again, up to the room the others left. The shares are then
:func:`fair_shares` of those counts, which both backends compute alike.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["counted_for_shares", "fair_shares"]


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


def counted_for_shares(due: Sequence[tuple[int, int, int]], room: int) -> list[int]:
    """F2, F8/F9: each visited tenant's due runs as the claim counts them for
    :func:`fair_shares` (issue 35, item 4: a claim reads about ``room`` index entries plus two
    per tenant, not each tenant's due runs up to what its limits allow). ``due`` is, per tenant
    in the claim's order, (its due runs up to what its limits allow, what its limits allow,
    its weight).

    1. When every tenant whose limits allow any run has the same weight (no ``Fairness``
       weights, or none that differ among them), each tenant's due runs count up to an equal
       share of the room, rounded up, plus one: ``top = ceil(room / n) + 1`` (``n``: the
       tenants whose limits allow any run). A tenant counted to ``top`` holds more than its
       share (it is *full*). With weights that differ, every tenant counts whole (``top``: one
       more than its limits allow, so none is full), as before.
    2. When those counts reach the room, or no tenant is full, they are the counts.
    3. Otherwise each full tenant counts up to ``top`` plus the room the first counts left
       (``room - sum``): no tenant's share can be more.

    Equal weights keep the shares those of the whole counts (within the rounding that breaks
    ties: a full tenant's share never reaches its ``top``); unequal ones would not (a tenant
    with a large weight and no due run lowers every share), hence step 1's exception. The
    first counts read at most ``room`` plus two entries per tenant; the second, only when some
    tenant held fewer due runs than its share and another more, at most the room left over
    per full tenant (never more than what their limits allow, which every tenant was counted
    up to before). The PostgreSQL claims read the untenanted runs (one tenant) whole, up to
    what their limits allow, once."""
    sharing = [weight for _, allowed, weight in due if allowed > 0]
    if len(set(sharing)) == 1:
        tops = [-(-room // len(sharing)) + 1] * len(due)
    else:
        tops = [allowed + 1 for _, allowed, _ in due]
    first = [min(count, top) for (count, _, _), top in zip(due, tops, strict=True)]
    left = room - sum(first)
    if left <= 0:
        return first
    return [
        min(count, top + left) if seen == top else seen
        for (count, _, _), top, seen in zip(due, tops, first, strict=True)
    ]
