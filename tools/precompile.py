"""Build every kernel the GPU suite needs, all CPU cores at once, into TileLang's disk cache; the
tests then load them instead of compiling one at a time.

    python -m tools.precompile [--jobs N] [--smoke | --gradients] [--arch ARCH --sm-count N]

A build is a compile (nvcc, seconds of one core) the first time and a disk-cache load after;
once all have built, a stamp in TileLang's cache (`fa_kernel.workbench.builds.build_unless_built`) skips even the loads.
The property suite's direct calls use the shipped configs at the GPU's own SM count, built here
too, and so are the backward's and the split-KV kernels (those flash_attn_func routes decode
steps to among them); a test that builds anything else compiles it in its worker.
With --arch and --sm-count it needs no GPU: it builds another machine's kernels here (nvcc
alone), and that machine loads them from a copy of TileLang's cache (TILELANG_CACHE_DIR).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def suite_builds(sm_count: int, arch: str) -> list[dict]:
    """compiled_forward's arguments of every kernel the GPU suite builds: each shipped config in
    both dtypes as flash_attn_func builds it on this GPU, the boundary sweep's builds, the
    fallback the property strategies call directly, the kernel tests' own schedules and the
    guard-region tests' grids, and the variants' (window, softcap and sinks) sweep builds."""
    from suite.boundaries import FALLBACK_ENTRIES
    from suite.builds import guard_region_builds, schedule_builds, variant_builds, varlen_builds

    from fa_kernel.workbench.builds import shipped_builds, unique

    builds = shipped_builds(arch.removesuffix("a"), sm_count=sm_count)  # the tables key "sm_90", nvcc "sm_90a"
    builds += smoke_builds(arch)
    # The property strategies call the fallback directly, in either dtype (boundary_cases).
    builds += [
        dict(
            head_dim=entry.head_dim, causal=entry.causal, dtype=dtype, config=entry.config, arch=arch, sm_count=sm_count
        )
        for entry in FALLBACK_ENTRIES
        for dtype in ("float16", "bfloat16")
    ]
    builds += schedule_builds(arch)
    builds += guard_region_builds(arch, sm_count)
    builds += variant_builds(arch)
    builds += varlen_builds(arch)
    return unique(builds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="builds at once")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--smoke", action="store_true", help="only the smoke tier's: the boundary sweep's builds")
    only.add_argument(
        "--gradients", action="store_true", help="only the gradient kernels' (about 50 builds: 6 minutes on 2 cores)"
    )
    parser.add_argument("--arch", help="build for this nvcc arch (sm_90a), not this machine's GPU; needs --sm-count")
    parser.add_argument("--sm-count", type=int, help="the SM count of --arch's GPU (132 on an H200)")
    args = parser.parse_args()
    if (args.arch is None) != (args.sm_count is None):
        given = f"--arch {args.arch} --sm-count {args.sm_count}"
        parser.error(f"--arch and --sm-count go together: expected both or neither, got {given}")
    from fa_kernel.device import device_target
    from fa_kernel.workbench.builds import build_unless_built, distinct_tasks

    sm_count, arch = device_target() if args.arch is None else (args.sm_count, args.arch)
    if args.smoke:
        everything = smoke_builds(arch)
        builders: list = [None] * len(everything)
    else:
        everything, builders = every_build(sm_count, arch)
    if args.gradients:
        from fa_kernel.backward import compiled_gradient_kernels

        everything = [
            build for build, builder in zip(everything, builders, strict=True) if builder is compiled_gradient_kernels
        ]
        builders = [compiled_gradient_kernels] * len(everything)
    start = time.perf_counter()
    errors = build_unless_built(everything, args.jobs, builder=builders)
    if errors is None:
        print(f"precompile: {len(everything)} kernels built already (stamps in TileLang's cache)")
        return 0
    tasks = distinct_tasks(everything, builders)
    failed = [f"  {build}: {error!r}" for (_, build), error in zip(tasks, errors, strict=True) if error]
    print(f"precompile: {len(errors)} kernel builds in {time.perf_counter() - start:.0f} s on {args.jobs} processes")
    if failed:
        print("\n".join(failed))
        return 1
    return 0


def every_build(sm_count: int, arch: str) -> tuple[list[dict], list]:
    """(builds, builders) of every kernel the GPU suite needs, as build_all takes them: the
    gradients' and split-KV's first (kernels of several kinds share one pool: a pool per kind
    would end each on a round of idle cores), then the forward's (builder None)."""
    from suite.builds import (
        deterministic_builds,
        gradient_builds,
        head_split_builds,
        paged_decode_builds,
        split_kv_test_builds,
        split_kv_variant_builds,
        variant_gradient_builds,
        varlen_gradient_builds,
    )

    from fa_kernel.backward import compiled_gradient_kernels
    from fa_kernel.decode import compiled_decode_kernels
    from fa_kernel.workbench.builds import split_kv_builds, unique

    gradients = gradient_builds(arch) + deterministic_builds(arch) + variant_gradient_builds(arch)
    gradients += varlen_gradient_builds(arch) + head_split_builds(arch)
    # The split-KV kernels: their own tests' builds, and those flash_attn_func routes decode steps to.
    decodes = split_kv_test_builds(arch) + split_kv_builds(arch) + split_kv_variant_builds(arch)
    decodes = unique(decodes + paged_decode_builds(arch))
    forwards = suite_builds(sm_count, arch)
    builders = [compiled_gradient_kernels] * len(gradients) + [compiled_decode_kernels] * len(decodes)
    return gradients + decodes + forwards, builders + [None] * len(forwards)


def smoke_builds(arch: str) -> list[dict]:
    """compiled_forward's arguments of the smoke tier's kernels: the boundary sweep's builds."""
    from suite.boundaries import sweep_builds

    return [dict(build, arch=arch) for build in sweep_builds()]


if __name__ == "__main__":
    sys.exit(main())
