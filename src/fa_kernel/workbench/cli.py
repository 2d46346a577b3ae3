"""`fa-kernel` (also `python -m fa_kernel`): verify, bench, tune, info.

Exit codes: 0 success; 1 a verification failed; 2 the command needs a CUDA GPU and there is
none; 3 `verify` without a GPU compiled the kernels for sm_90a but ran nothing.
"""

from __future__ import annotations

import argparse
import os
import sys

from fa_kernel import __version__
from fa_kernel.configs import TileConfig
from fa_kernel.interface import SUPPORTED_HEAD_DIMS
from fa_kernel.workbench import bench_command, info_command, tune, tune_command, verify_command
from fa_kernel.workbench.bench import BACKWARD_FLOPS
from fa_kernel.workbench.console import DTYPES

EXIT_CODES = (
    "exit codes: 0 success; 1 a check or a build failed; 2 the command needs a CUDA GPU (or, for verify, nvcc) "
    "and there is none; 3 verify without a GPU compiled the kernels for sm_90a but ran nothing"
)


def _tile_config(text: str) -> TileConfig:
    """argparse type for a tile config as TileConfig prints it."""
    try:
        return TileConfig.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _count(text: str) -> int:
    """argparse type for counts: says which value it got when it is not a positive integer."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fa-kernel", description=__doc__.splitlines()[0], epilog=EXIT_CODES)
    parser.add_argument("--version", action="version", version=f"fa_kernel {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    verify = commands.add_parser(
        "verify",
        help="check the kernel and its gradients against the fp32 reference on a sweep of shapes",
        description="Build the kernels it needs over all cores, then check each case's output, and its gradients "
        "where the backward has tiles for its head dim, against the fp32 reference. Without a GPU, compile every "
        "shipped forward kernel for sm_90a with nvcc and run nothing.",
        epilog=EXIT_CODES,
    )
    verify.add_argument("--markdown", action="store_true", help="print a markdown table (for CI summaries)")
    verify.add_argument("--jobs", type=_count, default=os.cpu_count(), help="kernels built at once (default: cores)")
    verify.add_argument("--verbose", action="store_true", help="let TileLang log at INFO")
    verify.set_defaults(run=verify_command.run)

    bench = commands.add_parser("bench", help="TFLOP/s beside torch SDPA's cuDNN and flash backends")
    bench.add_argument("--dtype", choices=sorted(DTYPES), nargs="+", default=["fp16"])
    bench.add_argument("--repeats", type=_count, default=50, help="timed calls per round (their median is the round's)")
    bench.add_argument(
        "--rounds", type=_count, default=5, help="rounds per case, the implementations alternated in each (median)"
    )
    bench.add_argument(
        "--grid",
        choices=["standard", "models", "decode", "variants"],
        default="standard",
        help="standard: eight shapes (MHA, GQA, prefill); models: the head counts, GQA groups and head dims of "
        "released models at 512-32k tokens, causal and not, and prefill chunks (bench.model_grid); decode: a few "
        "queries against a long KV cache (bench.DECODE_SHAPES), the split-KV kernels too, also in GB/s of K/V; "
        "variants: a window, a softcap and sinks (bench.VARIANTS) on causal 2k and 8k sequences against "
        "FlexAttention, for sinks the plain kernel",
    )
    bench.add_argument(
        "--backward",
        action="store_true",
        help="time the backward alone (the gradients of q, k, v from a forward graph built once), "
        f"at {BACKWARD_FLOPS}x the forward's FLOPs",
    )
    bench.add_argument(
        "--head-dim",
        type=int,
        choices=SUPPORTED_HEAD_DIMS,
        nargs="+",
        help="only the grid's shapes of these head dims (a long grid in parts: each part prints when it ends)",
    )
    bench.add_argument(
        "--seqlen-q",
        type=_count,
        nargs="+",
        help="only the grid's shapes of these query lengths (the model grid's 512-token row alone, say)",
    )
    bench.add_argument("--jobs", type=_count, default=os.cpu_count(), help="kernels built at once (default: cores)")
    bench.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bench.add_argument("--markdown", action="store_true", help="print a markdown table")
    bench.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also plot TFLOP/s against seq_len to this file (with --backward, the backward's); its points follow "
        "as a second table (JSON: 'plot')",
    )
    bench.set_defaults(run=bench_command.run)

    tuner = commands.add_parser("tune", help="measure tile configs over key counts and print configs.py's tables")
    tuner.add_argument("--head-dim", type=int, choices=SUPPORTED_HEAD_DIMS, nargs="+", default=[64, 128])
    tuner.add_argument("--keys", type=_count, nargs="+", default=list(tune.LADDER), help="the ladder of key counts")
    tuner.add_argument(
        "--heads",
        type=_count,
        nargs="+",
        default=[16],
        help="query heads of the shapes, one ladder each (32k tokens: 256 x heads work tiles of 128 rows, so the "
        "heads set the grid's size against the SMs)",
    )
    tuner.add_argument(
        "--configs",
        type=_tile_config,
        nargs="+",
        metavar="CONFIG",
        help="time only these candidates (as TileConfig prints them, like 128x128/2st/256thr/persistent), with the "
        "configs the tables run now; default: the whole search space (tune.candidate_configs)",
    )
    tuner.add_argument("--rounds", type=_count, default=5, help="alternated timings of the finalists at each length")
    tuner.add_argument("--jobs", type=_count, default=os.cpu_count(), help="kernels compiled at once before timing")
    tuner.add_argument("--json", metavar="FILE.json", help="also write every measurement and the entries to this file")
    tuner.add_argument(
        "--compile-only",
        nargs=2,
        metavar=("ARCH", "SMS"),
        help="no GPU: compile every candidate for nvcc ARCH (sm_90a) and a GPU of SMS SMs (132 on an H200) into "
        "TileLang's cache, then stop; the GPU host then tunes on a copy of that cache without compiling",
    )
    tuner.set_defaults(run=tune_command.run)

    info = commands.add_parser("info", help="GPU, versions, and the tile config each case uses")
    info.set_defaults(run=info_command.run)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
