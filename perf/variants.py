"""Alternative builds of the FlashAttention-2 forward kernel, for measurement on the H200.

Every builder here returns a TileLang PrimFunc with exactly the launch signature and the
semantics of the shipped `fa_kernel.kernel.forward_program`:

    kernel(Q [B, Sq, H, D], K [B, Sk, Hkv, D], V [B, Sk, Hkv, D],
           Output [B, Sq, H, D], LSE [B, H, Sq] fp32, scale_log2)

batch, both sequence lengths and both head counts symbolic (`T.dynamic`), GQA by head
groups, bottom-right causal alignment (query i sees key j iff j <= i + Sk - Sq), output 0
and LSE -inf for a row that sees no key, at least one K/V tile processed per block.

Variants (see VARIANTS at the bottom; `build(name, ...)` dispatches):

  shipped              the kernel as shipped (imported, not copied).
  masked_tail          shipped structure (TileLang auto warp specialisation); the mask is
                       written only into tiles that need one, every other tile's Q.K^T
                       GEMM starts from a zero accumulator (wgmma scale-d = 0).
  sw_pipeline          shipped body under T.Pipelined(order=..., stage=...): the QK GEMM
                       of tile k+1 is scheduled before the softmax / P.V of tile k.
                       NOTE: in TileLang 0.1.15 a manual order/stage disables the auto
                       warp specialisation (it needs num_stages, and with num_stages the
                       WS pass strips order/stage), so this is a 256-thread cp.async
                       software pipeline with blocking GEMMs. MEASURED INCORRECT on the
                       H200 (fails judge on 257x300 / 1000x1000) and 20-90% slower: kept
                       only as evidence; see KNOWN_INCORRECT.
  ws_explicit          hand-written producer/consumer warp specialisation (T.tma_copy +
                       mbarriers, one 128-thread producer warpgroup, setmaxnreg), consumer
                       loop in the shipped order (no overlap): the control for the next ones.
  overlap              ws_explicit + FA3 intra-warpgroup overlap: T.wgmma_gemm (no
                       implicit wait) + T.wait_wgmma. Per K/V tile j the consumer issues
                       S_j = Q.K_j^T, then O += P_{j-1}.V_{j-1}, waits for S_j only
                       (wgmma wait<1>), runs the softmax of tile j while P.V runs on the
                       tensor cores, then waits for P.V (wait<0>). First tile peeled
                       (prologue), last P.V after the loop (epilogue), so the steady-state
                       loop has no branches on the GEMM path (ptxas otherwise serialises).
  overlap_masked_tail  overlap + masked tail; causal launches the heaviest query blocks
                       first (the block index is reversed), as FA3 does.
  overlap_pingpong     overlap_masked_tail + FA3 inter-warpgroup ping-pong: two consumer
                       warpgroups take turns issuing their GEMMs (named barriers), so one
                       warpgroup's softmax runs under the other's GEMMs. Needs exactly two
                       consumer warpgroups (config.threads == 256); other configs fall
                       back to overlap_masked_tail's schedule.

For the explicit-WS variants `config.threads` is the number of CONSUMER threads (as for
the shipped kernel, where TileLang adds the 128-thread producer warpgroup itself), so a
TileConfig means the same launch (threads + 128) for every variant.

Measured on the H200 (perf/results/, B=8 H=32 N=4096, TFLOP/s, two runs each), best
correct variant vs shipped (128x128/2/256) vs cuDNN in the same process:
  d128 fp16      overlap_pingpong    128x176/2/256  558 / 557  shipped 511  cuDNN 585 / 578
  d128 fp16 c.   overlap_masked_tail 128x176/2/256  493 / 497  shipped 458  cuDNN 515 / 514
  d128 bf16      overlap_pingpong    128x176/2/256  580 / 580  shipped 527  cuDNN 605 / 602
  d64 fp16       masked_tail         192x128/2/384  441 / 423  shipped 370  cuDNN 442 / 448
  d64 fp16 c.    overlap_masked_tail 192x128/2/384  397 / 379  shipped 320  cuDNN 434 / 410
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import tilelang
import tilelang.language as T

from fa_kernel.configs import TileConfig
from fa_kernel.kernel import DTYPES, LN2, PASS_CONFIGS, forward_program

PRODUCER_THREADS = 128
# Named barriers 14 (warpgroup 0 may issue) and 15 (warpgroup 1 may issue) for the ping-pong;
# TileLang allocates its own from 3 upwards.
PINGPONG_BARRIERS = (14, 15)


def _register_budget(consumer_threads: int) -> tuple[int, int]:
    """(producer, consumer) setmaxnreg values that fit 64K registers, FA3 style."""
    consumer_wgs = consumer_threads // 128
    total_threads = consumer_threads + PRODUCER_THREADS
    per_thread = min(255, 65536 // total_threads) // 8 * 8  # what ptxas gets from launch bounds
    producer = 24 if consumer_wgs <= 2 else 32
    consumer = min(240, (per_thread * (consumer_wgs + 1) - producer) // consumer_wgs // 8 * 8)
    return producer, consumer


# --------------------------------------------------------------------------------------
# Auto warp-specialised family (the shipped structure)
# --------------------------------------------------------------------------------------


def _auto_ws_program(
    *, head_dim: int, causal: bool, dtype: str, config: TileConfig, masked_tail: bool, sw_pipeline: bool
):
    """The shipped kernel, optionally with the mask only where needed / a manual pipeline."""
    batch, seqlen_q, seqlen_k, heads, heads_kv = T.dynamic("batch, seqlen_q, seqlen_k, heads, heads_kv")
    block_m, block_n = config.block_m, config.block_n
    dtype = DTYPES[dtype]
    accum = T.float32
    neg_inf = -T.infinity(accum)
    if sw_pipeline:
        # 13 scheduled statements (kv_start is a replayable Bind): 0 copy K, 1 mask,
        # 2 QK gemm, 3 copy row_max, 4 reduce_max, 5 alpha, 6 exp2, 7 reduce_sum,
        # 8 row_sum, 9 cast P, 10 rescale O, 11 copy V, 12 PV gemm.
        # Body of iteration k: K copy/mask/QK of tile k+1 (stage 0), rescale/V copy/PV of
        # tile k (stage 1), then the softmax of tile k+1 (stage 0).
        pipeline = dict(order=[0, 1, 2, 6, 7, 8, 9, 10, 11, 12, 3, 4, 5], stage=[0] * 10 + [1] * 3)
    else:
        pipeline = dict(num_stages=config.num_stages)

    @T.prim_func
    def flash_attention_forward(
        Q: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        K: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        V: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        Output: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        LSE: T.Tensor([batch, heads, seqlen_q], accum),
        scale_log2: T.float32,
    ):
        with T.Kernel(T.ceildiv(seqlen_q, block_m), heads, batch, threads=config.threads) as (q_block, head, b):
            Q_shared = T.alloc_shared([block_m, head_dim], dtype)
            K_shared = T.alloc_shared([block_n, head_dim], dtype)
            V_shared = T.alloc_shared([block_n, head_dim], dtype)
            O_shared = T.alloc_shared([block_m, head_dim], dtype)
            acc_s = T.alloc_fragment([block_m, block_n], accum)
            acc_p = T.alloc_fragment([block_m, block_n], dtype)
            acc_o = T.alloc_fragment([block_m, head_dim], accum)
            row_max = T.alloc_fragment([block_m], accum)
            row_max_prev = T.alloc_fragment([block_m], accum)
            row_max_scaled = T.alloc_fragment([block_m], accum)
            alpha = T.alloc_fragment([block_m], accum)
            tile_sum = T.alloc_fragment([block_m], accum)
            row_sum = T.alloc_fragment([block_m], accum)

            kv_head = head // (heads // heads_kv)
            diagonal_offset = seqlen_k - seqlen_q
            q_start = q_block * block_m

            T.copy(Q[b, q_start : q_start + block_m, head, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(row_sum, 0)
            T.fill(row_max, neg_inf)

            num_kv_blocks = T.ceildiv(seqlen_k, block_n)
            if causal:
                last_visible = q_start + block_m + diagonal_offset
                num_kv_blocks = T.max(1, T.min(num_kv_blocks, T.ceildiv(last_visible, block_n)))

            for kv_block in T.Pipelined(num_kv_blocks, **pipeline):
                kv_start = kv_block * block_n
                T.copy(K[b, kv_start : kv_start + block_n, kv_head, :], K_shared)
                if masked_tail:
                    # A tile needs the mask iff it holds a key past seqlen_k or (causal) a key
                    # right of the diagonal for the block's first row; the others start the
                    # GEMM from zero (clear_accum: the wgmma ignores the accumulator input).
                    if _tile_needs_mask(causal, kv_start, block_n, q_start, diagonal_offset, seqlen_k):
                        for i, j in T.Parallel(block_m, block_n):
                            acc_s[i, j] = _mask_value(
                                causal, kv_start + j, q_start + i, diagonal_offset, seqlen_k, neg_inf
                            )
                        T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                    else:
                        T.gemm(
                            Q_shared,
                            K_shared,
                            acc_s,
                            transpose_B=True,
                            policy=T.GemmWarpPolicy.FullRow,
                            clear_accum=True,
                        )
                else:
                    for i, j in T.Parallel(block_m, block_n):
                        acc_s[i, j] = _mask_value(causal, kv_start + j, q_start + i, diagonal_offset, seqlen_k, neg_inf)
                    T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

                T.copy(row_max, row_max_prev)
                T.reduce_max(acc_s, row_max, dim=1, clear=False)
                for i in T.Parallel(block_m):
                    row_max_scaled[i] = T.if_then_else(row_max[i] == neg_inf, 0, row_max[i] * scale_log2)
                    alpha[i] = T.exp2(row_max_prev[i] * scale_log2 - row_max_scaled[i])
                for i, j in T.Parallel(block_m, block_n):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale_log2 - row_max_scaled[i])
                T.reduce_sum(acc_s, tile_sum, dim=1)
                for i in T.Parallel(block_m):
                    row_sum[i] = row_sum[i] * alpha[i] + tile_sum[i]
                T.copy(acc_s, acc_p)

                for i, d in T.Parallel(block_m, head_dim):
                    acc_o[i, d] *= alpha[i]
                T.copy(V[b, kv_start : kv_start + block_n, kv_head, :], V_shared)
                T.gemm(acc_p, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

            for i, d in T.Parallel(block_m, head_dim):
                acc_o[i, d] = T.if_then_else(row_sum[i] > 0, acc_o[i, d] / row_sum[i], 0)
            for i in T.Parallel(block_m):
                if q_start + i < seqlen_q:
                    LSE[b, head, q_start + i] = T.if_then_else(
                        row_sum[i] > 0, (row_max_scaled[i] + T.log2(row_sum[i])) * LN2, neg_inf
                    )
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[b, q_start : q_start + block_m, head, :])

    return flash_attention_forward


def _mask_value(causal, key, query, diagonal_offset, seqlen_k, neg_inf):
    """-inf where query may not see key, else 0 (the shipped kernel's mask expression)."""
    if causal:
        return T.if_then_else(T.Or(key > query + diagonal_offset, key >= seqlen_k), neg_inf, 0)
    return T.if_then_else(key >= seqlen_k, neg_inf, 0)


def _tile_needs_mask(causal, kv_start, block_n, q_start, diagonal_offset, seqlen_k):
    """Does the K/V tile starting at kv_start hold any key that some row of the block
    starting at q_start may not see? Uniform over the block (no divergence)."""
    past_end = kv_start + block_n > seqlen_k
    if causal:
        # Row q_start sees keys <= q_start + offset; later rows see more.
        return T.Or(past_end, kv_start + block_n - 1 > q_start + diagonal_offset)
    return past_end


# --------------------------------------------------------------------------------------
# Explicit warp-specialised family (hand-written producer / consumer)
# --------------------------------------------------------------------------------------


def _explicit_ws_program(
    *,
    head_dim: int,
    causal: bool,
    dtype: str,
    config: TileConfig,
    overlap: bool,
    masked_tail: bool,
    heavy_first: bool,
    pingpong: bool,
):
    batch, seqlen_q, seqlen_k, heads, heads_kv = T.dynamic("batch, seqlen_q, seqlen_k, heads, heads_kv")
    block_m, block_n, stages = config.block_m, config.block_n, max(1, config.num_stages)
    consumers = config.threads
    assert consumers % 128 == 0, "consumer threads must be whole warpgroups"
    threads = consumers + PRODUCER_THREADS
    producer_regs, consumer_regs = _register_budget(consumers)
    pingpong = pingpong and consumers == 256
    dtype = DTYPES[dtype]
    accum = T.float32
    neg_inf = -T.infinity(accum)
    # Per-thread register counts of the wgmma operands, for the fences after each wait.
    s_regs = block_m * block_n // consumers
    o_regs = block_m * head_dim // consumers

    @T.macro
    def scores_gemm(Q_shared, K_tile, acc_s, kv_start, q_start, diagonal_offset, seqlen_k):
        """Issue S = Q.K^T for one tile (no wait), with its mask folded into acc_s."""
        if masked_tail:
            if _tile_needs_mask(causal, kv_start, block_n, q_start, diagonal_offset, seqlen_k):
                for i, j in T.Parallel(block_m, block_n):
                    acc_s[i, j] = _mask_value(causal, kv_start + j, q_start + i, diagonal_offset, seqlen_k, neg_inf)
                T.wgmma_gemm(Q_shared, K_tile, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
            else:
                T.wgmma_gemm(
                    Q_shared, K_tile, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow, clear_accum=True
                )
        else:
            for i, j in T.Parallel(block_m, block_n):
                acc_s[i, j] = _mask_value(causal, kv_start + j, q_start + i, diagonal_offset, seqlen_k, neg_inf)
            T.wgmma_gemm(Q_shared, K_tile, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

    @T.macro
    def online_softmax(acc_s, row_max, row_max_prev, row_max_scaled, alpha, tile_sum, row_sum, scale_log2):
        """The shipped kernel's softmax update; leaves P (fp32) in acc_s and alpha."""
        T.copy(row_max, row_max_prev)
        T.reduce_max(acc_s, row_max, dim=1, clear=False)
        for i in T.Parallel(block_m):
            row_max_scaled[i] = T.if_then_else(row_max[i] == neg_inf, 0, row_max[i] * scale_log2)
            alpha[i] = T.exp2(row_max_prev[i] * scale_log2 - row_max_scaled[i])
        for i, j in T.Parallel(block_m, block_n):
            acc_s[i, j] = T.exp2(acc_s[i, j] * scale_log2 - row_max_scaled[i])
        T.reduce_sum(acc_s, tile_sum, dim=1)
        for i in T.Parallel(block_m):
            row_sum[i] = row_sum[i] * alpha[i] + tile_sum[i]

    @T.macro
    def rescale_o(acc_o, alpha):
        for i, d in T.Parallel(block_m, head_dim):
            acc_o[i, d] *= alpha[i]

    @T.prim_func
    def flash_attention_forward(
        Q: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        K: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        V: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        Output: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        LSE: T.Tensor([batch, heads, seqlen_q], accum),
        scale_log2: T.float32,
    ):
        with T.Kernel(T.ceildiv(seqlen_q, block_m), heads, batch, threads=threads) as (bx, head, b):
            Q_shared = T.alloc_shared([block_m, head_dim], dtype)
            K_shared = T.alloc_shared([stages, block_n, head_dim], dtype)
            V_shared = T.alloc_shared([stages, block_n, head_dim], dtype)
            # The output tile reuses Q's shared memory (as the shipped kernel's allocator does):
            # each consumer warpgroup reads only its own rows of Q and writes only its own
            # rows of O, after its last Q.K^T GEMM has completed.
            O_shared = Q_shared
            acc_s = T.alloc_fragment([block_m, block_n], accum)
            acc_p = T.alloc_fragment([block_m, block_n], dtype)
            acc_o = T.alloc_fragment([block_m, head_dim], accum)
            row_max = T.alloc_fragment([block_m], accum)
            row_max_prev = T.alloc_fragment([block_m], accum)
            row_max_scaled = T.alloc_fragment([block_m], accum)
            alpha = T.alloc_fragment([block_m], accum)
            tile_sum = T.alloc_fragment([block_m], accum)
            row_sum = T.alloc_fragment([block_m], accum)
            # full: the producer's 128 threads arrive (one of them also posts the TMA byte
            # count); empty: every consumer thread arrives once it is done with the tile.
            q_full = T.alloc_barrier(PRODUCER_THREADS)
            k_full = T.alloc_barrier([PRODUCER_THREADS] * stages)
            k_empty = T.alloc_barrier([consumers] * stages)
            v_full = T.alloc_barrier([PRODUCER_THREADS] * stages)
            v_empty = T.alloc_barrier([consumers] * stages)

            tx = T.get_thread_binding()
            q_block = bx
            if causal and heavy_first:
                # Causal blocks further down see more keys: launch them first.
                q_block = T.ceildiv(seqlen_q, block_m) - 1 - bx
            kv_head = head // (heads // heads_kv)
            diagonal_offset = seqlen_k - seqlen_q
            q_start = q_block * block_m
            num_kv_blocks = T.ceildiv(seqlen_k, block_n)
            if causal:
                # Same tile count as the shipped kernel, including its ">= 1 tile" rule (every
                # TMA load issued must be waited for before the block exits).
                last_visible = q_start + block_m + diagonal_offset
                num_kv_blocks = T.max(1, T.min(num_kv_blocks, T.ceildiv(last_visible, block_n)))

            if tx >= consumers:
                # ---------------- producer warpgroup: TMA loads only ----------------
                T.set_max_nreg(producer_regs, 0)
                T.tma_copy(Q[b, q_start : q_start + block_m, head, :], Q_shared, barrier=q_full)
                T.mbarrier_arrive(q_full)
                for kv_block in T.serial(num_kv_blocks):
                    stage = kv_block % stages
                    phase = (kv_block // stages) & 1
                    kv_start = kv_block * block_n
                    T.mbarrier_wait_parity(k_empty[stage], phase ^ 1)
                    T.tma_copy(
                        K[b, kv_start : kv_start + block_n, kv_head, :], K_shared[stage, :, :], barrier=k_full[stage]
                    )
                    T.mbarrier_arrive(k_full[stage])
                    T.mbarrier_wait_parity(v_empty[stage], phase ^ 1)
                    T.tma_copy(
                        V[b, kv_start : kv_start + block_n, kv_head, :], V_shared[stage, :, :], barrier=v_full[stage]
                    )
                    T.mbarrier_arrive(v_full[stage])
            else:
                # ---------------- consumer warpgroups ----------------
                T.set_max_nreg(consumer_regs, 1)
                T.fill(acc_o, 0)
                T.fill(row_sum, 0)
                T.fill(row_max, neg_inf)
                T.mbarrier_wait_parity(q_full, 0)
                if not overlap:
                    for kv_block in T.serial(num_kv_blocks):
                        stage = kv_block % stages
                        phase = (kv_block // stages) & 1
                        kv_start = kv_block * block_n
                        T.mbarrier_wait_parity(k_full[stage], phase)
                        scores_gemm(
                            Q_shared, K_shared[stage, :, :], acc_s, kv_start, q_start, diagonal_offset, seqlen_k
                        )
                        T.wait_wgmma(0)
                        T.warpgroup_fence_operand(acc_s, num_regs=s_regs)
                        T.mbarrier_arrive(k_empty[stage])
                        online_softmax(
                            acc_s, row_max, row_max_prev, row_max_scaled, alpha, tile_sum, row_sum, scale_log2
                        )
                        T.copy(acc_s, acc_p)
                        rescale_o(acc_o, alpha)
                        T.mbarrier_wait_parity(v_full[stage], phase)
                        T.wgmma_gemm(acc_p, V_shared[stage, :, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
                        T.wait_wgmma(0)
                        T.warpgroup_fence_operand(acc_o, num_regs=o_regs)
                        T.mbarrier_arrive(v_empty[stage])
                else:
                    if pingpong:  # noqa: SIM102 - static (Python) condition around a runtime one
                        # Warpgroup 1 lets warpgroup 0 issue first. Every arrive below has a
                        # matching sync (none is left pending when the block exits).
                        if tx >= 128 and num_kv_blocks > 1:
                            T.named_barrier_arrive(PINGPONG_BARRIERS[0], 256)
                    # Prologue: S_0 and its softmax, P_0 left in acc_p.
                    T.mbarrier_wait_parity(k_full[0], 0)
                    scores_gemm(Q_shared, K_shared[0, :, :], acc_s, 0, q_start, diagonal_offset, seqlen_k)
                    T.wait_wgmma(0)
                    T.warpgroup_fence_operand(acc_s, num_regs=s_regs)
                    T.mbarrier_arrive(k_empty[0])
                    online_softmax(acc_s, row_max, row_max_prev, row_max_scaled, alpha, tile_sum, row_sum, scale_log2)
                    T.copy(acc_s, acc_p)
                    # Steady state: S_j = Q.K_j^T overlaps O += P_{j-1}.V_{j-1} and softmax(S_j).
                    for kv_block in T.serial(1, num_kv_blocks):
                        stage = kv_block % stages
                        phase = (kv_block // stages) & 1
                        prev_stage = (kv_block - 1) % stages
                        prev_phase = ((kv_block - 1) // stages) & 1
                        kv_start = kv_block * block_n
                        T.mbarrier_wait_parity(k_full[stage], phase)
                        if pingpong:
                            T.sync_threads(PINGPONG_BARRIERS[0] + tx // 128, 256)
                        scores_gemm(
                            Q_shared, K_shared[stage, :, :], acc_s, kv_start, q_start, diagonal_offset, seqlen_k
                        )
                        rescale_o(acc_o, alpha)  # alpha of tile j-1, before P_{j-1}.V_{j-1} lands
                        T.mbarrier_wait_parity(v_full[prev_stage], prev_phase)
                        T.wgmma_gemm(acc_p, V_shared[prev_stage, :, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
                        if pingpong:  # noqa: SIM102 - static (Python) condition around a runtime one
                            # Hand the tensor cores to the other warpgroup (warpgroup 1's last
                            # hand-over would have no taker: warpgroup 0 has no next tile).
                            if tx < 128 or kv_block < num_kv_blocks - 1:
                                T.named_barrier_arrive(PINGPONG_BARRIERS[1] - tx // 128, 256)
                        T.wait_wgmma(1)  # S_j is ready; P.V may still run
                        T.warpgroup_fence_operand(acc_s, num_regs=s_regs)
                        T.mbarrier_arrive(k_empty[stage])
                        online_softmax(
                            acc_s, row_max, row_max_prev, row_max_scaled, alpha, tile_sum, row_sum, scale_log2
                        )
                        T.wait_wgmma(0)  # P_{j-1}.V_{j-1} done: acc_p may be overwritten
                        T.warpgroup_fence_operand(acc_o, num_regs=o_regs)
                        T.mbarrier_arrive(v_empty[prev_stage])
                        T.copy(acc_s, acc_p)
                    # Epilogue: the last tile's P.V.
                    last = num_kv_blocks - 1
                    rescale_o(acc_o, alpha)
                    T.mbarrier_wait_parity(v_full[last % stages], (last // stages) & 1)
                    T.wgmma_gemm(acc_p, V_shared[last % stages, :, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
                    T.wait_wgmma(0)
                    T.warpgroup_fence_operand(acc_o, num_regs=o_regs)
                    T.mbarrier_arrive(v_empty[last % stages])

                for i, d in T.Parallel(block_m, head_dim):
                    acc_o[i, d] = T.if_then_else(row_sum[i] > 0, acc_o[i, d] / row_sum[i], 0)
                for i in T.Parallel(block_m):
                    if q_start + i < seqlen_q:
                        LSE[b, head, q_start + i] = T.if_then_else(
                            row_sum[i] > 0, (row_max_scaled[i] + T.log2(row_sum[i])) * LN2, neg_inf
                        )
                T.copy(acc_o, O_shared)
                T.copy(O_shared, Output[b, q_start : q_start + block_m, head, :])

    return flash_attention_forward


# --------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------

Builder = Callable[..., object]

VARIANTS: dict[str, Builder] = {
    "shipped": forward_program,
    "masked_tail": functools.partial(_auto_ws_program, masked_tail=True, sw_pipeline=False),
    "sw_pipeline": functools.partial(_auto_ws_program, masked_tail=False, sw_pipeline=True),
    "ws_explicit": functools.partial(
        _explicit_ws_program, overlap=False, masked_tail=False, heavy_first=False, pingpong=False
    ),
    "overlap": functools.partial(
        _explicit_ws_program, overlap=True, masked_tail=False, heavy_first=False, pingpong=False
    ),
    "overlap_masked_tail": functools.partial(
        _explicit_ws_program, overlap=True, masked_tail=True, heavy_first=True, pingpong=False
    ),
    "overlap_pingpong": functools.partial(
        _explicit_ws_program, overlap=True, masked_tail=True, heavy_first=True, pingpong=True
    ),
}


# Measured on the H200 (perf/results/): sw_pipeline fails fa_kernel.reference.judge on the
# odd shapes (and is slower); the sweep leaves it out unless named.
KNOWN_INCORRECT = frozenset({"sw_pipeline"})


def build(name: str, head_dim: int, causal: bool, dtype: str, config: TileConfig):
    """The PrimFunc of variant `name` (dtype "float16" or "bfloat16")."""
    return VARIANTS[name](head_dim=head_dim, causal=causal, dtype=dtype, config=config)


def compile_variant(name: str, head_dim: int, causal: bool, dtype: str, config: TileConfig, arch: str | None = None):
    """tilelang.compile of a variant with the shipped pass configs; arch None = this GPU."""
    target = "auto" if arch is None else {"kind": "cuda", "arch": arch}
    return tilelang.compile(build(name, head_dim, causal, dtype, config), target=target, pass_configs=PASS_CONFIGS)
