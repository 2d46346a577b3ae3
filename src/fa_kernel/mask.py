"""Which keys a query row sees: the one visibility rule every kernel applies, and what each
derives from it (the tiles that need a mask, the tiles a block of rows visits).

Query row i of seqlen_q sees key j of seqlen_k iff j < seqlen_k and j lies in the row's window
around its diagonal d(i) = i + seqlen_k - seqlen_q (the bottom-right corner, as flash-attn >= 2.1):
d(i) - left <= j where a left edge is set, j <= d(i) + right where a right edge is (causal: right
= 0). `reference.visible_keys` is the same rule in torch. A kernel applies it in one of two forms,
the same rule either way:

- `sees`, a select: the gradient and split-KV kernels give a hidden key P = 0 (or a score of
  -inf) by a select, so a NaN or Inf score of a key a row cannot see never reaches the row;
- `hides`, an additive mask: the forward writes -inf into the score accumulator before the
  GEMM adds Q.K^T to it, so an unmasked tile's GEMM starts from zero (docs/nonfinite.md says
  what that costs a hidden NaN).

Every method builds TileLang expressions from the sizes it was made with (Python ints work too:
`tests/test_mask.py` checks the forms against each other and the reference). An edge that is not
set adds no term to any expression (TVM folds a `+ 0` away: causal builds the expressions it
built before windows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import tilelang.language as T

from fa_kernel.softmax import capped_score
from fa_kernel.variants import Variants, kernel_parameter


@dataclass(frozen=True)
class Visibility:
    """The rule for a launch of `seqlen_q` query rows against `seqlen_k` keys: causal, and a
    sliding window's edges (None: no edge on that side; causal is right = 0)."""

    seqlen_q: object
    seqlen_k: object
    causal: bool
    left: int | None = None
    right: int | None = None

    @classmethod
    def of_window(cls, seqlen_q: int, seqlen_k: int, causal: bool, window_size: tuple[int, int]) -> Visibility:
        """A launch's rule of ints from flash-attn's window_size (-1: no edge on that side)."""
        left, right = (edge if edge >= 0 else None for edge in window_size)
        return cls(seqlen_q, seqlen_k, causal, left, right)

    @property
    def right_edge(self) -> int | None:
        """How far right of its diagonal a row sees (None: to the last key)."""
        return 0 if self.causal else self.right

    @property
    def limits_right(self) -> bool:
        return self.right_edge is not None

    @property
    def limits_left(self) -> bool:
        return self.left is not None

    def last_key(self, row):
        """The last key `row` sees where the right edge is set (keys past seqlen_k aside)."""
        return row + (self.seqlen_k - self.seqlen_q) + self.right_edge

    def first_key(self, row):
        """The first key `row` sees where the left edge is set (keys before 0 aside)."""
        return row + (self.seqlen_k - self.seqlen_q) - self.left

    def keys_before(self, row_end):
        """Right edge: the rows before `row_end` see no key from this one on."""
        return self.last_key(row_end)

    def first_row(self, key):
        """Right edge: the first row that sees `key` (rows before it see none of the keys from it on)."""
        return key - (self.seqlen_k - self.seqlen_q) - self.right_edge

    def rows_before(self, key_end):
        """Left edge: the rows from this one on see no key before `key_end`."""
        return key_end - (self.seqlen_k - self.seqlen_q) + self.left

    def sees(self, key, row, *, last_key=None, first_key=None, rows_checked: bool = False):
        """Whether `row` sees `key`, for a select. `last_key`, `first_key`: the row's edges where
        the kernel keeps them (else last_key(row), first_key(row)); `rows_checked`: rows past
        seqlen_q see nothing (a kernel whose tiles reach past the last row and whose sums run
        over rows)."""
        visible = key < self.seqlen_k
        if rows_checked:
            visible = T.And(visible, row < self.seqlen_q)
        if self.limits_right:
            visible = T.And(visible, key <= (self.last_key(row) if last_key is None else last_key))
        if self.limits_left:
            visible = T.And(visible, key >= (self.first_key(row) if first_key is None else first_key))
        return visible

    def hides(self, key, row):
        """Whether `row` does not see `key`, for an additive mask (-inf where it hides)."""
        hidden = key >= self.seqlen_k
        if self.limits_right:
            hidden = T.Or(key > self.last_key(row), hidden)
        if self.limits_left:
            hidden = T.Or(hidden, key < self.first_key(row))
        return hidden

    def tile_needs_mask(self, kv_start, block_n: int, q_start, block_m: int, *, rows_checked: bool = False):
        """Whether the tile of `block_n` keys from kv_start and `block_m` rows from q_start holds
        a key some of its rows do not see: a key past seqlen_k, right of its first row's last
        key, or left of its last row's first key; with `rows_checked`, rows past seqlen_q too
        (`sees`' rows_checked). Uniform over the tile, so the test costs no divergence; a tile
        that needs none skips the mask."""
        needs_mask = kv_start + block_n > self.seqlen_k
        if rows_checked:
            needs_mask = T.Or(needs_mask, q_start + block_m > self.seqlen_q)
        if self.limits_right:
            needs_mask = T.Or(needs_mask, kv_start + block_n - 1 > self.last_key(q_start))
        if self.limits_left:
            needs_mask = T.Or(needs_mask, kv_start < self.first_key(q_start + block_m - 1))
        return needs_mask


