"""Every build the GPU tests launch besides the shipped configs and the boundary sweep's, in the
form its builder takes (tools/precompile.py builds them all ahead; the mutant runner the ones a
mutant changes), beside the parameters the tests read."""

from __future__ import annotations

import itertools

import pytest
import torch

from fa_kernel.backward import BACKWARD_TILES
from fa_kernel.configs import FALLBACK, HEAD_SPLIT_DIMS, SPLIT_TILES, TileConfig, key_ranges
from fa_kernel.interface import SUPPORTED_HEAD_DIMS
from fa_kernel.kernel import H100_SM_COUNT
from fa_kernel.variants import PLAIN, Variants
from suite.boundaries import sweep_builds

# test_kernel: the schedules it runs besides the shipped configs: one, two and three consumer
# warpgroups, taking turns or free, one K/V stage, two blocks per SM; persistent grids of 5
# thread blocks; warpgroups that see fewer tiles.
CONSUMER_SCHEDULES = [
    pytest.param(128, FALLBACK, id="1-warpgroup-fallback"),
    pytest.param(64, TileConfig(128, 128, 2, 256), id="2-warpgroups-pingpong"),
    pytest.param(64, TileConfig(192, 192, 1, 384), id="3-warpgroups-ring-1-stage"),
    pytest.param(64, TileConfig(128, 64, 2, 256, take_turns=False), id="2-free"),
    pytest.param(64, TileConfig(192, 128, 2, 384, take_turns=False), id="3-free"),
    pytest.param(64, TileConfig(64, 128, 2, 128, blocks_per_sm=2), id="1-warpgroup-2-per-sm-d64"),
    pytest.param(128, TileConfig(64, 64, 2, 128, blocks_per_sm=2), id="1-warpgroup-2-per-sm-d128"),
]
PERSISTENT_GRID = 5
PERSISTENT_SCHEDULES = [
    pytest.param(128, TileConfig(128, 176, 2, 256, persistent=True), id="2-pingpong"),
    pytest.param(64, TileConfig(192, 128, 2, 384, persistent=True), id="3-ring"),
    pytest.param(64, TileConfig(192, 128, 2, 384, take_turns=False, persistent=True), id="3-free"),
    pytest.param(128, TileConfig(128, 176, 2, 256, persistent=True, overlap_epilogue=True), id="2-pingpong-overlap"),
    pytest.param(64, TileConfig(192, 128, 2, 384, persistent=True, overlap_epilogue=True), id="3-ring-overlap"),
    pytest.param(128, TileConfig(128, 128, 2, 256, persistent=True), id="2-own-output"),
]
WARPGROUP_SCHEDULES = [
    pytest.param(64, TileConfig(192, 128, 2, 384), H100_SM_COUNT, id="3-ring"),
    pytest.param(64, TileConfig(192, 128, 2, 384, persistent=True), PERSISTENT_GRID, id="3-ring-persistent"),
    pytest.param(128, TileConfig(128, 128, 2, 256, persistent=True), PERSISTENT_GRID, id="2-pingpong-persistent"),
]


def schedule_builds(arch: str) -> list[dict]:
    """compiled_forward's arguments of every schedule above, both masks, as the tests build them."""
    builds = []
    for schedules, grid in ((CONSUMER_SCHEDULES, H100_SM_COUNT), (PERSISTENT_SCHEDULES, PERSISTENT_GRID)):
        for param in schedules:
            head_dim, config = param.values
            builds += [
                dict(head_dim=head_dim, causal=causal, dtype="float16", config=config, arch=arch, sm_count=grid)
                for causal in (False, True)
            ]
    for param in WARPGROUP_SCHEDULES:
        head_dim, config, sm_count = param.values
        builds += [
            dict(head_dim=head_dim, causal=causal, dtype="float16", config=config, arch=arch, sm_count=sm_count)
            for causal in (False, True)
        ]
    return builds


# test_guard_regions: every shipped config and the fallback; the persistent ones on a grid of 5
# thread blocks over 24 and 9 work tiles (its shapes), so the last round is partial.
GUARD_GRID = 5

GUARD_CASES = sorted(
    {
        (head_dim, causal, config)
        for head_dim, causal in itertools.product(SUPPORTED_HEAD_DIMS, (False, True))
        for config in (*(config for _, _, config in key_ranges("sm_90", head_dim, causal)), FALLBACK)
    },
    key=lambda case: (case[0], case[1], str(case[2])),
)


