"""The tuner's decisions, on made-up measurements (CPU): which entries a ladder of timings
gives, which configs are alternated, and that alternation interleaves the configs."""

from __future__ import annotations

import pytest

from fa_kernel.configs import TileConfig, select_config
from fa_kernel.workbench.tune import (
    FINALIST_SPREAD,
    FINALISTS,
    MARGIN,
    alternate,
    candidate_configs,
    choose_bands,
    choose_entries,
    config_source,
    finalists,
    serves,
    table_text,
)

SMALL = TileConfig(128, 128, 2, 256, persistent=True)
WIDE = TileConfig(192, 128, 2, 384, persistent=True)
LONG = TileConfig(192, 128, 2, 384)
TWO_PER_SM = TileConfig(64, 128, 2, 128, blocks_per_sm=2)


def test_one_config_fastest_everywhere_is_one_entry():
    tflops = {keys: {SMALL: 300.0, LONG: 250.0} for keys in (1024, 4096, 16384)}
    assert choose_entries(tflops) == [(None, SMALL)]


def test_a_config_serves_up_to_the_last_length_it_was_measured_good_at():
    tflops = {1024: {SMALL: 300.0, LONG: 250.0}, 2048: {SMALL: 330.0, LONG: 320.0}, 4096: {SMALL: 350.0, LONG: 420.0}}
    # 2048: 320 is 3% behind, outside the margin
    assert choose_entries(tflops) == [(2048, SMALL), (None, LONG)]


def test_within_the_margin_no_new_entry():
    behind = 1 - MARGIN / 2
    tflops = {1024: {SMALL: 300.0, LONG: 200.0}, 4096: {SMALL: 400.0 * behind, LONG: 400.0}}
    assert choose_entries(tflops) == [(None, SMALL)]


def test_an_entry_starts_with_the_fastest_and_a_tie_does_not_split_it():
    # 1024: SMALL fastest, WIDE 1% behind. 2048: SMALL 13% behind, so WIDE (fastest there)
    # starts an entry; 4096: LONG 0.5% behind WIDE; 8192: WIDE 6% behind LONG.
    tflops = {
        1024: {SMALL: 300.0, WIDE: 297.0, LONG: 250.0},
        2048: {SMALL: 330.0, WIDE: 380.0, LONG: 370.0},
        4096: {SMALL: 380.0, WIDE: 430.0, LONG: 428.0},
        8192: {SMALL: 380.0, WIDE: 450.0, LONG: 480.0},
    }
    assert choose_entries(tflops) == [(1024, SMALL), (4096, WIDE), (None, LONG)]


def test_the_ladder_may_come_in_any_order_and_configs_missing_at_a_length_are_not_good_there():
    tflops = {4096: {LONG: 400.0}, 1024: {SMALL: 300.0, LONG: 100.0}}
    assert choose_entries(tflops) == [(1024, SMALL), (None, LONG)]


def test_no_measurements_is_an_error_that_says_so():
    with pytest.raises(ValueError, match="tflops: expected measurements"):
        choose_entries({})


def test_the_printed_table_is_configs_py_and_selects_what_was_chosen():
    # d64 causal: a band of small grids (up to 4 tiles an SM) of its own, then the full grid's
    # entries; d64: one band, no TUNED_GRIDS entry.
    full = [(1024, SMALL), (4096, WIDE), (None, LONG)]
    chosen = {
        (64, True): [(4.0, [(2048, TWO_PER_SM), (None, WIDE)]), (None, full)],
        (64, False): [(None, [(None, WIDE)])],
    }
    text = table_text("sm_90", chosen)
    namespace = {"TileConfig": TileConfig}
    long_part, rest = text.split("# Paste into TUNED_SHORT")
    short_part, grid_part = rest.split("# Paste into TUNED_GRIDS")
    tuned, tuned_short, tuned_grids = (
        eval("{" + part.split("\n", 1)[1] + "}", namespace)  # noqa: S307 - our own printout
        for part in (long_part, short_part, grid_part)
    )
    assert tuned == {("sm_90", 64, True): LONG, ("sm_90", 64, False): WIDE}
    assert tuned_short == {("sm_90", 64, True): ((1024, SMALL), (4096, WIDE))}
    assert tuned_grids == {("sm_90", 64, True): ((4.0, ((2048, TWO_PER_SM), (None, WIDE))),)}
    # the same lookup the package does, on the printed tables
    import fa_kernel.configs as configs

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(configs, "TUNED", tuned)
        patch.setattr(configs, "TUNED_SHORT", tuned_short)
        patch.setattr(configs, "TUNED_GRIDS", tuned_grids)
        keys = (1, 1024, 1025, 2048, 2049, 4096, 4097, None)
        full_grid = [select_config("sm_90", 64, True, n) for n in keys]
        at_the_band = [select_config("sm_90", 64, True, n, 4.0) for n in keys]
        past_it = [select_config("sm_90", 64, True, n, 4.01) for n in keys]
        without_a_band = select_config("sm_90", 64, False, 1, 0.5)
    assert full_grid == past_it == [SMALL, SMALL, WIDE, WIDE, WIDE, WIDE, LONG, LONG]
    assert at_the_band == [TWO_PER_SM] * 4 + [WIDE] * 4
    assert without_a_band == WIDE


