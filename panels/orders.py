"""Option orders: seeded permutations per scenario, balanced so that every option stands in every position
equally often whenever the number of orders is a multiple of the number of options.

Construction: blocks of cyclic Latin squares. Each block takes a random base permutation and its n cyclic
shifts (every option once in every position), in random row order; k orders use k // n whole blocks plus
a random part of one more. The random source is seeded by (seed, scenario id), so orders do not depend on
which other scenarios are in the run.
"""

from __future__ import annotations

import random
from collections import Counter

ACTION_ORDERS = 32
RAW_ORDERS = 8


def option_orders(n_options: int, k: int, seed: int, key: str = "") -> list[tuple[int, ...]]:
    """k permutations of range(n_options), balanced by position when n_options divides k."""
    if n_options < 1 or k < 1:
        raise ValueError(f"need n_options >= 1 and k >= 1, got {n_options}, {k}")
    rng = random.Random(f"option-orders|{seed}|{key}|{n_options}")
    orders: list[tuple[int, ...]] = []
    while len(orders) < k:
        base = list(range(n_options))
        rng.shuffle(base)
        block = [tuple(base[(pos + shift) % n_options] for pos in range(n_options)) for shift in range(n_options)]
        rng.shuffle(block)
        orders.extend(block[: k - len(orders)])
    return orders


def balanced_by_position(orders: list[tuple[int, ...]]) -> bool:
    """Whether `orders` (permutations of one scenario's options) put every option in every position equally often."""
    if not orders:
        return True
    n = len(orders[0])
    counts = Counter((option, pos) for order in orders for pos, option in enumerate(order))
    return len({counts[(i, p)] for i in range(n) for p in range(n)}) == 1
