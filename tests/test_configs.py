"""The dispatch (configs.select_config): each table entry serves exactly the keys it claims, the
switch to the next entry is the first key past its reach, and cases outside the tables get the
fallback; and which calls the split-KV kernels serve (configs.split_kv_serves), on both sides of
each of its conditions. CPU only; the kernels behind each entry are checked on the GPU."""

from __future__ import annotations

import itertools
import math

import pytest

from fa_kernel.configs import (
    BACKWARD_TILES,
    DK_DV_TILES,
    FALLBACK,
    FIXED_ORDER_FASTER,
    GRID_ROWS,
    HEAD_SPLIT_DIMS,
    SPLIT_MAX_WAVES,
    TUNED,
    TUNED_GRIDS,
    TUNED_SHORT,
    TileConfig,
    gradient_head_splits,
    gradient_plan,
    grid_bands,
    key_ranges,
    key_tile_walks,
    list_schedule,
    select_config,
    split_kv_serves,
    tiles_per_sm,
)
from fa_kernel.mask import Visibility
from fa_kernel.reference import visible_keys

CASES = sorted({(arch, head_dim, causal) for arch, head_dim, causal in TUNED})


@pytest.mark.parametrize(("arch", "head_dim", "causal"), CASES)
def test_each_entry_serves_its_keys_and_the_next_takes_over_one_past_its_reach(arch, head_dim, causal):
    ranges = key_ranges(arch, head_dim, causal)
    assert ranges[0][0] == 0 and ranges[-1][1] is None, "the entries cover every key count"
    for (fewest, most, config), (next_fewest, _, next_config) in itertools.pairwise(ranges):
        assert next_fewest == most + 1, "no gap and no overlap between entries"
        for seqlen_k in {max(1, fewest), most - 1, most}:
            assert select_config(arch, head_dim, causal, seqlen_k) == config, f"{seqlen_k} keys"
        assert select_config(arch, head_dim, causal, most + 1) == next_config, f"{most + 1} keys"
    long_fewest, _, long_config = ranges[-1]
    assert long_config == TUNED[(arch, head_dim, causal)]
    for seqlen_k in (max(1, long_fewest), long_fewest + 1, 1 << 20, None):
        assert select_config(arch, head_dim, causal, seqlen_k) == long_config, f"{seqlen_k} keys"


GRID_CASES = sorted(TUNED_GRIDS)


@pytest.mark.parametrize(("arch", "head_dim", "causal"), GRID_CASES)
def test_each_band_serves_its_grids_and_the_next_takes_over_one_tile_past_its_limit(arch, head_dim, causal):
    bands = grid_bands(arch, head_dim, causal)
    limits = [most for most, _ in bands[:-1]]
    assert limits == sorted(set(limits)) and bands[-1][0] is None, "bands in increasing order of tiles, the last open"
    assert bands[-1][1] == key_ranges(arch, head_dim, causal), "past the last band, the full grid's tables"
    for sm_count in (132, 114):
        for (most, ranges), (_, next_ranges) in itertools.pairwise(bands):
            # the largest grid the band serves, in whole work tiles of GRID_ROWS rows, and one tile more
            tiles = math.floor(most * sm_count)
            at, past = tiles_per_sm(1, tiles, 1, sm_count), tiles_per_sm(1, tiles + 1, GRID_ROWS, sm_count)
            for fewest, most_keys, config in ranges:
                for seqlen_k in {max(1, fewest), most_keys or fewest + 1}:
                    assert select_config(arch, head_dim, causal, seqlen_k, at) == config, (
                        f"{tiles} tiles, {seqlen_k} keys"
                    )
            for fewest, most_keys, config in next_ranges:
                for seqlen_k in {max(1, fewest), most_keys or fewest + 1}:
                    assert select_config(arch, head_dim, causal, seqlen_k, past) == config, f"{tiles + 1} tiles"
    # a grid of one tile is the first band's; no grid given, the full grid's tables
    assert key_ranges(arch, head_dim, causal, tiles_per_sm(1, 1, 1, 132)) == bands[0][1]
    assert select_config(arch, head_dim, causal, 1 << 20) == bands[-1][1][-1][2]


def test_work_tiles_are_counted_in_rows_of_grid_rows_whatever_the_config():
    assert tiles_per_sm(2, 3, GRID_ROWS, 6) == 1.0
    assert tiles_per_sm(2, 3, GRID_ROWS + 1, 6) == 2.0
    assert tiles_per_sm(1, 1, 1, 132) == 1 / 132