def test_entries_serve_a_grid_where_each_length_runs_within_the_margin_of_its_fastest():
    entries = [(1024, SMALL), (None, LONG)]
    level = {1024: {SMALL: 100.0, LONG: 90.0}, 4096: {SMALL: 90.0, LONG: 100.0}}
    assert serves(entries, level)
    behind = (1 - MARGIN) * 100.0 - 0.1
    assert not serves(entries, {**level, 4096: {SMALL: 100.0, LONG: behind}})
    assert serves(entries, {**level, 4096: {SMALL: 100.0, LONG: behind + 0.2}})
    assert not serves(entries, {1024: {LONG: 100.0}})  # an entry's config not measured there: not served


def test_a_band_serves_down_while_its_entries_hold_and_the_first_grid_they_do_not_starts_the_next():
    fast_long = {1024: {SMALL: 100.0, LONG: 90.0}, 4096: {SMALL: 80.0, LONG: 100.0}}
    two_per_sm = {
        1024: {SMALL: 90.0, LONG: 80.0, TWO_PER_SM: 100.0},
        4096: {SMALL: 80.0, LONG: 100.0, TWO_PER_SM: 70.0},
    }
    bands = choose_bands({31.0: fast_long, 15.5: fast_long, 3.9: two_per_sm, 1.9: two_per_sm})
    assert bands == [(3.9, [(1024, TWO_PER_SM), (None, LONG)]), (None, [(1024, SMALL), (None, LONG)])]
    # one grid, or entries that hold on every grid: one band, the full grid's tables alone
    assert (
        choose_bands({31.0: fast_long})
        == choose_bands({31.0: fast_long, 1.9: fast_long})
        == [(None, [(1024, SMALL), (None, LONG)])]
    )
    # a grid's band is its own entries even where a smaller grid's would do again
    assert [most for most, _ in choose_bands({31.0: fast_long, 3.9: two_per_sm, 1.9: fast_long})] == [1.9, 3.9, None]
    with pytest.raises(ValueError, match="by_grid: expected the measurements of one grid"):
        choose_bands({})


def test_configs_print_as_configs_py_writes_them():
    for config in candidate_configs(True):
        assert eval(config_source(config), {"TileConfig": TileConfig}) == config  # noqa: S307
    assert config_source(WIDE) == "TileConfig(192, 128, 2, 384, persistent=True)"


def test_finalists_are_the_fastest_and_those_a_timing_cannot_tell_from_it():
    timings = {SMALL: 100.0, WIDE: 1 + 100.0 * (1 - FINALIST_SPREAD), LONG: 100.0 * (1 - FINALIST_SPREAD) - 1}
    assert finalists(timings) == [SMALL, WIDE]
    many = {TileConfig(64, block_n, 2, 128): 100.0 - block_n / 1000 for block_n in range(8, 200, 8)}
    assert finalists(many) == sorted(many, key=many.get, reverse=True)[:FINALISTS]


def test_alternation_times_every_config_once_per_round_and_takes_the_median():
    calls = []
    readings = {SMALL: iter([300.0, 100.0, 310.0]), LONG: iter([200.0, 205.0, 900.0])}

    def timer(config):
        def read():
            calls.append(config)
            return next(readings[config])

        return read

    assert alternate({SMALL: timer(SMALL), LONG: timer(LONG)}, rounds=3) == {SMALL: 300.0, LONG: 205.0}
    assert calls == [SMALL, LONG] * 3


def test_candidates_cover_every_schedule_the_tables_ship():
    from fa_kernel.configs import TUNED, TUNED_SHORT

    for (_, _, causal), config in TUNED.items():
        assert config in candidate_configs(causal), config
    for (_, _, causal), entries in TUNED_SHORT.items():
        for _, config in entries:
            assert config in candidate_configs(causal), config
    assert any(config.blocks_per_sm == 2 for config in candidate_configs(True))
    assert not any(config.blocks_per_sm == 2 for config in candidate_configs(False))
