"""A model, on the CPU, of whether the dK/dV kernel's dQ reduce-adds find their tile in L2: the
blocks list-scheduled on the SMs in heavy-first order, one walk step a time unit, each step's add
an access to its (pair, head, query tile) dQ tile in an LRU cache of L2's size. What it leaves
out: L2's two partitions and its real policy, the Q and dO tiles beside dQ's, steps' uneven cost.

From the repository root:

    python -m perf.dq_l2_model

Printed per shape and walk (backward_program's order by head slowest, `lockstep`, `staggered`):
the share of adds that miss after their tile's first add, and the modelled time in steps.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

from fa_kernel.configs import BACKWARD_TILES, SPLIT_BLOCK_STEPS, pairs_per_group

L2_BYTES = 50 * 2**20  # an H100's
WALKS = ("by head", "lockstep", "staggered")
SHAPES = [  # (batch, heads, heads_kv, seqlen, causal), head_dim 128
    (8, 48, 4, 2048, True),
    (8, 48, 4, 2048, False),
    (8, 32, 32, 2048, True),
    (8, 16, 2, 2048, True),
    (8, 128, 8, 2048, True),
    (2, 48, 4, 8192, True),
]


def block_walk(pair: int, key_tile: int, group: int, q_tiles: int, first: int, walk: str) -> list[tuple]:
    """The (pair, head, query tile) dQ tiles a block adds into, in its walk's order."""
    tiles = range(first, q_tiles)
    if walk == "lockstep":
        return [(pair, head, tile) for tile in reversed(tiles) for head in range(group)]
    if walk == "staggered":
        return [(pair, head, tiles[(i + key_tile) % len(tiles)]) for head in range(group) for i in range(len(tiles))]
    return [(pair, head, tile) for head in range(group) for tile in tiles]


def re_misses(batch, heads, heads_kv, seqlen, causal, walk, head_dim=128, sm_count=132) -> tuple[float, int]:
    """(the share of adds that miss after their tile's first, the modelled time in steps)."""
    block_m, block_n, _ = BACKWARD_TILES[head_dim]
    q_tiles, key_tiles, group = seqlen // block_m, seqlen // block_n, heads // heads_kv
    pairs, per_group = batch * heads_kv, pairs_per_group(seqlen, head_dim, sm_count)
    order = [
        (p, t)
        for g in range(0, pairs, per_group)
        for t in range(key_tiles)
        for p in range(g, min(g + per_group, pairs))
    ]
    free, adds = [(0, sm) for sm in range(sm_count)], []
    for pair, key_tile in order:
        start, sm = heapq.heappop(free)
        first = key_tile * block_n // block_m if causal else 0
        steps = block_walk(pair, key_tile, group, q_tiles, first, walk)
        adds += [(start + SPLIT_BLOCK_STEPS + i, sm, tile) for i, tile in enumerate(steps)]
        heapq.heappush(free, (start + SPLIT_BLOCK_STEPS + len(steps), sm))
    adds.sort()
    capacity = L2_BYTES // (block_m * (head_dim + 4) * 4)
    cache: OrderedDict = OrderedDict()
    misses = 0
    for _, _, tile in adds:
        if tile in cache:
            cache.move_to_end(tile)
            continue
        misses += 1
        cache[tile] = None
        if len(cache) > capacity:
            cache.popitem(last=False)
    distinct = len({tile for _, _, tile in adds})
    return (misses - distinct) / len(adds), max(time for time, _, _ in adds) + 1


def main() -> int:
    print("| shape (d128) | walk | adds missing L2 after their tile's first | modelled steps |\n|---|---|---|---|")
    for batch, heads, heads_kv, seqlen, causal in SHAPES:
        label = f"{batch}x{heads}/{heads_kv}x{seqlen}{' causal' if causal else ''}"
        for walk in WALKS:
            share, steps = re_misses(batch, heads, heads_kv, seqlen, causal, walk)
            print(f"| {label} | {walk} | {share:.3f} | {steps} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