def test_short_entries_are_in_increasing_order_of_keys():
    for entries in TUNED_SHORT.values():
        reaches = [most for most, _ in entries]
        assert reaches == sorted(set(reaches))


@pytest.mark.parametrize("seqlen_k", [None, 1, 4096])
def test_a_case_outside_the_tables_gets_the_fallback(seqlen_k):
    assert select_config("sm_80", 128, False, seqlen_k) == FALLBACK
    assert select_config("sm_90", 96, True, seqlen_k) == FALLBACK


def test_a_config_parses_what_it_prints():
    from fa_kernel.workbench.tune import candidate_configs

    for config in {*candidate_configs(False), *candidate_configs(True), TileConfig(64, 64, 1, 128, take_turns=False)}:
        assert TileConfig.parse(str(config)) == config


@pytest.mark.parametrize("text", ["128x128", "128x128/2st/256thr/fast", "128x128/2/256", ""])
def test_text_that_is_not_a_config_is_refused_with_the_form_expected(text):
    with pytest.raises(ValueError, match="expected BMxBN/Sst/Tthr"):
        TileConfig.parse(text)


# (batch, seqlen_q, seqlen_k, heads, heads_kv, rows_per_block, sm_count, served): each condition's
# two sides, the others' far from theirs (MANY keys).
MANY = 1 << 20
SPLIT_KV_CASES = [
    (1, 1, MANY, 32, 16, 64, 132, True),  # the smallest group
    (1, 1, MANY, 32, 8, 64, 132, True),
    (1000, 1, MANY, 32, 8, 64, 132, True),  # with GQA, whatever the grid
    (1000, 1, MANY, 32, 16, 64, 132, True),  # the smallest group too
    (1, 16, MANY, 32, 8, 64, 132, True),  # the group's 64 rows: one row block
    (1, 17, MANY, 32, 8, 64, 132, False),  # 68 rows
    (1, 13, MANY, 40, 8, 64, 132, False),  # groups of 5: 65 rows, one past the block
    (1, 32, MANY, 16, 8, 64, 132, True),  # groups of 2: 64 rows, then 66
    (1, 33, MANY, 16, 8, 64, 132, False),
    (1, 17, MANY, 32, 8, 128, 132, True),  # the row block is the split kernel's
    # Without GQA: where the forward kernel's grid, one tile per (batch, head), fills half the SMs.
    (2, 1, MANY, 33, 33, 64, 132, True),  # 66 tiles on 132 SMs
    (2, 1, MANY, 34, 34, 64, 132, False),  # 68
    (2, 1, MANY, 33, 33, 64, 130, False),  # the SMs are the device's
    (1, 1, MANY, 66, 66, 64, 131, False),  # 132 of 2x the tiles, one past
    # The forward kernel's keys per SM, whole waves of its tiles x seqlen_k, at SPLIT_KV_FORWARD_KEYS.
    (1, 1, 4096, 32, 8, 64, 132, True),  # one wave
    (1, 1, 4095, 32, 8, 64, 132, False),
    (1, 1, 4096, 32, 32, 64, 132, True),  # without GQA too
    (1, 1, 4095, 32, 32, 64, 132, False),
    (8, 1, 2048, 32, 8, 64, 132, True),  # two waves (256 tiles): 4096 at 2048 keys, not at 2047
    (8, 1, 2047, 32, 8, 64, 132, False),
    (4, 1, 2048, 32, 8, 64, 132, False),  # one (128 tiles)
    (8, 1, 2048, 32, 8, 64, 256, False),  # one wave of the device's SMs
    # SPLIT_KV_QUERIES: without GQA at any keys, with GQA below SPLIT_KV_MANY_QUERIES_KEYS.
    (1, 8, MANY, 32, 32, 64, 132, True),
    (1, 9, MANY, 32, 32, 64, 132, False),
    (1, 64, MANY, 32, 32, 64, 132, False),  # one row block of queries, many keys
    (16, 8, 3071, 32, 8, 64, 132, True),
    (16, 9, 3071, 32, 8, 64, 132, False),
    (16, 9, 3072, 32, 8, 64, 132, True),
    (16, 16, 3072, 32, 8, 64, 132, True),
]


@pytest.mark.parametrize(
    ("batch", "seqlen_q", "seqlen_k", "heads", "heads_kv", "rows_per_block", "sm_count", "served"), SPLIT_KV_CASES
)
def test_split_kv_serves_on_both_sides_of_each_limit(
    batch, seqlen_q, seqlen_k, heads, heads_kv, rows_per_block, sm_count, served
):
    assert split_kv_serves(batch, seqlen_q, seqlen_k, heads, heads_kv, rows_per_block, sm_count) is served


