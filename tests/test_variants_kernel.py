"""Sliding windows, softcap and sinks in the forward and gradient kernels, judged by
`reference.judge` and `reference_backward.judge_backward` like everything else
(tests/test_variants.py holds the same cases for the emulators, on the CPU).

Every boundary sweep build (each config the tables ship, the fallback, the persistent ones on a
small grid) runs twice more (suite.builds.variant_builds):

- with a window's edges and sinks compiled in: edges at 0 and 1, on its tiles' boundaries and one
  key either side (block_n, block_m, a warpgroup's rows, two K/V tiles), and wider than the
  sequence; left, right and both, at lengths that cut the last tiles and with more queries than
  keys, so some windows leave rows with no key (output 0, the LSE the sink alone); the causal
  builds with a left edge;
- with a softcap and a left edge (the mask is then a select after the cap): caps that saturate
  every score (0.05), 1, Gemma 2's 30 and 50, on scores of order one, large ones and the
  hard-scores distributions.

The gradients (both dQ kernels) run the same edges against the gradient kernels' own tiles,
softcaps, and every variant at once through autograd, eager and compiled, dsinks included.
"""

from __future__ import annotations

import pytest
import torch
from suite.boundaries import SWEEP_HEADS, SWEEP_HEADS_KV, build_id, rows_per_warpgroup, sweep_builds
from suite.builds import SOFTCAP_VARIANTS, WINDOW_VARIANTS
from suite.launch import device_arch, run_config
from suite.strategies import HARD_SCORES, hard_score_cases, sinks_for

from fa_kernel import flash_attn_func
from fa_kernel.configs import (
    BACKWARD_TILES,
    DK_DV_TILES,
    DQ_TILES,
    HEAD_SPLIT_DIMS,
    SPLIT_TILES,
    TileConfig,
    dk_dv_tiles,
)
from fa_kernel.decode import split_kv_into
from fa_kernel.gradient import backward_into
from fa_kernel.kernel import compiled_forward
from fa_kernel.reference import judge, random_qkv
from fa_kernel.reference_backward import judge_backward

BUILDS = sweep_builds()


def window_shapes(config: TileConfig) -> list[tuple[int, int]]:
    """(seqlen_q, seqlen_k): both cutting their last tile, a cut query block over whole K/V tiles,
    and more queries than keys (rows before the diagonal's start see nothing of a right edge)."""
    block_m, block_n = config.block_m, config.block_n
    return [(2 * block_m + 1, 3 * block_n + 3), (block_m - 1, 4 * block_n), (3 * block_m + 5, 2 * block_n - 1)]


def edge_values(config: TileConfig) -> list[int]:
    """0, 1, each block boundary of the config and a key either side of it, and wider than any
    sequence here."""
    values = {0, 1}
    for boundary in (config.block_n, config.block_m, rows_per_warpgroup(config), 2 * config.block_n):
        values |= {boundary - 1, boundary, boundary + 1}
    return [*sorted(values), 100_000]


