"""The tile schedulers: which work tiles a thread block runs, in which order, and which K/V
tiles each of them (and each consumer warpgroup's rows in it) visits; the forward's, and the
gradient's heavy-first order of its K/V tiles (`heavy_first_block`).

A work tile is one block of `block_m` query rows of one (batch, head). The per-tile grid is
(query block, head, batch); the persistent grid numbers the tiles in that order, query block
fastest, so the thread blocks running at once share their K/V in L2, and one thread block per
SM walks them, a round of `workers` at a time (its producer loads the next tile's Q and K/V
while the consumers finish the last one). The K/V tiles a work tile visits come from the
visibility rule (mask.py): tiles past its last row's last visible key are never loaded.

Every value is a TileLang expression of the launch's sizes; the kernel keeps a work tile's in
registers (pipeline.WorkTile), so each division here runs once per tile.

A ragged batch's grid is (tile order, heads): the host lists each sequence's own query blocks,
longest K/V walk first (ragged_tile_order), so no thread block is spent past a sequence's end
and the grid's tail is left to the short walks.
"""

import dataclasses
from typing import Any, NamedTuple

import numpy as np
import tilelang.language as T
import torch

from fa_kernel.configs import TileConfig
from fa_kernel.mask import Visibility


class TileScheduler(NamedTuple):
    q_blocks: Any  # query blocks per (batch, head)
    num_tiles: Any  # work tiles of the launch
    workers: Any  # thread blocks of the persistent grid
    place_in_round: Any  # (worker, tile_round) -> its place among the round's tiles
    work_tile: Any  # (block, tile_round, rule) -> (b, head, kv_head, q_start, num_kv_blocks)
    first_kv_block: Any  # (q_start, rule) -> left edge: the K/V tile the block's walk starts at
    warpgroup_kv_blocks: Any  # (q_start, num_kv_blocks, warpgroup, kv_first, rule) -> the tiles its rows see


