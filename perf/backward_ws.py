# mypy: disable-error-code="valid-type"
"""A hand warp-specialised backward kernel (a prototype for measurement, perf/backward_ab.py's
`hand_ws`): the math of `fa_kernel.backward.backward_program`, on FlashAttention-3's schedule.

The shipped kernel leaves the schedule to TileLang's pipelining (a producer warpgroup it adds,
every GEMM waited for before the next one starts). Here the producer warpgroup is written out
(TMA loads of each query tile's Q, dO, LSE₂ and Delta into a ring of `stages`, full/empty
mbarriers), and the two consumer warpgroups issue their GEMMs asynchronously:

    Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ issued together; Pᵀ from Sᵀ while dPᵀ runs;
    dV += Pᵀ·dO issued; dSᵀ = Pᵀ∘(dPᵀ − D) while it runs;
    dK += dSᵀ·Q and dQ = dS·K issued (dS through shared memory, both warpgroups' keys);
    one wait; the ring stage released; dQ reduce-added into its fp32 accumulator by TMA.

The release comes after the wait for every GEMM that reads the stage: TileLang's pipelining
cannot place it there for an asynchronous GEMM. Same launch signature and semantics as the
shipped main kernel (`compiled_backward(...)(q, k, v, dout, delta, lse_log2, dq_accum, dk, dv,
scale_log2, softmax_scale)`), head_dim 64 and 128.
"""

import functools

import tilelang.language as T

from fa_kernel.backward import BACKWARD_TILES, DTYPES, _compile, gradient_sizes, sees

PRODUCER_THREADS = 128
PRODUCER_REGISTERS = 24
CONSUMER_REGISTERS = 240
CONSUMERS = 256  # two warpgroups, each 64 of the K/V tile's 128 keys
TMA_PANEL = 64  # columns per TMA box: the 128-byte swizzle's width
DS_BARRIER = 7  # named barrier: both consumer warpgroups' dS rows are in shared memory


