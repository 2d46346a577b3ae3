"""The kernel's boundaries in the space of shapes, derived from the tile configs it runs.

Every comparison in the kernel's tile logic (kernel.py) turns over where a length, the
causal offset `seqlen_k - seqlen_q` or a tile count crosses a multiple of a block size:

- `needs_mask` / `write_mask`: a K/V tile's end against seqlen_k (seqlen_k mod block_n) and,
  causal, against the diagonal of the block's first row, q_start + offset with q_start a
  multiple of block_m: offset + k·block_m mod block_n;
- the causal `num_kv_blocks` (ceildiv(q_start + block_m + offset, block_n)) and
  `warpgroup_kv_blocks` (the same with a warpgroup's rows: first_row + rows_per_warpgroup,
  capped at seqlen_q): offset + k·rows_per_warpgroup mod block_n, and seqlen_q mod
  rows_per_warpgroup;
- the LSE row guard and the last, partial query block: seqlen_q mod block_m;
- the K/V tile count of 1 or more (the turn taking's first arrive): seqlen_k against block_n;
- the persistent grid's `rounds` and `place_in_round`: the number of work tiles against the
  number of thread blocks (the SM count), k·SMs - 1, k·SMs, k·SMs + 1;
- TUNED_SHORT's switch points: seqlen_k at each entry's reach, and one past it; TUNED_GRIDS':
  the launch's work tiles per SM at each band's limit, and one tile past it.

So the boundaries come from the configs, never from literals: a new table entry brings its
own. `strategies.py` draws on both sides of them; `test_boundary_sweep.py` walks every causal
offset of each shipped config in turn.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from fa_kernel.configs import FALLBACK, TileConfig, grid_bands

HEAD_DIMS = (64, 128, 256)
# A boundary is hit on both sides: the value at the multiple, and up to this far off it.
SIDE = 2


@dataclass(frozen=True)
class Entry:
    """One config the tables ship, and the keys it serves (`most` None: no upper end)."""

    head_dim: int
    causal: bool
    fewest: int
    most: int | None
    config: TileConfig
    grid: float | None = None  # the most work tiles per SM of its band (configs.grid_bands); None: any more

    def serves(self, seqlen_k: int) -> bool:
        return self.fewest <= seqlen_k and (self.most is None or seqlen_k <= self.most)


def shipped_entries(arch: str = "sm_90") -> list[Entry]:
    """Every (head_dim, causal, key range, config, band of grids) the tables ship, short entries
    first, small grids' bands first."""
    return [
        Entry(head_dim, causal, max(1, fewest), most, config, grid)
        for head_dim, causal in itertools.product(HEAD_DIMS, (False, True))
        for grid, ranges in grid_bands(arch, head_dim, causal)
        for fewest, most, config in ranges
    ]


def rows_per_warpgroup(config: TileConfig) -> int:
    """Query rows each consumer warpgroup owns (kernel.forward_program: FullRow policy)."""
    return config.block_m // (config.threads // 128)


def block_sizes(config: TileConfig) -> tuple[int, ...]:
    """The sizes whose multiples the kernel's conditions compare against."""
    return tuple(sorted({config.block_m, config.block_n, rows_per_warpgroup(config)}))


