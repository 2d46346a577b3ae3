# mypy: disable-error-code="valid-type,index"
# (T.Tensor annotations are TileLang's kernel signature.)
"""The dK/dV kernel on a persistent grid whose producer warpgroup is its own (an A/B variant:
backward_program's `persistent`; docs/pending/README.md).

Each of H100_SM_COUNT blocks walks (K/V tile, K/V head, batch) items, K/V tile fastest. The
producer TMA-loads an item's K and V once the consumers' last GEMM of the item before has read
them (`kv_empty`), and each step's Q and dO, a panel at a time, into rings of `num_stages`
stages, storing the step's LSE₂ and Delta beside them (`q_full`/`q_empty` a stage; the ring's
count runs on across items). The consumers run backward_program's step (Pᵀ, dSᵀ, then
`gemms_dq_first`) and store dK and dV from registers while the producer loads the next item:
what a block of the shipped grid does alone, before and after its walk, runs here under the
neighbouring items' steps. Plain and causal attention only, dQ by bulk adds, 64 keys a warpgroup.
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations
# against this module's closure, which string annotations would hide.
from typing import Any, NamedTuple

import tilelang.language as T

from fa_kernel.gradient_parts import (
    CONSUMER_REGISTERS,
    CONSUMERS_BARRIER,
    PRODUCER_REGISTERS,
    tile_needs_mask,
)
from fa_kernel.pipeline import H100_SM_COUNT, PRODUCER_THREADS, TMA_PANEL
from fa_kernel.scheduler import KeyTile


class DkDvParts(NamedTuple):
    """What backward_program hands a walk of its own: the tile (head_dim, block_m, block_n,
    consumer threads, stages, dtype, dQ's fragment shape), its launch sizes (gradient_sizes'
    variables, which the visibility rule holds too), the kernel's signature (dQ_accum's
    shape, dK's shape and dtype, the variants' annotations), the launch's visibility rule, the
    K/V tile's walk of one head (its first query tile, and the end of the rows that see its keys,
    as functions of its first key and the rule), and the step's and the epilogue's macros."""

    tile: tuple
    sizes: tuple
    signature: tuple
    visibility: Any
    walk: tuple
    gemms_dq_first: Any
    store_key_tile: Any


def persistent_program(parts: DkDvParts):
    """The persistent dK/dV PrimFunc: backward_program's arguments at launch, less the
    heavy-first group (its items go by K/V tile fastest)."""
    head_dim, block_m, block_n, consumers, stages, dtype, dq_fragment = parts.tile
    dq_accum_shape, dk_shape, dk_dtype, window_left, window_right, softcap_log2 = parts.signature
    visibility, gemms_dq_first, store_key_tile = parts.visibility, parts.gemms_dq_first, parts.store_key_tile
    batch, seqlen_q, seqlen_q_padded, seqlen_k, heads, heads_kv = parts.sizes
    accum, dq_row, workers = T.float32, dq_accum_shape[-1], H100_SM_COUNT
    panels = head_dim // TMA_PANEL

    def ring_stage(ring, stage):
        return ring[stage * block_m : (stage + 1) * block_m, :]

    def item_of(item):
        """(K/V tile, K/V head, batch) of the item."""
        key_tiles = T.ceildiv(seqlen_k, block_n)
        return item % key_tiles, item // key_tiles % heads_kv, item // (key_tiles * heads_kv)

    first_query_tile, rows_end = parts.walk

    def walk_of(kv_tile):
        """(first query tile, query tiles) of the K/V tile's walk of one head."""
        first = first_query_tile(kv_tile * block_n, visibility)
        return first, T.max(T.ceildiv(rows_end(kv_tile * block_n, visibility), block_m) - first, 0)

    @T.macro
    def producer(rings, barriers, registers, Q, K, V, dO, LSE_log2, Delta, block, rounds, thread):
        """K and V an item, Q, dO, LSE₂ and Delta a step, each once the consumers released its buffer."""
        K_shared, V_shared, Q_ring, dO_ring, lse_ring, delta_ring = rings
        kv_full, kv_empty, q_full, q_empty = barriers
        steps_before, kv_tile, kv_head, b, first_q_block, q_blocks, head, q_start = registers
        T.set_max_nreg(PRODUCER_REGISTERS, 0)
        for item_round in T.serial(rounds):
            kv_tile, kv_head, b = item_of(block + item_round * workers)
            first_q_block, q_blocks = walk_of(kv_tile)
            T.mbarrier_wait_parity(kv_empty, (item_round & 1) ^ 1)
            for panel in T.unroll(panels):
                columns = slice(panel * TMA_PANEL, (panel + 1) * TMA_PANEL)
                rows = slice(kv_tile * block_n, kv_tile * block_n + block_n)
                T.tma_copy(K[b, rows, kv_head, columns], K_shared[:, columns], barrier=kv_full)
                T.tma_copy(V[b, rows, kv_head, columns], V_shared[:, columns], barrier=kv_full)
            T.mbarrier_arrive(kv_full)
            for step in T.serial(heads // heads_kv * q_blocks):
                head = kv_head * (heads // heads_kv) + step // q_blocks
                q_start = (first_q_block + step % q_blocks) * block_m
                stage = (steps_before + step) % stages
                T.mbarrier_wait_parity(q_empty[stage], (((steps_before + step) // stages) & 1) ^ 1)
                for panel in T.unroll(panels):
                    columns = slice(panel * TMA_PANEL, (panel + 1) * TMA_PANEL)
                    ring_rows, rows = (
                        slice(stage * block_m, stage * block_m + block_m),
                        slice(q_start, q_start + block_m),
                    )
                    T.tma_copy(Q[b, rows, head, columns], Q_ring[ring_rows, columns], barrier=q_full[stage])
                    T.tma_copy(dO[b, rows, head, columns], dO_ring[ring_rows, columns], barrier=q_full[stage])
                for row in T.serial(T.ceildiv(block_m, PRODUCER_THREADS)):
                    r = row * PRODUCER_THREADS + thread - consumers
                    if r < block_m:
                        lse_ring[stage * block_m + r] = LSE_log2[b, head, q_start + r]
                        delta_ring[stage * block_m + r] = Delta[b, head, q_start + r]
                T.mbarrier_arrive(q_full[stage])
            steps_before = steps_before + heads // heads_kv * q_blocks

    @T.macro
    def consumer_step(rings, fragments, stage, kv_start, q_start, b, head, dQ_shared, dQ_accum, scale_log2):
        """backward_program's step on the ring's stage: Sᵀ and dPᵀ, Pᵀ (the select where the tile
        needs one) and dSᵀ, then dV's, dQ's and dK's GEMMs and dQ's bulk add."""
        K_shared, V_shared, Q_ring, dO_ring, lse_ring, delta_ring, dS_shared = rings
        acc_s, acc_dp, p_cast, ds_cast, acc_dk, acc_dv, acc_dq = fragments
        policy = T.GemmWarpPolicy.FullRow
        T.wgmma_gemm(K_shared, ring_stage(Q_ring, stage), acc_s, transpose_B=True, policy=policy, clear_accum=True)
        T.wgmma_gemm(V_shared, ring_stage(dO_ring, stage), acc_dp, transpose_B=True, policy=policy, clear_accum=True)
        T.wait_wgmma(1)
        T.warpgroup_fence_operand(acc_s, num_regs=block_n * block_m // consumers)
        if tile_needs_mask(visibility, kv_start, q_start, block_n, block_m):
            for i, j in T.Parallel(block_n, block_m):
                visible = visibility.sees(kv_start + i, q_start + j, rows_checked=True)
                lse_j = lse_ring[stage * block_m + j]
                acc_s[i, j] = T.if_then_else(visible, T.exp2(acc_s[i, j] * scale_log2 - lse_j), 0)
        else:
            for i, j in T.Parallel(block_n, block_m):
                acc_s[i, j] = T.exp2(acc_s[i, j] * scale_log2 - lse_ring[stage * block_m + j])
        T.copy(acc_s, p_cast)
        T.wait_wgmma(0)
        T.warpgroup_fence_operand(acc_dp, num_regs=block_n * block_m // consumers)
        for i, j in T.Parallel(block_n, block_m):
            ds_cast[i, j] = acc_s[i, j] * (acc_dp[i, j] - delta_ring[stage * block_m + j])
        gemms_dq_first(
            p_cast, ds_cast, ring_stage(dO_ring, stage), ring_stage(Q_ring, stage), K_shared, dS_shared, acc_dv,
            acc_dk, acc_dq, dQ_shared, dQ_accum, b, head, q_start, False,
        )  # fmt: skip

    @T.macro
    def consumers_walk(rings, fragments, barriers, registers, dQ_shared, dQ_accum, dK, dV, scales, block, rounds):
        """Each item: dK and dV over its walk's steps, then stored while the producer loads on."""
        kv_full, kv_empty, q_full, q_empty = barriers
        steps_before, kv_tile, kv_head, b, first_q_block, q_blocks, head, q_start = registers
        acc_dk, acc_dv = fragments[4], fragments[5]
        T.set_max_nreg(CONSUMER_REGISTERS, 1)
        if T.get_thread_binding() == 0:  # dQ_shared's pad columns, added as zeros
            for i, j in T.grid(block_m, dq_row - head_dim):
                dQ_shared[i, head_dim + j] = 0
            T.fence_proxy_async()
        T.sync_threads(CONSUMERS_BARRIER, consumers)
        for item_round in T.serial(rounds):
            kv_tile, kv_head, b = item_of(block + item_round * workers)
            first_q_block, q_blocks = walk_of(kv_tile)
            T.clear(acc_dk)
            T.clear(acc_dv)
            T.mbarrier_wait_parity(kv_full, item_round & 1)
            for step in T.serial(heads // heads_kv * q_blocks):
                head = kv_head * (heads // heads_kv) + step // q_blocks
                q_start = (first_q_block + step % q_blocks) * block_m
                stage = (steps_before + step) % stages
                T.mbarrier_wait_parity(q_full[stage], ((steps_before + step) // stages) & 1)
                consumer_step(
                    rings, fragments, stage, kv_tile * block_n, q_start, b, head, dQ_shared, dQ_accum, scales[0]
                )
                T.mbarrier_arrive(q_empty[stage])
            T.mbarrier_arrive(kv_empty)
            steps_before = steps_before + heads // heads_kv * q_blocks
            tile = KeyTile(b, kv_head, kv_tile * block_n, None, visibility, None)
            store_key_tile(acc_dk, acc_dv, dK, dV, tile, scales[1])
        T.tma_store_wait(0)  # the last add has read dQ_shared before the block exits

    @T.prim_func
    def flash_attention_backward_persistent(
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
    ):
        with T.Kernel(workers, threads=consumers + PRODUCER_THREADS) as block:
            K_shared = T.alloc_shared([block_n, head_dim], dtype)
            V_shared = T.alloc_shared([block_n, head_dim], dtype)
            Q_ring = T.alloc_shared([stages * block_m, head_dim], dtype)
            dO_ring = T.alloc_shared([stages * block_m, head_dim], dtype)
            lse_ring = T.alloc_shared([stages * block_m], accum)
            delta_ring = T.alloc_shared([stages * block_m], accum)
            dS_shared = T.alloc_shared([block_n, block_m], dtype)
            dQ_shared = T.alloc_shared([block_m, dq_row], accum)
            acc_s = T.alloc_fragment([block_n, block_m], accum)
            acc_dp = T.alloc_fragment([block_n, block_m], accum)
            p_cast = T.alloc_fragment([block_n, block_m], dtype)
            ds_cast = T.alloc_fragment([block_n, block_m], dtype)
            acc_dk = T.alloc_fragment([block_n, head_dim], accum)
            acc_dv = T.alloc_fragment([block_n, head_dim], accum)
            acc_dq = T.alloc_fragment(dq_fragment, accum)
            # kv_full: K and V landed; kv_empty: every consumer's last GEMM of the item read them.
            # q_full[s], q_empty[s]: the same for stage s of Q, dO, LSE₂ and Delta.
            kv_full = T.alloc_barrier(PRODUCER_THREADS)
            kv_empty = T.alloc_barrier(consumers)
            q_full = T.alloc_barrier([PRODUCER_THREADS] * stages)
            q_empty = T.alloc_barrier([consumers] * stages)
            # The ring's count across items, and the item's and the step's, in registers (the
            # macros write them as buffers).
            steps_before = T.alloc_var(T.int32, init=0)
            kv_tile = T.alloc_var(T.int32)
            kv_head = T.alloc_var(T.int32)
            b = T.alloc_var(T.int32)
            first_q_block = T.alloc_var(T.int32)
            q_blocks = T.alloc_var(T.int32)
            head = T.alloc_var(T.int32)
            q_start = T.alloc_var(T.int32)
            registers = (
                steps_before.buffer, kv_tile.buffer, kv_head.buffer, b.buffer, first_q_block.buffer, q_blocks.buffer,
                head.buffer, q_start.buffer,
            )  # fmt: skip
            thread = T.get_thread_binding()
            rounds = T.ceildiv(T.max(T.ceildiv(seqlen_k, block_n) * heads_kv * batch - block, 0), workers)
            barriers = (kv_full, kv_empty, q_full, q_empty)
            if thread >= consumers:
                loaded = (K_shared, V_shared, Q_ring, dO_ring, lse_ring, delta_ring)
                producer(loaded, barriers, registers, Q, K, V, dO, LSE_log2, Delta, block, rounds, thread)
            else:
                rings = (K_shared, V_shared, Q_ring, dO_ring, lse_ring, delta_ring, dS_shared)
                fragments = (acc_s, acc_dp, p_cast, ds_cast, acc_dk, acc_dv, acc_dq)
                scales = (scale_log2, softmax_scale)
                consumers_walk(
                    rings, fragments, barriers, registers, dQ_shared, dQ_accum, dK, dV, scales, block, rounds
                )

    return flash_attention_backward_persistent
