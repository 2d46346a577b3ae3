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
from fa_kernel.variants import Variants  # noqa: E402

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


@pytest.mark.parametrize(
    ("key_tiles", "kv_slots", "batch", "group"), [(16, 3, 3, 8), (3, 2, 1, 44), (5, 4, 2, 1), (2, 7, 1, 3)]
)
def test_the_heavy_first_order_runs_every_block_once_each_group_by_tile(key_tiles, kv_slots, batch, group):
    # backward_program's heavy_first: block index -> (K/V tile, K/V slot, batch) is a bijection,
    # and within a group of `group` pairs (the last may hold fewer) the tiles never go back; a
    # group of one is the batched grid's own order (K/V tile fastest, then slot, then batch).
    from fa_kernel.scheduler import heavy_first_block

    def at(index):
        return tuple(int(ANALYZER.simplify(x)) for x in heavy_first_block(index, key_tiles, kv_slots, batch, group))

    blocks = [at(index) for index in range(key_tiles * kv_slots * batch)]
    assert sorted(blocks) == sorted(itertools.product(range(key_tiles), range(kv_slots), range(batch)))
    group_blocks = group * key_tiles
    for start in range(0, len(blocks), group_blocks):
        tiles = [tile for tile, _, _ in blocks[start : start + group_blocks]]
        assert tiles == sorted(tiles), f"group from block {start}: tiles {tiles}"
    if group == 1:
        assert blocks == [(t, s, b) for b in range(batch) for s in range(kv_slots) for t in range(key_tiles)]


def test_the_blocks_go_heavy_first_where_a_right_edge_makes_the_walks_uneven():
    # Both sides of each term: causal or a right edge, in a batched launch of unsplit GQA groups.
    from fa_kernel.backward import heavy_first_order
    from fa_kernel.variants import PLAIN, Variants

    assert heavy_first_order(True, PLAIN, varlen=False, head_splits=False)
    assert heavy_first_order(False, Variants(window_right=True), varlen=False, head_splits=False)
    assert not heavy_first_order(False, Variants(window_left=True, softcap=True, sinks=True), False, False)
    assert not heavy_first_order(True, PLAIN, varlen=True, head_splits=False)
    assert not heavy_first_order(True, PLAIN, varlen=False, head_splits=True)


@pytest.mark.parametrize("option", ["with_dq", "varlen", "head_splits"])
def test_two_kv_heads_a_block_only_where_each_walk_stores_its_own_dk_and_dv(option):
    # kv_pairs (an A/B build, perf/backward_ab.py): a block stores its first K/V head's dK and dV
    # mid-walk; dQ's adds, a ragged batch's tiles and a group split between blocks are not
    # written for it, and are refused before anything is built.
    from fa_kernel.backward import backward_program

    options = {"with_dq": False, option: True}
    with pytest.raises(ValueError, match="kv_pairs"):
        backward_program(head_dim=64, causal=False, dtype="float16", block_m=64, block_n=128, kv_pairs=True, **options)
    backward_program(head_dim=64, causal=False, dtype="float16", block_m=64, block_n=128, kv_pairs=True, with_dq=False)


@pytest.mark.parametrize("option", ["head_splits", "heavy_first"])
def test_a_ragged_batch_is_refused_a_split_group_and_the_heavy_first_order(option):
    # Both index the grid by (K/V tile, K/V slot, batch) of a batched launch; a ragged batch's
    # grid is its tile order's.
    from fa_kernel.backward import backward_program

    with pytest.raises(ValueError, match=r"head_splits, heavy_first: expected a batched launch \(varlen=False\)"):
        backward_program(
            head_dim=64, causal=True, dtype="float16", block_m=64, block_n=128, varlen=True, **{option: True}
        )


@pytest.mark.parametrize(
    "options",
    [
        {"dq_writer": True, "varlen": True},
        {"dq_writer": True, "head_splits": True},
        {"dq_writer": True, "with_dq": False},
        {"dq_writer": True, "variants": Variants(window_left=True)},
        {"ordered_dq": True},
        {"shifted_walk": True, "dq_writer": True},
        {"dq_writer": True, "ordered_dq": True, "heavy_first": True},
    ],
    ids=["varlen", "head_splits", "without_dq", "variants", "ordered_alone", "shifted_unordered", "ordered_heavy"],
)
def test_the_dq_writer_build_is_refused_what_it_is_not_written_for(options):
    # backward_writer (an A/B build): a batched, unsplit walk adding dQ without the variants; its
    # order needs the writer, the shifted walk the order, and the order its last-tile-first grid.
    from fa_kernel.backward import backward_program

    with pytest.raises(ValueError, match="dq_writer|ordered_dq|shifted_walk"):
        backward_program(head_dim=64, causal=False, dtype="float16", block_m=64, block_n=128, **options)
    backward_program(head_dim=64, causal=False, dtype="float16", block_m=64, block_n=128, dq_writer=True)


def value(expression) -> int:
    simplified = ANALYZER.simplify(expression) if not isinstance(expression, int) else expression
    assert isinstance(simplified, int) or hasattr(simplified, "value"), f"not a constant: {simplified}"
    return int(simplified)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_ordered_writers_turns_take_each_query_tiles_adds_once_the_last_k_v_tile_first(causal):
    # backward_writer's ordered_dq on the plain walk: the K/V tiles whose walks reach a query tile
    # (first_query_tile on) take turns 0 .. k-1 there, the last first. A turn twice or never is a
    # writer that waits forever (a hang, then a wrong dQ), so each is held to the kernel's walk.
    from fa_kernel.backward_writer import first_query_tile, walk_turn

    for seqlen_q, seqlen_k in itertools.product([1, 3, 4, 5, 9, 16, 17, 30], [1, 7, 8, 9, 24, 41]):
        rule = Visibility(seqlen_q, seqlen_k, causal)
        key_tiles, q_tiles = -(-seqlen_k // BLOCK_N), -(-seqlen_q // BLOCK_M)
        visitors = {tile: [] for tile in range(q_tiles)}
        for kv_block in range(key_tiles):
            for tile in range(value(first_query_tile(rule, kv_block * BLOCK_N, BLOCK_M)), q_tiles):
                visitors[tile].append(kv_block)
        for tile, kv_blocks in visitors.items():
            turns = [value(walk_turn(rule, tile, kv_block, BLOCK_M, BLOCK_N)) for kv_block in sorted(kv_blocks)]
            assert turns == list(range(len(kv_blocks)))[::-1], (seqlen_q, seqlen_k, tile)


def test_the_shifted_walks_turns_count_the_blocks_that_reach_a_query_tile_earlier():
    # K/V tile n walks the Q query tiles from tile n on, cyclically (no more K/V tiles than query
    # tiles): at query tile m its turn is the count of blocks that reach m at an earlier step.
    from fa_kernel.backward_writer import shifted_turn

    for q_tiles in range(1, 15):
        for key_tiles, tile in itertools.product(range(1, q_tiles + 1), range(q_tiles)):
            by_step = sorted(range(key_tiles), key=lambda kv_block: (tile - kv_block) % q_tiles)
            turns = [value(shifted_turn(tile, kv_block, key_tiles, q_tiles)) for kv_block in by_step]
            assert turns == list(range(key_tiles)), (q_tiles, key_tiles, tile)
