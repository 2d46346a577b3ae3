"""Kernel variants (perf/variants.py) against torch SDPA's cuDNN backend, on the GPU.

From the repository root on the GPU machine:

    PYTHONPATH=$PWD/src:$PWD python perf/sweep.py --variants shipped no_exp --cases d128 d128c
    ... python perf/sweep.py --configs 128x128/2st/256thr 128x176/2st/256thr/persistent --cases d128
    # a change against its parent, in one process (the parent's kernel.py as a file):
    git show HEAD~1:src/fa_kernel/kernel.py > /tmp/kernel_parent.py
    ... python perf/sweep.py --variants file:/tmp/kernel_parent.py shipped --cases d128 --shape 2,16,16384

Every (variant, config) of a case is built first over all cores (`fa_kernel.builds.build_all`),
checked on odd shapes against `reference.judge`, then timed at the case's shape together with
cuDNN on both layouts (`bench.CUDNN_LAYOUTS`), alternated over rounds in this one process
(`tune.alternate`, `bench.cuda_median_ms`): the medians are what to compare, and the ratio is
against the faster cuDNN layout. Configs are written as TileConfig
prints them (`TileConfig.parse`); by default, the configs the tables run for the case. A
variant that hangs the GPU hangs the sweep: run it under `timeout`. Writes every number to
--json (default $OUT/sweep.json where OUT is set).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(path) for path in (ROOT, ROOT / "src") if str(path) not in sys.path]

import torch  # noqa: E402

from fa_kernel.bench import CUDNN_LAYOUTS, Shape, cuda_median_ms, runners  # noqa: E402
from fa_kernel.builds import build_all  # noqa: E402
from fa_kernel.configs import TileConfig, key_ranges  # noqa: E402
from fa_kernel.numerics import LOG2E  # noqa: E402
from fa_kernel.reference import judge, random_qkv  # noqa: E402
from fa_kernel.tune import alternate  # noqa: E402
from perf.variants import KNOWN_INCORRECT, VARIANTS, compile_variant, is_variant  # noqa: E402

# name: (head_dim, causal, dtype)
CASES = {
    "d128": (128, False, "float16"),
    "d128c": (128, True, "float16"),
    "d64": (64, False, "float16"),
    "d64c": (64, True, "float16"),
    "d128bf16": (128, False, "bfloat16"),
    "d64bf16": (64, False, "bfloat16"),
}
# Correctness shapes: (batch, heads, heads_kv, seqlen_q, seqlen_k), lengths off every block size.
CHECK_SHAPES = [(2, 4, 2, 257, 300), (1, 2, 1, 1000, 1000), (2, 4, 4, 300, 257)]


def table_configs(head_dim: int, causal: bool) -> list[TileConfig]:
    return list(dict.fromkeys(config for _, _, config in key_ranges("sm_90", head_dim, causal)))


def failed_checks(kernel, head_dim: int, causal: bool, dtype: torch.dtype) -> list[str]:
    """The check shapes on which `kernel(q, k, v, out, lse, scale_log2)` fails reference.judge."""
    failures = []
    for batch, heads, heads_kv, seqlen_q, seqlen_k in CHECK_SHAPES:
        q, k, v = random_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, seed=seqlen_q + seqlen_k)
        # NaN-filled, as the tests' launches are: an element the variant never writes fails the judge.
        out = torch.full_like(q, math.nan)
        lse = q.new_full((batch, heads, seqlen_q), math.nan, dtype=torch.float32)
        kernel(q, k, v, out, lse, LOG2E / math.sqrt(head_dim))
        verdict = judge(q, k, v, out, lse, causal)
        if not verdict.passed:
            failures.append(f"{(batch, heads, heads_kv, seqlen_q, seqlen_k)}: {verdict}")
    return failures


def tflops(call, shape: Shape) -> float:
    return shape.flops / cuda_median_ms(call, warmup=5, repeats=20) / 1e9


def sweep_case(case: str, variants: list[str], configs: list[TileConfig], shape: Shape, rounds: int) -> list[dict]:
    """Rows (variant, config, TFLOP/s median, ratio to cuDNN, check failures) of one case, fastest first."""
    head_dim, causal, dtype = CASES[case]
    q, k, v = shape.inputs()
    arguments = (
        q,
        k,
        v,
        torch.empty_like(q),
        q.new_empty((shape.batch, shape.nheads, shape.seqlen_q), dtype=torch.float32),
    )
    timers, failures = {}, {}
    for variant in variants:
        for config in configs:
            try:
                kernel = compile_variant(variant, head_dim, causal, dtype, config)  # from the disk cache
            except Exception as error:  # does not fit this head_dim: one line, and on
                print(f"  {variant} {config}: does not build ({type(error).__name__})", flush=True)
                continue
            failures[variant, config] = failed_checks(kernel, head_dim, causal, shape.dtype)
            call = functools.partial(kernel, *arguments, LOG2E / math.sqrt(head_dim))
            timers[variant, config] = functools.partial(tflops, call, shape)
    competitors = runners(shape)
    for layout in CUDNN_LAYOUTS:
        if layout in competitors:
            timers[layout, None] = functools.partial(tflops, competitors[layout], shape)
    medians = alternate(timers, rounds)
    cudnn = {layout: medians.pop((layout, None)) for layout in CUDNN_LAYOUTS if (layout, None) in medians}
    reference = max(cudnn.values(), default=None)  # cuDNN best: the faster layout
    rows = [
        dict(case=case, variant=variant, config=str(config), tflops=tflops,
             vs_cudnn=tflops / reference if reference else None, failures=failures.get((variant, config), []))
        for (variant, config), tflops in medians.items()
    ]  # fmt: skip
    rows += [dict(case=case, variant=layout, config="-", tflops=value, vs_cudnn=value / reference, failures=[])
             for layout, value in cudnn.items()]  # fmt: skip
    return sorted(rows, key=lambda row: -row["tflops"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_variants = [name for name in VARIANTS if name not in KNOWN_INCORRECT]
    parser.add_argument("--variants", nargs="+", default=default_variants, help="names, or file:PATH to a kernel.py")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--configs", nargs="+", type=TileConfig.parse, help="default: the tables' configs per case")
    parser.add_argument("--shape", default="8,32,4096", help="B,H,N of the timed shape")
    parser.add_argument("--rounds", type=int, default=7, help="alternated rounds; the medians are reported")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="builds at once")
    parser.add_argument("--json", type=Path, help="where to write every number (default $OUT/sweep.json)")
    args = parser.parse_args()
    if unknown := [name for name in args.variants if not is_variant(name)]:
        parser.error(f"unknown variants {unknown}; known: {list(VARIANTS)}, or file:PATH to a copy of kernel.py")
    batch, heads, seqlen = (int(part) for part in args.shape.split(","))
    torch_dtypes = {"float16": torch.float16, "bfloat16": torch.bfloat16}

    start = time.perf_counter()
    plan = {case: args.configs or table_configs(*CASES[case][:2]) for case in args.cases}
    builds = [
        dict(name=variant, head_dim=head_dim, causal=causal, dtype=dtype, config=config)
        for case, configs in plan.items()
        for head_dim, causal, dtype in [CASES[case]]
        for config in configs
        for variant in args.variants
    ]
    build_all(builds, args.jobs, builder=compile_variant)
    print(f"{len(builds)} kernels built in {time.perf_counter() - start:.0f} s", flush=True)

    rows = []
    for case, configs in plan.items():
        head_dim, causal, dtype = CASES[case]
        shape = Shape(batch, heads, seqlen, head_dim, causal, torch_dtypes[dtype])
        print(f"\n{case}: {shape.label()}, medians of {args.rounds} alternated rounds", flush=True)
        print(f"  {'variant':24} {'config':36} {'TFLOP/s':>8} {'x cuDNN':>8}  checks")
        for row in sweep_case(case, args.variants, configs, shape, args.rounds):
            ratio = f"{row['vs_cudnn']:8.3f}" if row["vs_cudnn"] else "       -"
            checks = "FAIL " + row["failures"][0][:100] if row["failures"] else "pass"
            print(f"  {row['variant']:24} {row['config']:36} {row['tflops']:8.1f} {ratio}  {checks}", flush=True)
            rows.append(row)
    output = args.json or (Path(os.environ["OUT"]) / "sweep.json" if os.environ.get("OUT") else None)
    if output is not None:
        device = torch.cuda.get_device_name(0)
        output.write_text(json.dumps(dict(gpu=device, shape=args.shape, rounds=args.rounds, rows=rows), indent=1))
        print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
