"""How evenly a causal grid's work spreads over the SMs, under four tile orders (a model).

A work tile (one query block of one head) costs its K/V tiles plus `OVERHEAD` tile-iterations
for its prologue and epilogue; the model counts nothing else (no L2, no power). It prints each
order's makespan over the ideal (total work / SMs):

  hardware   one thread block per tile, launched in order to whichever SM frees first (the
             hardware block scheduler: greedy list scheduling);
  plain      persistent, tile t to thread block t mod SMs;
  snake      persistent, kernel.py's order: a thread block's place reverses every round;
  pairs      persistent, units of two tiles of one head, query blocks j and last - j (equal
             cost per unit), units round-robin.

    python perf/causal_balance.py [--sms 132]

At 9090863 (2026-11-30): snake predicted 1.265 against hardware's 1.035 for d64 causal at 16k (-18%);
the H200 measured -12% (390.7 persistent vs 442.4 per tile). At f01b8c6: a persistent grid
drawing tiles from a global counter (the hardware's order) measured 449.8 against 452.3 per
tile there: balanced, and no faster (docs/perf-log.md).
"""

from __future__ import annotations

import argparse
import heapq
import math

OVERHEAD = 2  # prologue + epilogue of a work tile, in K/V-tile iterations (a guess, not measured)

# (name, batch, heads, seqlen, block_m, block_n): the tuned causal configs at the bench's shapes
CASES = [
    ("d64 causal 1k", 32, 16, 1024, 192, 128),
    ("d64 causal 4k", 8, 32, 4096, 192, 128),
    ("d64 causal 16k", 2, 16, 16384, 192, 128),
    ("d128 causal 1k", 32, 16, 1024, 128, 176),
    ("d128 causal 4k", 8, 32, 4096, 128, 176),
    ("d128 causal 16k", 2, 16, 16384, 128, 176),
]


def tile_cost(q_block: int, seqlen: int, block_m: int, block_n: int) -> int:
    return min(math.ceil(seqlen / block_n), math.ceil((q_block + 1) * block_m / block_n)) + OVERHEAD


def heaviest_first(batch, heads, seqlen, block_m, block_n) -> list[int]:
    """Tile costs in kernel.py's order: head by head, the query block with most keys first."""
    q_blocks = math.ceil(seqlen / block_m)
    per_head = [tile_cost(q_blocks - 1 - i, seqlen, block_m, block_n) for i in range(q_blocks)]
    return per_head * (batch * heads)


def hardware(costs: list[int], sms: int) -> float:
    finish = [0.0] * sms
    for cost in costs:
        heapq.heappush(finish, heapq.heappop(finish) + cost)
    return max(finish)


def round_robin(costs: list[int], sms: int, snake: bool) -> float:
    load = [0.0] * sms
    for index, cost in enumerate(costs):
        round_, place = divmod(index, sms)
        load[sms - 1 - place if snake and round_ % 2 else place] += cost
    return max(load)


def pairs(batch, heads, seqlen, block_m, block_n, sms: int) -> float:
    q_blocks = math.ceil(seqlen / block_m)
    units = []
    for _ in range(batch * heads):
        for j in range((q_blocks + 1) // 2):
            heavy, light = q_blocks - 1 - j, j
            units.append(
                tile_cost(heavy, seqlen, block_m, block_n)
                + (tile_cost(light, seqlen, block_m, block_n) if light != heavy else 0)
            )
    return round_robin(units, sms, snake=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sms", type=int, default=132)
    args = parser.parse_args()
    header = " ".join(f"{order:>8s}" for order in ("hardware", "plain", "snake", "pairs"))
    print(f"{'case':16s} {'tiles':>6s} {header}   (makespan / ideal)")
    for name, *shape in CASES:
        costs = heaviest_first(*shape)
        ideal = sum(costs) / args.sms
        ratios = [
            hardware(costs, args.sms),
            round_robin(costs, args.sms, snake=False),
            round_robin(costs, args.sms, snake=True),
            pairs(*shape, args.sms),
        ]
        print(f"{name:16s} {len(costs):6d} " + " ".join(f"{r / ideal:8.3f}" for r in ratios))


if __name__ == "__main__":
    main()
