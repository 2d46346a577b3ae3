"""The split-KV kernels' tiles and split counts against the shipped ones, on the GPU, alternated
in one process.

From the repository root on the GPU machine:

    python -m perf.decode_ab [--variants NAME ...] [--rounds 5] [--repeats 50]
        [--graphs] [--cudnn] [--shapes N ...]

Each variant is decode.py with its tile table edited, in a copy of the module of its own
(`ab.module_copy`: its own kernels, caches and split plan). Every variant is
first judged (`reference.judge`) on the decode grid's shapes (`bench.DECODE_SHAPES`) and a
partial one, then timed there, alternated over rounds in this one process; GB/s of K/V read
(`Shape.kv_bytes`), each variant's ratio to the shipped kernels taken round by round. By default
each figure is the median of `repeats` event-timed calls, the host's path included
(split_kv_attention allocates its partials); `--graphs` times GPU alone, CUDA graph replays of
20 launches (`perf.host_overhead.graph_us`). `--cudnn` adds SDPA's cuDNN backend on both layouts
as columns (`bench.runners`). `--shapes` picks rows of the grid by index (0 and 1: the two
anchors). `--compile-only sm_90a` builds them without a GPU.

Variants (`--list`): decode.py's tile table (`SPLIT_TILES`) edited; a lever that needs the kernel
itself changed enters as an argument of `split_program`, not as an edit of its text.

  shipped          decode.py as it is: a group's rows up to 16 on 16-row tiles at d64 and d128
                   (four warps, 128 keys, one stage, no producer; splits for two blocks an SM at
                   d64, one at d128), else 64 rows behind a producer warpgroup (d64 128 keys a
                   tile, d128 and d256 64, three stages, one block an SM).
  one_row_block    64-row tiles for every step (as shipped before 2026-12-04).
  small_rows_one_block, small_rows_two_blocks  the 16-row tiles' splits for one block an SM at
                   d64, two at d128 (the other head dim as shipped).
  small_rows_64_keys  the 16-row tile at d128 on 64 keys (40 KB: more blocks an SM could fit).
  wide_d128        64-row d128 tiles of 128 keys (half the loop trips, twice the registers for S).
  two_stages       64-row tiles with two K/V tiles in flight instead of three.

Measured and dropped, in git history (perf/decode_ab.py before the 16-row tiles shipped) and
docs/performance.md: four stages, splits for two or four blocks an SM on the 64-row tile, and
`no_warp_specialization` (the 64-row tile without a producer, one stage: 0.82-0.95x),
`small_rows_256_keys` (the 16-row tiles on 256 keys, twice the bytes in flight a block:
0.97-1.01x), `a_second_wave` (splits rounded up to at least a block for every SM, the plan
before split_plan rounded down: 1.03-1.50x slower).

Not a variant: two resident thread blocks an SM (`T.annotate_min_blocks_per_sm(2)` on the split
kernel, with setmaxnreg 24/232 or without it: 112-128 registers a thread, no spills) passed the
checks' single launches, then hung the GPU in the timing loops' repeated ones, events or graphs
(H200, 2026-12-04, docs/perf-log.md).
"""

from __future__ import annotations

import functools
import math
import sys

import torch

from fa_kernel import decode as shipped_decode
from fa_kernel.device import device_target
from fa_kernel.reference import judge
from fa_kernel.workbench.bench import CUDNN_LAYOUTS, DECODE_SHAPES, Shape, cuda_median_ms, runners
from fa_kernel.workbench.builds import quiet_tilelang
from perf import ab
from perf.host_overhead import GRAPH_CALLS, graph_us

SHIPPED = shipped_decode.SPLIT_TILES


def retiled(key: tuple[int, int], **fields):
    """The shipped (head_dim, block_m) tile with `fields` replaced."""
    return {key: SHIPPED[key]._replace(**fields)}


WIDE = [key for key in SHIPPED if key[1] == shipped_decode.MOST_ROWS]
# name -> SPLIT_TILES entries replaced (None: removed)
VARIANTS: dict[str, dict] = {
    "shipped": {},
    "one_row_block": {key: None for key in SHIPPED if key[1] < shipped_decode.MOST_ROWS},
    "small_rows_one_block": retiled((64, 16), blocks_per_sm=1),
    "small_rows_two_blocks": retiled((128, 16), blocks_per_sm=2),
    "small_rows_64_keys": retiled((128, 16), block_n=64),
    "wide_d128": retiled((128, 64), block_n=128),
    "two_stages": {key: value for key in WIDE for value in retiled(key, num_stages=2).values()},
}
# A partial row block, keys ending inside a tile, causal: judged besides the grid's shapes.
CHECKS = [Shape(2, 8, 3, 128, True, torch.bfloat16, nheads_kv=2, seqlen_k=1001)]


@functools.cache
def module(name: str):
    """decode.py as the variant has it: a copy of the module, its tile table edited."""
    tiles = VARIANTS[name]
    if not tiles:
        return shipped_decode
    variant = ab.module_copy(shipped_decode, name)
    variant.SPLIT_TILES = {key: tile for key, tile in {**variant.SPLIT_TILES, **tiles}.items() if tile is not None}
    return variant


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
                kernels = module(name)
                rows = shape.nheads // shape.heads_kv * shape.seqlen_q
                kernels.compiled_decode_kernels(
                    head_dim=shape.head_dim,
                    causal=shape.causal,
                    dtype=dtype,
                    arch=args.compile_only,
                    block_m=kernels.row_block(shape.head_dim, rows),
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
