"""The one visibility rule (fa_kernel.mask), evaluated on integers: each of its forms against the
reference's mask, and what the kernels derive from it against the pairs it hides (no GPU)."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("tilelang")

from tilelang import tvm  # noqa: E402

from fa_kernel.mask import Visibility  # noqa: E402
from fa_kernel.reference import visible_keys  # noqa: E402

SIZES = range(0, 7)


def value(expression) -> bool:
    """A rule's expression on integers, folded to a Python bool."""
    return bool(tvm.arith.Analyzer().simplify(expression)) if not isinstance(expression, bool) else expression


@pytest.mark.parametrize("causal", [False, True])
def test_sees_and_hides_are_the_reference_mask_and_its_complement(causal):
    for seqlen_q, seqlen_k in itertools.product(SIZES, SIZES):
        rule = Visibility(seqlen_q, seqlen_k, causal)
        reference = visible_keys(seqlen_q, seqlen_k, causal)
        for row, key in itertools.product(range(seqlen_q + 2), range(seqlen_k + 2)):
            expected = row < seqlen_q and key < seqlen_k and bool(reference[row, key])
            seen = value(rule.sees(key, row))
            assert value(rule.sees(key, row, rows_checked=True)) == expected
            assert seen == (expected if row < seqlen_q else seen)  # unchecked rows: the causal rule alone
            assert value(rule.hides(key, row)) == (not seen)
            if causal:
                # A kernel that keeps each row's last key (the split kernel: a row is a query and
                # a head) hands it in, and the select reads it, not the row.
                for last in range(-1, seqlen_k + 1):
                    assert value(rule.sees(key, None, last_key=last)) == (key < seqlen_k and key <= last)


@pytest.mark.parametrize("causal", [False, True])
def test_a_tile_needs_a_mask_exactly_where_it_holds_a_hidden_pair(causal):
    for seqlen_q, seqlen_k, block_m, block_n in itertools.product(SIZES, SIZES, (1, 2, 3), (1, 2, 4)):
        rule = Visibility(seqlen_q, seqlen_k, causal)
        for q_start, kv_start in itertools.product(range(0, seqlen_q + 1, block_m), range(0, seqlen_k + 1, block_n)):
            pairs = list(itertools.product(range(kv_start, kv_start + block_n), range(q_start, q_start + block_m)))
            # The forward's form: rows past seqlen_q follow the causal rule (their output is dropped).
            hidden = any(value(rule.hides(key, row)) for key, row in pairs)
            assert value(rule.tile_needs_mask(kv_start, block_n, q_start)) == hidden
            # The gradients' form: rows past seqlen_q see nothing.
            hidden = any(not value(rule.sees(key, row, rows_checked=True)) for key, row in pairs)
            assert value(rule.tile_needs_mask(kv_start, block_n, q_start, block_m)) == hidden


def test_the_bounds_a_block_walks_by_are_the_rules_own():
    for seqlen_q, seqlen_k in itertools.product(SIZES, SIZES):
        rule = Visibility(seqlen_q, seqlen_k, True)
        for row_end in range(1, seqlen_q + 3):
            # Rows before row_end see keys up to the last one of row_end - 1, and no further.
            assert rule.keys_before(row_end) == rule.last_key(row_end - 1) + 1
        for key in range(seqlen_k + 2):
            first = rule.first_row(key)
            assert value(rule.sees(key, first)) or key >= seqlen_k
            assert not value(rule.sees(key, first - 1))
