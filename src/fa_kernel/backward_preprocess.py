# mypy: disable-error-code="valid-type"
# (T.Tensor(shape, dtype) annotations are TileLang's kernel signature, not Python types.)
"""The backward's first kernel (FlashAttention-2's backward, step 1; backward.py has the rest):
per query row, D = rowsum(dO∘O) in fp32, and the forward's LSE in log2 units with +inf for a
row that saw no key, so that its P = 2^(S·scale_log2 − LSE₂) is 0, not 2^inf.
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations
# against this module's closure, which string annotations would hide.
import functools

import numpy as np
import tilelang.language as T

from fa_kernel.numerics import LOG2E
from fa_kernel.scheduler import at_offset, ragged_tile
from fa_kernel.toolchain import DTYPES, compile_program
from fa_kernel.variants import kernel_parameter

# Query rows per thread block of the preprocess: one row per thread. Delta and LSE₂ are written
# for seqlen_q rounded up to a multiple of it (`padded_rows`): the backward loads them by TMA,
# whose global strides must be multiples of 16 bytes, and whose boxes then never leave them.
PREPROCESS_ROWS = 128


def padded_rows(seqlen_q: int) -> int:
    """The length of Delta's and LSE₂'s last dimension for `seqlen_q` query rows."""
    return -(-seqlen_q // PREPROCESS_ROWS) * PREPROCESS_ROWS


def dq_row(head_dim: int) -> int:
    """The length of a row of dQ's fp32 accumulator, [B, H, padded_rows(Sq), dq_row(D)]: head_dim
    and 4 floats. A query tile's rows of it are one contiguous run, added from shared memory in
    one bulk copy, so shared memory holds its exact image; with 4 more floats a row, the rows of a
    wgmma fragment's column fall on different banks (ncu: 2-way conflicts on its stores, where
    unpadded rows would give 8-way; 8 floats measured within noise, perf/backward_ab.py)."""
    return head_dim + 4


# A ragged batch's Delta and LSE₂ hold each sequence's rows from a start of its own, a multiple
# of PREPROCESS_ROWS (FlashAttention-3's padded offsets): every query tile's TMA box then starts
# aligned, and its rows are read as in a batched launch (in pairs, not one float at a time).
def statistics_start(q_offset, sequence):
    """The first row of sequence `sequence` (its rows from q_offset in the packed tensors) in a
    ragged batch's Delta and LSE₂: past the rows and the padding of every sequence before it."""
    return (q_offset + sequence * PREPROCESS_ROWS) // PREPROCESS_ROWS * PREPROCESS_ROWS


def statistics_rows(total_q: int, batch: int) -> int:
    """The length of a ragged batch's Delta and LSE₂ rows (statistics_start's last sequence's
    rows, rounded up to whole tiles, end by then)."""
    return padded_rows(total_q) + batch * PREPROCESS_ROWS


def statistics_index(lengths_q: list[int]) -> np.ndarray:
    """Each packed query row's row in a ragged batch's Delta and LSE₂ (int64 [total_q])."""
    offsets = np.concatenate([[0], np.cumsum(lengths_q, dtype=np.int64)])
    starts = statistics_start(offsets[:-1], np.arange(len(lengths_q), dtype=np.int64))
    return np.arange(offsets[-1], dtype=np.int64) + np.repeat(starts - offsets[:-1], lengths_q)


def statistics_row(q_start, q_offset=None, sequence=None):
    """The row in Delta and LSE₂ of the query tile from q_start: its own in a batched launch (no
    sequence), else from its sequence's statistics_start."""
    return q_start if sequence is None else statistics_start(q_offset, sequence) + q_start