def tile_scheduler(
    *,
    batch,
    heads,
    heads_kv,
    visibility: Visibility,
    config: TileConfig,
    rows_per_warpgroup: int,
    sm_count: int,
    ragged: bool = False,
) -> TileScheduler:
    """The scheduler of a launch of `batch` x `heads` over `visibility`'s lengths (of a ragged
    batch: its longest sequence's), with `config`'s tiles, on `sm_count` SMs. Each work tile's
    walk takes the rule of its own lengths (`rule`: the launch's `visibility` unless given; a
    ragged batch's tile, its sequence's). `ragged`: a block's (query block, head, sequence) comes
    from the host's tile order (ragged_tile_order), which puts the long walks first already."""
    block_m, block_n = config.block_m, config.block_n
    seqlen_q = visibility.seqlen_q
    q_blocks = T.ceildiv(seqlen_q, block_m)
    num_tiles = q_blocks * heads * batch
    workers = T.min(sm_count, num_tiles)

    def place_in_round(worker, tile_round):
        """Round r covers tiles [r * workers, (r + 1) * workers) in snake order: a thread
        block's place reverses every round, so (causal) heavy and light tiles even out over a
        thread block's rounds instead of some blocks drawing the heavy ones."""
        return T.if_then_else(tile_round % 2 == 0, worker, workers - 1 - worker)

    def work_tile(block, tile_round, rule=visibility):
        """(batch, head, K/V head, first query row, K/V tiles to visit: from first_kv_block's
        with a left edge, else from the first) of thread block `block`'s tile_round-th work tile."""
        if config.persistent:
            tile = tile_round * workers + place_in_round(block[0], tile_round)
            q_block, head, b = tile % q_blocks, tile // q_blocks % heads, tile // (q_blocks * heads)
        else:
            q_block, head, b = block
        if visibility.limits_right and not ragged:
            # Later query blocks see more keys: run them first, so the short ones fill the
            # tail of the grid.
            q_block = q_blocks - 1 - q_block
        kv_head = head // (heads // heads_kv)  # GQA/MQA: a group of query heads shares a K/V head
        q_start = q_block * block_m
        num_kv_blocks = kv_end(q_start, rule)
        if visibility.limits_left:
            num_kv_blocks = num_kv_blocks - first_kv_block(q_start, rule)
        return b, head, kv_head, q_start, num_kv_blocks

    def kv_end(q_start, rule):
        """The K/V tile after the last one the block of rows from q_start visits."""
        num_kv_blocks = T.ceildiv(rule.seqlen_k, block_n)
        if rule is not visibility and not visibility.limits_right:
            # A ragged batch's sequence may have no key: its rows still visit one tile, which
            # the mask hides whole (the launch's own keys are never 0).
            num_kv_blocks = T.max(1, num_kv_blocks)
        if visibility.limits_right:
            # Tiles right of this block's last visible key are never loaded. At least one tile
            # is: every TMA load issued must be waited for before the block exits (a load in
            # flight would land in the next block's shared memory), and the consumers' loop is
            # written for one tile or more. The mask zeroes that tile.
            num_kv_blocks = T.max(1, T.min(num_kv_blocks, T.ceildiv(rule.keys_before(q_start + block_m), block_n)))
        return num_kv_blocks

    def first_kv_block(q_start, rule=visibility):
        """Left edge: the first K/V tile the block visits, its first row's first key's; tiles
        before it are never loaded (its later rows' windows start later still). Never past its
        last tile: one tile always is."""
        return T.min(T.max(0, rule.first_key(q_start)) // block_n, kv_end(q_start, rule) - 1)

    def warpgroup_kv_blocks(q_start, num_kv_blocks, warpgroup, kv_first=None, rule=visibility):
        """K/V tiles the rows of consumer warpgroup `warpgroup` see, of the block's num_kv_blocks
        from its tile kv_first (left edge; else 0), which its last rows see: with a right edge,
        up to the tile with its last row's last visible key;
        rows past seqlen_q (the last query block's), one, as every block visits at least one.
        The tiles after them are fully masked for these rows: they would add exact zeros.

        Under the overlapped epilogue every warpgroup visits every tile: it releases the tiles
        past its rows only after its last P.V, and the next work tile's S_0, issued before that
        P.V completes, waits for a K that one of those releases lets the producer load."""
        if config.overlap_epilogue:
            return num_kv_blocks
        first_row = q_start + warpgroup * rows_per_warpgroup
        visible = num_kv_blocks
        if visibility.limits_right:
            last_rows_end = T.min(first_row + rows_per_warpgroup, rule.seqlen_q)
            visible_end = T.ceildiv(rule.keys_before(last_rows_end), block_n)
            visible = T.min(num_kv_blocks, visible_end if kv_first is None else visible_end - kv_first)
        return T.if_then_else(first_row < rule.seqlen_q, T.max(1, visible), 1)

    return TileScheduler(q_blocks, num_tiles, workers, place_in_round, work_tile, first_kv_block, warpgroup_kv_blocks)


def at_offset(offset, row):
    """A row of a ragged tile's sequence in the packed tensors (offset None: a batched launch's
    own rows)."""
    return row if offset is None else offset + row


def ragged_registers() -> tuple:
    """A ragged batch's work tile's int32 registers: (sequence, its first query row and first key
    in the packed tensors, its query and key lengths), for read_sequence to fill."""
    return tuple(T.alloc_var(T.int32) for _ in range(5))


@T.macro
def read_sequence(cu_seqlens_q, cu_seqlens_k, sequence: T.Ref, q_offset: T.Ref, k_offset: T.Ref, seqlen_q: T.Ref,
                  seqlen_k: T.Ref):  # fmt: skip
    """Sequence `sequence`'s offsets and lengths from the cu_seqlens, into its registers."""
    q_offset = cu_seqlens_q[sequence]
    k_offset = cu_seqlens_k[sequence]
    seqlen_q = cu_seqlens_q[sequence + 1] - q_offset  # noqa: F841 (a register store)
    seqlen_k = cu_seqlens_k[sequence + 1] - k_offset  # noqa: F841


@T.macro
def read_ragged_tile(tile_order, block, cu_seqlens_q, cu_seqlens_k, sequence: T.Ref, q_offset: T.Ref, k_offset: T.Ref,
                     seqlen_q: T.Ref, seqlen_k: T.Ref):  # fmt: skip
    """Row `block` of a tile order's sequence, and its offsets and lengths, into the registers."""
    sequence = tile_order[block, 0]
    read_sequence(cu_seqlens_q, cu_seqlens_k, sequence, q_offset, k_offset, seqlen_q, seqlen_k)


def ragged_tile(tile_order, block, cu_seqlens_q, cu_seqlens_k) -> tuple:
    """A ragged batch's work tile, at the start of a kernel's block: the registers (sequence,
    q_offset, k_offset, seqlen_q, seqlen_k) read_ragged_tile fills from row `block` of the tile
    order, and the order's second column, the block's query or K/V tile in its sequence."""
    registers = ragged_registers()
    # As the kernels' bodies see a register: its one element.
    read_ragged_tile(tile_order, block, cu_seqlens_q, cu_seqlens_k, *(register[0] for register in registers))
    return *registers, tile_order[block, 1]


def ragged_tile_order(lengths_q: list[int], lengths_k: list[int], block_m: int, block_n: int, causal: bool,
                      window_size: tuple[int, int] = (-1, -1)) -> torch.Tensor:  # fmt: skip
    """int32 [tiles, 2] on the host: (sequence, query block) of each query block of a ragged
    batch's sequences, the ones whose rows visit the most K/V tiles first (ties in sequence
    order). Blocks run in about this order, so longest-first keeps the grid's tail short. Rows
    see keys from their bottom-right diagonal as the kernel's rule: right edge 0 when causal,
    else window_size's right (-1: none), left edge window_size's left. In numpy: on arrays this
    small its operations cost a tenth of torch's, and this runs on the host before each launch."""
    sequence, q_block, seqlen_q, seqlen_k = _tiles_of(lengths_q, lengths_k, lengths_q, block_m)
    diagonal = seqlen_k - seqlen_q  # row i's own key is i + diagonal
    first_row = q_block * block_m
    last_row = np.minimum(first_row + block_m, seqlen_q) - 1
    left, right = window_size[0], 0 if causal else window_size[1]
    keys_end = seqlen_k if right < 0 else np.clip(last_row + diagonal + right + 1, 0, seqlen_k)
    keys_first = 0 if left < 0 else np.maximum(first_row + diagonal - left, 0)
    kv_tiles = np.maximum((keys_end + block_n - 1) // block_n - keys_first // block_n, 1)
    return _longest_first(sequence, q_block, kv_tiles)


def ragged_key_tile_order(lengths_q: list[int], lengths_k: list[int], block_m: int, block_n: int, causal: bool,
                          window_size: tuple[int, int] = (-1, -1)) -> torch.Tensor:  # fmt: skip
    """The backward's ragged_tile_order: int32 [tiles, 2] of (sequence, K/V tile), each
    sequence's own K/V tiles, the ones whose walk visits the most query tiles first (the rows
    that see any of its keys: backward.backward_program's walk). A sequence with keys and no
    query rows has its tiles too: they write its dK and dV, zeros."""
    sequence, kv_tile, seqlen_q, seqlen_k = _tiles_of(lengths_q, lengths_k, lengths_k, block_n)
    diagonal = seqlen_k - seqlen_q
    kv_start = kv_tile * block_n
    left, right = window_size[0], 0 if causal else window_size[1]
    rows_first = 0 if right < 0 else np.maximum(kv_start - diagonal - right, 0)
    rows_end = seqlen_q if left < 0 else np.clip(kv_start + block_n - diagonal + left, 0, seqlen_q)
    q_tiles = np.maximum((rows_end + block_m - 1) // block_m - rows_first // block_m, 0)
    return _longest_first(sequence, kv_tile, q_tiles)


def _tiles_of(lengths_q, lengths_k, lengths_tiled, block: int) -> tuple:
    """(sequence, tile, the sequence's query length, its key length) of every tile of `block`
    rows of each sequence's lengths_tiled (its query or its key rows), in sequence order."""
    lengths_q_a, lengths_k_a = np.asarray(lengths_q, dtype=np.int64), np.asarray(lengths_k, dtype=np.int64)
    tiles = (np.asarray(lengths_tiled, dtype=np.int64) + block - 1) // block
    sequence = np.repeat(np.arange(len(tiles)), tiles)
    tile = np.arange(len(sequence)) - (np.cumsum(tiles) - tiles)[sequence]
    return sequence, tile, lengths_q_a[sequence], lengths_k_a[sequence]


def _longest_first(sequence, tile, walk) -> torch.Tensor:
    """int32 [tiles, 2] of (sequence, tile), the longest walks first, ties in the order given."""
    order = np.argsort(-walk, kind="stable")
    return torch.from_numpy(np.stack([sequence[order], tile[order]], axis=1).astype(np.int32))


@dataclasses.dataclass(frozen=True)
class KeyTile:
    """A dK/dV block's work tile as its macros read it: batch element, K/V head, first key; for
    a ragged batch its sequence's first key in the packed rows (None: a batched launch) and rule.
    (A macro binds a PrimExpr argument to a variable of its own; fields pass through as they are.)"""

    b: object
    kv_head: object
    kv_start: object
    k_offset: object
    rule: Visibility
    split: object = None  # the block's share of the group's query heads (head_splits), or None


def heavy_first_block(index, key_tiles, kv_slots, batch, group):
    """(K/V tile, K/V slot, batch) of block `index` in backward_program's heavy-first order: the
    (batch, K/V slot) pairs in groups of `group` (the last may hold fewer), each group's blocks by
    K/V tile slowest."""
    # Truncating divisions: every value is at least 0, and `//` by a launch value of unknown sign
    # lowers to a floor division's sign tests.
    group_blocks = group * key_tiles
    first_pair = T.truncdiv(index, group_blocks) * group
    pairs = T.min(group, kv_slots * batch - first_pair)
    within = T.truncmod(index, group_blocks)
    pair = first_pair + T.truncmod(within, pairs)
    return T.truncdiv(within, pairs), T.truncmod(pair, kv_slots), T.truncdiv(pair, kv_slots)