def guard_region_builds(arch: str, sm_count: int) -> list[dict]:
    """compiled_forward's arguments of GUARD_CASES as test_guard_regions builds them (fp16; the
    non-persistent ones on this GPU's `sm_count`)."""
    return [
        dict(
            head_dim=head_dim,
            causal=causal,
            dtype="float16",
            config=config,
            arch=arch,
            sm_count=GUARD_GRID if config.persistent else sm_count,
        )
        for head_dim, causal, config in GUARD_CASES
    ]


def gradient_builds(arch: str, head_dims=tuple(BACKWARD_TILES)) -> list[dict]:
    """compiled_gradient_kernels' arguments for every head dim, causal or not, and dtype."""
    return [
        dict(head_dim=head_dim, causal=causal, dtype=dtype, arch=arch)
        for head_dim in head_dims
        for causal in (False, True)
        for dtype in ("float16", "bfloat16")
    ]


def deterministic_builds(arch: str) -> list[dict]:
    """test_backward_kernel: compiled_gradient_kernels' arguments of the deterministic tests' builds."""
    return [
        dict(head_dim=head_dim, causal=causal, dtype="bfloat16", arch=arch, deterministic=True)
        for head_dim in sorted(BACKWARD_TILES)
        for causal in (False, True)
    ]


def head_split_builds(arch: str) -> list[dict]:
    """compiled_gradient_kernels' arguments of the dK/dV kernel's build that splits a GQA group
    between blocks: test_backward_kernel's split test (bf16, both dQ kernels), the property
    test's draws that take it (both dtypes), and test_variants_kernel's split test (bf16, its
    SPLIT_VARIANTS)."""
    kinds = (("bfloat16", False), ("bfloat16", True), ("float16", False))
    plain = [
        dict(head_dim=head_dim, causal=causal, dtype=dtype, arch=arch, deterministic=deterministic, head_splits=True)
        for head_dim in HEAD_SPLIT_DIMS
        for causal in (False, True)
        for dtype, deterministic in kinds
    ]
    variants = [
        dict(
            head_dim=head_dim,
            causal=causal,
            dtype="bfloat16",
            arch=arch,
            variants=SPLIT_VARIANTS[causal],
            head_splits=True,
        )
        for head_dim in HEAD_SPLIT_DIMS
        for causal in (False, True)
    ]
    return plain + variants


# test_decode: one dtype per head dim, both across the three: the dtype enters the kernels as the element
# type only.
SPLIT_KV_DTYPES = {64: torch.bfloat16, 128: torch.float16, 256: torch.bfloat16}


def split_kv_test_builds(arch: str) -> list[dict]:
    """test_decode: compiled_decode_kernels' arguments of every build its GPU tests launch."""
    return [
        dict(
            head_dim=head_dim,
            causal=causal,
            dtype=str(SPLIT_KV_DTYPES[head_dim]).removeprefix("torch."),
            arch=arch,
            block_m=block_m,
        )
        for head_dim, block_m in sorted(SPLIT_TILES)
        for causal in (False, True)
    ]


# test_variants_kernel: each boundary sweep build with a window's edges and sinks compiled in
# (the additive mask with a left edge; causal builds have their own right edge), and with a
# softcap and a left edge (the mask a select after the cap).
WINDOW_VARIANTS = {False: Variants(window_left=True, window_right=True, sinks=True), True: Variants(True, sinks=True)}
SOFTCAP_VARIANTS = Variants(window_left=True, softcap=True)
ALL_VARIANTS = Variants(window_left=True, window_right=True, softcap=True, sinks=True)
# test_variants_kernel's split GQA group: a left edge (and a right one without causal), a cap, sinks.
SPLIT_VARIANTS = {False: ALL_VARIANTS, True: Variants(window_left=True, softcap=True, sinks=True)}


def variant_sweep_builds() -> list[dict]:
    """compiled_forward's arguments of test_variants_kernel's builds, for any arch: windows first,
    then softcaps (mutant triage compares them too: code only a variant runs changes no plain
    build)."""
    return [
        dict(build, variants=WINDOW_VARIANTS[build["causal"]] if variants is None else variants)
        for variants in (None, SOFTCAP_VARIANTS)
        for build in sweep_builds()
    ]


def ragged_sweep_builds() -> list[dict]:
    """compiled_forward's arguments of a ragged batch's builds on the sweep's configs (varlen.py's
    on the per-tile grid), plain and with each variant: mutant triage compares them too (code only
    a ragged batch runs changes no batched build)."""
    builds = []
    for build in sweep_builds():
        config = build["config"].per_tile()
        ragged = {name: value for name, value in build.items() if name != "sm_count"}
        for variants in (PLAIN, WINDOW_VARIANTS[build["causal"]], SOFTCAP_VARIANTS):
            candidate = dict(ragged, config=config, variants=variants, varlen=True)
            if candidate not in builds:
                builds.append(candidate)
    return builds


