"""The gradient kernels' tile conditions, exactly, on the CPU (TileLang's expressions evaluated
by its simplifier): which (key, row) pairs a query row sees (the rule's select, rows checked), and
which tiles hold a pair it does not (gradient_parts.tile_needs_mask, the rule's tile test as the
gradient kernels take it). A tile the condition misses would give a hidden key its exponential; one it adds only costs
a select. Both are held to the definition here, so a mutant of either dies without a GPU."""

from __future__ import annotations

import itertools

import pytest

tilelang = pytest.importorskip("tilelang")

from fa_kernel.gradient_parts import tile_needs_mask  # noqa: E402
from fa_kernel.mask import Visibility  # noqa: E402

ANALYZER = tilelang.tvm.arith.Analyzer()
# Small tiles, so that every offset of a tile against the lengths and the causal diagonal occurs.
BLOCK_M, BLOCK_N = 4, 8


def evaluated(expression) -> bool:
    value = ANALYZER.simplify(expression)
    assert hasattr(value, "value"), f"not a constant: {value}"
    return bool(value.value)


def visible(key: int, row: int, seqlen_q: int, seqlen_k: int, causal: bool) -> bool:
    """The definition: the key and the row exist, and causal (bottom-right) the key is not right
    of the row's diagonal."""
    return key < seqlen_k and row < seqlen_q and (not causal or key <= row + seqlen_k - seqlen_q)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sees_is_the_definition(causal):
    for seqlen_q, seqlen_k in itertools.product(range(1, 7), range(1, 7)):
        for key, row in itertools.product(range(8), range(8)):
            expected = visible(key, row, seqlen_q, seqlen_k, causal)
            rule = Visibility(seqlen_q, seqlen_k, causal)
            assert evaluated(rule.sees(key, row, rows_checked=True)) == expected, (key, row, seqlen_q, seqlen_k)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_tile_is_masked_exactly_where_it_holds_a_hidden_pair(causal):
    # Every tile position against lengths from one tile short of it to one past, both signs of
    # the causal offset: each side of each comparison in tile_needs_mask.
    for seqlen_q, seqlen_k in itertools.product(range(1, 3 * BLOCK_M + 2), range(1, 3 * BLOCK_N + 2)):
        for q_start, kv_start in itertools.product(range(0, seqlen_q, BLOCK_M), range(0, seqlen_k, BLOCK_N)):
            hidden = any(
                not visible(key, row, seqlen_q, seqlen_k, causal)
                for key in range(kv_start, kv_start + BLOCK_N)
                for row in range(q_start, q_start + BLOCK_M)
            )
            rule = Visibility(seqlen_q, seqlen_k, causal)
            masked = evaluated(tile_needs_mask(rule, kv_start, q_start, BLOCK_N, BLOCK_M))
            assert masked == hidden, (q_start, kv_start, seqlen_q, seqlen_k)