def lengths_near_multiples(config: TileConfig, fewest: int, most: int) -> list[int]:
    """Lengths in [fewest, most] within SIDE of a multiple of one of the config's block sizes."""
    found = set()
    for size in block_sizes(config):
        for multiple in range(max(1, (fewest - SIDE) // size), (most + SIDE) // size + 1):
            found.update(range(multiple * size - SIDE, multiple * size + SIDE + 1))
    return sorted(n for n in found if fewest <= n <= most)


def boundary_offsets(config: TileConfig, limit: int, side: int = SIDE) -> list[int]:
    """Causal offsets in [-limit, limit] within `side` of n·block_n - k·rows_per_warpgroup: where
    some warpgroup's (and so some query block's) first or last row's diagonal meets the end of a
    K/V tile."""
    step = rows_per_warpgroup(config)
    found = set()
    for n in range(-(limit // config.block_n) - 1, limit // config.block_n + 2):
        for k in range(-(limit // step) - 1, limit // step + 2):
            centre = n * config.block_n - k * step
            found.update(range(centre - side, centre + side + 1))
    return sorted(o for o in found if -limit <= o <= limit)


def sweep_limit(config: TileConfig) -> int:
    """The sweep's offsets run over [-limit, limit]: two of the config's largest blocks each way,
    so that every row of a block meets every position inside a K/V tile."""
    return 2 * max(config.block_m, config.block_n)


def sweep_seqlens_q(config: TileConfig) -> tuple[int, ...]:
    """The query lengths the sweep runs each offset at: three full query blocks, and two and a
    bit, whose last block holds one warpgroup's rows but one (with two or three warpgroups, the
    others are past seqlen_q and see no key)."""
    return (3 * config.block_m, 2 * config.block_m + rows_per_warpgroup(config) - 1)


def sweep_shapes(config: TileConfig, part: str | None = None) -> list[tuple[int, int]]:
    """(seqlen_q, seqlen_k) of the deterministic sweep: every offset in [-limit, limit] at each of
    sweep_seqlens_q, where seqlen_k >= 1 (no keys at all is the API's case, not the kernel's).
    `part` 'boundaries': only the offsets within SIDE of a boundary (boundary_offsets, the smoke
    tier's share); 'between': the others; None: all."""
    limit = sweep_limit(config)
    near = set(boundary_offsets(config, limit))
    wanted = {None: lambda offset: True, "boundaries": near.__contains__, "between": lambda o: o not in near}[part]
    return [
        (seqlen_q, seqlen_q + offset)
        for seqlen_q in sweep_seqlens_q(config)
        for offset in range(-limit, limit + 1)
        if seqlen_q + offset >= 1 and wanted(offset)
    ]


def length_shapes(config: TileConfig) -> list[tuple[int, int]]:
    """(seqlen_q, seqlen_k) with one length on both sides of each block boundary and the other
    fixed, where the sweep's two query lengths (about three blocks each) never go:
    - key lengths within SIDE of a multiple of a block size, up to three K/V tiles, against a
      query block cut to one warpgroup's rows and one: one K/V tile or more (num_kv_blocks, the
      turn taking's `num_kv_blocks > 1`), the mask past seqlen_k (needs_mask);
    - query lengths within SIDE of a multiple of a block size, up to three query blocks, against
      two K/V tiles and a key: the query block count (a last block of one row), the LSE row
      guard, a warpgroup's rows past seqlen_q, and, causal, rows that see no key."""
    keys = [(rows_per_warpgroup(config) + 1, n) for n in lengths_near_multiples(config, 1, 3 * config.block_n + SIDE)]
    queries = [(n, 2 * config.block_n + 1) for n in lengths_near_multiples(config, 1, 3 * config.block_m + SIDE)]
    return sorted(set(keys + queries))


def tile_counts_near_grid(sm_count: int, rounds: tuple[int, ...] = (1, 2)) -> list[int]:
    """Work-tile counts on both sides of a persistent grid's full rounds."""
    return [k * sm_count + step for k in rounds for step in range(-1, 2)]


def factor_pairs(number: int, most_first: int) -> list[tuple[int, int]]:
    """(a, number // a) for every divisor a <= most_first."""
    return [(a, number // a) for a in range(1, most_first + 1) if number % a == 0]


# The fallback, which the tables never dispatch on Hopper, so it is only ever called directly
# (at head_dim 128).
FALLBACK_ENTRIES = (Entry(128, False, 1, None, FALLBACK), Entry(128, True, 1, None, FALLBACK))

# The sweep compiles persistent configs for a grid of this many thread blocks: its shapes have
# 3 query blocks x 3 heads = 9 work tiles, two full rounds and a partial third, snake order.
SWEEP_GRID = 4
SWEEP_HEADS, SWEEP_HEADS_KV = 3, 1


def sweep_builds() -> list[dict]:
    """compiled_forward's arguments for every config the sweep runs (fp16: the tile logic is the
    same in both dtypes), one build each: every entry of the full grid's tables and the
    fallback. The small grids' bands are not swept yet (the property suite and their limits'
    test run them): each new sweep build re-opens the generated mutants' triage."""
    builds = []
    full_grid = [entry for entry in shipped_entries() if entry.grid is None]
    for entry in (*full_grid, *FALLBACK_ENTRIES):
        build = dict(head_dim=entry.head_dim, causal=entry.causal, dtype="float16", config=entry.config)
        if entry.config.persistent:
            build["sm_count"] = SWEEP_GRID
        if build not in builds:
            builds.append(build)
    return builds


def build_id(build: dict) -> str:
    mask = "causal" if build["causal"] else "full"
    grid = f"-grid{build['sm_count']}" if "sm_count" in build else ""
    return f"d{build['head_dim']}-{mask}-{build['config']}{grid}"
