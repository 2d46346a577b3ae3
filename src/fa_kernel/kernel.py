# mypy: disable-error-code="valid-type"
# (T.Tensor(shape, dtype) annotations are TileLang's kernel signature, not Python types.)
"""The TileLang FlashAttention forward kernel for Hopper, and its compile cache.

FlashAttention-2's math (Algorithm 1): a thread block owns `block_m` query rows of one (batch,
head), keeps its Q tile in shared memory and walks the K/V tiles, with the online softmax of
softmax.py (fp32 row state, exp2, P the only down-cast, one normalisation) and the mask of
mask.py written into the score accumulator only in tiles that hold a hidden key. One departure,
exact in what it keeps: after the first tile a row keeps its max from before the tile while the
tile's row sum stays within STALE_SUM_LIMIT, and a warpgroup with a row over it issues S_j again.

FlashAttention-3's schedule: a TMA producer warpgroup fills a ring of K/V stages under mbarriers;
consumer warpgroups issue S_j = Q.K_j^T, then P_{j-1}.V_{j-1}, and run tile j's softmax under
that GEMM; two or three of them take turns on the tensor cores (`take_turns`); each visits only
the K/V tiles its rows see; causal blocks run heaviest first; a persistent grid walks the work
tiles in snake order, and can issue the next tile's first Q.K^T under this tile's epilogue
(`overlap_epilogue`); O leaves by TMA store from a buffer of its own where one fits, else from
the V ring. docs/design.md tells the whole argument and the measurements behind each choice.

`forward_program` reads top to bottom in named parts (tensors, mask, softmax, pipeline,
epilogue, tile scheduler, producer, the consumer's steps in the loop's order, the kernel); each
but the producer and the steps comes from the module its header names. T.alloc_var registers
reach the macros as buffers (`WorkTile`, `ConsumerRegisters`), so a macro's assignment is a
store. Sizes and the scale are runtime arguments: one compile per (dtype, head_dim, causal,
tile config, target).
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations
# against this module's closure, which string annotations would hide.
import dataclasses
import functools

import tilelang.language as T

from fa_kernel.configs import TileConfig
from fa_kernel.epilogue import epilogue_parts
from fa_kernel.mask import forward_score_parts, variant_visibility
from fa_kernel.numerics import STALE_SUM_LIMIT
from fa_kernel.pipeline import (
    H100_SM_COUNT,
    PRODUCER_REGISTERS,
    PRODUCER_THREADS,
    TURN_BARRIERS,
    VOTE_BARRIERS,
    WARPGROUP_ANY,
    ConsumerRegisters,
    Pipeline,
    WorkTile,
    consumer_registers,
    own_output_buffer,
    pipeline_parts,
)
from fa_kernel.scheduler import at_offset, ragged_tile, tile_scheduler
from fa_kernel.softmax import TANH_APPROX, RowState, online_softmax
from fa_kernel.toolchain import DTYPES, OWN_SYNCS, compile_program
from fa_kernel.variants import PLAIN, Variants, kernel_parameter

# Its own syncs (OUTPUT_BARRIERS): TileLang's would make every consumer warpgroup wait for the
# others at each work tile's end, where only the V ring needs it; mbarriers order the rest.
PASS_CONFIGS = OWN_SYNCS


def forward_program(
    *,
    head_dim: int,
    causal: bool,
    dtype: str,
    config: TileConfig,
    sm_count: int = H100_SM_COUNT,
    variants: Variants = PLAIN,
    varlen: bool = False,
    tanh_approx: bool = False,
):
    """The kernel as a TileLang PrimFunc.

    Arguments at launch: Q [B, Sq, H, D], K and V [B, Sk, Hkv, D], Output [B, Sq, H, D],
    LSE [B, H, Sq] (fp32, natural log) and scale_log2 = softmax_scale * log2(e); then those of
    the `variants` compiled in (variants.launch_arguments).

    `varlen`: a ragged batch, packed: Q and Output [total_q, H, D], K and V [total_k, Hkv, D],
    LSE [H, total_q]; after the variants', cu_seqlens_q and cu_seqlens_k (int32 [B + 1]), the
    max_seqlens and the tile order (int32 [tiles, 2] of (sequence, query block)), the grid's
    first dimension. Each sequence is attended on its own (its bottom-right diagonal and window).

    `tanh_approx`: the softcap's tanh by tanh.approx.f32, an A/B build option no table ships.
    """
    if tanh_approx and not variants.softcap:
        raise ValueError(f"tanh_approx: only a softcap build has a tanh, got variants {variants}")
    batch, seqlen_q, seqlen_k, heads, heads_kv = T.dynamic("batch, seqlen_q, seqlen_k, heads, heads_kv")
    if varlen:
        if config.persistent:
            raise ValueError(f"config: a ragged batch runs on the per-tile grid (persistent=False), got {config}")
        total_q, total_k, cu_len, ragged_tiles = T.dynamic("total_q, total_k, cu_len, ragged_tiles")
        batch = cu_len - 1
    block_m, block_n, stages = config.block_m, config.block_n, config.num_stages
    consumers = config.threads
    if consumers % 128 or not 128 <= consumers <= 384:
        raise ValueError(f"config.threads: expected 128, 256 or 384 consumer threads, got {consumers}")
    o_buffer = own_output_buffer(head_dim, config)
    if not o_buffer and block_m > stages * block_n:
        raise ValueError(
            f"config: the output tile ({block_m} rows) is staged in the V ring, which holds "
            f"num_stages * block_n = {stages * block_n} rows"
        )
    if config.overlap_epilogue and not config.persistent:
        raise ValueError("config.overlap_epilogue: needs persistent=True (the next work tile of a thread block)")
    overlap_epilogue = config.overlap_epilogue
    warpgroups = consumers // 128
    rows_per_warpgroup = block_m // warpgroups  # GemmWarpPolicy.FullRow: warpgroup w owns rows w * this..
    take_turns = config.take_turns and warpgroups > 1
    dtype = DTYPES[dtype]
    accum = T.float32
    neg_inf = -T.infinity(accum)
    # Per-thread registers of each wgmma accumulator, for the fences after each wait.
    s_regs = block_m * block_n // consumers
    o_regs = block_m * head_dim // consumers

    # ---- the tensors: batched, or a ragged batch's packed (`rows_of` takes b None for them) ----

    q_shape = [total_q, heads, head_dim] if varlen else [batch, seqlen_q, heads, head_dim]
    kv_shape = [total_k, heads_kv, head_dim] if varlen else [batch, seqlen_k, heads_kv, head_dim]
    lse_shape = [heads, total_q] if varlen else [batch, heads, seqlen_q]
    # Two annotations, not one object: TileLang would bind both parameters to one buffer.
    cu_seqlens_q = T.Tensor([cu_len], T.int32) if varlen else None
    cu_seqlens_k = T.Tensor([cu_len], T.int32) if varlen else None
    tile_order = T.Tensor([ragged_tiles, 2], T.int32) if varlen else None

    def batch_of(b):
        return None if varlen else b

    # ---- the mask (mask.py): the visibility rule with the variants' edges, written into the
    # score accumulator; each variant's value a kernel parameter only where compiled in ----

    visibility, window_left, window_right, softcap_log2 = variant_visibility(seqlen_q, seqlen_k, causal, variants)
    write_mask, issue_scores, capped_scores = forward_score_parts(
        block_m=block_m, block_n=block_n, softcap=variants.softcap, softcap_log2=softcap_log2, tanh_approx=tanh_approx
    )

    # ---- the online softmax (softmax.py): fp32 row state, exp2 with the scale folded in ----

    softmax = online_softmax(block_m, block_n, head_dim)

    # ---- the pipeline (pipeline.py): taking turns on the tensor cores, the K/V ring, O's way out ----

    wait_turn, pass_turn, ring_slot, ring_stage, load_tile, store_output, rows_of = pipeline_parts(
        head_dim=head_dim, block_n=block_n, stages=stages, consumers=consumers
    )

    # ---- the epilogue (epilogue.py): the sinks, one normalisation, the LSE, O's store ----

    epilogue = epilogue_parts(
        head_dim=head_dim, block_m=block_m, consumers=consumers, o_buffer=o_buffer,
        overlap_epilogue=overlap_epilogue, sinks=variants.sinks, varlen=varlen, softmax=softmax,
        store_output=store_output,
    )  # fmt: skip

    # ---- the tile scheduler (scheduler.py): each thread block's work tiles, and their K/V tiles ----

    schedule = tile_scheduler(
        batch=batch,
        heads=heads,
        heads_kv=heads_kv,
        visibility=visibility,
        config=config,
        rows_per_warpgroup=rows_per_warpgroup,
        sm_count=sm_count,
        ragged=varlen,
    )
    q_blocks, num_tiles, workers = schedule.q_blocks, schedule.num_tiles, schedule.workers
    place_in_round, work_tile, warpgroup_kv_blocks = (
        schedule.place_in_round, schedule.work_tile, schedule.warpgroup_kv_blocks
    )  # fmt: skip

    def without_max(rule, row_max, kv_start, row):
        """Whether a row takes the tile's max (the vote): it has none yet, and with a left edge its
        window reaches the tile (before, its scores are all hidden: nothing to take)."""
        if not visibility.limits_left:
            return row_max == neg_inf
        return T.And(row_max == neg_inf, rule.first_key(row) < kv_start + block_n)

    def walk_start(kv_first, kv_block):
        """The first key of a work tile's kv_block-th K/V tile (left edge: from its kv_first-th)."""
        return (kv_block if kv_first is None else kv_first + kv_block) * block_n

    # ---- the producer warpgroup ----

    @T.macro
    def producer(pipe, tile, kv_before: T.Ref, Q, K, V, block, rounds):
        """TMA loads of each work tile's Q and K/V tiles, never more than `stages` tiles ahead."""
        b, head, kv_head, q_start, num_kv_blocks = tile.registers()
        kv_first = tile.kv_first
        T.set_max_nreg(PRODUCER_REGISTERS, 0)
        for tile_round in T.serial(rounds):
            b, head, kv_head, q_start, num_kv_blocks = work_tile(block, tile_round, tile.rule)
            if visibility.limits_left:
                kv_first = schedule.first_kv_block(q_start, tile.rule)
            T.mbarrier_wait_parity(pipe.q_empty, (tile_round & 1) ^ 1)
            T.tma_copy(
                rows_of(Q, batch_of(b), at_offset(tile.q_offset, q_start), block_m, head), pipe.Q, barrier=pipe.q_full
            )
            T.mbarrier_arrive(pipe.q_full)
            for kv_block in T.serial(num_kv_blocks):
                stage, phase = ring_slot(kv_before + kv_block)
                kv_start = walk_start(kv_first, kv_block)
                key_row = at_offset(tile.k_offset, kv_start)
                load_tile(K, batch_of(b), key_row, kv_head, pipe.K, pipe.k_empty, pipe.k_full, stage, phase)
                if not o_buffer and kv_block == 0:
                    T.mbarrier_wait_parity(pipe.o_stored, (tile_round & 1) ^ 1)  # last tile's O
                load_tile(V, batch_of(b), key_row, kv_head, pipe.V, pipe.v_empty, pipe.v_full, stage, phase)
            kv_before = kv_before + num_kv_blocks

    # ---- the consumer warpgroups: one step per part of the loop, in its order ----

    @T.macro
    def first_scores_of_the_block(pipe, regs, tile, block):
        """overlap_epilogue: the first work tile's S_0; every later one is issued under the
        epilogue of the tile before it."""
        b, head, kv_head, q_start, num_kv_blocks = tile.registers()
        kv_first = tile.kv_first
        b, head, kv_head, q_start, num_kv_blocks = work_tile(block, 0, tile.rule)
        if visibility.limits_left:
            kv_first = schedule.first_kv_block(q_start, tile.rule)
        T.mbarrier_wait_parity(pipe.q_full, 0)
        T.mbarrier_wait_parity(pipe.k_full[0], 0)
        issue_scores(tile.rule, pipe.Q, ring_stage(pipe.K, 0), regs.acc_s, walk_start(kv_first, 0), q_start)

    @T.macro
    def start_work_tile(pipe, regs, tile, block, thread, tile_round):
        """The work tile's row state and Q, and (take_turns) warpgroup 0's first turn."""
        b, head, kv_head, q_start, num_kv_blocks = tile.registers()
        own_kv_blocks, kv_first = regs.own_kv_blocks, tile.kv_first
        if not overlap_epilogue:
            b, head, kv_head, q_start, num_kv_blocks = work_tile(block, tile_round, tile.rule)
            if visibility.limits_left:
                kv_first = schedule.first_kv_block(q_start, tile.rule)
            T.fill(regs.acc_o, 0)
        own_kv_blocks = warpgroup_kv_blocks(q_start, num_kv_blocks, thread // 128, kv_first, tile.rule)  # noqa: F841 (a register store)
        softmax.start_rows(regs.rows)
        if not overlap_epilogue:
            T.mbarrier_wait_parity(pipe.q_full, tile_round & 1)
        if take_turns:  # noqa: SIM102 - a Python (compile-time) test around a runtime one
            # The last warpgroup lets warpgroup 0 issue first. Each arrive has a matching
            # sync, by the next warpgroup in the ring (256 = the two warpgroups).
            if thread >= consumers - 128 and num_kv_blocks > 1:
                T.named_barrier_arrive(TURN_BARRIERS[0], 256)

    @T.macro
    def first_kv_tile(pipe, regs, tile, kv_before: T.Ref, scale_log2):
        """Tile 0: its scores and softmax; P~_0 waits in acc_p for the first P.V."""
        acc_s, acc_p, acc_o, q_start, own_kv_blocks = (
            regs.acc_s,
            regs.acc_p,
            regs.acc_o,
            tile.q_start,
            regs.own_kv_blocks,
        )
        kv_first = tile.kv_first
        kv_start = walk_start(kv_first, 0)
        first_stage = ring_slot(kv_before)[0]
        if not overlap_epilogue:
            T.mbarrier_wait_parity(pipe.k_full[first_stage], ring_slot(kv_before)[1])
            issue_scores(tile.rule, pipe.Q, ring_stage(pipe.K, first_stage), acc_s, kv_start, q_start)
        T.wait_wgmma(0)
        T.warpgroup_fence_operand(acc_s, num_regs=s_regs)
        if overlap_epilogue:
            # Only now: while a wgmma is in flight (S_0, issued in the last round), ptxas
            # keeps it asynchronous only if no other instruction writes an accumulator.
            T.fill(acc_o, 0)
        T.mbarrier_arrive(pipe.k_empty[first_stage])
        if own_kv_blocks == 1:
            T.mbarrier_arrive(pipe.q_empty)  # (as in kv_step)
        capped_scores(tile.rule, acc_s, kv_start, q_start)
        softmax.fold_tile(acc_s, regs.rows, scale_log2)
        T.copy(acc_s, acc_p)  # the only down-cast: P~ to the input dtype for the tensor cores

    @T.macro
    def kv_step(pipe, regs, tile, kv_before: T.Ref, thread, scale_log2, kv_block):
        """K/V tile j >= 1: S_j = Q.K_j^T issued, then P~_{j-1}.V_{j-1}; tile j's softmax
        against the max before it while that GEMM runs, and S_j again where a row's sum says
        the max moved too far."""
        acc_s, acc_p, acc_o, rows, row_over = regs.acc_s, regs.acc_p, regs.acc_o, regs.rows, regs.row_over
        q_start, num_kv_blocks, own_kv_blocks = tile.q_start, tile.num_kv_blocks, regs.own_kv_blocks
        stage, phase = ring_slot(kv_before + kv_block)
        prev_stage, prev_phase = ring_slot(kv_before + kv_block - 1)
        kv_first = tile.kv_first
        kv_start = walk_start(kv_first, kv_block)
        T.mbarrier_wait_parity(pipe.k_full[stage], phase)
        if take_turns:
            wait_turn(thread)
        issue_scores(tile.rule, pipe.Q, ring_stage(pipe.K, stage), acc_s, kv_start, q_start)
        T.mbarrier_wait_parity(pipe.v_full[prev_stage], prev_phase)
        T.wgmma_gemm(acc_p, ring_stage(pipe.V, prev_stage), acc_o, policy=T.GemmWarpPolicy.FullRow)
        if take_turns:
            pass_turn(thread, kv_block, num_kv_blocks)
        T.wait_wgmma(1)  # S_j is ready; P~_{j-1}.V_{j-1} may still be running
        T.warpgroup_fence_operand(acc_s, num_regs=s_regs)
        capped_scores(tile.rule, acc_s, kv_start, q_start)
        # P~_j against the max before tile j (STALE_SUM_LIMIT): no row max, no rescale.
        softmax.exponentials(acc_s, rows.row_max_scaled, rows.tile_sum, scale_log2)
        row_over = 0
        for i in T.Parallel(block_m):
            # A row with no max yet takes this tile's: its P~ could underflow (softmax.fold_tile).
            if T.Or(rows.tile_sum[i] > STALE_SUM_LIMIT, without_max(tile.rule, rows.row_max[i], kv_start, q_start + i)):
                row_over = 1
        T.wait_wgmma(0)  # P~_{j-1}.V_{j-1} is done: acc_p and acc_o may be overwritten
        T.warpgroup_fence_operand(acc_o, num_regs=o_regs)
        T.mbarrier_arrive(pipe.v_empty[prev_stage])
        # wgmma is warpgroup-wide: the warpgroup decides as one.
        if T.call_extern("int32", "warpgroup_any", VOTE_BARRIERS[0] + thread // 128, row_over) != 0:
            # A row's max moved too far: S_j again (Q and K_j are still in shared memory; the
            # same wgmma gives the same S), the online softmax for the rows over the limit,
            # and acc_o rescaled to their new max (P~_{j-1}.V_{j-1}, the last to add to it at
            # the old one, is done).
            issue_scores(tile.rule, pipe.Q, ring_stage(pipe.K, stage), acc_s, kv_start, q_start)
            T.wait_wgmma(0)
            T.warpgroup_fence_operand(acc_s, num_regs=s_regs)
            capped_scores(tile.rule, acc_s, kv_start, q_start)
            softmax.fold_tile(acc_s, rows, scale_log2, stale_sum=rows.tile_sum)
            softmax.rescale_output(acc_o, rows.alpha)
        else:
            for i in T.Parallel(block_m):
                rows.row_sum[i] += rows.tile_sum[i]
        T.mbarrier_arrive(pipe.k_empty[stage])
        if kv_block == own_kv_blocks - 1:
            # This warpgroup's last read of Q: the next work tile's Q loads under the tile's
            # last P.V and epilogue (persistent grid).
            T.mbarrier_arrive(pipe.q_empty)
        T.copy(acc_s, acc_p)

    @T.macro
    def last_kv_tile(pipe, regs, tile, next_tile, kv_before: T.Ref, block, rounds, tile_round):
        """The last tile's P~.V (acc_o is already at the last tile's reference max); under the
        overlapped epilogue, the next work tile's mask and S_0 with it."""
        acc_s, acc_p, acc_o, num_kv_blocks, own_kv_blocks = (
            regs.acc_s, regs.acc_p, regs.acc_o, tile.num_kv_blocks, regs.own_kv_blocks
        )  # fmt: skip
        next_b, next_head, next_kv_head, next_q_start, next_num_kv_blocks = next_tile.registers()
        next_kv_first = next_tile.kv_first
        last = kv_before + own_kv_blocks - 1  # counted over this thread block's life
        last_stage = ring_slot(last)[0]
        if overlap_epilogue:
            # acc_s is free (P~ is in acc_p): the next work tile's mask goes in now, as
            # nothing but its GEMM may write acc_s once that is in flight.
            next_b, next_head, next_kv_head, next_q_start, next_num_kv_blocks = work_tile(
                block, tile_round + 1, next_tile.rule
            )
            if visibility.limits_left:
                next_kv_first = schedule.first_kv_block(next_q_start, next_tile.rule)
            next_start = walk_start(next_kv_first, 0)
            if not variants.softcap and next_tile.rule.tile_needs_mask(next_start, block_n, next_q_start, block_m):
                write_mask(next_tile.rule, acc_s, next_start, next_q_start)
        T.mbarrier_wait_parity(pipe.v_full[last_stage], ring_slot(last)[1])
        T.wgmma_gemm(acc_p, ring_stage(pipe.V, last_stage), acc_o, policy=T.GemmWarpPolicy.FullRow)
        if overlap_epilogue:
            # The next work tile's S_0, so this tile's epilogue runs under it. The last round
            # issues it too, on whatever Q and K are in shared memory (no more loads come), and
            # drops it: a guarded issue makes ptxas serialise the wgmmas of the whole loop.
            next_first = kv_before + num_kv_blocks
            if tile_round + 1 < rounds:
                T.mbarrier_wait_parity(pipe.q_full, (tile_round + 1) & 1)
                T.mbarrier_wait_parity(pipe.k_full[ring_slot(next_first)[0]], ring_slot(next_first)[1])
            issue_scores(
                next_tile.rule,
                pipe.Q,
                ring_stage(pipe.K, ring_slot(next_first)[0]),
                acc_s,
                walk_start(next_kv_first, 0),
                next_q_start,
                mask_written=True,
            )
            T.wait_wgmma(1)
        else:
            T.wait_wgmma(0)
        T.warpgroup_fence_operand(acc_o, num_regs=o_regs)
        T.mbarrier_arrive(pipe.v_empty[last_stage])

    @T.macro
    def release_unread_tiles(pipe, regs, tile, kv_before: T.Ref, thread):
        """The tiles past this warpgroup's rows, which the block's later rows visit: released
        unread, each once it has landed (an arrive before would count toward the stage's
        previous phase), with the turn passed on, so that the ring of stages and the turn
        order run on as if it had visited them. Only after its last P.V has released V: the
        producer loads one of them into that stage."""
        num_kv_blocks, own_kv_blocks = tile.num_kv_blocks, regs.own_kv_blocks
        for kv_block in T.serial(own_kv_blocks, num_kv_blocks):
            stage, phase = ring_slot(kv_before + kv_block)
            T.mbarrier_wait_parity(pipe.k_full[stage], phase)
            if take_turns:
                wait_turn(thread)
                pass_turn(thread, kv_block, num_kv_blocks)
            T.mbarrier_arrive(pipe.k_empty[stage])
            T.mbarrier_wait_parity(pipe.v_full[stage], phase)
            T.mbarrier_arrive(pipe.v_empty[stage])

    @T.macro
    def advance(tile, next_tile):
        """overlap_epilogue: the next work tile, computed under this one's last P.V, becomes current."""
        b, head, kv_head, q_start, num_kv_blocks = tile.registers()
        next_b, next_head, next_kv_head, next_q_start, next_num_kv_blocks = next_tile.registers()
        b, head, kv_head, q_start, num_kv_blocks = (next_b, next_head, next_kv_head, next_q_start, next_num_kv_blocks)  # noqa: F841
        if visibility.limits_left:
            kv_first, next_kv_first = tile.kv_first, next_tile.kv_first
            kv_first = next_kv_first  # noqa: F841

    # ---- the kernel: shared memory, registers, and who runs which part ----

    def buffer_of(register):
        return None if register is None else register.buffer

    prelude = WARPGROUP_ANY + (TANH_APPROX if tanh_approx else "")

    @T.prim_func
    def flash_attention_forward(
        Q: T.Tensor(q_shape, dtype),
        K: T.Tensor(kv_shape, dtype),
        V: T.Tensor(kv_shape, dtype),
        Output: T.Tensor(q_shape, dtype),
        LSE: T.Tensor(lse_shape, accum),
        scale_log2: T.float32,
        window_left: window_left,
        window_right: window_right,
        softcap_log2: softcap_log2,  # 2·log2e·scale / c
        Sinks: kernel_parameter(T.Tensor([heads], accum), variants.sinks),
        CuSeqlensQ: kernel_parameter(cu_seqlens_q, varlen),
        CuSeqlensK: kernel_parameter(cu_seqlens_k, varlen),
        max_seqlen_q: kernel_parameter(seqlen_q, varlen),
        max_seqlen_k: kernel_parameter(seqlen_k, varlen),
        TileOrder: kernel_parameter(tile_order, varlen),
    ):
        grid = (
            (workers, 1, 1) if config.persistent else (ragged_tiles, heads, 1) if varlen else (q_blocks, heads, batch)
        )
        with T.Kernel(*grid, threads=consumers + PRODUCER_THREADS, prelude=prelude) as block:
            if config.blocks_per_sm > 1:
                # __launch_bounds__(threads, 2): ptxas budgets registers for two resident
                # blocks (the config's tiles keep shared memory within half an SM), so one
                # block's prologue and epilogue run beside the other's loop.
                T.annotate_min_blocks_per_sm(config.blocks_per_sm)
            Q_shared = T.alloc_shared([block_m, head_dim], dtype)
            # Rings of `stages` K and V tiles, stacked by rows (ring_stage).
            K_shared = T.alloc_shared([stages * block_n, head_dim], dtype)
            V_shared = T.alloc_shared([stages * block_n, head_dim], dtype)
            # The output tile leaves through a buffer of its own where shared memory has room
            # (own_output_buffer), else through the V ring's first block_m rows (FlashAttention-3
            # does the same; at head_dim 128 the 128x176 tiles leave no room): Q's buffer already
            # holds the next work tile's Q by then. The producer then loads no V of the next work
            # tile until O has left (o_stored).
            O_shared = T.alloc_shared([block_m, head_dim], dtype) if o_buffer else None
            acc_s = T.alloc_fragment([block_m, block_n], accum)
            acc_p = T.alloc_fragment([block_m, block_n], dtype)
            acc_o = T.alloc_fragment([block_m, head_dim], accum)
            rows = RowState.allocate(block_m)
            row_over = T.alloc_var(T.int32)  # this thread has a row whose sum is over STALE_SUM_LIMIT
            # full[stage]: the producer's threads arrived and the TMA bytes landed;
            # empty[stage]: every consumer thread is done reading the buffer. q_empty: every
            # consumer's last Q.K^T of the work tile is done, the next tile's Q may land.
            # o_stored (O staged in the V ring): O has been read out to global memory.
            q_full = T.alloc_barrier(PRODUCER_THREADS)
            q_empty = T.alloc_barrier(consumers)
            o_stored = T.alloc_barrier(consumers) if not o_buffer else None
            k_full = T.alloc_barrier([PRODUCER_THREADS] * stages)
            k_empty = T.alloc_barrier([consumers] * stages)
            v_full = T.alloc_barrier([PRODUCER_THREADS] * stages)
            v_empty = T.alloc_barrier([consumers] * stages)
            # K/V tiles this thread block went through before the current work tile: the ring
            # of stages, and the mbarriers' phases with it, run on across work tiles.
            kv_before = T.alloc_var(T.int32, init=0)
            # The current work tile, computed once per tile: left as expressions, its integer
            # divisions would be recomputed inside the loops (and the mask) that use them.
            b = T.alloc_var(T.int32)
            head = T.alloc_var(T.int32)
            kv_head = T.alloc_var(T.int32)
            q_start = T.alloc_var(T.int32)
            num_kv_blocks = T.alloc_var(T.int32)
            kv_first = T.alloc_var(T.int32) if visibility.limits_left else None
            own_kv_blocks = T.alloc_var(T.int32)  # of those, the ones this warpgroup's rows see
            # The next one, known before the current tile's epilogue (overlap_epilogue).
            next_b = T.alloc_var(T.int32)
            next_head = T.alloc_var(T.int32)
            next_kv_head = T.alloc_var(T.int32)
            next_q_start = T.alloc_var(T.int32)
            next_num_kv_blocks = T.alloc_var(T.int32)
            next_kv_first = T.alloc_var(T.int32) if visibility.limits_left and overlap_epilogue else None

            thread = T.get_thread_binding()
            # Work tiles of this thread block: every full round, and the last, partial one if
            # its place there holds a tile. (One in the per-tile grid: a loop of one trip, which
            # the compiler removes.)
            rounds = 1
            if config.persistent:
                place_in_last = place_in_round(block[0], num_tiles // workers)
                rounds = num_tiles // workers + T.if_then_else(place_in_last < num_tiles % workers, 1, 0)
            # A ragged batch: the block's (sequence, query block) from the tile order, as the
            # scheduler's (query block, head, sequence); the sequence's offsets and lengths.
            rule, q_offset, k_offset = visibility, None, None
            if varlen:
                ragged = ragged_tile(TileOrder, block[0], CuSeqlensQ, CuSeqlensK)
                sequence, q_offset, k_offset, sequence_q, sequence_k = ragged[:5]
                rule = dataclasses.replace(visibility, seqlen_q=sequence_q, seqlen_k=sequence_k)
                # The order's query block unnamed: a name given a load becomes a variable of its own.
                block = (ragged[5], block[1], sequence)

            pipe = Pipeline(
                Q_shared, K_shared, V_shared, O_shared, q_full, q_empty, o_stored, k_full, k_empty, v_full, v_empty
            )
            # The macros take T.alloc_var registers as their buffers (.buffer), to write them.
            tile = WorkTile(
                b.buffer,
                head.buffer,
                kv_head.buffer,
                q_start.buffer,
                num_kv_blocks.buffer,
                buffer_of(kv_first),
                rule,
                q_offset,
                k_offset,
            )
            next_tile = WorkTile(
                next_b.buffer,
                next_head.buffer,
                next_kv_head.buffer,
                next_q_start.buffer,
                next_num_kv_blocks.buffer,
                buffer_of(next_kv_first),
                visibility,
            )
            regs = ConsumerRegisters(acc_s, acc_p, acc_o, rows, row_over.buffer, own_kv_blocks.buffer)
            if thread >= consumers:
                producer(pipe, tile, kv_before, Q, K, V, block, rounds)
            else:
                # The FlashAttention loop, over each work tile of this thread block.
                T.set_max_nreg(consumer_registers(consumers, config.blocks_per_sm), 1)
                if overlap_epilogue:
                    first_scores_of_the_block(pipe, regs, tile, block)
                for tile_round in T.serial(rounds):
                    start_work_tile(pipe, regs, tile, block, thread, tile_round)
                    first_kv_tile(pipe, regs, tile, kv_before, scale_log2)
                    for kv_block in T.serial(1, own_kv_blocks):
                        kv_step(pipe, regs, tile, kv_before, thread, scale_log2, kv_block)
                    last_kv_tile(pipe, regs, tile, next_tile, kv_before, block, rounds, tile_round)
                    if not overlap_epilogue:
                        release_unread_tiles(pipe, regs, tile, kv_before, thread)
                    epilogue(pipe, regs, tile, LSE, Output, Sinks, thread)
                    kv_before = kv_before + num_kv_blocks
                    if overlap_epilogue:
                        advance(tile, next_tile)
                if overlap_epilogue:
                    T.wait_wgmma(0)  # the last round's S_0, dropped
                if o_buffer:
                    T.tma_store_wait(0)  # the last O stores read shared memory before the block exits

    return flash_attention_forward


@functools.cache
def compiled_forward(
    *,
    head_dim: int,
    causal: bool,
    dtype: str,
    config: TileConfig,
    arch: str | None = None,
    sm_count: int = H100_SM_COUNT,
    variants: Variants = PLAIN,
    varlen: bool = False,
    tanh_approx: bool = False,
):
    """The compiled kernel, cached in this process; TileLang's disk cache spans processes.

    `arch` None compiles for the current CUDA device; a name such as "sm_90a" compiles for
    that architecture without needing a GPU (nvcc only).
    """
    program = forward_program(
        head_dim=head_dim,
        causal=causal,
        dtype=dtype,
        config=config,
        sm_count=sm_count,
        variants=variants,
        varlen=varlen,
        tanh_approx=tanh_approx,
    )
    return compile_program(program, arch, PASS_CONFIGS)
