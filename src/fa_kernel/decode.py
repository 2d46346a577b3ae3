# mypy: disable-error-code="valid-type,index"
# (T.Tensor(shape, dtype) annotations are TileLang's kernel signature, not Python types.)
"""Split-KV attention for a few queries against many keys (the decode and append steps of a
server), in TileLang: flash-decoding, with the query heads of a GQA group in one tile.

With seqlen_q in the tens, the forward kernel's grid has one mostly empty 128-row tile per
(batch, query head) and reads each K/V head once per query head. Here:

1. `split_program`: one thread block per (key split, row block, K/V head, batch). Its rows are
   the (query, query head) pairs of the K/V head's group, `group_size * seqlen_q` of them in
   row blocks of `block_m`, so a K/V tile is read once for all of a group's heads: 16 rows
   where they fit, on four warps splitting the keys, else 64 on one warpgroup behind a
   producer warpgroup (`SPLIT_TILES`, `row_block`). It walks the K/V tiles of its split with
   the forward's online softmax (exp2, fp32 row state, P cast before P·V, one normalisation)
   and writes its normalised partial O and its LSE in log2 units (−inf for a row that sees
   none of the split's keys), both fp32.
2. `combine_program`: per (query, head, batch), LSE₂ = log2 Σₛ 2^lseₛ, O = Σₛ 2^(lseₛ − LSE₂)·Oₛ,
   and the natural-log LSE the forward returns; a row that sees no key gets 0 and −inf.

Splits are whole multiples of `block_n` keys, as many as fill the GPU (`split_plan`).
`split_kv_attention` launches both; flash_attn_func calls it where it measured faster than the
forward kernel (`configs.split_kv_serves`). Its algorithm is `emulator_split_kv.py`'s.
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations
# against this module's closure, which string annotations would hide.
import dataclasses
import functools

import tilelang.language as T
import torch

from fa_kernel.configs import SPLIT_TILES, SplitTile, split_kv_serves
from fa_kernel.mask import variant_visibility
from fa_kernel.numerics import LN2, LOG2E
from fa_kernel.softmax import RowState, capped_score, online_softmax
from fa_kernel.toolchain import DTYPES, NO_PRODUCER, compile_program
from fa_kernel.variants import PLAIN, Variants, exponent_scale, kernel_parameter, launch_arguments, window_first_tile

HEAD_DIMS = tuple(sorted({head_dim for head_dim, _ in SPLIT_TILES}))
# The most rows of a group the split kernels take (configs.split_kv_serves): the widest tile's.
MOST_ROWS = max(block_m for _, block_m in SPLIT_TILES)
THREADS = 128


def ceildiv(a: int, b: int) -> int:
    return -(-a // b)


def row_block(head_dim: int, rows: int) -> int:
    """The block_m of the tile a launch runs: the fewest of head_dim's tiles that holds a group's
    `rows` (group_size * seqlen_q), the widest where none does."""
    blocks = sorted(block_m for dim, block_m in SPLIT_TILES if dim == head_dim)
    return next((block_m for block_m in blocks if rows <= block_m), blocks[-1])


def split_plan(
    batch: int, heads_kv: int, row_blocks: int, seqlen_k: int, tile: SplitTile, sm_count: int
) -> tuple[int, int]:
    """(splits, K/V tiles per split) for this launch: at most the splits that give every SM the
    tile's blocks_per_sm thread blocks, at least one, and no more than there are tiles; every
    split the same number of tiles but the last, which has at least one. Rounded down, not up: a
    second, partial wave of blocks costs a whole block's time (docs/performance.md)."""
    tiles = max(1, ceildiv(seqlen_k, tile.block_n))
    wanted = max(1, tile.blocks_per_sm * sm_count // max(1, batch * heads_kv * row_blocks))
    tiles_per_split = ceildiv(tiles, wanted)
    return ceildiv(tiles, tiles_per_split), tiles_per_split


def split_program(
    *, head_dim: int, causal: bool, dtype: str, config: SplitTile, variants: Variants = PLAIN, page_size: int = 0
):
    """The partial attention of each key split, as a TileLang PrimFunc, on `config`'s blocks.

    Arguments at launch: Q [B, Sq, H, D], K and V [B, Sk, Hkv, D], then O_partial
    [B, splits, H, Sq, D] and LSE_partial [B, splits, H, Sq] (fp32, log2 units), then
    scale_log2 = softmax_scale·log2(e) (variants.exponent_scale) and tiles_per_split (K/V tiles
    per split), then the window's and softcap's values where compiled in (the sinks join in the
    combine). With a left edge the splits start at the first query's first key's tile.

    `page_size` (16, 64 or 256; 0: none): a paged KV cache. K and V are [num_pages, page_size,
    Hkv, D], and after the variants' values come BlockTable [B, max_pages] (int32: request b's
    keys i·page_size onward are in page BlockTable[b, i]) and CacheSeqlens [B] (int32: its keys).
    Each K/V tile is loaded page by page; a page index or a length past the table's is clamped
    into it, so no load leaves the cache (their keys are then masked or the request's own).
    """
    batch, seqlen_q, seqlen_k, heads, heads_kv, splits = T.dynamic("batch, seqlen_q, seqlen_k, heads, heads_kv, splits")
    num_pages, max_pages = T.dynamic("num_pages, max_pages")
    if page_size and (page_size % 16 or not (page_size % config.block_n == 0 or config.block_n % page_size == 0)):
        raise ValueError(
            f"page_size: expected a multiple of 16 that divides or is divided by {config.block_n}, got {page_size}"
        )
    paged = page_size > 0
    kv_shape = [num_pages, page_size, heads_kv, head_dim] if paged else [batch, seqlen_k, heads_kv, head_dim]
    block_table = T.Tensor([batch, max_pages], T.int32) if paged else None
    cache_seqlens = T.Tensor([batch], T.int32) if paged else None
    visibility, window_left, window_right, softcap_log2 = variant_visibility(seqlen_q, seqlen_k, causal, variants)
    softmax = online_softmax(config.block_m, config.block_n, head_dim)
    dtype = DTYPES[dtype]
    accum = T.float32
    neg_inf = -T.infinity(accum)
    block_m, block_n, num_stages = config.block_m, config.block_n, config.num_stages
    # One warpgroup's wgmma takes 64 rows whole; fewer, the four warps split S's keys and O's
    # columns, and P reaches every warp through shared memory.
    split_rows = block_m >= 64
    policy = T.GemmWarpPolicy.FullRow if split_rows else T.GemmWarpPolicy.FullCol

    def split_start(split, tiles_per_split, rule):
        """The split's first K/V tile: with a left edge, counted from the window's first
        (variants.window_first_tile, in the kernel)."""
        if not visibility.limits_left:
            return split * tiles_per_split
        last_tile = T.max(0, T.ceildiv(rule.seqlen_k, block_n) - 1)
        return split * tiles_per_split + T.min(T.max(0, rule.first_key(0)) // block_n, last_tile)

    def sees(rule, key, r, last_key, first_key):
        return rule.sees(key, None, last_key=last_key[r], first_key=None if first_key is None else first_key[r])

    def page_of(BlockTable, b, key):
        """The page that holds request b's `key`, both indices clamped into the table and cache."""
        return T.max(0, T.min(BlockTable[b, T.min(key // page_size, max_pages - 1)], num_pages - 1))

    @T.macro
    def load_tile(source, shared, b, kv_start, kv_head, BlockTable):
        """The K/V tile of block_n keys from kv_start: one copy, or one per page where pages are
        smaller than a tile (a page larger holds the whole tile: block_n divides it). TileLang picks
        the instruction: cp.async on the 16-row tiles (no producer) at every page size; TMA for
        the producer's tile of one page, synchronous loads for its 16-row pages (a TMA box into a
        16-row slice of the swizzled tile, or cp.async in the producer, does not lower)."""
        if not paged:
            T.copy(source[b, kv_start : kv_start + block_n, kv_head, :], shared)
        elif page_size >= block_n:
            row = kv_start % page_size
            T.copy(source[page_of(BlockTable, b, kv_start), row : row + block_n, kv_head, :], shared)
        else:
            for piece in T.unroll(block_n // page_size):
                page = page_of(BlockTable, b, kv_start + piece * page_size)
                T.copy(source[page, 0:page_size, kv_head, :], shared[piece * page_size : (piece + 1) * page_size, :])

    def kept(score):
        """The score as the softmax takes it: under a softcap, its tanh (softmax.capped_score)."""
        return capped_score(score, softcap_log2) if variants.softcap else score

    @T.prim_func
    def flash_decoding_split(
        Q: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        K: T.Tensor(kv_shape, dtype),
        V: T.Tensor(kv_shape, dtype),
        O_partial: T.Tensor([batch, splits, heads, seqlen_q, head_dim], accum),
        LSE_partial: T.Tensor([batch, splits, heads, seqlen_q], accum),
        scale_log2: T.float32,
        tiles_per_split: T.int32,
        window_left: window_left,
        window_right: window_right,
        softcap_log2: softcap_log2,
        BlockTable: kernel_parameter(block_table, paged),
        CacheSeqlens: kernel_parameter(cache_seqlens, paged),
    ):
        group_size = heads // heads_kv
        rows = group_size * seqlen_q  # (query i, head h of the group) is row i * group_size + h
        row_blocks = T.ceildiv(rows, block_m)
        with T.Kernel(splits, row_blocks * heads_kv, batch, threads=THREADS) as (split, row_block_head, b):
            Q_shared = T.alloc_shared([block_m, head_dim], dtype)
            K_shared = T.alloc_shared([block_n, head_dim], dtype)
            V_shared = T.alloc_shared([block_n, head_dim], dtype)
            acc_s = T.alloc_fragment([block_m, block_n], accum)
            allocate_p = T.alloc_fragment if split_rows else T.alloc_shared
            acc_p = allocate_p([block_m, block_n], dtype)
            acc_o = T.alloc_fragment([block_m, head_dim], accum)
            row_state = RowState.allocate(block_m)
            last_key = T.alloc_fragment([block_m], T.int32)  # right edge: each row's last visible key
            # Left edge: each row's first.
            first_key = T.alloc_fragment([block_m], T.int32) if visibility.limits_left else None

            kv_head = row_block_head % heads_kv
            first_row = (row_block_head // heads_kv) * block_m
            rule = visibility
            if paged:
                # The request's keys: its cache's length, at most the table's.
                cache_length = T.alloc_var(T.int32)
                cache_length = T.min(CacheSeqlens[b], max_pages * page_size)
                rule = dataclasses.replace(visibility, seqlen_k=cache_length)
            # Rows past the group's are zeros (read at the last row, in bounds): their scores
            # are 0 and nothing of theirs is stored.
            for r, d in T.Parallel(block_m, head_dim):
                row = T.min(first_row + r, rows - 1)
                Q_shared[r, d] = T.if_then_else(
                    first_row + r < rows, Q[b, row // group_size, kv_head * group_size + row % group_size, d], 0
                )
            T.fill(acc_o, 0)
            softmax.start_rows(row_state)
            if visibility.limits_right:
                # Each row's last key, worked out once per row here, not at every score (a
                # division by the group size).
                for r in T.Parallel(block_m):
                    last_key[r] = rule.last_key((first_row + r) // group_size)
            if visibility.limits_left:
                for r in T.Parallel(block_m):
                    first_key[r] = rule.first_key((first_row + r) // group_size)
            first_tile = split_start(split, tiles_per_split, rule)
            tiles = T.max(0, T.min(tiles_per_split, T.ceildiv(rule.seqlen_k, block_n) - first_tile))
            for tile in T.Pipelined(tiles, num_stages=num_stages):
                kv_start = (first_tile + tile) * block_n
                load_tile(K, K_shared, b, kv_start, kv_head, BlockTable)
                T.clear(acc_s)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=policy)
                # The mask is a select, not an addition: a NaN or Inf score of a key the row
                # cannot see (past seqlen_k, right of its diagonal) never reaches it.
                for r, j in T.Parallel(block_m, block_n):
                    key = kv_start + j
                    visible = sees(rule, key, r, last_key, first_key)
                    acc_s[r, j] = T.if_then_else(visible, kept(acc_s[r, j]), neg_inf)
                softmax.fold_tile(acc_s, row_state, scale_log2)
                T.copy(acc_s, acc_p)
                softmax.rescale_output(acc_o, row_state.alpha)  # before P·V, which adds into acc_o
                load_tile(V, V_shared, b, kv_start, kv_head, BlockTable)
                T.gemm(acc_p, V_shared, acc_o, policy=policy)
            for r, d in T.Parallel(block_m, head_dim):
                row = first_row + r
                if row < rows:
                    O_partial[b, split, kv_head * group_size + row % group_size, row // group_size, d] = (
                        softmax.normalised(acc_o, row_state.row_sum, r, d)
                    )
            for r in T.Parallel(block_m):
                row = first_row + r
                if row < rows:
                    LSE_partial[b, split, kv_head * group_size + row % group_size, row // group_size] = T.if_then_else(
                        row_state.row_sum[r] == 0, neg_inf, softmax.log2_sum(row_state, r)
                    )

    return flash_decoding_split


def combine_program(*, head_dim: int, dtype: str, sinks: bool = False):
    """The splits' partial results combined by their LSE, as a TileLang PrimFunc; `sinks`: each
    row's sink joins the sum here, once.

    Arguments at launch: O_partial [B, splits, H, Sq, D] and LSE_partial [B, splits, H, Sq]
    (split_program's), then Output [B, Sq, H, D] and LSE [B, H, Sq] (natural log), then Sinks
    [H] (fp32) where compiled in.
    """
    batch, seqlen_q, heads, splits = T.dynamic("batch, seqlen_q, heads, splits")
    dtype = DTYPES[dtype]
    accum = T.float32
    neg_inf = -T.infinity(accum)

    @T.prim_func
    def flash_decoding_combine(
        O_partial: T.Tensor([batch, splits, heads, seqlen_q, head_dim], accum),
        LSE_partial: T.Tensor([batch, splits, heads, seqlen_q], accum),
        Output: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        LSE: T.Tensor([batch, heads, seqlen_q], accum),
        Sinks: kernel_parameter(T.Tensor([heads], accum), sinks),
    ):
        # One thread per column of O; every thread of the row's block computes the row's LSE.
        with T.Kernel(seqlen_q, heads, batch, threads=head_dim) as (i, head, b):
            d = T.get_thread_binding()
            lse_max = T.alloc_var(accum)
            weights = T.alloc_var(accum)
            lse = T.alloc_var(accum)
            out = T.alloc_var(accum)
            lse_max = neg_inf
            for split in T.serial(splits):
                lse_max = T.max(lse_max, LSE_partial[b, split, head, i])
            if sinks:
                lse_max = T.max(lse_max, Sinks[head] * LOG2E)
            # A row that sees no key in any split (and no sink): every weight below is 2^-inf = 0.
            reference = T.if_then_else(lse_max == neg_inf, 0, lse_max)
            weights = 0
            for split in T.serial(splits):
                weights = weights + T.exp2(LSE_partial[b, split, head, i] - reference)
            if sinks:
                weights = weights + T.exp2(Sinks[head] * LOG2E - reference)
            lse = T.if_then_else(weights == 0, neg_inf, reference + T.log2(weights))
            out = 0
            for split in T.serial(splits):
                # A split the row sees no key of has O 0 and weight 0; skipped, so that a NaN
                # elsewhere in it cannot reach the row through 0 * NaN.
                if LSE_partial[b, split, head, i] != neg_inf:
                    out = out + T.exp2(LSE_partial[b, split, head, i] - lse) * O_partial[b, split, head, i, d]
            Output[b, i, head, d] = T.Cast(dtype, out)
            if d == 0:
                LSE[b, head, i] = lse * LN2

    return flash_decoding_combine


@functools.cache
def compiled_decode_kernels(
    *,
    head_dim: int,
    causal: bool,
    dtype: str,
    arch: str | None = None,
    block_m: int = MOST_ROWS,
    variants: Variants = PLAIN,
    page_size: int = 0,
) -> tuple:
    """(split, combine): the two kernels a split-KV launch on the (head_dim, block_m) tile runs
    (a module-level builder, for `builds.build_all`); `page_size`: over a paged KV cache."""
    tile = SPLIT_TILES[head_dim, block_m]
    split_variants = dataclasses.replace(variants, sinks=False)  # the sinks join in the combine
    split = split_program(
        head_dim=head_dim, causal=causal, dtype=dtype, config=tile, variants=split_variants, page_size=page_size
    )
    split_kernel = compile_program(split, arch) if tile.producer else compile_program(split, arch, NO_PRODUCER)
    combine = combine_program(head_dim=head_dim, dtype=dtype, sinks=variants.sinks)
    return split_kernel, compile_program(combine, arch)


def split_kv_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    sm_count: int,
    arch: str,
    pages: tuple[torch.Tensor, torch.Tensor] | None = None,
    **variants,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of attention by the split-KV kernels, as flash_attn_func returns them: q, k, v
    contiguous [batch, seqlen, heads, head_dim] on one Hopper GPU, as flash_attn_func checks
    them, seqlen_q and seqlen_k >= 1; `sm_count` the device's SMs, `arch` the nvcc architecture;
    `variants`: window_size, softcap, sinks, as flash_attn_func takes them. `pages`: (block_table,
    cache_seqlens) of a paged cache, k and v then [num_pages, page_size, heads_kv, head_dim]
    (split_program's paged build); the splits cover the table's capacity."""
    batch, seqlen_q, heads, head_dim = q.shape
    keys = None if pages is None else pages[0].shape[1] * k.shape[1]
    splits, tiles_per_split = split_plan_for(q, k, sm_count, variants.get("window_size", (-1, -1))[0], keys)
    o_partial = q.new_empty((batch, splits, heads, seqlen_q, head_dim), dtype=torch.float32)
    lse_partial = q.new_empty((batch, splits, heads, seqlen_q), dtype=torch.float32)
    out = torch.empty_like(q)
    lse = q.new_empty((batch, heads, seqlen_q), dtype=torch.float32)
    arguments = (softmax_scale, causal, tiles_per_split, arch)
    split_kv_into(out, lse, o_partial, lse_partial, q, k, v, *arguments, pages=pages, **variants)
    return out, lse


def launch_tile(q: torch.Tensor, k: torch.Tensor) -> SplitTile:
    """The tile a split-KV launch on these inputs runs (row_block of its group's rows)."""
    seqlen_q, heads, head_dim = q.shape[1:]
    return SPLIT_TILES[head_dim, row_block(head_dim, heads // k.shape[2] * seqlen_q)]


def split_plan_for(
    q: torch.Tensor, k: torch.Tensor, sm_count: int, window_left: int = -1, keys: int | None = None
) -> tuple[int, int]:
    """split_plan for these inputs: (splits, K/V tiles per split), over the keys from the window's
    first tile (a left edge; -1: none); `keys`: the keys to plan for where not k's (a paged cache's
    capacity)."""
    batch, seqlen_q, heads, _ = q.shape
    seqlen_k, heads_kv = k.shape[1] if keys is None else keys, k.shape[2]
    tile = launch_tile(q, k)
    row_blocks = ceildiv(heads // heads_kv * seqlen_q, tile.block_m)
    keys = seqlen_k - window_first_tile(seqlen_q, seqlen_k, window_left, tile.block_n) * tile.block_n
    return split_plan(batch, heads_kv, row_blocks, keys, tile, sm_count)


def serves_launch(batch: int, seqlen_q: int, seqlen_k: int, heads: int, heads_kv: int, sm_count: int) -> bool:
    """configs.split_kv_serves for a launch of these sizes with these kernels' most rows: whether
    flash_attn_func runs it here."""
    return split_kv_serves(batch, seqlen_q, seqlen_k, heads, heads_kv, MOST_ROWS, sm_count)


def split_kv_into(
    out,
    lse,
    o_partial,
    lse_partial,
    q,
    k,
    v,
    softmax_scale: float,
    causal: bool,
    tiles_per_split: int,
    arch: str,
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    pages: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """The split-KV launch into the caller's buffers (split_kv_attention's shapes; the tests pass
    NaN-filled ones, so that an element no thread block writes fails whatever memory held);
    `pages`: as split_kv_attention's."""
    head_dim = q.shape[-1]
    dtype = str(q.dtype).removeprefix("torch.")
    block_m = launch_tile(q, k).block_m
    variants = Variants.of(causal, window_size, softcap, sinks)
    build = dict(head_dim=head_dim, causal=causal, dtype=dtype, arch=arch, block_m=block_m, variants=variants)
    split_kernel, combine_kernel = compiled_decode_kernels(**build, page_size=0 if pages is None else k.shape[1])
    split_variants = dataclasses.replace(variants, sinks=False)
    split_values = launch_arguments(split_variants, window_size, softcap, softmax_scale, None)
    with torch.cuda.device(q.device):
        # Every (split, head, query) row of the partials is written by the one block whose rows it is.
        scale_log2 = exponent_scale(softmax_scale, softcap)
        split_kernel(q, k, v, o_partial, lse_partial, scale_log2, tiles_per_split, *split_values, *(pages or ()))
        combine_kernel(o_partial, lse_partial, out, lse, *([] if sinks is None else [sinks]))