def variant_builds(arch: str) -> list[dict]:
    """variant_sweep_builds for `arch`."""
    return [dict(build, arch=arch) for build in variant_sweep_builds()]


def variant_gradient_builds(arch: str) -> list[dict]:
    """compiled_gradient_kernels' arguments of test_variants_kernel's gradients: each head dim,
    mask and dQ kernel with a window and sinks, and with a softcap and a left edge; bf16, all
    variants at once, for its autograd test."""
    builds = [
        dict(head_dim=head_dim, causal=causal, dtype="bfloat16", arch=arch, deterministic=deterministic, variants=v)
        for head_dim, causal, deterministic in itertools.product(BACKWARD_TILES, (False, True), (False, True))
        for v in (WINDOW_VARIANTS[causal], SOFTCAP_VARIANTS)
    ]
    return [*builds, dict(head_dim=128, causal=False, dtype="bfloat16", arch=arch, variants=ALL_VARIANTS)]


def split_kv_variant_builds(arch: str) -> list[dict]:
    """compiled_decode_kernels' arguments of test_variants_kernel's split-KV cases: each tile and
    mask with a left edge and sinks, a window and a softcap, and a softcap and sinks (bf16)."""
    from fa_kernel.configs import SPLIT_TILES

    def variants_of(causal: bool) -> list[Variants]:
        window = Variants(window_left=True, window_right=not causal, softcap=True)
        return [Variants(window_left=True, sinks=True), window, Variants(softcap=True, sinks=True)]

    return [
        dict(head_dim=head_dim, causal=causal, dtype="bfloat16", arch=arch, block_m=block_m, variants=variants)
        for head_dim, block_m in sorted(SPLIT_TILES)
        for causal in (False, True)
        for variants in variants_of(causal)
    ]


def varlen_builds(arch: str) -> list[dict]:
    """compiled_forward's arguments of every varlen build flash_attn_varlen_func runs: each config
    the tables give a head dim and mask, on the per-tile grid (persistent and overlap off), bf16
    and fp16, plain; and the variants tests/test_varlen.py launches (causal d64 fp16)."""
    from fa_kernel.configs import key_ranges, select_config

    builds = []
    for head_dim, causal, dtype in itertools.product((64, 128, 256), (False, True), ("float16", "bfloat16")):
        for _, most, _ in key_ranges("sm_90", head_dim, causal):
            config = select_config("sm_90", head_dim, causal, most).per_tile()
            builds.append(dict(head_dim=head_dim, causal=causal, dtype=dtype, config=config, arch=arch, varlen=True))
    config = select_config("sm_90", 64, True, 1024).per_tile()
    for variants in (
        Variants(window_left=True),
        Variants(window_left=True, window_right=True),
        Variants(softcap=True),
        Variants(sinks=True),
    ):
        builds.append(
            dict(head_dim=64, causal=True, dtype="float16", config=config, arch=arch, varlen=True, variants=variants)
        )
    return [build for index, build in enumerate(builds) if build not in builds[:index]]


def varlen_gradient_builds(arch: str) -> list[dict]:
    """compiled_gradient_kernels' arguments of tests/test_varlen.py's gradients: each head dim and
    mask in bf16, and the variants' tests (causal d64 fp16) plain, with a left edge and a cap."""
    builds = [
        dict(head_dim=head_dim, causal=causal, dtype="bfloat16", arch=arch, varlen=True)
        for head_dim, causal in itertools.product((64, 128), (False, True))
    ]
    for variants in (PLAIN, Variants(window_left=True), Variants(softcap=True)):
        builds.append(dict(head_dim=64, causal=True, dtype="float16", arch=arch, variants=variants, varlen=True))
    return builds


def paged_decode_builds(arch: str) -> list[dict]:
    """compiled_decode_kernels' arguments of tests/test_paged.py's launches: each page size and
    head dim on the 16-row tile (causal), and the 64-row tile and the 16-row one without a mask
    at 64-row pages, d128, bf16."""
    builds = [
        dict(head_dim=head_dim, causal=True, dtype="bfloat16", arch=arch, block_m=16, page_size=page_size)
        for head_dim, page_size in itertools.product((64, 128), (16, 64, 256))
    ]
    builds += [dict(head_dim=128, causal=False, dtype="bfloat16", arch=arch, block_m=m, page_size=64) for m in (16, 64)]
    return builds