def backward_ws_program(
    *,
    head_dim: int,
    causal: bool,
    dtype: str,
    block_m: int,
    block_n: int,
    num_stages: int = 2,
    rows_bottom_up: bool = False,
):
    batch, seqlen_q, seqlen_q_padded, seqlen_k, heads, heads_kv = gradient_sizes(block_m)
    dtype = DTYPES[dtype]
    accum = T.float32
    stages = num_stages
    s_regs = block_n * block_m // CONSUMERS
    dkv_regs = block_n * head_dim // CONSUMERS
    dq_regs = block_m * head_dim // CONSUMERS

    def ring_slot(count):
        return count % stages, (count // stages) & 1

    def panel(index):
        return slice(index * TMA_PANEL, (index + 1) * TMA_PANEL)

    def query_tile(step, kv_head, group_size, first_q_block, q_blocks):
        """(query head, first row) of the block's step-th query tile: the group's heads in turn,
        each head's tiles top-down (or bottom-up), as the producer loads them."""
        q_tile = step % q_blocks
        if rows_bottom_up:
            q_tile = q_blocks - 1 - q_tile
        return kv_head * group_size + step // q_blocks, (first_q_block + q_tile) * block_m

    def ring_stage(ring, stage):
        """Stage `stage` of a query-tile ring (a region, passed straight to a GEMM: TileLang
        would take a name bound to it inside the kernel for a whole-buffer value)."""
        return ring[stage * block_m : (stage + 1) * block_m, :]

    @T.prim_func
    def flash_attention_backward_ws(
        Q: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        K: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        V: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        dO: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        Delta: T.Tensor([batch, heads, seqlen_q_padded], accum),
        LSE_log2: T.Tensor([batch, heads, seqlen_q_padded], accum),
        dQ_accum: T.Tensor([batch, heads, seqlen_q, head_dim], accum),
        dK: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        dV: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        scale_log2: T.float32,
        softmax_scale: T.float32,
    ):
        grid = (T.ceildiv(seqlen_k, block_n), heads_kv, batch)
        with T.Kernel(*grid, threads=CONSUMERS + PRODUCER_THREADS) as (kv_block, kv_head, b):
            K_shared = T.alloc_shared([block_n, head_dim], dtype)
            V_shared = T.alloc_shared([block_n, head_dim], dtype)
            # Rings of `stages` query tiles, stacked by rows.
            Q_ring = T.alloc_shared([stages * block_m, head_dim], dtype)
            dO_ring = T.alloc_shared([stages * block_m, head_dim], dtype)
            lse_ring = T.alloc_shared([stages * block_m], accum)
            delta_ring = T.alloc_shared([stages * block_m], accum)
            dS_shared = T.alloc_shared([block_n, block_m], dtype)
            dQ_shared = T.alloc_shared([block_m, head_dim], accum)
            acc_s = T.alloc_fragment([block_n, block_m], accum)  # Sᵀ, then Pᵀ
            acc_dp = T.alloc_fragment([block_n, block_m], accum)  # dPᵀ
            p_cast = T.alloc_fragment([block_n, block_m], dtype)
            ds_cast = T.alloc_fragment([block_n, block_m], dtype)
            acc_dk = T.alloc_fragment([block_n, head_dim], accum)
            acc_dv = T.alloc_fragment([block_n, head_dim], accum)
            acc_dq = T.alloc_fragment([block_m, head_dim], accum)
            kv_full = T.alloc_barrier(PRODUCER_THREADS)
            q_full = T.alloc_barrier([PRODUCER_THREADS] * stages)
            q_empty = T.alloc_barrier([CONSUMERS] * stages)

            thread = T.get_thread_binding()
            group_size = heads // heads_kv
            kv_start = kv_block * block_n
            diagonal_offset = seqlen_k - seqlen_q
            # Causal: rows before the first that sees this tile's first key add nothing.
            first_q_block = T.max(kv_start - diagonal_offset, 0) // block_m if causal else 0
            q_blocks = T.max(T.ceildiv(seqlen_q, block_m) - first_q_block, 0)
            steps = group_size * q_blocks

            if thread >= CONSUMERS:
                T.set_max_nreg(PRODUCER_REGISTERS, 0)
                for index in T.unroll(head_dim // TMA_PANEL):
                    T.tma_copy(
                        K[b, kv_start : kv_start + block_n, kv_head, panel(index)],
                        K_shared[:, panel(index)],
                        barrier=kv_full,
                    )
                    T.tma_copy(
                        V[b, kv_start : kv_start + block_n, kv_head, panel(index)],
                        V_shared[:, panel(index)],
                        barrier=kv_full,
                    )
                T.mbarrier_arrive(kv_full)
                for step in T.serial(steps):
                    stage, phase = ring_slot(step)
                    head, q_start = query_tile(step, kv_head, group_size, first_q_block, q_blocks)
                    rows = slice(stage * block_m, (stage + 1) * block_m)
                    T.mbarrier_wait_parity(q_empty[stage], phase ^ 1)
                    for index in T.unroll(head_dim // TMA_PANEL):
                        T.tma_copy(
                            Q[b, q_start : q_start + block_m, head, panel(index)],
                            Q_ring[rows, panel(index)],
                            barrier=q_full[stage],
                        )
                        T.tma_copy(
                            dO[b, q_start : q_start + block_m, head, panel(index)],
                            dO_ring[rows, panel(index)],
                            barrier=q_full[stage],
                        )
                    T.tma_copy(LSE_log2[b, head, q_start : q_start + block_m], lse_ring[rows], barrier=q_full[stage])
                    T.tma_copy(Delta[b, head, q_start : q_start + block_m], delta_ring[rows], barrier=q_full[stage])
                    T.mbarrier_arrive(q_full[stage])
            else:
                T.set_max_nreg(CONSUMER_REGISTERS, 1)
                T.clear(acc_dk)
                T.clear(acc_dv)
                T.mbarrier_wait_parity(kv_full, 0)
                for step in T.serial(steps):
                    stage, phase = ring_slot(step)
                    head, q_start = query_tile(step, kv_head, group_size, first_q_block, q_blocks)
                    T.mbarrier_wait_parity(q_full[stage], phase)
                    # Sᵀ and dPᵀ together; Pᵀ below runs while dPᵀ is on the tensor cores.
                    scores = dict(transpose_B=True, policy=T.GemmWarpPolicy.FullRow, clear_accum=True)
                    T.wgmma_gemm(K_shared, ring_stage(Q_ring, stage), acc_s, **scores)
                    T.wgmma_gemm(V_shared, ring_stage(dO_ring, stage), acc_dp, **scores)
                    T.wait_wgmma(1)
                    T.warpgroup_fence_operand(acc_s, num_regs=s_regs)
                    for i, j in T.Parallel(block_n, block_m):
                        visible = sees(kv_start + i, q_start + j, seqlen_q, seqlen_k, causal)
                        acc_s[i, j] = T.if_then_else(
                            visible, T.exp2(acc_s[i, j] * scale_log2 - lse_ring[stage * block_m + j]), 0
                        )
                    T.copy(acc_s, p_cast)
                    T.wait_wgmma(0)
                    T.warpgroup_fence_operand(acc_dp, num_regs=s_regs)
                    T.wgmma_gemm(p_cast, ring_stage(dO_ring, stage), acc_dv, policy=T.GemmWarpPolicy.FullRow)
                    for i, j in T.Parallel(block_n, block_m):
                        ds_cast[i, j] = acc_s[i, j] * (acc_dp[i, j] - delta_ring[stage * block_m + j])
                    T.wgmma_gemm(ds_cast, ring_stage(Q_ring, stage), acc_dk, policy=T.GemmWarpPolicy.FullRow)
                    T.copy(ds_cast, dS_shared)
                    T.fence_proxy_async()
                    T.sync_threads(DS_BARRIER, CONSUMERS)
                    T.wgmma_gemm(dS_shared, K_shared, acc_dq, transpose_A=True, clear_accum=True)
                    T.wait_wgmma(0)
                    T.warpgroup_fence_operand(acc_dv, num_regs=dkv_regs)
                    T.warpgroup_fence_operand(acc_dk, num_regs=dkv_regs)
                    T.warpgroup_fence_operand(acc_dq, num_regs=dq_regs)
                    T.mbarrier_arrive(q_empty[stage])
                    T.copy(acc_dq, dQ_shared)
                    T.atomic_add(dQ_accum[b, head, q_start : q_start + block_m, :], dQ_shared, use_tma=True)
                for i, j in T.Parallel(block_n, head_dim):
                    acc_dk[i, j] = acc_dk[i, j] * softmax_scale
                T.copy(acc_dk, dK[b, kv_start : kv_start + block_n, kv_head, :])
                T.copy(acc_dv, dV[b, kv_start : kv_start + block_n, kv_head, :])

    return flash_attention_backward_ws


@functools.cache
def compiled_backward_ws(
    *, head_dim: int, causal: bool, dtype: str, arch: str | None = None, rows_bottom_up: bool = False
):
    """The compiled prototype, on the shipped kernel's tiles (BACKWARD_TILES)."""
    block_m, block_n, num_stages = BACKWARD_TILES[head_dim]
    program = backward_ws_program(
        head_dim=head_dim,
        causal=causal,
        dtype=dtype,
        block_m=block_m,
        block_n=block_n,
        num_stages=num_stages,
        rows_bottom_up=rows_bottom_up,
    )
    return _compile(program, arch)
