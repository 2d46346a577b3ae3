"""The split-KV kernels' tiles and split counts against the shipped ones, on the GPU, alternated
in one process.

From the repository root on the GPU machine:

    PYTHONPATH=$PWD/src:$PWD python perf/decode_ab.py [--variants NAME ...] [--rounds 5] [--repeats 50]
        [--graphs] [--cudnn] [--shapes N ...]

Each variant is decode.py patched: its tiles, its split count, its pass configs or fragments of
the split kernel (`variants.patched_module`; its own kernels and split plan). Every variant is
first judged (`reference.judge`) on the decode grid's shapes (`bench.DECODE_SHAPES`) and a
partial one, then timed there, alternated over rounds in this one process; GB/s of K/V read
(`Shape.kv_bytes`), each variant's ratio to the shipped kernels taken round by round. By default
each figure is the median of `repeats` event-timed calls, the host's path included
(split_kv_attention allocates its partials); `--graphs` times GPU alone, CUDA graph replays of
20 launches (`perf.host_overhead.graph_us`). `--cudnn` adds SDPA's cuDNN backend on both layouts
as columns (`bench.runners`). `--shapes` picks rows of the grid by index (0 and 1: the two
anchors). `--compile-only sm_90a` builds them without a GPU.

Variants (`--list`):

  shipped          decode.py as it is: d64 128 keys a tile, d128 and d256 64, three stages,
                   splits rounded down to at most one thread block per SM, the causal limit worked
                   out once per row.
  wide_d128        d128 tiles of 128 keys (half the loop trips, twice the registers for S).
  two_stages       two K/V tiles in flight instead of three.
  two_blocks_per_sm  splits for two thread blocks per SM (shorter splits, more partials; the
                   kernel's registers still hold one block an SM, so a second wave).
  four_blocks_per_sm  splits for four.
  a_second_wave    splits rounded up: at least a block for every SM, where a partial second wave
                   of blocks follows (a one-batch decode step: 18 splits of 8 heads on 132 SMs).
  four_stages      four K/V tiles in flight (144 KB of shared memory a block at d128).
  no_warp_specialization  no producer warpgroup: the 128 threads load K/V themselves (cp.async,
                   the next tile issued before this one's math), one stage; 165 registers and
                   48 KB of shared memory a block at d128, so three blocks an SM, where cuDNN's
                   decode kernel runs two of four warps each (ncu, docs/perf-log.md).
  no_warp_specialization_two_splits, _three_splits  and splits for two or three blocks an SM.
  small_row_block  cuDNN's decode tile: 16 rows (a group's 4-8 heads, not 64 rows mostly
                   padding), 128 keys, the four warps splitting the keys of S and the columns
                   of O, no producer warpgroup; 196 registers and 72 KB at d128: two blocks an
                   SM. `_two_splits`: and splits for two.

Not a variant: two resident thread blocks an SM (`T.annotate_min_blocks_per_sm(2)` on the split
kernel, with setmaxnreg 24/232 or without it: 112-128 registers a thread, no spills) passed the
checks' single launches, then hung the GPU in the timing loops' repeated ones, events or graphs
(H200, 2026-12-04, docs/perf-log.md).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(path) for path in (ROOT, ROOT / "src") if str(path) not in sys.path]

import torch  # noqa: E402

from fa_kernel import decode as shipped_decode  # noqa: E402
from fa_kernel.bench import CUDNN_LAYOUTS, DECODE_SHAPES, Shape, cuda_median_ms, runners  # noqa: E402
from fa_kernel.builds import device_target, quiet_tilelang  # noqa: E402
from fa_kernel.reference import judge  # noqa: E402
from perf import ab  # noqa: E402
from perf.host_overhead import GRAPH_CALLS, graph_us  # noqa: E402
from perf.variants import patched_module  # noqa: E402

TILES = "DECODE_TILES = {64: (128, 3), 128: (64, 3), 256: (64, 3)}"
BLOCKS = "BLOCKS_PER_SM = 1"
FAST_MATH = "{tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True}"
NO_PRODUCER = (FAST_MATH, FAST_MATH[:-1] + ", tilelang.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True}")
# No producer warpgroup (TileLang's pass config), and one stage: TileLang 0.1.15 fails to
# generate two or more without it, the loop's trip count being dynamic.
NO_WARP_SPECIALIZATION = (NO_PRODUCER, (TILES, "DECODE_TILES = {64: (128, 1), 128: (64, 1), 256: (64, 1)}"))
# cuDNN's decode kernel's shape (ncu: `16x128x128_1x4x1`): a 16-row tile, 128 keys a tile, the
# four warps splitting S's keys and O's columns (mma.sync, P through shared memory between them).
SMALL_ROW_BLOCK = (
    NO_PRODUCER,
    (TILES, "DECODE_TILES = {64: (128, 1), 128: (128, 1), 256: (64, 1)}"),
    ("BLOCK_M = 64", "BLOCK_M = 16"),
    (
        "T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)",
        "T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)",
    ),
    (
        "T.gemm(acc_p, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)",
        "T.gemm(acc_p, V_shared, acc_o, policy=T.GemmWarpPolicy.FullCol)",
    ),
    ("T.alloc_fragment([block_m, block_n], dtype)", "T.alloc_shared([block_m, block_n], dtype)"),
)
# split_plan rounds the splits down, to at most one wave of blocks; rounding them up instead
# asks at least a block for every SM, and 8 K/V heads on 132 SMs then get 18 splits, 144 blocks,
# 12 SMs a second block's tiles (the plan before 2026-12-03, 1.03-1.50x slower).
AT_MOST_A_WAVE = """wanted = max(1, BLOCKS_PER_SM * sm_count // max(1, batch * heads_kv * row_blocks))
tiles_per_split = ceildiv(tiles, wanted)"""
AT_LEAST_A_WAVE = """wanted = ceildiv(BLOCKS_PER_SM * sm_count, max(1, batch * heads_kv * row_blocks))
tiles_per_split = max(1, tiles // wanted)"""
VARIANTS: dict[str, tuple[tuple[str, str], ...]] = {
    "shipped": (),
    "wide_d128": ((TILES, "DECODE_TILES = {64: (128, 3), 128: (128, 3), 256: (64, 3)}"),),
    "two_stages": ((TILES, "DECODE_TILES = {64: (128, 2), 128: (64, 2), 256: (64, 2)}"),),
    "two_blocks_per_sm": ((BLOCKS, "BLOCKS_PER_SM = 2"),),
    "four_blocks_per_sm": ((BLOCKS, "BLOCKS_PER_SM = 4"),),
    "a_second_wave": ((AT_MOST_A_WAVE, AT_LEAST_A_WAVE),),
    "four_stages": ((TILES, "DECODE_TILES = {64: (128, 4), 128: (64, 4), 256: (64, 3)}"),),
    "no_warp_specialization": NO_WARP_SPECIALIZATION,
    "no_warp_specialization_two_splits": (*NO_WARP_SPECIALIZATION, (BLOCKS, "BLOCKS_PER_SM = 2")),
    "no_warp_specialization_three_splits": (*NO_WARP_SPECIALIZATION, (BLOCKS, "BLOCKS_PER_SM = 3")),
    "small_row_block": SMALL_ROW_BLOCK,
    "small_row_block_two_splits": (*SMALL_ROW_BLOCK, (BLOCKS, "BLOCKS_PER_SM = 2")),
}
# A partial row block, keys ending inside a tile, causal: judged besides the grid's shapes.
CHECKS = [Shape(2, 8, 3, 128, True, torch.bfloat16, nheads_kv=2, seqlen_k=1001)]


def module(name: str):
    patches = VARIANTS[name]
    return patched_module(shipped_decode, name, patches) if patches else shipped_decode


def attend(name: str, shape: Shape, seed: int = 0):
    """(call, inputs): the variant's split-KV launch on the shape's inputs, and (q, k, v)."""
    q, k, v = shape.inputs(seed)
    sm_count, arch = device_target(q.device)
    scale = 1.0 / math.sqrt(shape.head_dim)
    kernels = module(name)
    return (lambda: kernels.split_kv_attention(q, k, v, scale, shape.causal, sm_count, arch)), (q, k, v)


def options(parser) -> None:
    parser.add_argument("--graphs", action="store_true", help="GPU time: CUDA graph replays, no host")
    parser.add_argument("--cudnn", action="store_true", help="SDPA's cuDNN backend on both layouts as columns")
    parser.add_argument("--shapes", type=int, nargs="+", help="rows of bench.DECODE_SHAPES by index")


def main() -> int:
    args, variants = ab.arguments(__doc__.splitlines()[0], VARIANTS, repeats=50, more=options)
    if unknown := sorted(set(args.shapes or ()) - set(range(len(DECODE_SHAPES)))):
        print(f"--shapes: expected indices 0-{len(DECODE_SHAPES) - 1} of bench.DECODE_SHAPES, got {unknown}")
        return 2
    if args.list:
        print("\n".join(VARIANTS))
        return 0
    grid = [DECODE_SHAPES[index] for index in args.shapes] if args.shapes else list(DECODE_SHAPES)
    shapes = [*grid, *CHECKS]
    if args.compile_only:
        quiet_tilelang()
        for name in variants:
            for shape in shapes:
                dtype = str(shape.dtype).removeprefix("torch.")
                module(name).compiled_decode_kernels(
                    head_dim=shape.head_dim, causal=shape.causal, dtype=dtype, arch=args.compile_only
                )
            print(f"{name}: compiled for {args.compile_only}", flush=True)
        return 0

    def failures(name: str):
        for shape in shapes:
            call, (q, k, v) = attend(name, shape)
            out, lse = call()
            verdict = judge(q, k, v, out, lse, shape.causal)
            if not verdict.passed:
                yield f"{shape.label()}: {verdict}"

    variants = ab.within_the_bound(variants, failures)
    if variants is None:
        return 1
    columns = [*variants, *(CUDNN_LAYOUTS if args.cudnn else ())]
    ab.print_header(f"GB/s of K and V read ({'GPU time, CUDA graphs' if args.graphs else 'CUDA events'})", columns)

    def gb_per_s(call, kv_bytes: int) -> float:
        if call is None:
            return math.nan
        if args.graphs:
            gpu_us = graph_us(call, GRAPH_CALLS)  # None: not capturable, reported there
            return math.nan if gpu_us is None else kv_bytes / (gpu_us * 1e-6) / 1e9
        return kv_bytes / (cuda_median_ms(call, 10, args.repeats) * 1e-3) / 1e9

    for shape in grid:
        calls = {name: attend(name, shape)[0] for name in variants}
        if args.cudnn:
            # A layout cuDNN does not take here (the causal append step) stays a column, as NaN.
            competitors = runners(shape)
            calls |= {name: competitors.get(name) for name in CUDNN_LAYOUTS}
        timers = {
            name: lambda call=call, kv_bytes=shape.kv_bytes: gb_per_s(call, kv_bytes) for name, call in calls.items()
        }
        ab.print_row(shape.label(), timers, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
