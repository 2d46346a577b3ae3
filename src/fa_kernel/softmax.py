"""The online softmax, FlashAttention-2's: per query row a running max and a running sum in fp32,
exponentials by exp2 with the scale folded in (scale_log2 = softmax_scale * log2(e)), P~ cast
to the input dtype only for P.V, and one normalisation after the last tile. The forward and
split-KV kernels build theirs from these parts (`emulator.py` is the same math in torch).

A row that has seen only hidden keys keeps max = -inf: 0 stands in for its scaled max, so that
exp2 sees -inf - 0 (weight 0) instead of -inf + inf, and its sum stays 0, which the
normalisation and the LSE read as "no key": output 0, LSE -inf.
"""

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import tilelang.language as T

from fa_kernel.numerics import LN2, STALE_SUM_LIMIT


def capped_score(score, softcap_log2, approx: bool = False):
    """A softcap's score: tanh(x·scale / c) of the raw score x, as 1 - 2 / (2^(x·softcap_log2) + 1)
    with softcap_log2 = 2·log2e·scale / c (numerics.TANH_ERROR); ±1 for x = ±inf, NaN for NaN.
    Two MUFU operations a score (ex2, and the fast division's rcp): the reciprocal by Newton steps
    on the FMA pipe instead was slower (docs/perf-log.md). `approx`: tanh.approx.f32, one MUFU
    operation but numerics.TANH_APPROX_ERROR (an A/B build option; needs TANH_APPROX's prelude)."""
    if approx:
        return T.call_extern("float32", "tanh_approx", score * (softcap_log2 * (LN2 / 2)))
    return 1 - 2 / (T.exp2(score * softcap_log2) + 1)


# The device function capped_score(approx=True) calls: TileLang 0.1.15 has no tanh.approx.
TANH_APPROX = r"""
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
"""


@dataclass(frozen=True)
class RowState:
    """The online softmax's fp32 state of each query row (fragments of block_m): the running max,
    the max before the tile, the max times scale_log2 (0 for a row that has seen only hidden
    keys), the rescale factor for the output accumulator, the tile's row sums and the running sum."""

    row_max: object
    row_max_prev: object
    row_max_scaled: object
    alpha: object
    tile_sum: object
    row_sum: object

    @classmethod
    def allocate(cls, block_m: int) -> "RowState":
        """Each part a new fp32 fragment of block_m rows, allocated in field order."""
        return cls(*(T.alloc_fragment([block_m], T.float32) for _ in fields(cls)))


class OnlineSoftmax(NamedTuple):
    """The parts, as macros (and expressions) over tiles of block_m rows and block_n keys."""

    start_rows: Callable[..., Any]  # (rows): the state before the first tile
    exponentials: Callable[..., Any]  # (acc_s, row_max_scaled, tile_sum, scale_log2): P~ in place, its row sums
    fold_tile: Callable[..., Any]  # (acc_s, rows, scale_log2, stale_sum=None): a tile's scores into the state
    rescale_output: Callable[..., Any]  # (acc_o, alpha): the output accumulator to the new max
    join_sink: Callable[..., Any]  # (rows, sink_log2): a sink joins each row's sum, before `normalised`
    normalised: Callable[..., Any]  # (acc_o, row_sum, i, d, kept=None) -> O[i, d] after the one normalisation
    log2_sum: Callable[..., Any]  # (rows, i) -> the row's LSE in log2 units, for a row that saw a key


def online_softmax(block_m: int, block_n: int, head_dim: int) -> OnlineSoftmax:
    """The online softmax's parts for tiles of `block_m` rows, `block_n` keys and `head_dim`."""
    neg_inf = -T.infinity(T.float32)

    @T.macro
    def start_rows(rows):
        T.fill(rows.row_sum, 0)
        T.fill(rows.row_max, neg_inf)

    @T.macro
    def exponentials(acc_s, row_max_scaled, tile_sum, scale_log2):
        """P~ = 2^(S * scale_log2 - the row's reference max), in place, and its row sums."""
        for i, j in T.Parallel(block_m, block_n):
            acc_s[i, j] = T.exp2(acc_s[i, j] * scale_log2 - row_max_scaled[i])
        T.reduce_sum(acc_s, tile_sum, dim=1)

    @T.macro
    def fold_tile(acc_s, rows, scale_log2, stale_sum=None):
        """Fold tile S into the row state; leaves P~ (fp32) in acc_s and alpha for the output. With
        `stale_sum` (the row sums of P~ against the max before the tile), a row whose sum is within
        STALE_SUM_LIMIT keeps that max, and gets bitwise what that pass gave it (the forward's
        stale max, kernel.py); a row with no max yet takes the tile's (what it summed against the
        stand-in 0 may have underflowed)."""
        row_max, row_max_prev, row_max_scaled = rows.row_max, rows.row_max_prev, rows.row_max_scaled
        alpha, tile_sum, row_sum = rows.alpha, rows.tile_sum, rows.row_sum
        T.copy(row_max, row_max_prev)
        T.reduce_max(acc_s, row_max, dim=1, clear=False)
        for i in T.Parallel(block_m):
            if stale_sum is not None:
                moves = T.Or(stale_sum[i] > STALE_SUM_LIMIT, row_max_prev[i] == neg_inf)
                row_max[i] = T.if_then_else(moves, row_max[i], row_max_prev[i])
            row_max_scaled[i] = T.if_then_else(row_max[i] == neg_inf, 0, row_max[i] * scale_log2)
            # Exactly 1 where the max stayed (the subtraction, fused into an FMA, need not give 0).
            alpha[i] = T.if_then_else(
                row_max[i] == row_max_prev[i], 1, T.exp2(row_max_prev[i] * scale_log2 - row_max_scaled[i])
            )
        exponentials(acc_s, row_max_scaled, tile_sum, scale_log2)
        for i in T.Parallel(block_m):
            row_sum[i] = row_sum[i] * alpha[i] + tile_sum[i]

    @T.macro
    def rescale_output(acc_o, alpha):
        for i, d in T.Parallel(block_m, head_dim):
            acc_o[i, d] *= alpha[i]

    @T.macro
    def join_sink(rows, sink_log2):
        """A sink (its logit times log2e) joins each row's sum, against the larger of the row's
        max and itself (neither overflows); alpha keeps what acc_o's weights are worth against
        that, for `normalised`. The row's state is then its LSE's, sink included."""
        for i in T.Parallel(block_m):
            joint_max = T.max(rows.row_max_scaled[i], sink_log2)
            rows.alpha[i] = T.exp2(rows.row_max_scaled[i] - joint_max)
            rows.row_sum[i] = rows.row_sum[i] * rows.alpha[i] + T.exp2(sink_log2 - joint_max)
            rows.row_max_scaled[i] = joint_max

    def normalised(acc_o, row_sum, i, d, kept=None):
        """O[i, d] after the one normalisation (after join_sink: its alpha as `kept`); a row that
        saw no key is 0. A NaN row sum is not 0: the NaN reaches O (docs/nonfinite.md)."""
        weighted = acc_o[i, d] if kept is None else acc_o[i, d] * kept[i]
        return T.if_then_else(row_sum[i] == 0, 0, weighted / row_sum[i])

    def log2_sum(rows, i):
        return rows.row_max_scaled[i] + T.log2(rows.row_sum[i])

    return OnlineSoftmax(start_rows, exponentials, fold_tile, rescale_output, join_sink, normalised, log2_sum)
