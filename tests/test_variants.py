"""Sliding windows, softcap and sinks in the emulators (the kernels' specification), on the CPU:
each within the judge's bound of the fp32 reference, on cases drawn from the variants' own edges.

The window's edges are placed on the tiles' boundaries, one key either side of them, at 0 and 1,
and wider than the sequence; windows that leave rows with no key (their output 0, their LSE the
sink or -inf); causal together with a window. Softcaps of 0.05 (every score saturated), 1 and 30
(Gemma 2's), on scores of order one and on large ones.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from fa_kernel.configs import TileConfig
from fa_kernel.emulator import attention_backward_tiled, attention_tiled
from fa_kernel.emulator_split_kv import attention_split_kv
from fa_kernel.reference import judge, random_qkv
from fa_kernel.reference_backward import judge_backward
from fa_kernel.variants import keys_a_row_sees, window_first_tile

# Small tiles, so that short sequences hold many of them: the edges' cases are about tiles.
CONFIG = TileConfig(64, 32, 2, 128)
BLOCK_M, BLOCK_N = CONFIG.block_m, CONFIG.block_n
# (seqlen_q, seqlen_k): off the tile grid both ways, more queries than keys, and the reverse.
LENGTHS = [(100, 150), (150, 100), (64, 96)]


def edge_windows() -> list[tuple[int, int]]:
    """(left, right) with an edge at 0, 1, a tile's width ±1 and beyond the sequence, on each side."""
    near = [0, 1, BLOCK_N - 1, BLOCK_N, BLOCK_N + 1, 1000]
    return [(left, -1) for left in near] + [(-1, right) for right in near] + [(BLOCK_N, 1), (1, BLOCK_N - 1)]


def sinks_for(nheads: int, seed: int) -> torch.Tensor:
    return torch.randn(nheads, generator=torch.Generator().manual_seed(seed)) * 2