def windows(config: TileConfig, causal: bool) -> list[tuple[int, int]]:
    values = edge_values(config)
    left_only = [(left, -1) for left in values]
    if causal:
        return left_only
    return left_only + [(-1, right) for right in values] + list(zip(values, reversed(values), strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize("build", BUILDS, ids=build_id)
def test_window_sweep_with_sinks(build, request):
    variants = WINDOW_VARIANTS[build["causal"]]
    kernel = compiled_forward(**build, arch=device_arch(), variants=variants)
    config, causal, head_dim = build["config"], build["causal"], build["head_dim"]
    fail_fast = request.config.getoption("maxfail") == 1  # under -x (the mutant runner) the first is enough
    sinks = sinks_for(SWEEP_HEADS, seed=head_dim)
    failures = []
    for seqlen_q, seqlen_k in window_shapes(config):
        q, k, v = random_qkv(1, seqlen_q, seqlen_k, SWEEP_HEADS, SWEEP_HEADS_KV, head_dim, torch.float16)
        for window in windows(config, causal):
            for sink in (sinks, None):
                # Without sinks: the build's sinks at -inf, which join no row.
                launched = sink if sink is not None else torch.full_like(sinks, -torch.inf)
                out, lse = run_config(
                    q, k, v, head_dim**-0.5, causal, config, kernel=kernel, variants=variants,
                    window_size=window, sinks=launched,
                )  # fmt: skip
                verdict = judge(q, k, v, out, lse, causal, window_size=window, sinks=sink)
                if not verdict.passed:
                    failures.append(f"({seqlen_q}, {seqlen_k}) window {window} sinks {sink is not None}: {verdict}")
                    if fail_fast:
                        break
    shown = "\n".join(failures[:10])
    assert not failures, f"{len(failures)} cases fail:\n{shown}"


@pytest.mark.gpu
@pytest.mark.parametrize("build", BUILDS, ids=build_id)
def test_softcap_with_a_left_edge(build):
    kernel = compiled_forward(**build, arch=device_arch(), variants=SOFTCAP_VARIANTS)
    config, causal, head_dim = build["config"], build["causal"], build["head_dim"]
    seqlen_q, seqlen_k = window_shapes(config)[0]
    q, k, v = random_qkv(1, seqlen_q, seqlen_k, SWEEP_HEADS, SWEEP_HEADS_KV, head_dim, torch.float16)  # the build's
    failures = []
    for softcap in (0.05, 1.0, 30.0, 50.0):
        for logits in (1.0, 20.0):
            for window in ((-1, -1), (config.block_n + 1, -1), (0, -1)):
                scaled_q = (q.float() * logits).to(q.dtype)
                out, lse = run_config(
                    scaled_q, k, v, head_dim**-0.5, causal, config, kernel=kernel, variants=SOFTCAP_VARIANTS,
                    window_size=window, softcap=softcap,
                )  # fmt: skip
                verdict = judge(scaled_q, k, v, out, lse, causal, window_size=window, softcap=softcap)
                if not verdict.passed:
                    failures.append(f"softcap {softcap} logits x{logits} window {window}: {verdict}")
    assert not failures, "\n".join(failures[:10])


@pytest.mark.gpu
@pytest.mark.parametrize("distribution", sorted(HARD_SCORES))
@pytest.mark.parametrize("build", BUILDS, ids=build_id)
def test_softcap_on_hard_scores(build, distribution):
    # Scores that jump between key tiles and logits past fp16's range, capped at 30: the stale
    # max and its vote on capped scores.
    kernel = compiled_forward(**build, arch=device_arch(), variants=SOFTCAP_VARIANTS)
    for case in hard_score_cases(build, distribution):
        q, k, v = case.inputs("cuda")
        out, lse = run_config(
            q, k, v, case.scale, build["causal"], build["config"], kernel=kernel, variants=SOFTCAP_VARIANTS,
            softcap=30.0,
        )  # fmt: skip
        verdict = judge(q, k, v, out, lse, build["causal"], case.scale, softcap=30.0)
        assert verdict.passed, f"{case}: {verdict}"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "kwargs",
    [
        {"window_size": (256, 0)},
        {"window_size": (100, 37), "causal": True},
        {"softcap": 30.0, "causal": True},
        {"softcap": 50.0, "window_size": (128, 128)},
        {"sinks": "random", "window_size": (64, -1), "causal": True},
    ],
    ids=str,
)
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 8, 2, 128), (3, 1, 5000, 8, 1, 64)], ids=["prefill", "decode"])
def test_flash_attn_func_with_variants(shape, kwargs):
    # Through the API: the build it picks for the call's variants, decode steps included (the
    # split-KV kernels' builds with the variants compiled in, where the routing sends the step).
    batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim = shape
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, torch.bfloat16)
    if kwargs.get("sinks") == "random":
        kwargs = dict(kwargs, sinks=sinks_for(nheads, seed=1))
    out, lse = flash_attn_func(q, k, v, return_lse=True, **kwargs)
    causal = kwargs.pop("causal", False)
    verdict = judge(q, k, v, out, lse, causal, **kwargs)
    assert verdict.passed, str(verdict)


@pytest.mark.gpu
def test_no_keys_with_sinks_gives_the_sink_alone():
    q, k, v = random_qkv(2, 7, 0, 4, 2, 64, torch.float16)
    sinks = sinks_for(4, seed=2)
    out, lse = flash_attn_func(q, k, v, return_lse=True, sinks=sinks)
    assert torch.all(out == 0) and torch.equal(lse, sinks[None, :, None].expand_as(lse))


# ---- the gradients: every backward tile's edges, both dQ kernels ----


