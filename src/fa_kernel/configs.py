"""Tile configurations: which block sizes, pipeline depth and thread count each kernel runs, and
which kernel serves a call (the forward kernel or the split-KV kernels), one line of reason per
entry; the measurements behind them: docs/tile-configs.md and docs/performance.md.

The gradient kernels' tiles (BACKWARD_TILES, DQ_TILES) and the split-KV kernels' (SPLIT_TILES)
are keyed by head_dim. The forward's table is keyed by (GPU architecture, head_dim, causal) and
was filled by measurement (`fa-kernel tune` regenerates it). Attention over few keys has a
second table, TUNED_SHORT: per case, configs each up to a number of keys (seqlen_k); past the
last, TUNED's. Launches whose grid gives the SMs few work tiles have a third, TUNED_GRIDS: bands
of tiles per SM, each with key entries of its own (`fa-kernel tune --heads` measures a ladder
per grid). The kernel is written for Hopper (TMA, wgmma, setmaxnreg), so the tables have sm_90
rows only; a case not in them gets the smallest configuration, which is correct and slow.
"""

from __future__ import annotations

import functools
import heapq
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import NamedTuple


@dataclass(frozen=True)
class TileConfig:
    """One point of the kernel's tuning space."""

    block_m: int  # query rows per thread block (the resident Q tile)
    block_n: int  # key/value rows per loop iteration
    num_stages: int  # depth of the K/V software pipeline
    threads: int  # consumer threads: 128, 256 or 384 (1-3 warpgroups); the kernel adds a
    # 128-thread producer warpgroup
    take_turns: bool = True  # 2-3 consumer warpgroups issue their GEMMs in a fixed order
    # (ping-pong / ring) so their softmaxes stagger; False lets them run free
    persistent: bool = False  # one thread block per SM walks the work tiles, instead of one
    # thread block per tile
    blocks_per_sm: int = 1  # 2: registers halved so that two thread blocks share an SM, one
    # block's prologue and epilogue beside the other's loop (short sequences)
    overlap_epilogue: bool = False  # persistent: the next work tile's first Q.K^T is issued
    # before this tile's epilogue (LSE, O out), which then runs under it

    def as_dict(self) -> dict[str, int | bool]:
        return asdict(self)

    def per_tile(self) -> TileConfig:
        """The config on the per-tile grid, a ragged batch's (its work tiles come from the key
        tile order, one thread block each, not from a persistent walk)."""
        return replace(self, persistent=False, overlap_epilogue=False)

    def __str__(self) -> str:
        """The config in one word, e.g. 128x176/2st/256thr/persistent/overlap; `parse` reads it back."""
        free = "" if self.take_turns else "/free"
        persistent = "/persistent" if self.persistent else ""
        persistent += "/overlap" if self.overlap_epilogue else ""
        shared = f"/{self.blocks_per_sm}persm" if self.blocks_per_sm > 1 else ""
        return f"{self.block_m}x{self.block_n}/{self.num_stages}st/{self.threads}thr{free}{persistent}{shared}"

    @classmethod
    def parse(cls, text: str) -> TileConfig:
        """The config `str(config)` printed; ValueError naming what does not fit that form."""
        match = _CONFIG_TEXT.fullmatch(text.strip())
        if match is None:
            raise ValueError(
                f"config: expected BMxBN/Sst/Tthr[/free][/persistent][/overlap][/Npersm], "
                f"like 128x176/2st/256thr/persistent, got {text!r}"
            )
        return cls(
            int(match["block_m"]),
            int(match["block_n"]),
            int(match["stages"]),
            int(match["threads"]),
            take_turns=match["free"] is None,
            persistent=match["persistent"] is not None,
            blocks_per_sm=int(match["blocks_per_sm"] or 1),
            overlap_epilogue=match["overlap"] is not None,
        )


_CONFIG_TEXT = re.compile(
    r"(?P<block_m>\d+)x(?P<block_n>\d+)/(?P<stages>\d+)st/(?P<threads>\d+)thr"
    r"(?P<free>/free)?(?P<persistent>/persistent)?(?P<overlap>/overlap)?(?:/(?P<blocks_per_sm>\d+)persm)?"
)


