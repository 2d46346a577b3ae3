"""Which keys a query row sees: the one visibility rule every kernel applies, and what each
derives from it (the tiles that need a mask, the tiles a block of rows visits).

Query row i of seqlen_q sees key j of seqlen_k iff j < seqlen_k and, causal, j <= i + seqlen_k -
seqlen_q: aligned to the bottom-right corner, as flash-attn >= 2.1 (`reference.visible_keys` is
the same rule in torch). A kernel applies it in one of two forms, the same rule either way:

- `sees`, a select: the gradient and split-KV kernels give a hidden key P = 0 (or a score of
  -inf) by a select, so a NaN or Inf score of a key a row cannot see never reaches the row;
- `hides`, an additive mask: the forward writes -inf into the score accumulator before the
  GEMM adds Q.K^T to it, so an unmasked tile's GEMM starts from zero (docs/nonfinite.md says
  what that costs a hidden NaN).

Every method builds TileLang expressions from the sizes it was made with (Python ints work too:
`tests/test_mask.py` checks the forms against each other and the reference).
"""

from __future__ import annotations

from dataclasses import dataclass

import tilelang.language as T


@dataclass(frozen=True)
class Visibility:
    """The rule for a launch of `seqlen_q` query rows against `seqlen_k` keys."""

    seqlen_q: object
    seqlen_k: object
    causal: bool

    def last_key(self, row):
        """The last key `row` sees, causal (keys past seqlen_k aside)."""
        return row + (self.seqlen_k - self.seqlen_q)

    def keys_before(self, row_end):
        """Causal: the rows before `row_end` see no key from this one on."""
        return row_end + (self.seqlen_k - self.seqlen_q)

    def first_row(self, key):
        """Causal: the first row that sees `key` (rows before it see none of the keys from it on)."""
        return key - (self.seqlen_k - self.seqlen_q)

    def sees(self, key, row, *, last_key=None, rows_checked: bool = False):
        """Whether `row` sees `key`, for a select. `last_key`: the row's last key where the kernel
        keeps it (else last_key(row)); `rows_checked`: rows past seqlen_q see nothing (a kernel
        whose tiles reach past the last row and whose sums run over rows)."""
        visible = key < self.seqlen_k
        if rows_checked:
            visible = T.And(visible, row < self.seqlen_q)
        if self.causal:
            visible = T.And(visible, key <= (self.last_key(row) if last_key is None else last_key))
        return visible

    def hides(self, key, row):
        """Whether `row` does not see `key`, for an additive mask (-inf where it hides)."""
        if self.causal:
            return T.Or(key > self.last_key(row), key >= self.seqlen_k)
        return key >= self.seqlen_k

    def tile_needs_mask(self, kv_start, block_n: int, q_start, block_m: int | None = None):
        """Whether the tile of `block_n` keys from kv_start holds a key some of its rows (from
        q_start) do not see: a key past seqlen_k or, causal, its last key after its first row's
        last; with `block_m`, rows past seqlen_q too (`sees`' rows_checked). Uniform over the
        tile, so the test costs no divergence; a tile that needs none skips the mask."""
        needs_mask = kv_start + block_n > self.seqlen_k
        if block_m is not None:
            needs_mask = T.Or(needs_mask, q_start + block_m > self.seqlen_q)
        if self.causal:
            needs_mask = T.Or(needs_mask, kv_start + block_n - 1 > self.last_key(q_start))
        return needs_mask
