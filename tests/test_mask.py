"""The one visibility rule (fa_kernel.mask), evaluated on integers: each of its forms against the
reference's mask, and what the kernels derive from it against the pairs it hides (no GPU).

Every edge is drawn on both sides: full, causal, and sliding windows whose edges are 0, 1, 2 or
unset on each side, with and without causal (which is right = 0), on every length to 6 (so windows
wider than the sequence, and rows that see no key, are among them)."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("tilelang")

from tilelang import tvm  # noqa: E402

from fa_kernel.mask import Visibility  # noqa: E402
from fa_kernel.reference import visible_keys  # noqa: E402

SIZES = range(0, 7)
# (causal, left, right): None is an unset edge (flash-attn's -1).
RULES = [
    (causal, left, right)
    for causal in (False, True)
    for left in (None, 0, 1, 2)
    for right in ((None,) if causal else (None, 0, 1, 2))
]


def rule_id(rule) -> str:
    causal, left, right = rule
    return f"{'causal' if causal else 'full'}-left{left}-right{right}"


def value(expression) -> bool:
    """A rule's expression on integers, folded to a Python bool."""
    return bool(tvm.arith.Analyzer().simplify(expression)) if not isinstance(expression, bool) else expression


def reference_mask(seqlen_q: int, seqlen_k: int, causal: bool, left, right):
    window = (-1 if left is None else left, -1 if right is None else right)
    return visible_keys(seqlen_q, seqlen_k, causal, window_size=window)


@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_sees_and_hides_are_the_reference_mask_and_its_complement(rule):
    causal, left, right = rule
    for seqlen_q, seqlen_k in itertools.product(SIZES, SIZES):
        visibility = Visibility(seqlen_q, seqlen_k, causal, left, right)
        reference = reference_mask(seqlen_q, seqlen_k, causal, left, right)
        for row, key in itertools.product(range(seqlen_q + 2), range(-1, seqlen_k + 2)):
            expected = row < seqlen_q and 0 <= key < seqlen_k and bool(reference[row, key])
            seen = value(visibility.sees(key, row))
            if key >= 0:
                assert value(visibility.sees(key, row, rows_checked=True)) == expected
                assert seen == (expected if row < seqlen_q else seen)  # unchecked rows: the edges alone
            assert value(visibility.hides(key, row)) == (not seen)
            # A kernel that keeps each row's edges (the split kernel: a row is a query and a
            # head) hands them in, and the select reads them, not the row.
            last = visibility.last_key(row) if visibility.limits_right else None
            first = visibility.first_key(row) if visibility.limits_left else None
            assert value(visibility.sees(key, None, last_key=last, first_key=first)) == seen


@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_a_tile_needs_a_mask_exactly_where_it_holds_a_hidden_pair(rule):
    causal, left, right = rule
    for seqlen_q, seqlen_k, block_m, block_n in itertools.product(SIZES, SIZES, (1, 2, 3), (1, 2, 4)):
        visibility = Visibility(seqlen_q, seqlen_k, causal, left, right)
        for q_start, kv_start in itertools.product(range(0, seqlen_q + 1, block_m), range(0, seqlen_k + 1, block_n)):
            pairs = list(itertools.product(range(kv_start, kv_start + block_n), range(q_start, q_start + block_m)))
            # The forward's form: rows past seqlen_q follow the edges (their output is dropped).
            hidden = any(value(visibility.hides(key, row)) for key, row in pairs)
            assert value(visibility.tile_needs_mask(kv_start, block_n, q_start, block_m)) == hidden
            # The gradients' form: rows past seqlen_q see nothing.
            hidden = any(not value(visibility.sees(key, row, rows_checked=True)) for key, row in pairs)
            assert value(visibility.tile_needs_mask(kv_start, block_n, q_start, block_m, rows_checked=True)) == hidden


@pytest.mark.parametrize("rule", [rule for rule in RULES if rule[0] or rule[2] is not None], ids=rule_id)
def test_the_bounds_a_block_walks_by_on_its_right_edge_are_the_rules_own(rule):
    causal, left, right = rule
    for seqlen_q, seqlen_k in itertools.product(SIZES, SIZES):
        visibility = Visibility(seqlen_q, seqlen_k, causal, left, right)
        for row_end in range(1, seqlen_q + 3):
            # Rows before row_end see keys up to the last one of row_end - 1, and no further.
            assert visibility.keys_before(row_end) == visibility.last_key(row_end - 1) + 1
        for key in range(seqlen_k + 2):
            # The first row whose right edge reaches the key: rows before it see none of it.
            first = visibility.first_row(key)
            assert visibility.last_key(first) >= key > visibility.last_key(first - 1)


@pytest.mark.parametrize("rule", [rule for rule in RULES if rule[1] is not None], ids=rule_id)
def test_the_bounds_a_block_walks_by_on_its_left_edge_are_the_rules_own(rule):
    causal, left, right = rule
    for seqlen_q, seqlen_k in itertools.product(SIZES, SIZES):
        visibility = Visibility(seqlen_q, seqlen_k, causal, left, right)
        for key_end in range(0, seqlen_k + 2):
            # Rows from rows_before(key_end) on see no key before key_end; the row before does.
            row = visibility.rows_before(key_end)
            assert visibility.first_key(row) >= key_end > visibility.first_key(row - 1)