# sm_90 (H100/H200). One line of reasoning per entry; the numbers: docs/tile-configs.md.
TUNED: dict[tuple[str, int, bool], TileConfig] = {
    # three warpgroups in a ring: at d64 the softmax's fp32 work limits, and a third warpgroup gives it issue slots
    ("sm_90", 64, False): TileConfig(192, 128, 2, 384, persistent=True),
    # per tile: the hardware's block order balances causal tiles better than a static persistent one
    ("sm_90", 64, True): TileConfig(192, 128, 2, 384),
    # block_n 176 (wgmma's N is any multiple of 8): fewer loop trips, no spills; the epilogue under the next S_0
    ("sm_90", 128, False): TileConfig(128, 176, 2, 256, persistent=True, overlap_epilogue=True),
    # per tile, as d64 causal; past 4096 keys (fewer: TUNED_SHORT)
    ("sm_90", 128, True): TileConfig(128, 176, 2, 256),
    # what fits shared memory with two K/V stages (Q 64 KB, K and V 2 x 2 x 32 KB); speed not tuned
    ("sm_90", 256, False): TileConfig(128, 64, 2, 256),
    ("sm_90", 256, True): TileConfig(128, 64, 2, 256),
}

# Few keys: a work tile visits few K/V tiles, so what it pays once (its Q load, first softmax,
# last P.V, O store) weighs more than the loop. The numbers: docs/tile-configs.md.
# Per case: (the most keys it serves, config), in increasing order of keys.
TUNED_SHORT: dict[tuple[str, int, bool], tuple[tuple[int, TileConfig], ...]] = {
    ("sm_90", 64, True): (
        # persistent: the next tile's Q and K/V load under this tile's loop; O through a buffer of its own
        (1024, TileConfig(128, 128, 2, 256, persistent=True)),
        # 192-row blocks pay off once each warpgroup visits only its rows' tiles, up to the long entry's reach
        (4096, TileConfig(192, 128, 2, 384, persistent=True)),
    ),
    # persistent without the overlapped epilogue (slower and erratic at these lengths)
    ("sm_90", 128, False): ((2048, TileConfig(128, 128, 2, 256, persistent=True)),),
    # as d128; ahead of the long entry up to 4096 keys, level at 8192
    ("sm_90", 128, True): ((4096, TileConfig(128, 128, 2, 256, persistent=True)),),
}

# Launches with few work tiles for the SMs: per case, bands in increasing order of the work tiles
# per SM they serve (`tiles_per_sm`), each (the most tiles per SM it serves, its entries: (the
# most keys, config), the last with None for any longer). Past the last band, TUNED_SHORT and
# TUNED. `fa-kernel tune --heads` measures each band on grids of its own. The numbers:
# docs/tile-configs.md.
TUNED_GRIDS: dict[tuple[str, int, bool], tuple[tuple[float, tuple[tuple[int | None, TileConfig], ...]], ...]] = {
    ("sm_90", 64, True): (
        # 4 tiles an SM: from 4096 keys two blocks an SM, whose unequal causal tiles fill the SMs
        # where a static persistent order leaves them idle
        (
            3.88,
            (
                (1024, TileConfig(192, 128, 2, 384, persistent=True)),
                (2048, TileConfig(128, 128, 2, 256, persistent=True)),
                (None, TileConfig(64, 128, 2, 128, blocks_per_sm=2)),
            ),
        ),
    ),
    ("sm_90", 128, False): (
        # 16 tiles an SM: up to 8192 keys the overlapped epilogue does not pay for itself
        (
            15.52,
            (
                (2048, TileConfig(128, 128, 2, 256, persistent=True)),
                (8192, TileConfig(128, 176, 2, 256, persistent=True)),
                (None, TileConfig(128, 176, 2, 256, persistent=True, overlap_epilogue=True)),
            ),
        ),
    ),
    ("sm_90", 128, True): (
        # 4 tiles an SM: one block a tile from 2049 keys, where the persistent order's causal
        # imbalance costs more than the grid's tail
        (
            3.88,
            (
                (2048, TileConfig(128, 128, 2, 256, persistent=True)),
                (4096, TileConfig(128, 128, 2, 256)),
                (None, TileConfig(128, 176, 2, 256)),
            ),
        ),
        # 16 tiles an SM: persistent up to 8192 keys, one block a tile past it
        (
            15.52,
            (
                (4096, TileConfig(128, 128, 2, 256, persistent=True)),
                (8192, TileConfig(128, 176, 2, 256, persistent=True)),
                (None, TileConfig(128, 128, 2, 256)),
            ),
        ),
    ),
}