@pytest.mark.parametrize("lengths", LENGTHS, ids=str)
@pytest.mark.parametrize("window", edge_windows(), ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_emulated_window_within_the_bound(lengths, window, causal):
    seqlen_q, seqlen_k = lengths
    q, k, v = random_qkv(1, seqlen_q, seqlen_k, 2, 1, 64, torch.float16, seed=seqlen_q + window[0], device="cpu")
    out, lse = attention_tiled(q, k, v, causal=causal, config=CONFIG, window_size=window)
    verdict = judge(q, k, v, out, lse, causal, window_size=window)
    assert verdict.passed, str(verdict)


@pytest.mark.parametrize("softcap", [0.05, 1.0, 30.0])
@pytest.mark.parametrize("logits", [1.0, 20.0], ids=["unit", "large"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_emulated_softcap_within_the_bound(softcap, logits, dtype):
    q, k, v = random_qkv(1, 100, 150, 2, 1, 64, dtype, seed=int(softcap * 10), device="cpu")
    q = (q.float() * logits).to(dtype)
    out, lse = attention_tiled(q, k, v, causal=True, config=CONFIG, softcap=softcap)
    verdict = judge(q, k, v, out, lse, True, softcap=softcap)
    assert verdict.passed, str(verdict)


@pytest.mark.parametrize("window", [(-1, -1), (0, 0), (3, -1)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_emulated_sinks_within_the_bound_and_rows_without_a_key_get_the_sink_alone(window, causal):
    # 150 queries on 100 keys, causal: the first 50 rows see no key; a window (0, 0) leaves
    # every row one key or none. Sinks of either sign, larger than every score and smaller.
    q, k, v = random_qkv(1, 150, 100, 4, 2, 64, torch.bfloat16, seed=7, device="cpu")
    sinks = torch.tensor([-3.0, 0.0, 2.5, 40.0])
    out, lse = attention_tiled(q, k, v, causal=causal, config=CONFIG, window_size=window, sinks=sinks)
    verdict = judge(q, k, v, out, lse, causal, window_size=window, sinks=sinks)
    assert verdict.passed, str(verdict)
    if causal:
        assert torch.all(out[:, :50] == 0) and torch.equal(lse[0, :, 0], sinks)


def test_a_row_without_a_key_and_without_a_sink_is_zero_with_lse_minus_inf():
    q, k, v = random_qkv(1, 70, 40, 2, 2, 64, torch.float16, seed=1, device="cpu")
    out, lse = attention_tiled(q, k, v, causal=True, config=CONFIG, window_size=(5, -1))
    assert torch.all(out[:, :30] == 0) and torch.all(lse[..., :30] == -math.inf)
    assert judge(q, k, v, out, lse, True, window_size=(5, -1)).passed


def backward_edge_windows(seqlen_q: int, seqlen_k: int) -> list[tuple[int, int]]:
    """(left, right) whose edges put the query walk of a K/V tile (attention_backward_tiled) on a
    query tile's boundary, one row before it and one after: the left edge ends the walk of the
    first K/V tile there, the right edge starts it there."""
    offset = seqlen_k - seqlen_q
    windows = []
    first_end = min(BLOCK_N, seqlen_k) - offset  # the first K/V tile's rows end at first_end + left
    left = -first_end % BLOCK_M or BLOCK_M
    windows += [(left + step, -1) for step in (-1, 0, 1) if left + step >= 0]
    start = -offset  # the first K/V tile's rows start at -offset - right
    if start > 0:
        right = start % BLOCK_M
        windows += [(-1, right + step) for step in (-1, 0, 1) if right + step >= 0]
    return windows


BACKWARD_CASES = [
    *(
        (lengths, window, 0.0, False)
        for lengths in [(130, 200), (200, 130)]
        for window in [*backward_edge_windows(*lengths), (0, 1)]
    ),
    ((130, 200), (-1, -1), 2.0, False),
    ((200, 130), (-1, -1), 0.0, True),
    ((130, 200), (40, 3), 2.0, True),
]


@pytest.mark.parametrize(("lengths", "window", "softcap", "with_sinks"), BACKWARD_CASES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_emulated_backward_of_the_variants_within_the_bound(lengths, window, softcap, with_sinks, causal):
    # The backward walks only the query tiles whose windows reach a K/V tile: a walk off by a
    # row drops a row's gradient, which the bound sees.
    seqlen_q, seqlen_k = lengths
    q, k, v = random_qkv(1, seqlen_q, seqlen_k, 4, 2, 64, torch.bfloat16, seed=seqlen_q, device="cpu")
    q = (q.float() * 3).to(q.dtype)  # scores of a few units: the cap bends them
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).to(q.dtype)
    options = dict(window_size=window, softcap=softcap, sinks=sinks_for(4, 3) if with_sinks else None)
    out, lse = attention_tiled(q, k, v, causal=causal, config=CONFIG, **options)
    grads = attention_backward_tiled(
        q, k, v, out, lse, dout, causal=causal, block_m=BLOCK_M, block_n=BLOCK_N, **options
    )
    verdict = judge_backward(q, k, v, dout, grads, causal, **options)
    assert verdict.passed, str(verdict)


def test_the_backward_edge_windows_sit_on_the_query_tiles():
    for seqlen_q, seqlen_k in [(130, 200), (200, 130)]:
        offset = seqlen_k - seqlen_q
        for left, right in backward_edge_windows(seqlen_q, seqlen_k):
            if left >= 0:
                end = min(BLOCK_N, seqlen_k) - offset + left
                assert end % BLOCK_M in (BLOCK_M - 1, 0, 1), (left, end)
            if right >= 0:
                assert (-offset - right) % BLOCK_M in (BLOCK_M - 1, 0, 1), right


def test_the_walks_skip_exactly_the_tiles_outside_every_window():
    # The work grows with the window, not the sequence: at 2048 keys and a window of 64, each
    # row block visits the few tiles its windows cross (counted by the emulator's own loop
    # bounds, as the kernel will), and nothing it skips holds a visible key.
    from fa_kernel.reference import visible_keys

    seqlen = 2048
    left = 64
    visible = visible_keys(seqlen, seqlen, True, window_size=(left, -1))
    for q_start in range(0, seqlen, BLOCK_M):
        first_key = max(0, q_start - left)
        first_block = first_key // BLOCK_N
        last_block = -(-(q_start + BLOCK_M) // BLOCK_N)
        rows = visible[q_start : q_start + BLOCK_M]
        seen = rows.any(dim=0).nonzero().flatten()
        assert first_block * BLOCK_N <= seen.min() and seen.max() < last_block * BLOCK_N
        assert last_block - first_block <= -(-(left + BLOCK_M) // BLOCK_N) + 1
    assert list(itertools.islice(edge_windows(), 1)) == [(0, -1)]


# ---- the split-KV emulator (decode steps): the splits start at the window's first tile ----


@pytest.mark.parametrize("tiles_per_split", [1, 3])
@pytest.mark.parametrize(
    ("window", "softcap", "with_sinks"),
    [
        ((-1, -1), 0.0, True),
        ((50, -1), 0.0, False),
        ((50, -1), 0.0, True),
        ((150, -1), 0.0, True),
        ((200, 3), 30.0, True),
        ((-1, -1), 1.0, False),
        ((0, 0), 0.0, True),
    ],
    ids=str,
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_emulated_split_kv_variants_within_the_bound(causal, window, softcap, with_sinks, tiles_per_split):
    # Four queries of 8 heads on 2 K/V heads against 700 keys: a decode step of a GQA group.
    q, k, v = random_qkv(2, 4, 700, 8, 2, 64, torch.bfloat16, seed=sum(window) + 3, device="cpu")
    sinks = sinks_for(8, seed=4) if with_sinks else None
    variants = dict(window_size=window, softcap=softcap, sinks=sinks)
    out, lse = attention_split_kv(q, k, v, None, causal, 64, tiles_per_split, **variants)
    verdict = judge(q, k, v, out, lse, causal, **variants)
    assert verdict.passed, str(verdict)


@pytest.mark.parametrize(
    ("seqlen_q", "seqlen_k", "left", "expected"),
    [(1, 1000, -1, 0), (1, 1000, 0, 999 // 64), (1, 1000, 999, 0), (4, 1000, 100, (996 - 100) // 64), (300, 200, 5, 0)],
)
def test_the_splits_start_at_the_first_querys_first_key(seqlen_q, seqlen_k, left, expected):
    assert window_first_tile(seqlen_q, seqlen_k, left, 64) == expected


@pytest.mark.parametrize(
    "seqlen_k, causal, window_size, expected",
    [
        (32768, True, (-1, -1), 32768),  # no left edge: every key of the sequence
        (32768, False, (128, -1), 32768),  # a left edge without a right one: the keys after it
        (32768, True, (128, -1), 129),  # causal is right = 0: the row's key and 128 before it
        (32768, True, (128, 5), 129),  # causal's right edge wins over the window's
        (32768, False, (128, 5), 134),
        (32768, False, (0, 0), 1),
        (100, True, (4096, 0), 100),  # a window wider than the sequence
        (100, False, (99, 0), 100),
        (100, False, (98, 0), 99),
    ],
)
def test_a_row_sees_the_window_span_or_the_sequence(seqlen_k, causal, window_size, expected):
    assert keys_a_row_sees(seqlen_k, causal, window_size) == expected


def test_a_short_window_on_a_long_sequence_gets_the_short_entry():
    # The config table is keyed by the keys a row sees: a window of 128 keys on 32k tokens runs the
    # config tuned for few keys, as the same window does on a short sequence.
    from fa_kernel.configs import select_config

    for head_dim in (64, 128):
        short = select_config("sm_90", head_dim, True, 1024)
        windowed = select_config("sm_90", head_dim, True, keys_a_row_sees(32768, True, (128, 0)))
        assert windowed == short != select_config("sm_90", head_dim, True, 32768)


def test_the_forward_picks_its_config_by_the_keys_a_row_sees(monkeypatch):
    import fa_kernel.interface as interface

    asked = []

    class Asked(Exception):
        pass

    def tile_config_for(device, head_dim, causal, seqlen_k, grid):
        asked.append(seqlen_k)
        raise Asked

    monkeypatch.setattr(interface, "device_target", lambda device: (132, "sm_90a"))
    monkeypatch.setattr(interface, "tile_config_for", tile_config_for)
    q = torch.zeros(1, 8, 2, 64, dtype=torch.float16)
    k = v = torch.zeros(1, 4096, 2, 64, dtype=torch.float16)
    for window_size in ((-1, -1), (128, -1)):
        with pytest.raises(Asked):
            interface.forward_kernel_attention(q, k, v, 0.125, True, window_size=window_size)
    assert asked == [4096, 129]
