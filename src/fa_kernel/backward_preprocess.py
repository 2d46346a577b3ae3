# mypy: disable-error-code="valid-type"
# (T.Tensor(shape, dtype) annotations are TileLang's kernel signature, not Python types.)
"""The backward's first kernel (FlashAttention-2's backward, step 1; backward.py has the rest):
per query row, D = rowsum(dO∘O) in fp32, and the forward's LSE in log2 units with +inf for a
row that saw no key, so that its P = 2^(S·scale_log2 − LSE₂) is 0, not 2^inf.
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations
# against this module's closure, which string annotations would hide.
import functools

import tilelang.language as T

from fa_kernel.numerics import LOG2E
from fa_kernel.toolchain import DTYPES, compile_program

# Query rows per thread block of the preprocess: one row per thread. Delta and LSE₂ are written
# for seqlen_q rounded up to a multiple of it (`padded_rows`): the backward loads them by TMA,
# whose global strides must be multiples of 16 bytes, and whose boxes then never leave them.
PREPROCESS_ROWS = 128


def padded_rows(seqlen_q: int) -> int:
    """The length of Delta's and LSE₂'s last dimension for `seqlen_q` query rows."""
    return -(-seqlen_q // PREPROCESS_ROWS) * PREPROCESS_ROWS


def preprocess_program(*, head_dim: int, dtype: str):
    """D = rowsum(dO∘O) (fp32) and LSE₂ = LSE·log2(e), +inf where LSE is −inf, per query row.

    Arguments at launch: O and dO [B, Sq, H, D], LSE [B, H, Sq] (natural log, as the forward
    writes it), then the outputs Delta and LSE₂ [B, H, padded_rows(Sq)], fp32 (rows past Sq: 0).
    """
    batch, seqlen_q, seqlen_q_padded, heads = T.dynamic("batch, seqlen_q, seqlen_q_padded, heads")
    dtype = DTYPES[dtype]
    accum = T.float32
    rows = PREPROCESS_ROWS

    @T.prim_func
    def flash_attention_backward_preprocess(
        O: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        dO: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        LSE: T.Tensor([batch, heads, seqlen_q], accum),
        Delta: T.Tensor([batch, heads, seqlen_q_padded], accum),
        LSE_log2: T.Tensor([batch, heads, seqlen_q_padded], accum),
    ):
        # A thread a row up to head_dim 128; two at 256, whose row alone would spill.
        threads = rows * max(1, head_dim // 128)
        with T.Kernel(T.ceildiv(seqlen_q, rows), heads, batch, threads=threads) as (q_block, head, b):
            o = T.alloc_fragment([rows, head_dim], dtype)
            do = T.alloc_fragment([rows, head_dim], dtype)
            products = T.alloc_fragment([rows, head_dim], accum)
            delta = T.alloc_fragment([rows], accum)
            lse = T.alloc_fragment([rows], accum)
            q_start = q_block * rows
            T.copy(O[b, q_start : q_start + rows, head, :], o)
            T.copy(dO[b, q_start : q_start + rows, head, :], do)
            for i, j in T.Parallel(rows, head_dim):
                products[i, j] = T.Cast(accum, o[i, j]) * T.Cast(accum, do[i, j])
            T.reduce_sum(products, delta, dim=1)
            T.copy(delta, Delta[b, head, q_start : q_start + rows])
            T.copy(LSE[b, head, q_start : q_start + rows], lse)
            for i in T.Parallel(rows):
                lse[i] = T.if_then_else(lse[i] == -T.infinity(accum), T.infinity(accum), lse[i] * LOG2E)
            T.copy(lse, LSE_log2[b, head, q_start : q_start + rows])

    return flash_attention_backward_preprocess


@functools.cache
def compiled_preprocess(*, head_dim: int, dtype: str, arch: str | None = None):
    """The compiled preprocess, cached in this process (TileLang's disk cache spans processes)."""
    return compile_program(preprocess_program(head_dim=head_dim, dtype=dtype), arch)
