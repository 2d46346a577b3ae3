# mypy: disable-error-code="valid-type,index"
# (T.Tensor annotations are TileLang's kernel signature, not Python types.)
"""The fixed-order dQ kernel (`deterministic=True`), and its compile cache.

Where the dK/dV kernel (backward.py) adds each query tile's dQ into an fp32 accumulator by bulk
reduce-adds, in no fixed order, this kernel sums dQ in registers, one thread block per query tile
and head, so every run adds the same terms in the same order: the deterministic gradient runs
the dK/dV kernel without its dQ (`with_dq=False`) beside it. It shares the dK/dV kernel's parts
(gradient_parts.py: the tile's mask test, the launch sizes, the compile cache).
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations
# against this module's closure, which string annotations would hide.
import dataclasses

import tilelang.language as T

from fa_kernel.backward_preprocess import statistics_row
from fa_kernel.configs import DQ_TILES
from fa_kernel.gradient_parts import WGMMA_ROWS, compiled_at_tiles, gradient_sizes, ragged_parameters, tile_needs_mask
from fa_kernel.mask import variant_visibility
from fa_kernel.scheduler import at_offset, ragged_tile
from fa_kernel.softmax import capped_score
from fa_kernel.toolchain import DTYPES
from fa_kernel.variants import PLAIN, Variants, kernel_parameter


def dq_program(
    *,
    head_dim: int,
    causal: bool,
    dtype: str,
    block_m: int,
    block_n: int,
    num_stages: int = 2,
    variants: Variants = PLAIN,
    varlen: bool = False,
):
    """dQ in a fixed order (the deterministic gradient), as a TileLang PrimFunc: one thread block
    per query tile and head walks the K/V tiles its rows see, recomputes S = Q·Kᵀ and P from the
    saved LSE, dP = dO·Vᵀ, dS = P∘(dP − D), and sums dQ = softmax_scale·Σ dS·K in registers, so
    every run adds the same terms in the same order. Two GEMMs more than the atomic dQ.

    Arguments at launch: Q and dO [B, Sq, H, D], K and V [B, Sk, Hkv, D], Delta and LSE₂
    [B, H, padded_rows(Sq)] (the preprocess's), dQ [B, Sq, H, D] in the input dtype, then
    scale_log2 and softmax_scale, then the variants' (as backward_program's).

    `varlen`: a ragged batch as backward_program's, then cu_seqlens_q, cu_seqlens_k and the query
    tile order (int32 [tiles, 2] of (sequence, query tile), scheduler.ragged_tile_order), the
    grid's first dimension; a sequence's last, partial query tile stores dQ row by row.

    A consumer warpgroup for each 64 of the tile's rows (GemmWarpPolicy.FullRow): on 128 rows the
    two take turns on the tensor cores, where one alone leaves them idle through its exponentials.
    """
    if block_m % WGMMA_ROWS:
        raise ValueError(f"block_m: expected a multiple of {WGMMA_ROWS} (a warpgroup's wgmma rows), got {block_m}")
    threads = 128 * (block_m // WGMMA_ROWS)
    batch, seqlen_q, seqlen_q_padded, seqlen_k, heads, heads_kv = gradient_sizes(block_m)
    visibility, window_left, window_right, softcap_log2 = variant_visibility(seqlen_q, seqlen_k, causal, variants)
    dtype = DTYPES[dtype]
    accum = T.float32
    ragged_tiles, cu_seqlens_q, cu_seqlens_k, tile_order = ragged_parameters(varlen)

    @T.prim_func
    def flash_attention_backward_dq(
        Q: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        K: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        V: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        dO: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        Delta: T.Tensor([batch, heads, seqlen_q_padded], accum),
        LSE_log2: T.Tensor([batch, heads, seqlen_q_padded], accum),
        dQ: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        scale_log2: T.float32,
        softmax_scale: T.float32,
        window_left: window_left,
        window_right: window_right,
        softcap_log2: softcap_log2,
        CuSeqlensQ: kernel_parameter(cu_seqlens_q, varlen),
        CuSeqlensK: kernel_parameter(cu_seqlens_k, varlen),
        TileOrder: kernel_parameter(tile_order, varlen),
    ):
        grid = (ragged_tiles, heads, 1) if varlen else (T.ceildiv(seqlen_q, block_m), heads, batch)
        with T.Kernel(*grid, threads=threads) as (q_block, head, b):
            Q_shared = T.alloc_shared([block_m, head_dim], dtype)
            dO_shared = T.alloc_shared([block_m, head_dim], dtype)
            K_shared = T.alloc_shared([block_n, head_dim], dtype)
            V_shared = T.alloc_shared([block_n, head_dim], dtype)
            lse = T.alloc_shared([block_m], accum)
            delta = T.alloc_shared([block_m], accum)
            acc_s = T.alloc_fragment([block_m, block_n], accum)  # S, then dS
            acc_dp = T.alloc_fragment([block_m, block_n], accum)
            ds_cast = T.alloc_fragment([block_m, block_n], dtype)
            acc_dq = T.alloc_fragment([block_m, head_dim], accum)

            kv_head = head // (heads // heads_kv)
            q_tile, rule, sequence, q_offset, k_offset = q_block, visibility, None, None, None
            if varlen:
                # The block's (sequence, query tile) from the tile order; the sequence's offsets
                # and lengths, read once, and its rule.
                ragged = ragged_tile(TileOrder, q_block, CuSeqlensQ, CuSeqlensK)
                sequence, q_offset, k_offset, sequence_q, sequence_k, q_tile = ragged
                rule = dataclasses.replace(visibility, seqlen_q=sequence_q, seqlen_k=sequence_k)
            q_start = q_tile * block_m
            q_row = at_offset(q_offset, q_start)  # in the packed rows, for a ragged batch
            num_kv_blocks = T.ceildiv(rule.seqlen_k, block_n)
            if visibility.limits_right:
                # Tiles right of the block's last row's diagonal add nothing: none is loaded (a
                # block whose rows see no key walks none, and its dQ is 0).
                num_kv_blocks = T.max(0, T.min(num_kv_blocks, T.ceildiv(rule.keys_before(q_start + block_m), block_n)))
            kv_first = 0
            if visibility.limits_left:
                # Nor tiles left of its first row's first key: the walk starts at that key's tile.
                kv_first = T.max(0, rule.first_key(q_start)) // block_n
                num_kv_blocks = T.max(0, num_kv_blocks - kv_first)
            T.copy(Q[b, q_row : q_row + block_m, head, :], Q_shared)
            T.copy(dO[b, q_row : q_row + block_m, head, :], dO_shared)
            first = statistics_row(q_start, q_offset, sequence)
            T.copy(LSE_log2[b, head, first : first + block_m], lse)
            T.copy(Delta[b, head, first : first + block_m], delta)
            T.clear(acc_dq)
            for kv_block in T.Pipelined(num_kv_blocks, num_stages=num_stages):
                kv_start = (kv_first + kv_block) * block_n
                k_row = at_offset(k_offset, kv_start)
                T.copy(K[b, k_row : k_row + block_n, kv_head, :], K_shared)
                T.copy(V[b, k_row : k_row + block_n, kv_head, :], V_shared)
                T.clear(acc_s)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.clear(acc_dp)
                T.gemm(dO_shared, V_shared, acc_dp, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                # P = 0 by a select at the keys a row cannot see, where the tile holds any.
                if variants.softcap:
                    # The capped scores t, and the cap's slope 1 − t² on dS.
                    for i, j in T.Parallel(block_m, block_n):
                        t = capped_score(acc_s[i, j], softcap_log2)
                        visible = rule.sees(kv_start + j, q_start + i, rows_checked=True)
                        p = T.if_then_else(visible, T.exp2(t * scale_log2 - lse[i]), 0)
                        ds_cast[i, j] = p * (acc_dp[i, j] - delta[i]) * (1 - t * t)
                elif tile_needs_mask(rule, kv_start, q_start, block_n, block_m):
                    for i, j in T.Parallel(block_m, block_n):
                        visible = rule.sees(kv_start + j, q_start + i, rows_checked=True)
                        p = T.if_then_else(visible, T.exp2(acc_s[i, j] * scale_log2 - lse[i]), 0)
                        ds_cast[i, j] = p * (acc_dp[i, j] - delta[i])
                else:
                    for i, j in T.Parallel(block_m, block_n):
                        p = T.exp2(acc_s[i, j] * scale_log2 - lse[i])
                        ds_cast[i, j] = p * (acc_dp[i, j] - delta[i])
                T.gemm(ds_cast, K_shared, acc_dq, policy=T.GemmWarpPolicy.FullRow)
            for i, d in T.Parallel(block_m, head_dim):
                acc_dq[i, d] = acc_dq[i, d] * softmax_scale
            if varlen and q_start + block_m > rule.seqlen_q:
                # A sequence's last, partial tile row by row (the next sequence's block writes on).
                for i, d in T.Parallel(block_m, head_dim):
                    if q_start + i < rule.seqlen_q:
                        dQ[b, q_row + i, head, d] = T.Cast(dtype, acc_dq[i, d])
            else:
                T.copy(acc_dq, dQ[b, q_row : q_row + block_m, head, :])

    return flash_attention_backward_dq


compiled_dq = compiled_at_tiles(dq_program, DQ_TILES)