def splits_for(batch, heads, heads_kv, seqlen, head_dim, causal, sm_count=132, seqlen_k=None):
    rule = Visibility(seqlen, seqlen if seqlen_k is None else seqlen_k, causal)
    return gradient_head_splits(batch, rule, heads_kv, heads // heads_kv, head_dim, sm_count)


@pytest.mark.parametrize("head_dim", HEAD_SPLIT_DIMS)
def test_a_gqa_group_is_split_where_its_blocks_leave_sms_waiting(head_dim):
    # Both sides of each reason: a grid short of a wave (an MQA gradient over 4k keys: 32 blocks)
    # splits, one whose blocks fill the waves evenly does not; a walk too short to pay for the
    # sums does not; a causal grid of few long uneven blocks splits where the same grid without
    # causal (one even wave) does not; a group of one never.
    block_m, block_n, _ = BACKWARD_TILES[head_dim]
    assert splits_for(1, 8, 1, 4096, head_dim, False) > 1
    assert splits_for(1, 8, 1, 132 * block_n, head_dim, False) == 1  # 132 blocks: one full wave
    assert splits_for(1, 2, 1, block_m, head_dim, False) == 1  # one query tile a head
    assert splits_for(8, 71, 1, 2048, head_dim, True) > 1
    assert splits_for(8, 71, 1, 2048, head_dim, False) == 1
    assert splits_for(1, 8, 8, 4096, head_dim, False) == splits_for(1, 8, 8, 4096, head_dim, True) == 1
    # An uneven count where the group has no divisor near the best (71 is prime).
    assert splits_for(8, 71, 1, 2048, head_dim, True) not in (1, 71)


def test_more_splits_are_not_tried_past_the_waves_the_model_schedules():
    # A causal MQA grid of 128 blocks (8 x 16 K/V tiles, head_dim 64) takes fewer splits on 132
    # SMs than the waves allow; on fewer SMs its splits stop where the blocks reach
    # SPLIT_MAX_WAVES waves.
    assert 1 < splits_for(8, 71, 1, 2048, 64, True) < SPLIT_MAX_WAVES * 132 // 128
    for sm_count in (33, 66):
        assert splits_for(8, 71, 1, 2048, 64, True, sm_count=sm_count) == SPLIT_MAX_WAVES * sm_count // 128


@pytest.mark.parametrize(("seqlen_q", "seqlen_k"), [(500, 500), (300, 700), (700, 300), (1, 129)])
@pytest.mark.parametrize("window", [(-1, -1), (100, -1), (-1, 30), (64, 0)])
@pytest.mark.parametrize("causal", [False, True])
def test_each_key_tile_walks_the_query_tiles_that_see_it(seqlen_q, seqlen_k, window, causal):
    # The model's walks against the reference rule: a K/V tile's walk spans the query tiles from
    # the first holding a row that sees one of its keys to the last (none: no walk).
    block_m, block_n = 64, 128
    walks = key_tile_walks(Visibility.of_window(seqlen_q, seqlen_k, causal, window), block_m, block_n)
    visible = visible_keys(seqlen_q, seqlen_k, causal, window_size=window)
    assert len(walks) == -(-seqlen_k // block_n)
    for tile, walk in enumerate(walks):
        rows = visible[:, tile * block_n : (tile + 1) * block_n].any(dim=1).nonzero().flatten().tolist()
        span = rows[-1] // block_m - rows[0] // block_m + 1 if rows else 0
        assert walk == span, f"K/V tile {tile}: walks {walk} query tiles, its rows span {span}"


def test_the_list_schedule_starts_each_block_on_the_first_sm_free():
    assert list_schedule([3, 1, 1, 1], 2) == 3
    assert list_schedule([1, 1, 1, 1, 1], 2) == 3
    assert list_schedule([1, 1, 1, 5], 2) == 6  # launch order, not the longest first


def test_head_dim_256_keeps_its_group_whole():
    # Its split build does not lower (backward_program): the rule never asks for it.
    assert 256 not in HEAD_SPLIT_DIMS and set(HEAD_SPLIT_DIMS) < set(BACKWARD_TILES)
    assert splits_for(1, 8, 1, 1 << 14, 256, False, seqlen_k=64) == 1
    assert splits_for(1, 8, 1, 1 << 14, 128, False, seqlen_k=128) > 1


# Each region of configs.FIXED_ORDER_FASTER from both sides of each bound: (head_dim, GQA group,
# keys, the edge, whether the default gradient takes the fixed-order path). The edge: "causal",
# "window" (a right edge without causal) or "none".
ROUTES = [
    (128, 1, 512, "none", True),  # head_dim 128's short walks, any edge
    (128, 1, 513, "none", False),
    (128, 8, 513, "none", False),  # groups widen only the right edge's regions
    (128, 1, 1024, "causal", True),  # its right edge's 1k
    (128, 1, 1024, "window", True),
    (128, 1, 1025, "causal", False),
    (128, 4, 1025, "window", False),
    (128, 5, 2048, "causal", True),  # its GQA region: at the keys and the group ...
    (128, 5, 2049, "causal", False),  # ... a key past them ...
    (128, 4, 2048, "causal", False),  # ... a head short
    (128, 5, 2048, "window", True),
    (256, 1, 1024, "none", True),  # head_dim 256's
    (256, 1, 1025, "none", False),
    (256, 1, 1024, "causal", True),
    (256, 2, 1025, "causal", False),
    (64, 8, 512, "causal", False),  # not in the table
]


@pytest.mark.parametrize(("head_dim", "group", "keys", "edge", "routed"), ROUTES)
def test_the_fixed_order_path_takes_what_its_table_names_and_keeps_the_group_whole(head_dim, group, keys, edge, routed):
    # configs.gradient_plan: under a right edge the path keeps the group whole, without one its
    # splits are the model's; `route` False (the kernels' tests): never; `deterministic`: always.
    rule = {
        "causal": Visibility(keys, keys, True),
        "window": Visibility.of_window(keys, keys, False, (-1, 64)),
        "none": Visibility(keys, keys, False),
    }[edge]
    model = gradient_head_splits(16, rule, 4, group, head_dim, 132)  # 16 x 4 pairs: a wave of blocks or more
    forced = (True, 1 if rule.limits_right else model)
    assert gradient_plan(16, rule, 4, group, head_dim, 132, False) == (forced if routed else (False, model))
    assert gradient_plan(16, rule, 4, group, head_dim, 132, False, route=False) == (False, model)
    assert gradient_plan(16, rule, 4, group, head_dim, 132, True) == forced


def test_the_fixed_order_path_takes_a_grid_of_a_wave_or_more():
    # On fewer unsplit blocks than SMs the atomic path's group splits fill them: not routed there.
    # head_dim 128's short walks: 1 K/V tile of 128 keys a (batch, K/V head) pair.
    rule = Visibility(128, 128, True)
    assert gradient_plan(132, rule, 1, 8, 128, 132, False) == (True, 1)
    assert gradient_plan(131, rule, 1, 8, 128, 132, False) == (False, gradient_head_splits(131, rule, 1, 8, 128, 132))
    assert gradient_plan(33, rule, 4, 8, 128, 132, False)[0] is True  # heads_kv counts
    assert gradient_plan(66, Visibility(129, 129, True), 1, 8, 128, 132, False)[0] is True  # a partial tile counts
    assert gradient_plan(1, Visibility(1024, 1024, True), 1, 8, 128, 8, False)[0] is True  # 8 tiles on 8 SMs
    assert gradient_plan(1, Visibility(1024, 1024, True), 1, 8, 128, 9, False)[0] is False


def test_the_fixed_order_dk_dv_kernel_walks_the_atomic_one_s_key_tiles():
    # configs.pairs_per_group counts a launch's K/V tiles on BACKWARD_TILES for either kernel.
    assert set(DK_DV_TILES) == set(BACKWARD_TILES)
    assert all(DK_DV_TILES[head_dim][1] == BACKWARD_TILES[head_dim][1] for head_dim in BACKWARD_TILES)


def test_every_region_of_the_table_is_among_the_routes():
    # At each region's corner, by an edge it takes only there: a right edge where it wants one, none where not.
    probed = {(head_dim, group, keys, edge != "none") for head_dim, group, keys, edge, routed in ROUTES if routed}
    for head_dim, regions in FIXED_ORDER_FASTER.items():
        for keys, group, right_edge_only in regions:
            assert (head_dim, group, keys, right_edge_only) in probed, (head_dim, keys, group, right_edge_only)
    assert 64 not in FIXED_ORDER_FASTER


def test_deterministic_without_a_right_edge_splits_as_the_model_says():
    model = gradient_head_splits(1, Visibility(4096, 4096, False), 1, 8, 128, 132)
    assert model > 1 and gradient_plan(1, Visibility(4096, 4096, False), 1, 8, 128, 132, True) == (True, model)
    causal = Visibility(2048, 2048, True)
    assert gradient_plan(8, causal, 1, 71, 64, 132, False) == (False, gradient_head_splits(8, causal, 1, 71, 64, 132))
