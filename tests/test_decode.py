"""The split-KV kernels (`decode.py`): their plan, their algorithm on the CPU (the emulator),
and the kernels on a GPU, each judged against the fp32 reference with the forward's bound.

The cases come from the kernels' own conditions: a key split's end (`tiles_per_split` tiles of
`block_n` keys) and the last tile's (`key < seqlen_k`), the diagonal (bottom-right causal,
rows that see no key), the GQA group's rows in a tile (`row < rows`: group_size * seqlen_q
next to multiples of each tile's block_m), and the choice between the tiles (`row_block`: a
group's rows next to the narrower tile's).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from suite.builds import SPLIT_KV_DTYPES

from fa_kernel.configs import SPLIT_KV_FORWARD_KEYS, SPLIT_KV_QUERIES
from fa_kernel.decode import (
    HEAD_DIMS,
    MOST_ROWS,
    SPLIT_TILES,
    ceildiv,
    launch_tile,
    row_block,
    serves_launch,
    split_plan,
)
from fa_kernel.emulator_split_kv import attention_split_kv
from fa_kernel.reference import judge, random_qkv


def boundary_key_counts(block_n: int, tiles_per_split: int) -> list[int]:
    """seqlen_k on both sides of the first tile's end, the first split's and the second's."""
    split_keys = block_n * tiles_per_split
    ends = sorted({block_n, split_keys, 2 * split_keys})
    return sorted({1, *(end + side for end in ends for side in (-1, 0, 1))})


@pytest.mark.parametrize("tile_key", sorted(SPLIT_TILES), ids=lambda key: f"d{key[0]}-{key[1]}rows")
@pytest.mark.parametrize("sm_count", [1, 4, 132])
@pytest.mark.parametrize("batch_heads", [(1, 1), (2, 8), (64, 8)])
def test_split_plan_covers_every_tile_once_and_fills_the_gpu(tile_key, sm_count, batch_heads):
    batch, heads_kv = batch_heads
    tile = SPLIT_TILES[tile_key]
    for seqlen_k in (1, tile.block_n - 1, tile.block_n, tile.block_n + 1, 1000, 8192, 32768 + 1):
        for row_blocks in (1, 2):
            splits, tiles_per_split = split_plan(batch, heads_kv, row_blocks, seqlen_k, tile, sm_count)
            tiles = ceildiv(seqlen_k, tile.block_n)
            # Every tile in one split, and every split with a tile (the kernel's `tiles` >= 1).
            assert (splits - 1) * tiles_per_split < tiles <= splits * tiles_per_split
            # At most the splits blocks_per_sm on every SM asks for (no second, partial wave),
            # at most one per tile, at least one, and at least half as many.
            wanted = max(1, tile.blocks_per_sm * sm_count // (batch * heads_kv * row_blocks))
            assert 1 <= splits <= min(wanted, tiles) <= 2 * splits


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_a_launch_takes_the_narrowest_tile_that_holds_its_groups_rows(head_dim):
    blocks = sorted(block_m for dim, block_m in SPLIT_TILES if dim == head_dim)
    assert blocks[-1] == MOST_ROWS
    for narrower, wider in zip([0, *blocks], blocks, strict=False):
        for rows in (narrower + 1, wider):  # both ends of the rows each tile takes
            assert row_block(head_dim, rows) == wider
    # Past the widest (flash_attn_func routes no such step here; split_kv_into still runs it).
    assert row_block(head_dim, MOST_ROWS + 1) == MOST_ROWS
    # launch_tile reads the group's rows off the inputs: 16 queries of a group of 4 is 64 rows.
    q, k = torch.empty(1, 16, 8, head_dim), torch.empty(1, 5, 2, head_dim)
    assert launch_tile(q, k) == SPLIT_TILES[head_dim, row_block(head_dim, 64)]


def test_one_query_of_a_group_of_up_to_16_heads_runs_on_16_rows_at_d64_and_d128():
    # cuDNN's decode tile (docs/performance.md: 1.09-1.36x the 64-row tile's GPU time).
    for head_dim in (64, 128):
        assert row_block(head_dim, 16) == 16 and row_block(head_dim, 17) == 64
    assert row_block(256, 1) == 64


def emulator_cases():
    """(batch, seqlen_q, heads, heads_kv, seqlen_k, head_dim, block_n, tiles_per_split)."""
    cases = []
    for tiles_per_split in (1, 3):
        for seqlen_k in boundary_key_counts(64, tiles_per_split):
            cases.append((1, 3, 4, 2, seqlen_k, 64, 64, tiles_per_split))
    # seqlen_q > seqlen_k: causal rows that see no key; one query; MQA.
    cases += [(2, 9, 2, 1, 5, 64, 64, 1), (1, 1, 6, 1, 130, 128, 64, 2), (1, 70, 1, 1, 200, 64, 64, 1)]
    return cases


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", emulator_cases(), ids=lambda case: "x".join(map(str, case)))
def test_emulator_within_the_bound(case, causal):
    batch, seqlen_q, heads, heads_kv, seqlen_k, head_dim, block_n, tiles_per_split = case
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, torch.float16, seqlen_k, "cpu")
    out, lse = attention_split_kv(q, k, v, None, causal, block_n, tiles_per_split)
    verdict = judge(q, k, v, out, lse, causal)
    assert verdict.passed, verdict
    if causal and seqlen_q > seqlen_k:  # rows that see no key: 0 and -inf, never NaN
        hidden = seqlen_q - seqlen_k
        assert torch.all(out[:, :hidden] == 0) and torch.all(lse[..., :hidden] == -math.inf)