def preprocess_program(*, head_dim: int, dtype: str, varlen: bool = False):
    """D = rowsum(dO∘O) (fp32) and LSE₂ = LSE·log2(e), +inf where LSE is −inf, per query row.

    Arguments at launch: O and dO [B, Sq, H, D], LSE [B, H, Sq] (natural log, as the forward
    writes it), then the outputs Delta and LSE₂ [B, H, padded_rows(Sq)], fp32 (rows past Sq: 0).

    `varlen`: a ragged batch, packed, as a batch of one: O, dO [1, total_q, H, D], LSE [1, H,
    total_q], Delta and LSE₂ [1, H, statistics_rows(total_q, B)] (zeros where no row lands), then
    cu_seqlens_q (int32 [B + 1]) and the tile order of PREPROCESS_ROWS-row query tiles
    (scheduler.ragged_tile_order), the grid's first dimension. Sequence s's rows land from
    statistics_start.
    """
    batch, seqlen_q, seqlen_q_padded, heads = T.dynamic("batch, seqlen_q, seqlen_q_padded, heads")
    dtype = DTYPES[dtype]
    accum = T.float32
    rows = PREPROCESS_ROWS
    ragged_tiles, cu_len = T.dynamic("ragged_tiles, cu_len")
    cu_seqlens_q = T.Tensor([cu_len], T.int32) if varlen else None
    tile_order = T.Tensor([ragged_tiles, 2], T.int32) if varlen else None

    @T.prim_func
    def flash_attention_backward_preprocess(
        O: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        dO: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        LSE: T.Tensor([batch, heads, seqlen_q], accum),
        Delta: T.Tensor([batch, heads, seqlen_q_padded], accum),
        LSE_log2: T.Tensor([batch, heads, seqlen_q_padded], accum),
        CuSeqlensQ: kernel_parameter(cu_seqlens_q, varlen),
        TileOrder: kernel_parameter(tile_order, varlen),
    ):
        # A thread a row up to head_dim 128; two at 256, whose row alone would spill.
        threads = rows * max(1, head_dim // 128)
        grid = (ragged_tiles, heads, 1) if varlen else (T.ceildiv(seqlen_q, rows), heads, batch)
        with T.Kernel(*grid, threads=threads) as (q_block, head, b):
            o = T.alloc_fragment([rows, head_dim], dtype)
            do = T.alloc_fragment([rows, head_dim], dtype)
            products = T.alloc_fragment([rows, head_dim], accum)
            delta = T.alloc_fragment([rows], accum)
            lse = T.alloc_fragment([rows], accum)
            q_start, q_offset = q_block * rows, None
            if varlen:
                # The block's (sequence, query tile) from the tile order, and the sequence's rows
                # (its query cu_seqlens stand for the keys', which the preprocess has none of).
                ragged = ragged_tile(TileOrder, q_block, CuSeqlensQ, CuSeqlensQ)
                sequence, q_offset, k_offset, sequence_q, sequence_k, q_tile = ragged
                q_start = q_tile * rows
            T.copy(O[b, at_offset(q_offset, q_start) : at_offset(q_offset, q_start) + rows, head, :], o)
            T.copy(dO[b, at_offset(q_offset, q_start) : at_offset(q_offset, q_start) + rows, head, :], do)
            for i, j in T.Parallel(rows, head_dim):
                products[i, j] = T.Cast(accum, o[i, j]) * T.Cast(accum, do[i, j])
            T.reduce_sum(products, delta, dim=1)
            if not varlen:
                T.copy(delta, Delta[b, head, q_start : q_start + rows])
            T.copy(LSE[b, head, at_offset(q_offset, q_start) : at_offset(q_offset, q_start) + rows], lse)
            for i in T.Parallel(rows):
                lse[i] = T.if_then_else(lse[i] == -T.infinity(accum), T.infinity(accum), lse[i] * LOG2E)
            if varlen:
                # The sequence's own rows only: its padding stays 0 (finite, for the rows past its
                # end that a query tile reads), and the rows after it are the next sequence's.
                first = statistics_row(q_start, q_offset, sequence)
                for i in T.Parallel(rows):
                    if q_start + i < sequence_q:
                        Delta[b, head, first + i] = delta[i]
                        LSE_log2[b, head, first + i] = lse[i]
            else:
                T.copy(lse, LSE_log2[b, head, q_start : q_start + rows])

    return flash_attention_backward_preprocess


@functools.cache
def compiled_preprocess(*, head_dim: int, dtype: str, arch: str | None = None, varlen: bool = False):
    """The compiled preprocess, cached in this process (TileLang's disk cache spans processes)."""
    return compile_program(preprocess_program(head_dim=head_dim, dtype=dtype, varlen=varlen), arch)