def backward_windows(head_dim: int, causal: bool) -> list[tuple[int, int]]:
    """Edges at 0, 1, each block size of the gradient kernels (BACKWARD_TILES, DK_DV_TILES, DQ_TILES) and a key
    either side, and wider than any sequence here; left alone under causal, else left, right and
    both."""
    values = {0, 1, 100_000}
    for tiles in (BACKWARD_TILES, DK_DV_TILES, DQ_TILES):
        block_m, block_n, _ = tiles[head_dim]
        for boundary in (block_m, block_n):
            values |= {boundary - 1, boundary, boundary + 1}
    values = sorted(values)
    left_only = [(left, -1) for left in values]
    if causal:
        return left_only
    return left_only + [(-1, right) for right in values] + list(zip(values, values[::-1], strict=True))


def kernel_gradients_with(q, k, v, dout, causal, deterministic, head_splits=None, **variants):
    """(dq, dk, dv, dsinks) of the backward kernels, written into NaN, for the forward kernel's
    (out, lse) with the same variants (dsinks None without sinks); `head_splits` as
    backward_into takes it; dQ by the path `deterministic` names, unrouted."""
    out, lse = flash_attn_func(q, k, v, causal=causal, return_lse=True, **variants)
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    scale = q.shape[-1] ** -0.5
    options = dict(variants, head_splits=head_splits, route=False)
    dsinks = backward_into(*grads, dout, None, q, k, v, out, lse, scale, causal, deterministic, **options)
    return (*grads, dsinks) if dsinks is not None else grads


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic-dq", "fixed-order-dq"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", sorted(BACKWARD_TILES))
def test_backward_window_sweep_with_sinks(head_dim, causal, deterministic):
    block_m, block_n, _ = dk_dv_tiles(deterministic)[head_dim]
    sinks = sinks_for(4, seed=head_dim)
    failures = []
    for seqlen_q, seqlen_k in ((2 * block_m + 3, 2 * block_n + 5), (3 * block_m - 1, block_n + 1)):
        q, k, v = random_qkv(1, seqlen_q, seqlen_k, 4, 2, head_dim, torch.bfloat16)
        dout = torch.randn_like(q)
        for window in backward_windows(head_dim, causal):
            for sink in (sinks, None):
                grads = kernel_gradients_with(q, k, v, dout, causal, deterministic, window_size=window, sinks=sink)
                verdict = judge_backward(q, k, v, dout, grads, causal, window_size=window, sinks=sink)
                if not verdict.passed:
                    failures.append(f"({seqlen_q}, {seqlen_k}) window {window} sinks {sink is not None}: {verdict}")
    assert not failures, f"{len(failures)} cases fail:\n" + "\n".join(failures[:10])


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_SPLIT_DIMS)
def test_a_split_gqa_group_keeps_the_window_the_cap_and_the_sinks(head_dim, causal):
    # configs.gradient_head_splits may split any launch's group, windowed or capped: a group of
    # five on one K/V head in three splits (shares 2+2+1), a left edge at a K/V tile's boundary and
    # inside one (a right edge too without causal), with the cap and the sinks (suite.builds'
    # SPLIT_VARIANTS).
    block_m, block_n, _ = BACKWARD_TILES[head_dim]
    q, k, v = random_qkv(1, 3 * block_m + 1, 2 * block_n + 3, 5, 1, head_dim, torch.bfloat16)
    dout = torch.randn_like(q)
    sinks = sinks_for(5, seed=3)
    failures = []
    windows = ((block_n, -1), (block_n // 2 + 1, -1)) if causal else ((block_n, 3), (block_n // 2 + 1, block_n + 1))
    for window in windows:
        variants = dict(window_size=window, softcap=30.0, sinks=sinks)
        grads = kernel_gradients_with(q, k, v, dout, causal, False, head_splits=3, **variants)
        verdict = judge_backward(q, k, v, dout, grads, causal, **variants)
        if not verdict.passed:
            failures.append(f"window {window}: {verdict}")
    assert not failures, "\n".join(failures)


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic-dq", "fixed-order-dq"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", sorted(BACKWARD_TILES))
def test_backward_softcap(head_dim, causal, deterministic):
    block_m, block_n, _ = dk_dv_tiles(deterministic)[head_dim]
    q, k, v = random_qkv(1, 2 * block_m + 3, 2 * block_n + 5, 4, 2, head_dim, torch.bfloat16)
    dout = torch.randn_like(q)
    failures = []
    # Without causal, a right edge too: the cap's build with both edges (the one triage builds).
    windows = ((-1, -1), (block_n + 1, -1)) if causal else ((-1, -1), (block_n + 1, -1), (block_n + 1, 3))
    for softcap in (0.05, 1.0, 30.0):
        for logits in (1.0, 20.0):
            for window in windows:
                scaled_q = (q.float() * logits).to(q.dtype)
                variants = dict(window_size=window, softcap=softcap)
                grads = kernel_gradients_with(scaled_q, k, v, dout, causal, deterministic, **variants)
                verdict = judge_backward(scaled_q, k, v, dout, grads, causal, **variants)
                if not verdict.passed:
                    failures.append(f"softcap {softcap} logits x{logits} window {window}: {verdict}")
    assert not failures, "\n".join(failures[:10])


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "torch.compile"])
def test_autograd_with_every_variant_gives_dsinks(compiled):
    # Through autograd, eager and compiled: the gradients of q, k, v and the sinks (a learned
    # parameter), an upstream gradient of the LSE included.
    q, k, v = (t.requires_grad_() for t in random_qkv(2, 300, 400, 8, 2, 128, torch.bfloat16))
    sinks = sinks_for(8, seed=3).requires_grad_()
    variants = dict(window_size=(96, 17), softcap=30.0)

    def attention(q, k, v, sinks):
        return flash_attn_func(q, k, v, return_lse=True, sinks=sinks, **variants)

    out, lse = (torch.compile(attention, fullgraph=True) if compiled else attention)(q, k, v, sinks)
    dout, grad_lse = torch.randn_like(out), torch.randn_like(lse)
    torch.autograd.backward((out, lse), (dout, grad_lse))
    grads = (q.grad, k.grad, v.grad, sinks.grad)
    inputs = (q.detach(), k.detach(), v.detach())
    verdict = judge_backward(*inputs, dout, grads, False, None, grad_lse, sinks=sinks.detach(), **variants)
    assert verdict.passed, str(verdict)