# Work tiles are counted in rows of this many queries whatever the config's block_m, so that the
# measure a band is chosen by does not depend on the config it chooses.
GRID_ROWS = 128

# One consumer warpgroup, one stage: fits any head_dim up to 256 in a Hopper SM's shared
# memory and registers. Slower than tuned, never wrong; the GPU tests run it too.
FALLBACK = TileConfig(64, 64, 1, 128)


def arch_of(compute_capability: tuple[int, int]) -> str:
    """'sm_90' for (9, 0): the key the table uses."""
    major, minor = compute_capability
    return f"sm_{major}{minor}"


def tiles_per_sm(batch: int, heads: int, seqlen_q: int, sm_count: int) -> float:
    """Work tiles of GRID_ROWS query rows per SM in a launch: how far its grid fills the GPU."""
    return batch * heads * -(-seqlen_q // GRID_ROWS) / sm_count


def select_config(
    arch: str, head_dim: int, causal: bool, seqlen_k: int | None = None, grid: float | None = None
) -> TileConfig:
    """The measured configuration for this case, or the fallback. seqlen_k None: the
    long-sequence entry; grid: the launch's work tiles per SM (`tiles_per_sm`), None: a full
    grid (TUNED_SHORT and TUNED)."""
    entries = _entries(arch, head_dim, causal, grid)
    return next(config for most, config in entries if most is None or seqlen_k is not None and seqlen_k <= most)


def key_ranges(
    arch: str, head_dim: int, causal: bool, grid: float | None = None
) -> list[tuple[int, int | None, TileConfig]]:
    """Every config this case runs on a grid of `grid` work tiles per SM (None: a full grid) and
    the keys it runs them at: (fewest, most, config), in increasing order of keys; `most` is None
    for the last, which serves any longer too."""
    entries = _entries(arch, head_dim, causal, grid)
    ranges, fewest = [], 0
    for most_keys, config in entries:
        ranges.append((fewest, most_keys, config))
        fewest = (most_keys or 0) + 1
    return ranges


def grid_bands(
    arch: str, head_dim: int, causal: bool
) -> list[tuple[float | None, list[tuple[int, int | None, TileConfig]]]]:
    """Every band of grids this case has: (the most work tiles per SM it serves, None for the
    last, which serves any more; its key_ranges), in increasing order of tiles."""
    limits = [most for most, _ in TUNED_GRIDS.get((arch, head_dim, causal), ())]
    return [(most, key_ranges(arch, head_dim, causal, most)) for most in limits] + [
        (None, key_ranges(arch, head_dim, causal))
    ]


def _entries(arch: str, head_dim: int, causal: bool, grid: float | None) -> tuple[tuple[int | None, TileConfig], ...]:
    """(most keys, config) of the band that serves `grid` tiles per SM, the last entry's most None."""
    case = (arch, head_dim, causal)
    if grid is not None:
        for most_tiles, entries in TUNED_GRIDS.get(case, ()):
            if grid <= most_tiles:
                return entries
    return (*TUNED_SHORT.get(case, ()), (None, TUNED.get(case, FALLBACK)))


# ---- the gradient kernels (backward.py): (block_m, block_n, num_stages) by head_dim ----

BACKWARD_TILES = {
    # FlashAttention-3's: 128 query rows halve the walk's steps and double each GEMM's height
    64: (128, 128, 2),
    # 64 rows: Sᵀ and dPᵀ of 128 rows would take 128 fp32 registers a thread beside dK's and dV's
    128: (64, 128, 2),
    # 64 keys: dK and dV of 128 would take 256 fp32 registers a thread; one stage: two of Q and dO
    # (64 KB each) would not fit beside K, V and dQ's buffer (FlashAttention-3's tile)
    256: (64, 64, 1),
}
# The same kernel without dQ (`with_dq=False`), beside the fixed-order dQ kernel; its K/V tiles are
# BACKWARD_TILES' (pairs_per_group counts them there).
DK_DV_TILES = BACKWARD_TILES | {
    # 64 rows: on 128, without dQ's GEMM in the step, ptxas serialises every wgmma and spills
    64: (64, 128, 2),
    # the room of dQ's buffer buys a second stage of Q and dO (209 KB, no spills)
    256: (64, 64, 2),
}
# The fixed-order dQ kernel (the fixed-order path's: deterministic=True, and where gradient_plan
# routes the default): one consumer warpgroup per 64 rows (dq_program).
DQ_TILES = {
    # 128 rows on two warpgroups: one's GEMMs run through the other's exponentials (on 64 rows,
    # one warpgroup, the tensor cores idle through them)
    64: (128, 128, 2),
    128: (128, 128, 2),
    # 64 keys and one stage: Q and dO of 128 rows fill the room (192 KB) that a second K/V stage wants
    256: (128, 64, 1),
}


# The dK/dV kernel's time as gradient_head_splits models it, in steps (one query tile of one
# head against a block's K/V tile, about 3 µs at either head dim's tile, docs/performance.md).
SPLIT_STEP_US = 3.0
# A block's own cost past its walk: K/V's load, the pipeline's fill, dK's and dV's store.
SPLIT_BLOCK_STEPS = 3
# Splitting adds four launches (two sums, two casts), about 20 µs, and each split writes its fp32
# partial dK and dV and the sums read them back.
SPLIT_SUM_STEPS = 7
HBM_BYTES_PER_US = 3.0e6
# Past this many waves of blocks the grid is fine enough that its tail costs little (and the
# model's list schedule grows with the blocks): no more splits are tried.
SPLIT_MAX_WAVES = 16
# The head dims whose dK/dV kernel keeps P and dS in registers; head_dim 256's split build does not
# lower in TileLang 0.1.15 (backward_program).
HEAD_SPLIT_DIMS = (64, 128)


def key_tiles(seqlen_k: int, head_dim: int) -> int:
    """The K/V tiles of a dK/dV launch over seqlen_k keys, one block each a (batch, K/V head) pair
    (BACKWARD_TILES' block_n, which DK_DV_TILES shares)."""
    return -(-seqlen_k // BACKWARD_TILES[head_dim][1])


def dk_dv_tiles(fixed_order: bool) -> dict:
    """The dK/dV kernel's tile table on a gradient's path: without dQ beside the fixed-order dQ
    kernel, DK_DV_TILES; adding dQ atomically, BACKWARD_TILES."""
    return DK_DV_TILES if fixed_order else BACKWARD_TILES


def pairs_per_group(seqlen_k: int, head_dim: int, sm_count: int) -> int:
    """The (batch, K/V slot) pairs a heavy-first group of dK/dV blocks holds (backward_program's
    `heavy_first`, a launch argument): as many as one wave of SMs takes every K/V tile of, at
    least one."""
    return max(1, sm_count // key_tiles(seqlen_k, head_dim))


def key_tile_walks(rule, block_m: int, block_n: int) -> list[int]:
    """The query tiles a dK/dV block walks for one head, for each K/V tile in launch order: from
    the tile of the first row that sees its first key (a right edge) to past the last row that
    sees its last (a left edge), as backward_program walks them. `rule`: a mask.Visibility of ints."""
    walks = []
    for kv_start in range(0, rule.seqlen_k, block_n):
        first = max(rule.first_row(kv_start), 0) // block_m if rule.limits_right else 0
        end = min(rule.seqlen_q, max(0, rule.rows_before(kv_start + block_n))) if rule.limits_left else rule.seqlen_q
        walks.append(max(-(-end // block_m) - first, 0))
    return walks


def list_schedule(block_steps: Sequence[float], sm_count: int) -> float:
    """When the last of `block_steps` ends, each block started on the first SM free, in launch
    order (one dK/dV block an SM: its shared memory)."""
    ends = [0.0] * sm_count
    for steps in block_steps:
        heapq.heapreplace(ends, ends[0] + steps)
    return max(ends)


# Where the fixed-order path (the dK/dV kernel without dQ, then the dQ kernel) is the faster
# gradient: head_dim -> its regions, each (the most keys, the least GQA group, whether only under
# a right edge). Its two kernels do two GEMMs more than one kernel adding dQ atomically, which
# pays where walks are short and the adds contend (the measurements: docs/performance.md, "The
# fixed-order path"); head_dim 64 is level or behind everywhere measured. Measured on grids of a
# wave of unsplit dK/dV blocks or more: on fewer the atomic path's group splits fill the SMs, where
# the fixed-order one under a right edge keeps each group whole.
FIXED_ORDER_FASTER = {
    128: (
        (512, 1, False),  # the shortest walks, with or without causal (without, behind from 1k)
        (1024, 1, True),  # causal at 1k, MHA and GQA alike
        (2048, 5, True),  # causal GQA at 2k from groups of 5 (behind at 8k and past)
    ),
    256: ((1024, 1, False),),  # to 1k with or without causal (level at 2k, behind at 8k)
}


def gradient_plan(
    batch: int,
    rule,
    heads_kv: int,
    group_size: int,
    head_dim: int,
    sm_count: int,
    deterministic: bool,
    route: bool = True,
) -> tuple[bool, int]:
    """(fixed_order, splits) of a gradient launch: dQ from the fixed-order kernel where asked
    (`deterministic`) or, with `route`, where it is the faster (in a region of FIXED_ORDER_FASTER,
    on a wave of blocks or more); that path under a right edge keeps each group whole (its blocks
    heavy first, backward.heavy_first_order), else gradient_head_splits' count."""
    limits_right = rule.limits_right
    faster = batch * heads_kv * key_tiles(rule.seqlen_k, head_dim) >= sm_count and any(
        rule.seqlen_k <= most_keys and group_size >= least_group and (limits_right or not right_edge_only)
        for most_keys, least_group, right_edge_only in FIXED_ORDER_FASTER.get(head_dim, ())
    )
    fixed_order = deterministic or (route and faster)
    if fixed_order and limits_right:
        return True, 1
    return fixed_order, gradient_head_splits(batch, rule, heads_kv, group_size, head_dim, sm_count)


def gradient_head_splits(batch: int, rule, heads_kv: int, group_size: int, head_dim: int, sm_count: int) -> int:
    """Into how many blocks the dK/dV kernel splits each K/V tile's GQA group of query heads
    (backward_program's `head_splits`; 1: none): the count whose modelled time is least, each
    split's blocks walking a share of the group. Splits fill a grid short of a wave (an MQA
    gradient over 4k keys is 32 blocks on 132 SMs), and even out a causal one, whose first K/V
    tiles walk every query tile of the group while the last walk a few: with few large blocks
    the SMs wait on the longest. `rule`: the launch's mask.Visibility, of ints."""
    if head_dim not in HEAD_SPLIT_DIMS or group_size == 1:
        return 1  # before the cache: an MHA gradient pays no lookup
    return least_time_splits(batch, rule, heads_kv, group_size, head_dim, sm_count)


@functools.lru_cache(maxsize=256)
def least_time_splits(batch: int, rule, heads_kv: int, group_size: int, head_dim: int, sm_count: int) -> int:
    """gradient_head_splits' model, once per launch shape (it schedules up to thousands of blocks)."""
    block_m, block_n, _ = BACKWARD_TILES[head_dim]
    walks = key_tile_walks(rule, block_m, block_n)
    partial_bytes = 2 * 2 * 4 * batch * rule.seqlen_k * heads_kv * head_dim  # dK and dV, written and read
    split_steps = partial_bytes / HBM_BYTES_PER_US / SPLIT_STEP_US

    def modelled_steps(splits: int) -> float:
        heads = [-(-(group_size - split) // splits) for split in range(splits)]  # split s: heads s, s + splits, ...
        blocks = [walked * h + SPLIT_BLOCK_STEPS for _ in range(batch * heads_kv) for h in heads for walked in walks]
        if splits == 1:
            return list_schedule(blocks, sm_count)
        return list_schedule(blocks, sm_count) + SPLIT_SUM_STEPS + splits * split_steps

    most = min(group_size, SPLIT_MAX_WAVES * sm_count // max(1, batch * heads_kv * len(walks)))
    if most < 2:
        return 1  # the grid is fine already: no schedule is worked out
    best, least = 1, modelled_steps(1)
    for splits in range(2, most + 1):
        if (steps := modelled_steps(splits)) < least:
            best, least = splits, steps
    return best


# ---- the split-KV kernels (decode.py) ----


class SplitTile(NamedTuple):
    """A split kernel's tile and launch: how its thread blocks are shaped and how many an SM."""

    block_m: int  # rows, (query, query head of the group) pairs, a thread block
    block_n: int  # keys a K/V tile
    num_stages: int  # K/V tiles in flight
    producer: bool  # a producer warpgroup loads K/V by TMA (TileLang's warp specialisation)
    blocks_per_sm: int  # thread blocks an SM the splits aim for (decode.split_plan)


# By (head_dim, block_m); a launch takes the fewest rows that hold its group's (decode.row_block).
SPLIT_TILES = {
    # a group's rows up to 16: cuDNN's decode tile, four warps splitting the keys (mma.sync, P through
    # shared memory), no producer, one stage (TileLang's pipeliner cannot unroll more without one)
    # two blocks an SM at d64, one at d128 (72 KB, 196 registers)
    (64, 16): SplitTile(16, 128, 1, False, 2),
    (128, 16): SplitTile(16, 128, 1, False, 1),
    # up to 64 rows, and d256: one warpgroup (wgmma's smallest M) behind a TMA producer; three
    # stages, the only way to more bytes in flight with one block an SM
    (64, 64): SplitTile(64, 128, 3, True, 1),
    (128, 64): SplitTile(64, 64, 3, True, 1),
    (256, 64): SplitTile(64, 64, 3, True, 1),
}


# ---- which kernel serves a call ----

# Where the split-KV kernels beat the forward kernel on a step of few queries, in GPU time on the
# H200 (the routing ladder and its boundaries: docs/performance.md). Where the forward kernel's
# time is short, the split kernels' second kernel and fp32 partials outweigh what they save: its
# keys per SM (waves of tiles times seqlen_k) must reach this.
SPLIT_KV_FORWARD_KEYS = 4096
# Past 8 queries the split kernel's pace drops to the forward kernel's without GQA...
SPLIT_KV_QUERIES = 8
# ...and with GQA at few keys, not at more: the re-reads saved grow with the keys.
SPLIT_KV_MANY_QUERIES_KEYS = 3072


def forward_keys_per_sm(batch: int, heads: int, seqlen_q: int, seqlen_k: int, sm_count: int) -> int:
    """Keys each SM walks in the forward kernel's launch: whole waves of its work tiles (the last
    wave counts whole, however few its tiles) times seqlen_k."""
    return math.ceil(tiles_per_sm(batch, heads, seqlen_q, sm_count)) * seqlen_k


def split_kv_serves(
    batch: int, seqlen_q: int, seqlen_k: int, heads: int, heads_kv: int, rows_per_block: int, sm_count: int
) -> bool:
    """Whether a call runs on the split-KV kernels (`fa_kernel.decode`) rather than the forward
    kernel, causal or not (the mask costs both the same), measured on the H200:

    - a group's query rows, group_size * seqlen_q, fit one of the split kernel's row blocks of
      `rows_per_block`: each K/V tile is read once for the group;
    - without GQA, the forward kernel's grid, one tile per (batch, head), fills at most half the
      SMs: no read is saved, but the split kernels spread the keys over every SM;
    - the forward kernel's keys per SM (`forward_keys_per_sm`) reach SPLIT_KV_FORWARD_KEYS;
    - at most SPLIT_KV_QUERIES queries, or with GQA at least SPLIT_KV_MANY_QUERIES_KEYS keys."""
    group_size = heads // heads_kv
    if group_size * seqlen_q > rows_per_block or group_size == 1 and 2 * batch * heads > sm_count:
        return False
    if forward_keys_per_sm(batch, heads, seqlen_q, seqlen_k, sm_count) < SPLIT_KV_FORWARD_KEYS:
        return False
    return seqlen_q <= SPLIT_KV_QUERIES or group_size > 1 and seqlen_k >= SPLIT_KV_MANY_QUERIES_KEYS
