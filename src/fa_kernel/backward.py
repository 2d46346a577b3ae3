# mypy: disable-error-code="valid-type,index,operator"
# (T.Tensor annotations are TileLang's signature; an option's buffers and values are None without it.)
"""The TileLang FlashAttention backward kernels for Hopper, and their compile cache.

FlashAttention-2's backward (its Algorithm 2), as `emulator.attention_backward_tiled` specifies
it tile by tile (docs/design.md walks through it): after `backward_preprocess` (D = rowsum(dO∘O)
and LSE₂ per query row), `backward_program` runs one thread block per K/V tile and K/V head,
K and V in shared memory and dK, dV in fp32 registers, over the query tiles of its GQA group's
heads that see its keys: Sᵀ = K·Qᵀ and P from the saved LSE, dPᵀ = V·dOᵀ, dSᵀ = Pᵀ∘(dPᵀ − D),
dV += Pᵀ·dO, dK += dSᵀ·Q (keys as rows: P and dS straight from registers), and dQ_tile = dS·K
bulk-added into an fp32 accumulator the caller scales and casts; `backward_dq` sums dQ in a
fixed order instead (deterministic=True). P and dS are the only down-casts. Hidden keys and rows
past the ends get P = 0 by a select, so a NaN or Inf score a row cannot see never reaches its
gradients. dK and dV are written once per K/V tile; dQ's reduce-adds arrive in any order.
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations
# against this module's closure, which string annotations would hide.
import dataclasses
import functools

import tilelang.language as T

from fa_kernel.backward_dq import compiled_dq
from fa_kernel.backward_preprocess import compiled_preprocess, dq_row, statistics_row
from fa_kernel.backward_writer import writer_program
from fa_kernel.configs import BACKWARD_TILES, DK_DV_TILES
from fa_kernel.gradient_parts import (
    CONSUMER_REGISTERS,
    CONSUMERS_BARRIER,
    PRODUCER_REGISTERS,
    WGMMA_ROWS,
    compiled_at_tiles,
    gradient_sizes,
    probabilities_and_ds,
    ragged_parameters,
    tile_needs_mask,
)
from fa_kernel.mask import variant_visibility
from fa_kernel.scheduler import KeyTile, at_offset, heavy_first_block, ragged_tile
from fa_kernel.softmax import capped_score
from fa_kernel.toolchain import DTYPES, FAST_MATH, OWN_SYNCS
from fa_kernel.variants import PLAIN, Variants, kernel_parameter


def operands_in_registers(block_n: int, threads: int = 256) -> bool:
    """Whether Pᵀ and dSᵀ enter the dK/dV kernel's dV and dK GEMMs from registers: each consumer
    warpgroup holds whole rows of them (64 keys a warpgroup); else through shared memory."""
    return block_n >= WGMMA_ROWS * (threads // 128)


def syncs_by_hand(block_n: int, threads: int = 256, with_dq: bool = True) -> bool:
    """Whether the dK/dV kernel places its consumers' syncs itself, compiled without TileLang's
    planner: with the operands in registers where it adds dQ (a build that splits a GQA group
    too: it differs in its heads and its fp32 epilogue only, after the walk)."""
    return with_dq and operands_in_registers(block_n, threads)


def backward_program(
    *,
    head_dim: int,
    causal: bool,
    dtype: str,
    block_m: int,
    block_n: int,
    threads: int = 256,
    num_stages: int = 2,
    with_dq: bool = True,
    variants: Variants = PLAIN,
    varlen: bool = False,
    head_splits: bool = False,
    heavy_first: bool = False,
    kv_pairs: bool = False,
    dq_writer: bool = False,
    ordered_dq: bool = False,
    shifted_walk: bool = False,
):
    """dK and dV, and dQ's fp32 accumulator, as a TileLang PrimFunc.

    `with_dq` False: dK and dV alone (the deterministic gradient, whose dQ `dq_program` sums in
    a fixed order); dQ_accum is then a one-element placeholder, left alone, and dQ's shared
    buffers and registers are not allocated.

    Arguments at launch: Q and dO [B, Sq, H, D], K and V [B, Sk, Hkv, D], Delta and LSE₂
    [B, H, padded_rows(Sq)] (from the preprocess), dQ_accum [B, H, padded_rows(Sq), dq_row(D)]
    fp32 (zeroed by the caller; BHSD, padded, so that a query tile's rows are one contiguous run
    for the bulk reduce-add), dK and dV [B, Sk, Hkv, D],
    then scale_log2 = softmax_scale·log2(e) (variants.exponent_scale) and softmax_scale, then
    the variants' (variants.launch_arguments; sinks enter the gradients only through the LSE,
    and dsinks is the caller's).

    `varlen`: a ragged batch, packed, as a batch of one: Q, dO [1, total_q, H, D], K, V, dK, dV
    [1, total_k, Hkv, D], dQ_accum over the packed rows at Delta's length (one dynamic size for
    both; rows past a sequence's end add zeros to it), Delta and LSE₂ each sequence's from its own
    aligned start (backward_preprocess.statistics_start); then cu_seqlens_q, cu_seqlens_k (int32
    [B + 1]) and the key tile order (int32 [tiles, 2] of (sequence, K/V tile),
    scheduler.ragged_key_tile_order), the grid's first dimension. Each sequence's keys see only
    its own rows; a partial last K/V tile stores dK and dV row by row.

    `head_splits`: a GQA group's query heads split between `splits` blocks of each K/V tile (1 to
    the group's size, at launch), for a grid of few or uneven blocks (MQA, causal GQA): dK and dV
    are then fp32 partial sums [splits, B, Sk, Hkv, D], block (tile, kv_head·splits + split)
    walking the group's heads split, split + splits, ..., which the caller sums in a fixed order.
    Batched launches with P and dS in registers only (head_dim 64 and 128).

    `heavy_first`: the blocks in groups of `pairs_per_group` (batch, K/V slot) pairs (a launch
    parameter after the variants'; configs.pairs_per_group), each group's taken by K/V tile
    slowest (`heavy_first_block`), so that its first tiles, under a right edge the longest walks,
    are dispatched before its second: the SMs take the long blocks first, where the
    K/V-tile-fastest order (a group of one pair) leaves the last heads' long blocks to run alone
    at the end. A group of about a wave keeps the blocks that run together on few query heads,
    which they share in L2. Batched launches only.

    `kv_pairs` (an A/B build, perf/backward_ab.py; without dQ, batched, unsplit): two K/V heads a
    block, both tiles loaded at its start, their walks one pipeline, the first head's dK and dV
    stored where its walk ends: a short walk's fixed costs over twice the steps. An odd last K/V
    head walks alone.

    `dq_writer` (an A/B build, perf/backward_ab.py; batched, adding dQ, without the variants): the
    same walk on TileLang's typed warp-specialisation schedule, dQ's bulk adds issued by a warp
    of their own (backward_writer.py); `ordered_dq` with it: those adds in a fixed order, bitwise
    the same on every run (a launch parameter more: the adds' turns); `shifted_walk` with that:
    without causal, each K/V tile's walk from a query tile of its own.

    Pᵀ and dSᵀ enter dV's and dK's GEMMs from registers where each warpgroup holds whole rows of
    them (block_n of 64 rows a warpgroup); on fewer keys (head_dim 256's 64) the warpgroups split
    Sᵀ by columns, and the operands go through shared memory, as in FlashAttention-3's. In
    registers, with dQ added here, the consumers' syncs are placed by hand (`syncs_by_hand`: two
    named barriers a step where TileLang's planner, which takes every GEMM's shared operand for an
    alias of every shared buffer, places four), and dQ's GEMM is issued before dK's, whose GEMM
    runs on under dQ's staging and add, as FlashAttention-3's does; dQ comes transposed there,
    dQᵀ = Kᵀ·dSᵀ (its dQ_swapAB).
    """
    if dq_writer or ordered_dq or shifted_walk:  # an A/B build of its own module: backward_writer.py
        if not dq_writer or head_splits or varlen or kv_pairs or not with_dq or variants != PLAIN or threads != 256:
            raise ValueError("dq_writer (ordered_dq, shifted_walk on it): expected a batched unsplit launch adding dQ")
        return writer_program(
            head_dim=head_dim, causal=causal, dtype=dtype, block_m=block_m, block_n=block_n, num_stages=num_stages,
            heavy_first=heavy_first, ordered_dq=ordered_dq, shifted_walk=shifted_walk,
        )  # fmt: skip
    if kv_pairs and (head_splits or varlen or with_dq):
        raise ValueError("kv_pairs: expected a batched launch without dQ or head splits")
    if (head_splits or heavy_first) and varlen:
        raise ValueError("head_splits, heavy_first: expected a batched launch (varlen=False)")
    batch, seqlen_q, seqlen_q_padded, seqlen_k, heads, heads_kv = gradient_sizes(block_m)
    visibility, window_left, window_right, softcap_log2 = variant_visibility(seqlen_q, seqlen_k, causal, variants)
    dtype = DTYPES[dtype]
    accum = T.float32
    splits, pairs_per_group = T.dynamic("splits, pairs_per_group")
    dk_shape = [splits, batch, seqlen_k, heads_kv, head_dim] if head_splits else [batch, seqlen_k, heads_kv, head_dim]
    dk_dtype = accum if head_splits else dtype
    DQ_ROW = dq_row(head_dim)
    dq_accum_shape = [batch, heads, seqlen_q_padded, DQ_ROW] if with_dq else [1]
    ragged_tiles, cu_seqlens_q, cu_seqlens_k, tile_order = ragged_parameters(varlen)
    operands_in_shared = not operands_in_registers(block_n, threads)
    if head_splits and operands_in_shared:
        # Without causal, TileLang 0.1.15's ThreadSync leaves such a build a guarded range of 95
        # threads ("cannot lower a required shared-memory sync inside a divergent region").
        raise ValueError(f"head_splits: expected a tile of 64 keys a warpgroup, got block_n={block_n}")
    own_syncs = syncs_by_hand(block_n, threads, with_dq)
    # Where the syncs are placed by hand, dQᵀ = Kᵀ·dSᵀ (FlashAttention-3's dQ_swapAB): its M is
    # head_dim, 64 rows a warpgroup, and the fragment is written to dQ's shared tile transposed.
    dq_fragment = [head_dim, block_m] if own_syncs else [block_m, head_dim]
    probabilities = probabilities_and_ds(block_m=block_m, block_n=block_n, threads=threads)

    def rows_end(kv_start, rule):
        """The query rows after the last that sees a key of the tile from kv_start (left edge)."""
        if not visibility.limits_left:
            return rule.seqlen_q
        # Clamped at 0 first: the other order (the same value) leaves TileLang's ThreadSync a
        # thread range of 225 at head_dim 256 without causal, a build that does not lower.
        return T.min(rule.seqlen_q, T.max(0, rule.rows_before(kv_start + block_n)))

    @T.macro
    def capped_probabilities_and_ds(
        rule, acc_s, acc_dp, p_cast, ds_cast, kv_start, q_start, lse, delta, scale_log2, softcap_log2
    ):
        """softcap: Pᵀ = 2^(t·scale_log2 − LSE₂) of the capped scores t (Sᵀ in acc_s, then p_cast),
        dSᵀ = Pᵀ∘(dPᵀ − D)∘(1 − t²); the select where the tile needs one. dS takes the cap's slope
        beside P: both GEMMs first, then P and dS in one pass over t. q_start is the step's
        expression: its register leaves d256 with a left edge alone a build that does not lower."""
        T.wait_wgmma(0)
        T.warpgroup_fence_operand(acc_s, num_regs=block_n * block_m // threads)
        T.warpgroup_fence_operand(acc_dp, num_regs=block_n * block_m // threads)
        if tile_needs_mask(rule, kv_start, q_start, block_n, block_m):
            for i, j in T.Parallel(block_n, block_m):
                t = capped_score(acc_s[i, j], softcap_log2)
                visible = rule.sees(kv_start + i, q_start + j, rows_checked=True)
                acc_s[i, j] = T.if_then_else(visible, T.exp2(t * scale_log2 - lse[j]), 0)
                ds_cast[i, j] = acc_s[i, j] * (acc_dp[i, j] - delta[j]) * (1 - t * t)
        else:
            for i, j in T.Parallel(block_n, block_m):
                t = capped_score(acc_s[i, j], softcap_log2)
                acc_s[i, j] = T.exp2(t * scale_log2 - lse[j])
                ds_cast[i, j] = acc_s[i, j] * (acc_dp[i, j] - delta[j]) * (1 - t * t)
        T.copy(acc_s, p_cast)

    @T.macro
    def start_sums(acc_dk, acc_dv, dQ_shared):
        """dK's and dV's sums zeroed, and dQ_shared's pad columns, which no step writes and which are
        added as zeros (one thread: 4 elements a row, once a block); where the syncs are placed by
        hand, the block's threads meet before the walk."""
        T.clear(acc_dk)
        T.clear(acc_dv)
        if with_dq and T.get_thread_binding() == 0:
            for i, j in T.grid(block_m, DQ_ROW - head_dim):
                dQ_shared[i, head_dim + j] = 0
            if own_syncs:
                T.fence_proxy_async()
        if own_syncs:
            T.sync_threads()

    @T.macro
    def issue_dq_add(dQ_shared, dQ_accum, b, head, q_row):
        """The elected thread's bulk reduce-add of dQ_shared's image into dQ_accum's rows from q_row."""
        T.call_extern(
            "handle", "tl::tma_store_add", T.address_of(dQ_shared[0, 0]),
            T.address_of(dQ_accum[b, head, q_row, 0]), block_m * DQ_ROW * 4,
        )  # fmt: skip
        T.tma_store_arrive()

    @T.macro
    def add_dq_tile(dS_shared, K_shared, acc_dq, dQ_shared, dQ_accum, b, head, q_row):
        """dQ_tile = dS·K, added to dQ_accum's rows from q_row by one bulk reduce-add."""
        T.clear(acc_dq)
        T.gemm(dS_shared, K_shared, acc_dq, transpose_A=True)
        # The previous step's reduce-add must have read dQ_shared: waited for here, a step after
        # it was issued. T.atomic_add(use_tma=True) waits right after the add, holding its
        # warpgroup's next GEMMs (docs/performance.md). Threads with no add in flight pass.
        T.tma_store_wait(0)
        T.copy(acc_dq, dQ_shared[:, :head_dim])
        if T.shuffle_elect(threads):
            # dQ_accum's rows are contiguous, so a query tile is one bulk add of dQ_shared's
            # image (its pad columns stay 0).
            T.fence_proxy_async()
            issue_dq_add(dQ_shared, dQ_accum, b, head, q_row)

    @T.macro
    def gemms_dq_first(
        p_cast, ds_cast, dO_shared, Q_shared, K_shared, dS_shared, acc_dv, acc_dk, acc_dq, dQ_shared, dQ_accum,
        b, head, q_row,
    ):  # fmt: skip
        """dV and dK from registers, dQ_tile = dS·K (as dQᵀ) through shared memory and its bulk add, two
        consumer barriers a step: dQ's GEMM first, and dK's left in flight under dQ's staging, its
        barrier and the add's issue. dS_shared is free to write: the previous step's second
        barrier came after both warpgroups' dQ GEMMs had read it; dQ_shared is once the issuing
        thread's wait for the previous add precedes the first barrier."""
        T.wgmma_gemm(p_cast, dO_shared, acc_dv, policy=T.GemmWarpPolicy.FullRow)
        T.copy(ds_cast, dS_shared)
        T.tma_store_wait(0)
        T.fence_proxy_async()  # dS's stores, seen by the wgmma (the async proxy)
        T.sync_threads(CONSUMERS_BARRIER, threads)
        T.wgmma_gemm(  # dQᵀ
            K_shared, dS_shared, acc_dq, transpose_A=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow
        )
        T.wgmma_gemm(ds_cast, Q_shared, acc_dk, policy=T.GemmWarpPolicy.FullRow)
        T.wait_wgmma(1)  # dV's and dQ's
        T.warpgroup_fence_operand(acc_dv, num_regs=block_n * head_dim // threads)
        T.warpgroup_fence_operand(acc_dq, num_regs=block_m * head_dim // threads)
        # A use after the wait: T.Pipelined releases a stage after its buffers' last use, which
        # would otherwise be the GEMM's issue.
        T.evaluate(T.address_of(dO_shared[0, 0]))
        # A thread's pair (i, j), (i, j + 1) lands on rows j, j + 1, dq_row = head_dim + 4 floats
        # apart: 2·(head_dim + 4) ≡ 8 (mod 32) at 64 and 128, so a warp's 32 stores take 32 banks.
        for i, j in T.Parallel(head_dim, block_m):
            dQ_shared[j, i] = acc_dq[i, j]
        T.fence_proxy_async()  # every writer's stores, seen by the bulk copy
        T.sync_threads(CONSUMERS_BARRIER, threads)
        if T.shuffle_elect(threads):
            issue_dq_add(dQ_shared, dQ_accum, b, head, q_row)
        T.wait_wgmma(0)  # dK's
        T.warpgroup_fence_operand(acc_dk, num_regs=block_n * head_dim // threads)
        T.evaluate(T.address_of(Q_shared[0, 0]))

    @T.macro
    def step_gradients(
        p_cast, ds_cast, P_shared, dS_shared, dO_shared, Q_shared, K_shared, acc_dv, acc_dk, acc_dq, dQ_shared,
        dQ_accum, b, head, q_row,
    ):  # fmt: skip
        """A step's GEMMs after P and dS: dV += Pᵀ·dO, dK += dSᵀ·Q, and dQ's tile added."""
        if own_syncs:
            gemms_dq_first(
                p_cast, ds_cast, dO_shared, Q_shared, K_shared, dS_shared, acc_dv, acc_dk, acc_dq, dQ_shared,
                dQ_accum, b, head, q_row,
            )  # fmt: skip
        else:
            if operands_in_shared:
                T.copy(p_cast, P_shared)
                T.copy(ds_cast, dS_shared)
                T.gemm(P_shared, dO_shared, acc_dv, policy=T.GemmWarpPolicy.FullRow)
                T.gemm(dS_shared, Q_shared, acc_dk, policy=T.GemmWarpPolicy.FullRow)
            else:
                T.gemm(p_cast, dO_shared, acc_dv, policy=T.GemmWarpPolicy.FullRow)
                T.gemm(ds_cast, Q_shared, acc_dk, policy=T.GemmWarpPolicy.FullRow)
            if with_dq:  # dS is in shared memory already: with P and dS in registers, own_syncs holds
                add_dq_tile(dS_shared, K_shared, acc_dq, dQ_shared, dQ_accum, b, head, q_row)

    @T.macro
    def store_key_tile(acc_dk, acc_dv, dK, dV, tile, softmax_scale):
        """The epilogue: dK (scaled once, here) and dV of the tile's keys."""
        # Names for variables only: a name given a load (a ragged sequence's registers) would
        # become a variable of its own, another program.
        b, kv_head, kv_start = tile.b, tile.kv_head, tile.kv_start
        for i, j in T.Parallel(block_n, head_dim):
            acc_dk[i, j] = acc_dk[i, j] * softmax_scale
        if varlen:
            # A sequence's last, partial tile row by row (the next sequence's block writes on).
            if kv_start + block_n <= tile.rule.seqlen_k:
                T.copy(acc_dk, dK[b, tile.k_offset + kv_start : tile.k_offset + kv_start + block_n, kv_head, :])
                T.copy(acc_dv, dV[b, tile.k_offset + kv_start : tile.k_offset + kv_start + block_n, kv_head, :])
            else:
                for i, j in T.Parallel(block_n, head_dim):
                    if kv_start + i < tile.rule.seqlen_k:
                        dK[b, tile.k_offset + kv_start + i, kv_head, j] = T.Cast(dtype, acc_dk[i, j])
                        dV[b, tile.k_offset + kv_start + i, kv_head, j] = T.Cast(dtype, acc_dv[i, j])
        elif head_splits:
            T.copy(acc_dk, dK[tile.split, b, kv_start : kv_start + block_n, kv_head, :])
            T.copy(acc_dv, dV[tile.split, b, kv_start : kv_start + block_n, kv_head, :])
        else:
            T.copy(acc_dk, dK[b, kv_start : kv_start + block_n, kv_head, :])
            T.copy(acc_dv, dV[b, kv_start : kv_start + block_n, kv_head, :])

    @T.macro
    def score_gemms(K_shared, V_shared, K_pair, V_pair, pair, Q_shared, dO_shared, acc_s, acc_dp):
        """Sᵀ and dPᵀ issued together (wgmma is asynchronous): Pᵀ is computed while dPᵀ runs. The
        GEMMs after them stay synchronous: T.Pipelined releases a stage's Q and dO after their last
        GEMM, which must then have finished reading them. kv_pairs: K and V of the step's K/V head."""
        T.wgmma_gemm(
            K_pair[pair, :, :] if kv_pairs else K_shared, Q_shared, acc_s, transpose_B=True,
            policy=T.GemmWarpPolicy.FullRow, clear_accum=True,
        )  # fmt: skip
        T.wgmma_gemm(
            V_pair[pair, :, :] if kv_pairs else V_shared, dO_shared, acc_dp, transpose_B=True,
            policy=T.GemmWarpPolicy.FullRow, clear_accum=True,
        )  # fmt: skip

    @T.macro
    def load_second_of_pair(K, V, K_pair, V_pair, b, kv_head, kv_start, pair_heads):
        """kv_pairs: the K/V tile of the block's second K/V head, where it has one."""
        if pair_heads == 2:
            T.copy(K[b, kv_start : kv_start + block_n, kv_head + 1, :], K_pair[1, :, :])
            T.copy(V[b, kv_start : kv_start + block_n, kv_head + 1, :], V_pair[1, :, :])

    @T.macro
    def end_first_walk(acc_dk, acc_dv, dK, dV, tile, softmax_scale):
        """kv_pairs: the first K/V head's walk ends: its dK and dV stored, the sums begun again."""
        store_key_tile(acc_dk, acc_dv, dK, dV, tile, softmax_scale)
        T.clear(acc_dk)
        T.clear(acc_dv)

    @T.prim_func
    def flash_attention_backward(
        Q: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        K: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        V: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        dO: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        Delta: T.Tensor([batch, heads, seqlen_q_padded], accum),
        LSE_log2: T.Tensor([batch, heads, seqlen_q_padded], accum),
        dQ_accum: T.Tensor(dq_accum_shape, accum),
        dK: T.Tensor(dk_shape, dk_dtype),
        dV: T.Tensor(dk_shape, dk_dtype),
        scale_log2: T.float32,
        softmax_scale: T.float32,
        window_left: window_left,
        window_right: window_right,
        softcap_log2: softcap_log2,
        CuSeqlensQ: kernel_parameter(cu_seqlens_q, varlen),
        CuSeqlensK: kernel_parameter(cu_seqlens_k, varlen),
        TileOrder: kernel_parameter(tile_order, varlen),
        PairsPerGroup: kernel_parameter(pairs_per_group, heavy_first),
    ):
        kv_slots = heads_kv * splits if head_splits else (T.ceildiv(heads_kv, 2) if kv_pairs else heads_kv)
        key_tiles = T.ceildiv(seqlen_k, block_n)
        grid = (key_tiles * kv_slots * batch, 1, 1) if heavy_first else (key_tiles, kv_slots, batch)
        grid = (ragged_tiles, heads_kv, 1) if varlen else grid
        with T.Kernel(*grid, threads=threads) as (kv_block, kv_slot, b):
            if heavy_first:
                # In registers, set once: left as expressions, the map's divisions recur inline at every use.
                block_tile, block_slot, block_batch = T.alloc_var(T.int32), T.alloc_var(T.int32), T.alloc_var(T.int32)
                block_tile, block_slot, block_batch = heavy_first_block(
                    kv_block, key_tiles, kv_slots, batch, PairsPerGroup
                )
                kv_block, kv_slot, b = block_tile, block_slot, block_batch
            # kv_pairs: both K/V heads' tiles in one buffer each (K_shared the first's).
            K_pair = T.alloc_shared([2, block_n, head_dim], dtype) if kv_pairs else None
            V_pair = T.alloc_shared([2, block_n, head_dim], dtype) if kv_pairs else None
            K_shared = K_pair[0, :, :] if kv_pairs else T.alloc_shared([block_n, head_dim], dtype)
            V_shared = V_pair[0, :, :] if kv_pairs else T.alloc_shared([block_n, head_dim], dtype)
            Q_shared = T.alloc_shared([block_m, head_dim], dtype)
            dO_shared = T.alloc_shared([block_m, head_dim], dtype)
            dS_shared = T.alloc_shared([block_n, block_m], dtype) if with_dq or operands_in_shared else None
            P_shared = T.alloc_shared([block_n, block_m], dtype) if operands_in_shared else None
            dQ_shared = T.alloc_shared([block_m, DQ_ROW], accum) if with_dq else None
            lse = T.alloc_shared([block_m], accum)
            delta = T.alloc_shared([block_m], accum)
            acc_s = T.alloc_fragment([block_n, block_m], accum)  # Sᵀ, then Pᵀ
            acc_dp = T.alloc_fragment([block_n, block_m], accum)  # dPᵀ
            p_cast = T.alloc_fragment([block_n, block_m], dtype)
            ds_cast = T.alloc_fragment([block_n, block_m], dtype)
            acc_dk = T.alloc_fragment([block_n, head_dim], accum)
            acc_dv = T.alloc_fragment([block_n, head_dim], accum)
            acc_dq = T.alloc_fragment(dq_fragment, accum) if with_dq else None

            group_size = heads // heads_kv
            kv_head, split, walk_heads, pair_heads = kv_slot, None, group_size, 1
            if kv_pairs:  # K/V heads 2·slot and, unless the last is alone, 2·slot + 1
                kv_head, pair_heads = kv_slot * 2, T.min(heads_kv - kv_slot * 2, 2)
            if head_splits:
                # Split s walks the group's heads s, s + splits, ...: any number of splits up to
                # the group, their walks within one head of each other. At least one head (as
                # split < group): without the bound, ThreadSync cannot lower some builds' syncs.
                kv_head, split = kv_slot // splits, kv_slot % splits
                walk_heads = T.max(T.ceildiv(group_size - split, splits), 1)
            kv_tile, rule, sequence, q_offset, k_offset = kv_block, visibility, None, None, None
            if varlen:
                # The producer writes the sequence's registers, which TileLang's warp specialisation
                # takes for a copy in registers, giving neither side a register budget (1.4 KB of
                # spills, every wgmma serialised): the batched build's budgets, given by hand.
                T.annotate_producer_reg_dealloc(PRODUCER_REGISTERS)
                T.annotate_consumer_reg_alloc(CONSUMER_REGISTERS)
                # The block's (sequence, K/V tile) from the key tile order; the sequence's
                # offsets and lengths, read once, and its rule.
                ragged = ragged_tile(TileOrder, kv_block, CuSeqlensQ, CuSeqlensK)
                sequence, q_offset, k_offset, sequence_q, sequence_k, kv_tile = ragged
                rule = dataclasses.replace(visibility, seqlen_q=sequence_q, seqlen_k=sequence_k)
            kv_start = kv_tile * block_n
            # Right edge (causal): rows before the first that sees this tile's first key add
            # nothing; left edge: nor rows from the first whose window starts past its last key.
            first_q_block = T.max(rule.first_row(kv_start), 0) // block_m if visibility.limits_right else 0
            q_blocks = T.ceildiv(rows_end(kv_start, rule), block_m) - first_q_block
            T.copy(K[b, at_offset(k_offset, kv_start) : at_offset(k_offset, kv_start) + block_n, kv_head, :], K_shared)
            T.copy(V[b, at_offset(k_offset, kv_start) : at_offset(k_offset, kv_start) + block_n, kv_head, :], V_shared)
            if kv_pairs:
                load_second_of_pair(K, V, K_pair, V_pair, b, kv_head, kv_start, pair_heads)
            start_sums(acc_dk, acc_dv, dQ_shared)
            # The step's head and first row, set once a step in registers: as expressions (the
            # producer's) their divisions recur at every use, in 64 bits in dQ's add's address.
            step_head = T.alloc_var(T.int32)
            step_q_start = T.alloc_var(T.int32)
            # One walk over (query head of the group, query tile), so the pipeline spans heads.
            # A PrimExpr bound to a name becomes a program variable: bound under kv_pairs alone,
            # so the shipped programs keep their code.
            group_steps = walk_heads * T.max(q_blocks, 0) if kv_pairs else None
            for step in T.Pipelined(
                pair_heads * group_steps if kv_pairs else walk_heads * T.max(q_blocks, 0), num_stages=num_stages
            ):
                head = kv_head * group_size + step // q_blocks
                if head_splits:
                    head = kv_head * group_size + split + step // q_blocks * splits
                q_tile = step % q_blocks
                q_start = (first_q_block + q_tile) * block_m
                q_row = at_offset(q_offset, q_start)  # in the packed rows, for a ragged batch
                T.copy(Q[b, q_row : q_row + block_m, head, :], Q_shared)
                T.copy(dO[b, q_row : q_row + block_m, head, :], dO_shared)
                first = statistics_row(q_start, q_offset, sequence)
                T.copy(LSE_log2[b, head, first : first + block_m], lse)
                T.copy(Delta[b, head, first : first + block_m], delta)
                pair = step // group_steps if kv_pairs else None
                score_gemms(K_shared, V_shared, K_pair, V_pair, pair, Q_shared, dO_shared, acc_s, acc_dp)
                # Set after the GEMMs' issue: set before it, TileLang's warp specialisation parts a
                # ragged batch's row names (q_row, first) from their uses ("used before definition").
                step_head = head
                step_q_start = q_start
                if variants.softcap:
                    capped_probabilities_and_ds(
                        rule, acc_s, acc_dp, p_cast, ds_cast, kv_start, q_start, lse, delta, scale_log2, softcap_log2
                    )
                else:
                    probabilities(rule, acc_s, acc_dp, p_cast, ds_cast, kv_start, step_q_start, lse, delta, scale_log2)
                step_gradients(
                    p_cast, ds_cast, P_shared, dS_shared, dO_shared, Q_shared, K_shared, acc_dv, acc_dk, acc_dq,
                    dQ_shared, dQ_accum, b, step_head, at_offset(q_offset, step_q_start),
                )  # fmt: skip
                if kv_pairs and pair_heads == 2 and step == group_steps - 1:
                    end_first_walk(acc_dk, acc_dv, dK, dV, KeyTile(b, kv_head, kv_start, None, rule), softmax_scale)
            if with_dq:
                T.tma_store_wait(0)  # the last add has read dQ_shared before the block may exit
            tile = KeyTile(b, kv_head + (pair_heads - 1) if kv_pairs else kv_head, kv_start, k_offset, rule, split)
            store_key_tile(acc_dk, acc_dv, dK, dV, tile, softmax_scale)

    return flash_attention_backward


def backward_pass_configs(*, block_n, threads=256, with_dq=True, **_build) -> dict:
    """TileLang's pass configs for a dK/dV build: without its sync planner where the kernel
    places its own syncs."""
    return OWN_SYNCS if syncs_by_hand(block_n, threads, with_dq) else FAST_MATH


# The dK/dV kernel with dQ by bulk adds: the atomic path's.
compiled_backward = compiled_at_tiles(backward_program, BACKWARD_TILES, backward_pass_configs)
# Without dQ, at its own tiles: the fixed-order path's dK/dV kernel.
compiled_dk_dv = compiled_at_tiles(
    functools.partial(backward_program, with_dq=False),
    DK_DV_TILES,
    functools.partial(backward_pass_configs, with_dq=False),
)


def heavy_first_order(causal: bool, variants: Variants, varlen: bool, head_splits: bool) -> bool:
    """Whether the dK/dV kernel dispatches its blocks heavy first (backward_program's
    `heavy_first`): in a batched launch whose right edge (causal's included) makes the K/V
    tiles' walks uneven, unless a GQA group is split (configs.gradient_head_splits' model
    schedules the tile-fastest order, and picks fewer splits than win if told otherwise)."""
    return not varlen and not head_splits and (causal or variants.window_right)


def compiled_gradient_kernels(
    *,
    head_dim: int,
    causal: bool,
    dtype: str,
    arch: str | None = None,
    deterministic: bool = False,
    variants: Variants = PLAIN,
    varlen: bool = False,
    head_splits: bool = False,
) -> tuple:
    """(preprocess, backward, dq): the kernels a gradient launches (a module-level builder, for
    `builds.build_all`); dq is None where the backward kernel sums dQ by atomic adds, and the
    fixed-order dQ kernel where `deterministic` (the backward kernel then without its dQ);
    `varlen` and `head_splits` as backward_program takes them; the backward kernel heavy first
    where heavy_first_order says (it then takes configs.pairs_per_group after the variants)."""
    preprocess = compiled_preprocess(head_dim=head_dim, dtype=dtype, arch=arch, varlen=varlen)
    arguments = dict(head_dim=head_dim, causal=causal, dtype=dtype, arch=arch, variants=variants, varlen=varlen)
    options = dict(head_splits=True) if head_splits else {}
    if heavy_first_order(causal, variants, varlen, head_splits):
        options["heavy_first"] = True
    if not deterministic:
        return preprocess, compiled_backward(**arguments, **options), None
    return preprocess, compiled_dk_dv(**arguments, **options), compiled_dq(**arguments)