# ---- the split-KV kernels (decode steps): windows, softcap and sinks on every tile ----


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("tile", sorted(SPLIT_TILES), ids=lambda tile: f"d{tile[0]}-rows{tile[1]}")
def test_split_kv_variants_within_the_bound(tile, causal):
    # A decode step whose group fills the tile's rows, against keys off the tile grid: windows
    # on the tile's key boundaries and a key either side, a softcap, sinks; every buffer NaN.
    head_dim, block_m = tile
    block_n = SPLIT_TILES[tile].block_n
    heads_kv, seqlen_q = 2, 1 if causal else 2
    heads = block_m // seqlen_q * heads_kv
    seqlen_k = 5 * block_n + 3
    q, k, v = random_qkv(2, seqlen_q, seqlen_k, heads, heads_kv, head_dim, torch.bfloat16, seed=block_m)
    sinks = sinks_for(heads, seed=head_dim)
    lefts = (0, 1, block_n - 1, block_n, block_n + 1, 3 * block_n)
    cases = [dict(window_size=(left, -1), sinks=sinks) for left in lefts]
    cases += [dict(window_size=(2 * block_n, 0 if causal else 5), softcap=30.0), dict(softcap=0.05, sinks=sinks)]
    failures = []
    for variants in cases:
        for tiles_per_split in (1, 2):
            splits = 6  # at least the tiles from the window's first: trailing splits see no key
            out, lse = torch.full_like(q, float("nan")), torch.full((2, heads, seqlen_q), float("nan"), device=q.device)
            o_partial = torch.full((2, splits, heads, seqlen_q, head_dim), float("nan"), device=q.device)
            lse_partial = torch.full((2, splits, heads, seqlen_q), float("nan"), device=q.device)
            args = (q, k, v, head_dim**-0.5, causal, tiles_per_split, device_arch())
            split_kv_into(out, lse, o_partial, lse_partial, *args, **variants)
            verdict = judge(q, k, v, out, lse, causal, **variants)
            if not verdict.passed:
                failures.append(f"{variants} tiles_per_split {tiles_per_split}: {verdict}")
    assert not failures, "\n".join(failures[:10])