def variant_visibility(seqlen_q, seqlen_k, causal: bool, variants: Variants):
    """(the visibility rule with the window's edges, window_left, window_right, softcap_log2):
    the variants' launch parameters (T.dynamic), a kernel's only where `variants` compiles them
    in (kernel_parameter)."""
    window_left, window_right = T.dynamic("window_left, window_right")
    softcap_log2 = T.dynamic("softcap_log2", "float32")
    left = kernel_parameter(window_left, variants.window_left)
    right = kernel_parameter(window_right, variants.window_right)
    visibility = Visibility(seqlen_q, seqlen_k, causal, left=left, right=right)
    return visibility, left, right, kernel_parameter(softcap_log2, variants.softcap)


class ScoreParts(NamedTuple):
    """The forward's mask on its score accumulator (forward_score_parts)."""

    write_mask: Any  # macro (rule, acc_s, kv_start, q_start): -inf where hidden, 0 elsewhere
    issue_scores: Any  # macro: start S = Q.K^T onto the mask where the tile needs one
    capped_scores: Any  # (rule, acc_s, kv_start, q_start): a softcap's tanh, then the mask's select


def forward_score_parts(
    *, block_m: int, block_n: int, softcap: bool, softcap_log2, tanh_approx: bool = False
) -> ScoreParts:
    """The rule applied to a forward kernel's `block_m` x `block_n` score tiles: `hides` added
    before the GEMM, or under a softcap (`softcap_log2` its kernel parameter; `tanh_approx`:
    softmax.capped_score's) a select after the cap. Each macro takes the work tile's rule (a
    ragged batch's is its sequence's)."""
    neg_inf = -T.infinity(T.float32)

    @T.macro
    def write_mask(rule, acc_s, kv_start, q_start):
        """-inf where a key is hidden (`rule`: the work tile's, WorkTile.rule), 0 elsewhere, into
        the score accumulator: the GEMM then adds Q.K^T to it."""
        for i, j in T.Parallel(block_m, block_n):
            acc_s[i, j] = T.if_then_else(rule.hides(kv_start + j, q_start + i), neg_inf, 0)

    @T.macro
    def issue_scores(rule, Q_shared, K_tile, acc_s, kv_start, q_start, mask_written=False):
        """Start S = Q.K^T for one tile (asynchronous), onto its mask (written here unless
        `mask_written`) where the tile needs one, else onto zero; under a softcap always onto
        zero (capped_scores masks after the cap)."""
        if softcap:
            T.wgmma_gemm(Q_shared, K_tile, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow, clear_accum=True)
        elif rule.tile_needs_mask(kv_start, block_n, q_start, block_m):
            if not mask_written:
                write_mask(rule, acc_s, kv_start, q_start)
            T.wgmma_gemm(Q_shared, K_tile, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
        else:
            T.wgmma_gemm(Q_shared, K_tile, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow, clear_accum=True)

    def capped(score):
        return capped_score(score, softcap_log2, tanh_approx)

    @T.macro
    def cap_and_mask(rule, acc_s, kv_start, q_start):
        if rule.tile_needs_mask(kv_start, block_n, q_start, block_m):
            for i, j in T.Parallel(block_m, block_n):
                acc_s[i, j] = T.if_then_else(rule.hides(kv_start + j, q_start + i), neg_inf, capped(acc_s[i, j]))
        else:
            for i, j in T.Parallel(block_m, block_n):
                acc_s[i, j] = capped(acc_s[i, j])

    def capped_scores(rule, acc_s, kv_start, q_start):
        """softcap: the scores become their tanh (c·log2e is then scale_log2), and the mask a
        select after it, where the tile needs one (an additive -inf would come out as -1).
        (Without one nothing: no macro call, which would bind its arguments in the program.)"""
        if softcap:
            cap_and_mask(rule, acc_s, kv_start, q_start)

    return ScoreParts(write_mask, issue_scores, capped_scores)
