"""The deterministic boundary sweep: each config the tables ship (and the fallback), called
directly, at every causal offset seqlen_k - seqlen_q in [-2·max(block), +2·max(block)], at
query lengths that fill and that cut the last query block (boundaries.py). One compile per
config, many small launches: every row of a block meets every position inside a K/V tile,
the diagonal crosses every tile and warpgroup boundary, and the persistent configs walk a
small grid in partial rounds. Judged like everything else, by `reference.judge`.

The emulator runs the causal boundaries on the CPU, one step either side of each only.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch
from suite.boundaries import (
    SWEEP_HEADS,
    SWEEP_HEADS_KV,
    boundary_offsets,
    build_id,
    length_shapes,
    rows_per_warpgroup,
    sweep_builds,
    sweep_limit,
    sweep_seqlens_q,
    sweep_shapes,
)
from suite.launch import device_arch, run_config
from suite.strategies import HARD_SCORES, hard_score_cases

from fa_kernel.emulator import attention_tiled
from fa_kernel.kernel import compiled_forward
from fa_kernel.reference import judge, random_qkv

BUILDS = sweep_builds()


def assert_every_shape_passes(attend, shapes, inputs, causal, fail_fast=False):
    """Each (seqlen_q, seqlen_k) of `shapes` on prefixes of `inputs` (q, k, v drawn once at the
    longest lengths, so the sweep costs launches, not RNG), `attend(q, k, v) -> (out, lse)`
    judged by `reference.judge`; fails listing the shapes that do not pass (the first only, with
    `fail_fast`)."""
    q_all, k_all, v_all = inputs
    failures = []
    for seqlen_q, seqlen_k in shapes:
        q, k, v = q_all[:, :seqlen_q], k_all[:, :seqlen_k], v_all[:, :seqlen_k]
        out, lse = attend(q, k, v)
        verdict = judge(q, k, v, out, lse, causal)
        if not verdict.passed:
            failures.append(f"({seqlen_q}, {seqlen_k}): {verdict}")
            if fail_fast:
                break
    shown = "\n".join(failures[:10])
    assert not failures, f"{len(failures)} of {len(shapes)} shapes (seqlen_q, seqlen_k) fail:\n{shown}"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "part",
    # The offsets next to a boundary are the smoke tier's (an off-by-one shows there); the
    # offsets between boundaries complete the sweep in the full suite.
    [pytest.param("boundaries", marks=pytest.mark.smoke), "between"],
)
@pytest.mark.parametrize("query_length", [0, 1], ids=["full-q-blocks", "cut-q-block"])
@pytest.mark.parametrize("build", BUILDS, ids=build_id)
def test_boundary_sweep(build, query_length, part, request):
    # One test per build, query length (sweep_seqlens_q) and part, so that xdist spreads the sweep evenly.
    kernel = compiled_forward(**build, arch=device_arch())
    fail_fast = request.config.getoption("maxfail") == 1  # under -x (the mutant runner) the first is enough
    config, causal, head_dim = build["config"], build["causal"], build["head_dim"]
    seqlen_q = sweep_seqlens_q(config)[query_length]
    shapes = [shape for shape in sweep_shapes(config, part) if shape[0] == seqlen_q]
    longest_k = max(k for _, k in shapes)
    inputs = random_qkv(1, seqlen_q, longest_k, SWEEP_HEADS, SWEEP_HEADS_KV, head_dim, torch.float16)

    def attend(q, k, v):
        return run_config(q, k, v, head_dim**-0.5, causal, config, kernel=kernel)

    assert_every_shape_passes(attend, shapes, inputs, causal, fail_fast)


@pytest.mark.gpu
@pytest.mark.smoke
@pytest.mark.parametrize("distribution", HARD_SCORES)
@pytest.mark.parametrize("build", BUILDS, ids=build_id)
def test_sweep_builds_on_hard_scores(build, distribution):
    # The sweep's kernels on scores that leave the max a tile started from (both paths of the
    # stale-max softmax, strategies.JUMP_LOG2), on integer maxima one apart (unit_steps) and on
    # logits past fp16's range: the smoke tier's check of the softmax, at no extra compile.
    config, causal = build["config"], build["causal"]
    kernel = compiled_forward(**build, arch=device_arch())
    for case in hard_score_cases(build, distribution):
        q, k, v = case.inputs("cuda")
        out, lse = run_config(q, k, v, case.scale, causal, config, kernel=kernel)
        verdict = judge(q, k, v, out, lse, causal, case.scale)
        assert verdict.passed, f"{case}: {verdict}"


def far_below_zero(case, device, log2_units=40.0):
    """The jumping-scores case's q, k, v with every score moved down by `log2_units` (in
    score * scale * log2(e); q[..., 0] is 1 there, so k[..., 0] carries the shift): the same
    attention, with each row's max far below 0, the reference that stands in for the max of a
    row that has seen no key. A finite row that took 0 for its max would keep it past fp16."""
    q, k, v = case.inputs(device)
    k = k.clone()
    k[..., 0] -= log2_units / (case.scale * math.log2(math.e))
    return q, k, v


@pytest.mark.gpu
@pytest.mark.smoke
@pytest.mark.parametrize("build", BUILDS, ids=build_id)
def test_sweep_builds_on_scores_far_below_zero(build):
    config, causal = build["config"], build["causal"]
    kernel = compiled_forward(**build, arch=device_arch())
    for case in hard_score_cases(build, "jumping_scores"):
        q, k, v = far_below_zero(case, "cuda")
        out, lse = run_config(q, k, v, case.scale, causal, config, kernel=kernel)
        verdict = judge(q, k, v, out, lse, causal, case.scale)
        assert verdict.passed, f"{case}, scores 40 below: {verdict}"


@pytest.mark.parametrize("build", BUILDS, ids=build_id)
def test_scores_far_below_zero_emulator(build):
    for case in hard_score_cases(build, "jumping_scores"):
        case = dataclasses.replace(case, head_dim=64)  # head_dim plays no part in the tile logic
        q, k, v = far_below_zero(case, "cpu")
        out, lse = attention_tiled(q, k, v, case.scale, build["causal"], build["config"])
        verdict = judge(q, k, v, out, lse, build["causal"], case.scale)
        assert verdict.passed, f"{case}, scores 40 below: {verdict}"


@pytest.mark.gpu
@pytest.mark.smoke
@pytest.mark.parametrize("build", BUILDS, ids=build_id)
def test_lengths_at_tile_boundaries(build, request):
    # One length on both sides of each block boundary, the other fixed (boundaries.length_shapes):
    # one K/V tile, and a last query block of one row, which the sweep's lengths never reach.
    fail_fast = request.config.getoption("maxfail") == 1  # under -x (the mutant runner) the first is enough
    config, causal, head_dim = build["config"], build["causal"], build["head_dim"]
    kernel = compiled_forward(**build, arch=device_arch())
    shapes = length_shapes(config)
    longest_q, longest_k = max(q for q, _ in shapes), max(k for _, k in shapes)
    inputs = random_qkv(1, longest_q, longest_k, SWEEP_HEADS, SWEEP_HEADS_KV, head_dim, torch.float16, seed=2)

    def attend(q, k, v):
        return run_config(q, k, v, head_dim**-0.5, causal, config, kernel=kernel)

    assert_every_shape_passes(attend, shapes, inputs, causal, fail_fast)


def one_key_shapes(config):
    """Both sides of the epilogue's `row_sum == 0` (0 and -inf for a row that sees no key): rows
    that see exactly one key, whose row sum is exactly 1 (2^0: that key is the row's max), and,
    causal, rows beside them that see none; in one query row, one warpgroup's and one, and a
    query block and one."""
    return [(q, k) for q in (1, rows_per_warpgroup(config) + 1, config.block_m + 1) for k in (1, 2)]


def one_key_inputs(config, head_dim, nheads, nheads_kv, device):
    """Random q, k, v for one_key_shapes, and the same with q = 0: every score 0, so that a row
    sum is exactly its count of keys whatever the rounding of S * scale_log2 - max."""
    q, k, v = random_qkv(1, config.block_m + 1, 2, nheads, nheads_kv, head_dim, torch.float16, seed=3, device=device)
    return [(q, k, v), (torch.zeros_like(q), k, v)]


@pytest.mark.gpu
@pytest.mark.smoke
@pytest.mark.parametrize("build", BUILDS, ids=build_id)
def test_rows_that_see_one_key_or_none(build):
    config, causal, head_dim = build["config"], build["causal"], build["head_dim"]
    kernel = compiled_forward(**build, arch=device_arch())

    def attend(q, k, v):
        return run_config(q, k, v, head_dim**-0.5, causal, config, kernel=kernel)

    for inputs in one_key_inputs(config, head_dim, SWEEP_HEADS, SWEEP_HEADS_KV, "cuda"):
        assert_every_shape_passes(attend, one_key_shapes(config), inputs, causal)


@pytest.mark.parametrize("build", BUILDS, ids=build_id)
def test_rows_that_see_one_key_or_none_emulator(build):
    config = build["config"]
    attend = functools.partial(attention_tiled, causal=build["causal"], config=config)
    # head_dim plays no part in the tile logic; 64 keeps the CPU's work small.
    for inputs in one_key_inputs(config, 64, 1, 1, "cpu"):
        assert_every_shape_passes(attend, one_key_shapes(config), inputs, build["causal"])


@pytest.mark.parametrize("build", [build for build in BUILDS if build["causal"]], ids=build_id)
def test_boundary_sweep_emulator(build):
    # Causal only, one step either side of each boundary: the CPU's share of the sweep (without
    # the causal mask the tile logic turns on seqlen_k alone: the test below).
    config = build["config"]
    seqlen_q = sweep_seqlens_q(config)[-1]
    offsets = [o for o in boundary_offsets(config, sweep_limit(config), side=1) if seqlen_q + o >= 1]
    # head_dim plays no part in the tile logic; 64 keeps the CPU's work small.
    inputs = random_qkv(1, seqlen_q, seqlen_q + max(offsets), 1, 1, 64, torch.float16, device="cpu")
    shapes = [(seqlen_q, seqlen_q + offset) for offset in offsets]
    assert_every_shape_passes(functools.partial(attention_tiled, causal=True, config=config), shapes, inputs, True)


@pytest.mark.parametrize("build", BUILDS, ids=build_id)
def test_lengths_at_tile_boundaries_emulator(build):
    # The smoke tier's one-length-at-a-time shapes (boundaries.length_shapes) on the emulator:
    # one K/V tile or three, the mask of a last tile with one key past the end, a last query
    # block of one row; causal and not.
    config = build["config"]
    shapes = length_shapes(config)
    # head_dim plays no part in the tile logic; 64 keeps the CPU's work small.
    longest_q, longest_k = max(q for q, _ in shapes), max(k for _, k in shapes)
    inputs = random_qkv(1, longest_q, longest_k, 1, 1, 64, torch.float16, seed=1, device="cpu")
    attend = functools.partial(attention_tiled, causal=build["causal"], config=config)
    assert_every_shape_passes(attend, shapes, inputs, build["causal"])
