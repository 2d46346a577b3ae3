# mypy: disable-error-code="valid-type"
# (T.Tensor(shape, dtype) annotations are TileLang's kernel signature, not Python types.)
"""The TileLang FlashAttention-2 forward kernel (Algorithm 1) and its compile cache.

One thread block owns `block_m` query rows of one (batch, head). It keeps that Q tile in
shared memory, walks the K/V sequence in tiles of `block_n` rows and keeps, per query row,
the running maximum score `row_max`, the running softmax denominator `row_sum` and the
unnormalised output `acc_o`, all in fp32. `emulator.py` is the same loop in plain torch.

Batch, both sequence lengths and both head counts are symbolic (`T.dynamic`), and the
softmax scale is a runtime argument: one compiled kernel serves every shape with the same
head_dim, so a compile happens once per (dtype, head_dim, causal, tile config, target).
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations
# against this module's closure, which string annotations would hide.
import functools
import math

import tilelang
import tilelang.language as T

from fa_kernel.configs import TileConfig

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)

DTYPES = {"float16": T.float16, "bfloat16": T.bfloat16}

PASS_CONFIGS = {
    # exp2 goes to the MUFU unit's ex2.approx; its relative error (2^-22) is far below the
    # fp16/bf16 rounding of P, the only down-cast in the algorithm.
    tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True,
}


def forward_program(
    *,
    head_dim: int,
    causal: bool,
    dtype: str,
    config: TileConfig,
):
    """The kernel as a TileLang PrimFunc.

    Arguments at launch: Q [B, Sq, H, D], K and V [B, Sk, Hkv, D], Output [B, Sq, H, D],
    LSE [B, H, Sq] (fp32, natural log) and scale_log2 = softmax_scale * log2(e).
    """
    batch, seqlen_q, seqlen_k, heads, heads_kv = T.dynamic("batch, seqlen_q, seqlen_k, heads, heads_kv")
    block_m, block_n = config.block_m, config.block_n
    dtype = DTYPES[dtype]
    accum = T.float32
    neg_inf = -T.infinity(accum)

    @T.prim_func
    def flash_attention_forward(
        Q: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        K: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        V: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        Output: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        LSE: T.Tensor([batch, heads, seqlen_q], accum),
        scale_log2: T.float32,
    ):
        with T.Kernel(T.ceildiv(seqlen_q, block_m), heads, batch, threads=config.threads) as (
            q_block,
            head,
            b,
        ):
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

            kv_head = head // (heads // heads_kv)  # GQA/MQA: a group of query heads shares a K/V head
            # Bottom-right causal alignment (flash-attn >= 2.1): query i sees key j <= i + offset.
            diagonal_offset = seqlen_k - seqlen_q
            q_start = q_block * block_m

            T.copy(Q[b, q_start : q_start + block_m, head, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(row_sum, 0)
            T.fill(row_max, neg_inf)

            num_kv_blocks = T.ceildiv(seqlen_k, block_n)
            if causal:
                # Tiles right of this block's last visible key are never loaded. At least one
                # tile is: a block whose rows all see no key (seqlen_q > seqlen_k) must still wait
                # for its Q load inside the loop, since a block that exits with a TMA load in
                # flight lets it land in the next block's shared memory. The mask zeroes that tile.
                last_visible = q_start + block_m + diagonal_offset
                num_kv_blocks = T.max(1, T.min(num_kv_blocks, T.ceildiv(last_visible, block_n)))

            for kv_block in T.Pipelined(num_kv_blocks, num_stages=config.num_stages):
                kv_start = kv_block * block_n
                T.copy(K[b, kv_start : kv_start + block_n, kv_head, :], K_shared)
                # The mask goes into the accumulator before the GEMM, which adds Q.K^T to it.
                for i, j in T.Parallel(block_m, block_n):
                    if causal:
                        acc_s[i, j] = T.if_then_else(
                            (kv_start + j > q_start + i + diagonal_offset) or (kv_start + j >= seqlen_k),
                            neg_inf,
                            0,
                        )
                    else:
                        acc_s[i, j] = T.if_then_else(kv_start + j >= seqlen_k, neg_inf, 0)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

                T.copy(row_max, row_max_prev)
                T.reduce_max(acc_s, row_max, dim=1, clear=False)
                for i in T.Parallel(block_m):
                    # A row that has seen only masked keys keeps max = -inf; 0 stands in so that
                    # exp2 below sees -inf - 0 = -inf (weight 0) instead of -inf + inf = NaN.
                    row_max_scaled[i] = T.if_then_else(row_max[i] == neg_inf, 0, row_max[i] * scale_log2)
                    alpha[i] = T.exp2(row_max_prev[i] * scale_log2 - row_max_scaled[i])
                for i, j in T.Parallel(block_m, block_n):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale_log2 - row_max_scaled[i])
                T.reduce_sum(acc_s, tile_sum, dim=1)
                for i in T.Parallel(block_m):
                    row_sum[i] = row_sum[i] * alpha[i] + tile_sum[i]
                T.copy(acc_s, acc_p)  # the only down-cast: P to the input dtype for the tensor cores

                # acc_o must be rescaled to the new max before P.V adds this tile's share.
                for i, d in T.Parallel(block_m, head_dim):
                    acc_o[i, d] *= alpha[i]
                T.copy(V[b, kv_start : kv_start + block_n, kv_head, :], V_shared)
                T.gemm(acc_p, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

            # One normalisation after the loop; a row that saw no key (causal, Sq > Sk) is 0.
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


@functools.cache
def compiled_forward(
    *,
    head_dim: int,
    causal: bool,
    dtype: str,
    config: TileConfig,
    arch: str | None = None,
):
    """The compiled kernel, cached in this process; TileLang's disk cache spans processes.

    `arch` None compiles for the current CUDA device; a name such as "sm_90a" compiles for
    that architecture without needing a GPU (nvcc only).
    """
    target = "auto" if arch is None else {"kind": "cuda", "arch": arch}
    program = forward_program(head_dim=head_dim, causal=causal, dtype=dtype, config=config)
    return tilelang.compile(program, target=target, pass_configs=PASS_CONFIGS)