def test_emulator_a_nan_reaches_the_rows_that_see_its_key_only():
    # Causal, 4 queries against 200 keys in splits of 64: query i sees keys j <= i + 196. A NaN
    # in key 199 is hidden from queries 0-2 (a select, not an addition, masks it), in the last
    # split; a NaN in key 10, which every query sees, reaches all of them.
    q, k, v = random_qkv(1, 4, 200, 2, 1, 64, torch.bfloat16, seed=0, device="cpu")
    k[0, 199, 0, 5] = math.nan
    out, lse = attention_split_kv(q, k, v, None, True, 64, 1)
    assert torch.isnan(out[0, 3]).all() and torch.isnan(lse[0, :, 3]).all()
    assert torch.isfinite(out[0, :3]).all() and torch.isfinite(lse[0, :, :3]).all()
    k[0, 10, 0, 5] = math.nan
    out, _ = attention_split_kv(q, k, v, None, True, 64, 1)
    assert torch.isnan(out).all()


# ---- the kernels on a GPU ----


def gpu_cases():
    """(batch, seqlen_q, heads, heads_kv, seqlen_k, head_dim, tiles_per_split): the K/V tiles per
    split chosen, so that split ends fall next to the tile counts; None: split_plan's, for an
    H200's 132 SMs. Every tile (SPLIT_TILES) gets its split and key ends, with a group's rows
    filling its row block, and its row block's end on both sides (which crosses to the wider
    tile past the narrower one's)."""
    cases = []
    for (head_dim, block_m), tile in sorted(SPLIT_TILES.items()):
        for tiles_per_split in (1, 2):
            for seqlen_k in boundary_key_counts(tile.block_n, tiles_per_split):
                cases.append((1, block_m // 4, 8, 2, seqlen_k, head_dim, tiles_per_split))
        for rows in (block_m - 1, block_m, block_m + 1, 2 * block_m + 1):
            # No GQA: seqlen_q is the rows; a group of 4: its query heads split across blocks.
            cases.append((2, rows, 2, 2, 3 * tile.block_n + 5, head_dim, None))
            cases.append((2, ceildiv(rows, 4), 8, 2, 3 * tile.block_n + 5, head_dim, None))
        cases += [(3, 1, 32, 8, 8192 + 7, head_dim, None), (1, 9, 4, 4, 5, head_dim, None)]
    return sorted(set(cases), key=cases.index)


def test_every_tile_has_its_key_ends_and_both_sides_of_its_row_block():
    runs = {}
    for _, seqlen_q, heads, heads_kv, _, head_dim, _ in gpu_cases():
        rows = heads // heads_kv * seqlen_q
        runs.setdefault((head_dim, row_block(head_dim, rows)), set()).add(rows)
    for (head_dim, block_m), rows in runs.items():
        assert block_m in rows and block_m - 1 in rows, (head_dim, block_m, rows)
    assert set(runs) == set(SPLIT_TILES)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", gpu_cases(), ids=lambda case: "x".join(map(str, case)))
def test_split_kv_kernels_within_the_bound(case, causal):
    from fa_kernel.decode import split_kv_into, split_plan_for
    from fa_kernel.interface import compile_arch

    batch, seqlen_q, heads, heads_kv, seqlen_k, head_dim, tiles_per_split = case
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, SPLIT_KV_DTYPES[head_dim], seed=seqlen_k)
    if tiles_per_split is None:
        splits, tiles_per_split = split_plan_for(q, k, sm_count=132)
    else:
        splits = ceildiv(ceildiv(seqlen_k, launch_tile(q, k).block_n), tiles_per_split)
    # Every buffer NaN: an element no thread block writes fails, whatever the memory held.
    out = torch.full_like(q, math.nan)
    lse = torch.full((batch, heads, seqlen_q), math.nan, device=q.device)
    o_partial = torch.full((batch, splits, heads, seqlen_q, head_dim), math.nan, device=q.device)
    lse_partial = torch.full((batch, splits, heads, seqlen_q), math.nan, device=q.device)
    scale = 1.0 / math.sqrt(head_dim)
    split_kv_into(out, lse, o_partial, lse_partial, q, k, v, scale, causal, tiles_per_split, compile_arch(q.device))
    verdict = judge(q, k, v, out, lse, causal)
    assert verdict.passed, f"{case} causal={causal}: {verdict}"


# (batch, seqlen_q, seqlen_k, heads, heads_kv, causal, served on 132 SMs): flash_attn_func's
# switch to the split-KV kernels (configs.split_kv_serves at d128), both sides of each condition.
ROUTED = [
    (1, MOST_ROWS // 4, 8192, 32, 8, False, True),  # a group's rows fill the widest row block
    (1, MOST_ROWS // 4 + 1, 8192, 32, 8, False, False),
    (1, 2, 8192, 32, 8, True, True),  # the causal mask, as the full one
    (1, MOST_ROWS // 4, 8192, 32, 8, True, True),
    (1, 1, 3072, 32, 8, False, False),  # the forward kernel's keys per SM: 3072 on one wave
    (1, 1, 4096, 32, 8, True, True),  # 4096
    (4, 1, 2048, 32, 8, False, False),  # 2048 on one wave of 4 batches
    (16, 8, 2048, 32, 8, True, True),  # 8 queries of a group at few keys, then 9
    (16, 9, 2048, 32, 8, True, False),
    (16, 9, 3072, 32, 8, False, True),  # 9 at more keys
    (1, 8, 8192, 32, 32, False, True),  # no GQA: 8 queries, then 9
    (1, 9, 8192, 32, 32, False, False),
]


def test_routed_cases_sit_where_they_claim_on_an_h200():
    for batch, seqlen_q, seqlen_k, heads, heads_kv, _, served in ROUTED:
        assert serves_launch(batch, seqlen_q, seqlen_k, heads, heads_kv, 132) is served


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "seqlen_q", "seqlen_k", "heads", "heads_kv", "causal", "served"), ROUTED)
def test_flash_attn_func_gives_decode_steps_to_the_split_kv_kernels(
    monkeypatch, batch, seqlen_q, seqlen_k, heads, heads_kv, causal, served
):
    import fa_kernel.interface as interface
    from fa_kernel.device import device_target
    from fa_kernel.interface import flash_attn_func

    calls = []
    split_kv_attention = interface.split_kv_attention
    monkeypatch.setattr(
        interface, "split_kv_attention", lambda *args, **kw: calls.append(args) or split_kv_attention(*args, **kw)
    )
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, 128, torch.float16, seed=seqlen_q)
    out, lse = flash_attn_func(q, k, v, causal=causal, return_lse=True)
    # On 132 SMs as the case claims; elsewhere, as the rule says for the device's SMs.
    assert bool(calls) is serves_launch(batch, seqlen_q, seqlen_k, heads, heads_kv, device_target()[0])
    verdict = judge(q, k, v, out, lse, causal)
    assert verdict.passed, f"{batch}x{heads}/{heads_kv}x{seqlen_q}x{seqlen_k} causal={causal}: {verdict}"


@pytest.mark.gpu
@pytest.mark.parametrize("past", [False, True], ids=["half-the-sms", "one-head-more"])
def test_without_gqa_decode_steps_go_to_the_split_kv_kernels_while_the_grid_fills_half_the_sms(monkeypatch, past):
    # One query per head of one sequence: the forward kernel's grid is one tile per head, one
    # wave, and its keys per SM past SPLIT_KV_FORWARD_KEYS.
    import fa_kernel.interface as interface
    from fa_kernel.device import device_target
    from fa_kernel.interface import flash_attn_func

    calls = []
    split_kv_attention = interface.split_kv_attention
    monkeypatch.setattr(
        interface, "split_kv_attention", lambda *args, **kw: calls.append(args) or split_kv_attention(*args, **kw)
    )
    heads = device_target()[0] // 2 + past
    q, k, v = random_qkv(1, 1, SPLIT_KV_FORWARD_KEYS + 7, heads, heads, 64, torch.bfloat16, seed=heads)
    out, lse = flash_attn_func(q, k, v, return_lse=True)
    assert bool(calls) is not past
    verdict = judge(q, k, v, out, lse, False)
    assert verdict.passed, f"{heads} heads: {verdict}"


def first_served_keys(batch, seqlen_q, heads, heads_kv, sm_count, most=1 << 16) -> int | None:
    """The fewest keys at which flash_attn_func gives this step to the split-KV kernels (None: not
    up to `most`); serves_launch only grows with seqlen_k."""
    if not serves_launch(batch, seqlen_q, most, heads, heads_kv, sm_count):
        return None
    fewest, enough = 1, most
    while fewest < enough:
        middle = (fewest + enough) // 2
        if serves_launch(batch, seqlen_q, middle, heads, heads_kv, sm_count):
            enough = middle
        else:
            fewest = middle + 1
    return fewest


@st.composite
def decode_steps(draw) -> tuple:
    """(batch, seqlen_q, heads, heads_kv, seqlen_k, head_dim, causal, dtype, seed): a few queries
    against a KV cache, on both sides of flash_attn_func's switch to the split-KV kernels: the
    group's rows next to each tile's block_m, seqlen_q next to SPLIT_KV_QUERIES, keys next to
    the fewest the split kernels take the step at (on 132 SMs), next to the split kernel's tile
    ends, or anywhere up to a few thousand."""
    head_dim = draw(st.sampled_from(HEAD_DIMS))
    group_size = draw(st.sampled_from([1, 2, 3, 4, 5, 8]))
    heads_kv = draw(st.sampled_from([1, 2]))
    batch = draw(st.integers(1, 3))
    fits = {block_m // group_size for dim, block_m in SPLIT_TILES if dim == head_dim}
    near_fits = {max(1, fit + side) for fit in fits for side in (-1, 0, 1)}
    seqlen_q = draw(st.sampled_from(sorted({1, 2, *near_fits, SPLIT_KV_QUERIES, SPLIT_KV_QUERIES + 1})))
    heads = group_size * heads_kv
    block_n = SPLIT_TILES[head_dim, row_block(head_dim, group_size * seqlen_q)].block_n
    near_tiles = [n * block_n + step for n in (1, 2, 7) for step in (-1, 0, 1)]
    switch = first_served_keys(batch, seqlen_q, heads, heads_kv, 132)
    near_switch = [switch - 1, switch] if switch else near_tiles
    seqlen_k = draw(st.one_of(st.sampled_from(near_switch), st.sampled_from(near_tiles), st.integers(1, 3000)))
    causal = draw(st.booleans())
    dtype = draw(st.sampled_from([torch.float16, torch.bfloat16]))
    return (batch, seqlen_q, heads, heads_kv, seqlen_k, head_dim, causal, dtype, draw(st.integers(0, 2**31 - 1)))


@pytest.mark.gpu
@given(step=decode_steps())
def test_decode_steps_match_the_reference_on_both_sides_of_the_switch(step):
    from fa_kernel.interface import flash_attn_func

    batch, seqlen_q, heads, heads_kv, seqlen_k, head_dim, causal, dtype, seed = step
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, seed=seed)
    out, lse = flash_attn_func(q, k, v, causal=causal, return_lse=True)
    verdict = judge(q, k, v, out, lse, causal)
    assert verdict.passed, f"{step}: {verdict}"
