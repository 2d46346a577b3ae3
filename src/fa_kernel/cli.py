"""`fa-kernel` (also `python -m fa_kernel`): verify, bench, tune, info.

Exit codes: 0 success; 1 a verification failed; 2 the command needs a CUDA GPU and there is
none; 3 `verify` without a GPU compiled the kernels for sm_90a but ran nothing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace

import torch
from rich.console import Console
from rich.progress import Progress, track
from rich.table import Table

from fa_kernel import __version__, tune
from fa_kernel.backward import BACKWARD_TILES, compiled_gradient_kernels
from fa_kernel.bench import (
    BACKWARD_FLOPS,
    CUDNN_LAYOUTS,
    DECODE_SHAPES,
    H200_HBM_BYTES_PER_S,
    SPLIT_KV_QUERIES,
    Shape,
    Timing,
    cudnn_best,
    measure,
    model_grid,
    plot_seqlen_sweep,
    plot_shapes,
    ratio_to_cudnn_best,
    summarise,
)
from fa_kernel.builds import build_unless_built, device_target, distinct_tasks, quiet_tilelang, shipped_builds
from fa_kernel.configs import (
    TUNED,
    TileConfig,
    arch_of,
    grid_bands,
    select_config,
    split_kv_serves,
)
from fa_kernel.decode import MOST_ROWS as SPLIT_KV_ROWS
from fa_kernel.decode import SPLIT_TILES, compiled_decode_kernels
from fa_kernel.interface import SUPPORTED_HEAD_DIMS, compile_arch, flash_attn_func, kernel_build, serving_build
from fa_kernel.kernel import H100_SM_COUNT
from fa_kernel.reference import GRADIENTS, judge, judge_backward

EXIT_FAILED, EXIT_NO_GPU, EXIT_COMPILED_ONLY = 1, 2, 3
EXIT_CODES = (
    "exit codes: 0 success; 1 a check or a build failed; 2 the command needs a CUDA GPU (or, for verify, nvcc) "
    "and there is none; 3 verify without a GPU compiled the kernels for sm_90a but ran nothing"
)

# (batch, nheads, nheads_kv, seqlen_q, seqlen_k, head_dim): odd lengths, GQA/MQA, seqlen_q != seqlen_k.
VERIFY_SHAPES = [
    (1, 4, 4, 1, 1, 64),
    (2, 4, 4, 127, 127, 64),
    (2, 4, 4, 129, 129, 128),
    (1, 8, 8, 1000, 1000, 128),
    (1, 2, 2, 4097, 4097, 128),
    (2, 4, 4, 257, 257, 256),
    (2, 8, 2, 113, 203, 128),
    (2, 8, 1, 799, 3, 64),
    (1, 8, 4, 1, 239, 128),
    (2, 8, 1, 4, 1000, 64),  # a decode step: the split-KV kernels without the mask, the forward's with it
    (1, 32, 8, 1023, 1024, 128),
    (1, 16, 2, 1024, 3000, 64),
]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}

BENCH_SHAPES = (
    [Shape(8, 32, 4096, 128, causal) for causal in (False, True)]
    + [Shape(2, 16, 16384, 128, causal) for causal in (False, True)]
    + [Shape(8, 32, 4096, 64, causal) for causal in (False, True)]
    + [
        Shape(8, 32, 4096, 128, False, nheads_kv=8),  # GQA 4:1
        Shape(8, 32, 2048, 128, False, seqlen_k=8192),  # prefill against a 4x longer cache
    ]
)


def _console(stderr: bool = False) -> Console:
    """A console that does not fold tables to 80 columns when writing to a file or CI log."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 160)


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
    verify.set_defaults(run=cmd_verify)

    bench = commands.add_parser("bench", help="TFLOP/s beside torch SDPA's cuDNN and flash backends")
    bench.add_argument("--dtype", choices=sorted(DTYPES), nargs="+", default=["fp16"])
    bench.add_argument("--repeats", type=_count, default=50, help="timed calls per round (their median is the round's)")
    bench.add_argument(
        "--rounds", type=_count, default=5, help="rounds per case, the implementations alternated in each (median)"
    )
    bench.add_argument(
        "--grid",
        choices=["standard", "models", "decode"],
        default="standard",
        help="standard: eight shapes (MHA, GQA, prefill); models: the head counts, GQA groups and head dims of "
        "released models at 512-32k tokens, causal and not, and prefill chunks (bench.model_grid); decode: a few "
        "queries against a long KV cache (bench.DECODE_SHAPES), the split-KV kernels too, also in GB/s of K/V",
    )
    bench.add_argument(
        "--backward",
        action="store_true",
        help="time the backward alone (the gradients of q, k, v from a forward graph built once), "
        f"at {BACKWARD_FLOPS}x the forward's FLOPs; head_dim 64 and 128",
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
    bench.set_defaults(run=cmd_bench)

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
    tuner.set_defaults(run=cmd_tune)

    info = commands.add_parser("info", help="GPU, versions, and the tile config each case uses")
    info.set_defaults(run=cmd_info)

    args = parser.parse_args(argv)
    return args.run(args)


def cmd_verify(args) -> int:
    console = _console()
    quiet_tilelang(args.verbose)
    if not torch.cuda.is_available():
        return _compile_only(console, args.jobs, args.verbose)
    device = torch.device("cuda")
    cases = list(itertools.product(VERIFY_SHAPES, DTYPES.values(), (False, True)))
    # The gradients of the same cases, where the backward has tiles for the head dim.
    gradient_cases = [(shape, dtype, causal) for shape, dtype, causal in cases if shape[5] in BACKWARD_TILES]
    # What flash_attn_func runs for each: the forward kernel, or the split-KV kernels (decode steps).
    served = [_served(device, _verify_shape(*case)) for case in cases]
    builds = [arguments for _, arguments in served]
    arch = compile_arch(device)
    gradient_builds = [_kernels_arguments(_verify_shape(*case), arch) for case in gradient_cases]
    builders = [builder for builder, _ in served] + [compiled_gradient_kernels] * len(gradient_builds)
    if not _build_all(console, builds + gradient_builds, args.jobs, args.verbose, args.markdown, builders):
        return EXIT_FAILED

    def progress(items, description):
        return track(items, description=description, console=console, transient=True, disable=args.markdown)

    rows = [_verify_forward(*case) for case in progress(cases, "verifying")]
    gradient_rows = [_verify_gradients(*case) for case in progress(gradient_cases, "gradients")]
    title = f"fa-kernel verify on {torch.cuda.get_device_name()}"
    headers = ["shape BxHxSxD", "dtype", "mask", "max err", "bound", "mismatches", "LSE err", "result"]
    _print_table(console, headers, rows, args.markdown, title=f"{title}: the forward")
    gradient_headers = ["shape BxHxSxD", "dtype", "mask", *(f"{name} err / bound" for name in GRADIENTS), "result"]
    gradient_title = f"{title}: the gradients of a random loss (flash-attn's rule for each)"
    _print_table(console, gradient_headers, gradient_rows, args.markdown, title=gradient_title)
    results = [row[-1] for row in rows + gradient_rows]
    failed = results.count("FAIL")
    console.print(f"{len(results) - failed}/{len(results)} cases pass" + ("" if not failed else f", {failed} FAIL"))
    return EXIT_FAILED if failed else 0


def _served(device: torch.device, shape: Shape) -> tuple[Callable[..., object] | None, dict]:
    """The builder and build of the kernels flash_attn_func runs for `shape` (serving_build)."""
    return serving_build(
        device,
        shape.head_dim,
        shape.causal,
        shape.dtype,
        shape.batch,
        shape.seqlen_q,
        shape.keys,
        shape.nheads,
        shape.heads_kv,
    )


def _verify_shape(shape: tuple, dtype: torch.dtype, causal: bool) -> Shape:
    batch, nheads, nheads_kv, seqlen_q, seqlen_k, head_dim = shape
    return Shape(batch, nheads, seqlen_q, head_dim, causal, dtype, nheads_kv, seqlen_k)


def _verify_inputs(shape: Shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return shape.inputs(seed=shape.seqlen_q * 7919 + shape.keys)


def _case_cells(shape: Shape) -> list[str]:
    """The shape (its label's first word), the dtype's short name and the mask."""
    dtype = next(name for name, dtype in DTYPES.items() if dtype == shape.dtype)
    return [shape.label().split()[0], dtype, "causal" if shape.causal else ""]


def _verify_forward(shape: tuple, dtype: torch.dtype, causal: bool) -> list[str]:
    """One forward case's row: its error against the fp32 reference, within reference.judge's bound."""
    case = _verify_shape(shape, dtype, causal)
    q, k, v = _verify_inputs(case)
    out, lse = flash_attn_func(q, k, v, causal=causal, return_lse=True)
    verdict = judge(q, k, v, out, lse, causal)
    report, bound = verdict.output, verdict.output_bound
    lse_err = verdict.lse.max_abs if verdict.lse is not None else math.nan
    return [
        *_case_cells(case),
        f"{report.max_abs:.2e}",
        f"{bound.atol:.2e}",
        f"{report.mismatches}/{report.numel}",
        f"{lse_err:.1e}",
        "pass" if verdict.passed else "FAIL",
    ]


def _verify_gradients(shape: tuple, dtype: torch.dtype, causal: bool) -> list[str]:
    """One case's gradients through flash_attn_func (autograd) for a random upstream gradient,
    each of dq, dk, dv within reference.judge_backward's bound."""
    case = _verify_shape(shape, dtype, causal)
    q, k, v = (t.requires_grad_() for t in _verify_inputs(case))
    out, _ = flash_attn_func(q, k, v, causal=causal, return_lse=True)
    generator = torch.Generator(out.device).manual_seed(case.seqlen_q)
    dout = torch.randn(out.shape, generator=generator, device=out.device, dtype=out.dtype)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    verdict = judge_backward(q.detach(), k.detach(), v.detach(), dout, (dq, dk, dv), causal)
    figures = [f"{verdict.reports[name].max_abs:.1e} / {verdict.bounds[name].atol:.1e}" for name in GRADIENTS]
    return [*_case_cells(case), *figures, "pass" if verdict.passed else "FAIL"]


def _build_all(
    console: Console, builds: list[dict], jobs: int, verbose: bool, quiet: bool = False, builder=None
) -> bool:
    """Build every kernel over `jobs` processes (`builder`: other kernels than the forward, from
    the builds' arguments; one for all, or one per build), with a progress bar and one line per
    build that fails; True if all built."""
    count = len(distinct_tasks(builds, builder))
    failures = []
    with Progress(console=console, transient=True, disable=quiet) as progress:
        task = progress.add_task(f"building {count} kernels on {jobs} processes", total=count)

        def done(build, seconds, error):
            progress.advance(task)
            if error is not None:
                failures.append(f"  {_build_label(build)}: {type(error).__name__}: {error}")
            elif not (quiet or console.is_terminal):
                # A log (CI, a pipe) shows no progress bar: a line per kernel instead.
                finished = int(progress.tasks[0].completed)
                console.print(f"built {finished}/{count}: {_build_label(build)} in {seconds:.0f} s")

        start = time.perf_counter()
        errors = build_unless_built(builds, jobs, done, verbose, builder)
    if errors is None:
        if not quiet:
            console.print(f"{count} kernels built already (TileLang's cache holds them)")
        return True
    for line in failures:
        console.print(line)
    if not quiet:
        console.print(f"{count - len(failures)}/{count} kernels built in {time.perf_counter() - start:.0f} s")
    return not failures


def _kernels_arguments(shape: Shape, arch: str | None) -> dict:
    """The split-KV and gradient kernels' build for a shape: (head_dim, causal, dtype, arch)."""
    return dict(head_dim=shape.head_dim, causal=shape.causal, dtype=str(shape.dtype).removeprefix("torch."), arch=arch)


def _build_label(build: dict) -> str:
    return f"{build['dtype']} head_dim={build['head_dim']} causal={build['causal']} {build.get('config', '')}".rstrip()


def _compile_only(console: Console, jobs: int, verbose: bool) -> int:
    if shutil.which("nvcc") is None:
        console.print("No CUDA GPU and no nvcc: nothing was compiled and nothing was run.")
        return EXIT_NO_GPU
    console.print("No CUDA GPU here: compiling the kernels for sm_90a with nvcc instead.")
    builds = shipped_builds("sm_90", SUPPORTED_HEAD_DIMS)
    if not _build_all(console, builds, jobs, verbose):
        return EXIT_FAILED
    for build in builds:
        console.print(f"  compiled {_build_label(build)}")
    console.print("[bold]Nothing was run on a GPU[/]: the kernels compile, but correctness is unverified here.")
    return EXIT_COMPILED_ONLY


def cmd_bench(args) -> int:
    console = _console(stderr=args.json)
    quiet_tilelang()
    if not torch.cuda.is_available():
        console.print("fa-kernel bench needs a CUDA GPU; torch.cuda.is_available() is False here.")
        return EXIT_NO_GPU
    if args.grid == "models":
        shapes = [shape for d in args.dtype for shape in model_grid(DTYPES[d])]
    elif args.grid == "decode":
        shapes = [replace(s, dtype=DTYPES[d]) for d in args.dtype for s in DECODE_SHAPES]
    else:
        shapes = [
            Shape(s.batch, s.nheads, s.seqlen_q, s.head_dim, s.causal, DTYPES[d], s.nheads_kv, s.seqlen_k)
            for d in args.dtype
            for s in BENCH_SHAPES
        ]
    if args.backward:
        shapes = [shape for shape in shapes if shape.head_dim in BACKWARD_TILES]
    if args.head_dim:
        shapes = [shape for shape in shapes if shape.head_dim in args.head_dim]
    if args.seqlen_q:
        shapes = [shape for shape in shapes if shape.seqlen_q in args.seqlen_q]
    # Every kernel the grid and the plot launch, built over all cores first (one compile each,
    # not one at a time inside the timing loop's warm-up), in one pool: the forward's, and the
    # split-KV or gradient kernels, which take (head_dim, causal, dtype, arch).
    device = torch.device("cuda")
    launched = shapes + (plot_shapes(DTYPES[args.dtype[0]]) if args.plot else [])
    served = [_served(device, s) for s in launched]  # what flash_attn_func runs
    builds, builders = [build for _, build in served], [builder for builder, _ in served]
    arch = compile_arch(device)
    # The decode grid times the forward kernel and the split-KV kernels apart too, whichever
    # flash_attn_func runs.
    decodes = [s for s in shapes if s.seqlen_q <= SPLIT_KV_QUERIES and not args.backward]
    for s in decodes:
        launch = (s.batch, s.nheads, s.seqlen_q)
        builds += [
            kernel_build(device, s.head_dim, s.causal, s.dtype, s.keys, launch=launch),
            _kernels_arguments(s, arch),
        ]
        builders += [None, compiled_decode_kernels]
    if args.backward:  # the atomic and the deterministic gradient's (its own dQ kernel)
        builds += [_kernels_arguments(s, arch) for s in launched]
        builds += [_kernels_arguments(s, arch) | {"deterministic": True} for s in launched]
        builders += [compiled_gradient_kernels] * (2 * len(launched))
    if not _build_all(console, builds, args.jobs, verbose=False, quiet=args.json, builder=builders):
        return EXIT_FAILED
    results: list[tuple[Shape, dict[str, Timing]]] = [
        (shape, measure(shape, rounds=args.rounds, repeats=args.repeats, backward=args.backward))
        for shape in track(shapes, description="benchmarking", console=console, transient=True)
    ]
    # The numbers behind the plot are printed too: a figure alone cannot be quoted or compared.
    plotted = []
    if args.plot:

        def progress(seqlens, description):
            return track(seqlens, description=description, console=console, transient=True)

        dtype = DTYPES[args.dtype[0]]
        plotted = plot_seqlen_sweep(args.plot, dtype, args.repeats, progress, args.rounds, args.backward)
        console.print(f"plot written to {args.plot}")
    if args.json:
        record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": _records(results)}
        record["pass"] = "backward" if args.backward else "forward"
        record["summary"] = [asdict(summary) for summary in summarise(results)]
        if args.plot:
            record["plot"] = _records(plotted)
        print(json.dumps(record))
        return 0
    names = ("fa_kernel", *(["fa_kernel deterministic"] if args.backward else []), *CUDNN_LAYOUTS, "flash")
    headers = ["shape BxHxSxD", *(COLUMNS[name] for name in names), "vs cuDNN best", "ratio range"]
    title = (
        f"{'Backward' if args.backward else 'Forward'} TFLOP/s on {torch.cuda.get_device_name()}:"
        f" medians of {args.rounds} rounds alternated in this process,"
        f" each the median of {args.repeats} timings; the ratio round by round against the faster cuDNN layout"
    )
    _print_table(console, headers, _rows(results, names), args.markdown, title=title)
    summary_rows = [
        [str(found.head_dim), str(found.shapes), f"{found.median:.2f}x", f"{found.worst:.2f}x", found.worst_shape]
        for found in summarise(results)
    ]
    summary_headers = ["head_dim", "shapes", "median vs cuDNN best", "worst", "worst shape"]
    _print_table(console, summary_headers, summary_rows, args.markdown, title="Ratios to cuDNN best by head_dim")
    if args.plot:
        plot_title = f"{title}: the points of {args.plot}"
        _print_table(console, headers, _rows(plotted, names), args.markdown, title=plot_title)
    if decodes:
        bandwidth_headers = [
            "shape BxHxSqxSkxD",
            *(COLUMNS[name] for name in BANDWIDTH_NAMES),
            "split-KV vs cuDNN best",
            "split-KV of HBM",
        ]
        bandwidth_title = (
            f"GB/s of K and V read, from the same timings; HBM {H200_HBM_BYTES_PER_S / 1e12:.1f} TB/s (H200 SXM)"
        )
        _print_table(console, bandwidth_headers, _bandwidth_rows(results), args.markdown, title=bandwidth_title)
    return 0


# Each implementation bench.runners times, as a table's column names it.
COLUMNS = {
    "fa_kernel": "fa_kernel",
    "fa_kernel deterministic": "deterministic",
    "fa_kernel forward kernel": "forward kernel",
    "fa_kernel split-KV": "split-KV",
    "cudnn BHSD": "cuDNN BHSD",
    "cudnn BSHD view": "cuDNN BSHD view",
    "flash": "SDPA flash",
}
# The decode grid's table of GB/s.
BANDWIDTH_NAMES = ("fa_kernel", "fa_kernel forward kernel", "fa_kernel split-KV", *CUDNN_LAYOUTS, "flash")


def _bandwidth_rows(results: list[tuple[Shape, dict[str, Timing]]]) -> list[list[str]]:
    """GB/s of K/V per implementation (TFLOP/s times the shape's K/V bytes per FLOP) of the
    shapes the split-KV kernels ran on."""
    rows = []
    for shape, timings in results:
        if "fa_kernel split-KV" not in timings:
            continue
        per_tflops = shape.kv_bytes / shape.flops * 1e3  # GB/s per TFLOP/s
        ratio = ratio_to_cudnn_best(timings, ours="fa_kernel split-KV")
        split_kv = timings["fa_kernel split-KV"].median * per_tflops
        rows.append(
            [
                shape.label(),
                *(f"{timings[name].median * per_tflops:.0f}" if name in timings else "-" for name in BANDWIDTH_NAMES),
                "-" if ratio is None else f"{ratio.median:.2f}x ({min(ratio.rounds):.2f}-{max(ratio.rounds):.2f})",
                f"{split_kv * 1e9 / H200_HBM_BYTES_PER_S:.0%}",
            ]
        )
    return rows


def _records(results: list[tuple[Shape, dict[str, Timing]]]) -> list[dict[str, object]]:
    records: list[dict[str, object]] = []
    for shape, timings in results:
        ratio = ratio_to_cudnn_best(timings)
        records.append(
            {
                "shape": shape.label(),
                "tflops": {name: timing.median for name, timing in timings.items()},
                "rounds": {name: list(timing.rounds) for name, timing in timings.items()},
                "cudnn_best": cudnn_best(timings),
                "ratio_to_cudnn_best": None if ratio is None else ratio.median,
            }
        )
    return records


def _rows(results: list[tuple[Shape, dict[str, Timing]]], names: tuple[str, ...]) -> list[list[str]]:
    """A table row per shape: the TFLOP/s of each implementation in `names`, then fa_kernel's
    ratio to the faster cuDNN layout."""
    rows = []
    for shape, timings in results:
        ratio = ratio_to_cudnn_best(timings)
        rows.append(
            [
                shape.label(),
                *(f"{timings[name].median:.0f}" if name in timings else "-" for name in names),
                "-" if ratio is None else f"{ratio.median:.2f}x",
                "-" if ratio is None else f"{min(ratio.rounds):.2f}-{max(ratio.rounds):.2f}",
            ]
        )
    return rows


def cmd_tune(args) -> int:
    console = _console()
    cases = list(itertools.product(args.head_dim, (False, True)))
    if args.compile_only:
        arch, sms = args.compile_only
        if not (arch.startswith("sm_") and sms.isdigit() and int(sms) > 0):
            console.print(f"--compile-only: expected an nvcc arch and an SM count, like sm_90a 132, got {arch} {sms}")
            return EXIT_FAILED
        quiet_tilelang()
        by_case = tune.precompile(cases, args.jobs, target=(int(sms), arch), candidates=_tune_candidates(args, "sm_90"))
        errors = [error for case in by_case.values() for error in case.values()]
        counts = f"{errors.count(None)} of {len(errors)} candidate kernels"
        console.print(f"{counts} compiled for {arch} with {sms} SMs into TileLang's cache")
        return 0
    if not torch.cuda.is_available():
        console.print("fa-kernel tune needs a CUDA GPU; torch.cuda.is_available() is False here.")
        return EXIT_NO_GPU
    arch = arch_of(torch.cuda.get_device_capability())
    sm_count = device_target()[0]
    ladder = sorted(set(args.keys))
    candidates = _tune_candidates(args, arch)
    built: dict[tuple[int, bool], list] = {}
    if args.jobs > 1:
        console.print(f"compiling every candidate kernel, {args.jobs} at a time")
        tried = 0
        for (head_dim, causal), outcomes in tune.precompile(cases, args.jobs, candidates=candidates).items():
            tried += len(outcomes)
            built[head_dim, causal] = [config for config, error in outcomes.items() if error is None]
            for config, error in outcomes.items():
                if error is not None:
                    mask = " causal" if causal else ""
                    console.print(f"  d{head_dim}{mask} {config}: does not compile ({type(error).__name__})")
        console.print(f"{sum(map(len, built.values()))} of {tried} candidate kernels built (the others do not fit)")
    elif candidates is not None:
        built = {case: candidates(*case) for case in cases}
    by_grid: dict[tuple[int, bool], dict[float, tune.Measurements]] = {case: {} for case in cases}
    record = []
    for (head_dim, causal), heads in itertools.product(cases, sorted(set(args.heads))):
        mask = " causal" if causal else ""
        grid = round(tune.sweep_tiles(heads) / sm_count, 2)
        console.print(
            f"d{head_dim}{mask}, {heads} heads ({grid} work tiles an SM): timing every candidate at {ladder} keys"
        )
        shipped = {keys: select_config(arch, head_dim, causal, keys, grid) for keys in ladder}
        sweep, tflops = tune.measure_case(
            head_dim, causal, ladder, args.rounds, console.print, shipped.values(), heads, built.get((head_dim, causal))
        )
        by_grid[head_dim, causal][grid] = tflops
        entries = tune.choose_entries(tflops)
        record.append(
            {
                "head_dim": head_dim,
                "causal": causal,
                "heads": heads,
                "tiles_per_sm": grid,
                **{name: _by_name(measured) for name, measured in (("sweep", sweep), ("alternated", tflops))},
                "entries": [[most, str(config)] for most, config in entries],
            }
        )
        rows = []
        for keys, measured in tflops.items():
            fastest = max(measured, key=measured.__getitem__)
            entry = next(config for most, config in entries if most is None or keys <= most)
            cells = [
                f"{c} {measured[c]:.0f}" if c in measured else f"{c} (no build)"
                for c in (fastest, entry, shipped[keys])
            ]
            rows.append([str(keys), *cells])
        headers = ["keys", "fastest (TFLOP/s)", "entry derived", "configs.py now"]
        _print_table(
            console, headers, rows, False, title=f"d{head_dim}{mask}, {heads} heads, {grid} tiles an SM (fp16)"
        )
    chosen = {case: tune.choose_bands(grids) for case, grids in by_grid.items()}
    console.print(tune.table_text(arch, chosen), highlight=False, soft_wrap=True)
    if args.json:
        bands = [
            {
                "head_dim": d,
                "causal": c,
                "bands": [[most, [[keys, str(config)] for keys, config in entries]] for most, entries in b],
            }
            for (d, c), b in chosen.items()
        ]
        with open(args.json, "w") as file:
            json.dump(
                {
                    "device": torch.cuda.get_device_name(),
                    "arch": arch,
                    "sm_count": sm_count,
                    "cases": record,
                    "bands": bands,
                },
                file,
                indent=1,
            )
    return 0


def _tune_candidates(args, arch: str) -> Callable[[int, bool], list[TileConfig]] | None:
    """The candidates `--configs` names, with the configs the tables run for each case now (None: the
    whole search space)."""
    if not args.configs:
        return None

    def candidates(head_dim: int, causal: bool) -> list[TileConfig]:
        shipped = [config for _, ranges in grid_bands(arch, head_dim, causal) for _, _, config in ranges]
        return list(dict.fromkeys([*args.configs, *shipped]))

    return candidates


def _by_name(measured: tune.Measurements) -> dict[int, dict[str, float]]:
    return {keys: {str(config): value for config, value in row.items()} for keys, row in measured.items()}


def cmd_info(args) -> int:
    console = _console()
    import tilelang

    console.print(
        f"fa_kernel {__version__}, tilelang {tilelang.__version__}, torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}, Python {platform.python_version()}"
    )
    if torch.cuda.is_available():
        arch = arch_of(torch.cuda.get_device_capability())
        sm_count = device_target()[0]
        console.print(f"GPU: {torch.cuda.get_device_name()} ({arch}, {sm_count} SMs)")
    else:
        arch, sm_count = "sm_90", H100_SM_COUNT
        console.print(
            f"GPU: none (torch.cuda.is_available() is False); showing what an sm_90 GPU of {sm_count} SMs would run"
        )
    rows = []
    for head_dim, causal in itertools.product(SUPPORTED_HEAD_DIMS, (False, True)):
        mask = "causal" if causal else ""
        fewest_tiles = 0.0
        for most_tiles, ranges in grid_bands(arch, head_dim, causal):
            if most_tiles is None:
                grid = f"> {fewest_tiles:g}" if fewest_tiles else "any"
            else:
                grid = f"{fewest_tiles:g}-{most_tiles:g}" if fewest_tiles else f"<= {most_tiles:g}"
            for fewest, most, config in ranges:
                if most_tiles is not None:
                    source = "tuned (grid)"
                elif most is None:
                    source = "tuned" if (arch, head_dim, causal) in TUNED else "fallback"
                else:
                    source = "tuned (short)"
                if most is None:
                    keys = f">= {fewest}" if fewest else "any"
                else:
                    keys = f"{fewest}-{most}" if fewest else f"<= {most}"
                rows.append([str(head_dim), mask, grid, keys, str(config), source])
            fewest_tiles = most_tiles or 0.0
    headers = ["head_dim", "mask", "work tiles / SM", "seqlen_k", "tile config", "source"]
    _print_table(console, headers, rows, False, title=f"tile configs for {arch}")

    # The split-KV rule's limits, read off configs.split_kv_serves itself, each with the others
    # far from theirs (keys without end; many waves of forward tiles where keys are probed).
    def serves(seqlen_q=1, heads=2, heads_kv=1, seqlen_k=1 << 30, batch=1) -> bool:
        return split_kv_serves(batch, seqlen_q, seqlen_k, heads, heads_kv, SPLIT_KV_ROWS, sm_count)

    group_rows = max(group for group in range(2, 4 * SPLIT_KV_ROWS) if serves(heads=group))
    mha_heads = max((h for h in range(1, 2 * sm_count) if serves(heads=h, heads_kv=h)), default=0)
    forward_keys = next(keys for keys in range(1, 1 << 16) if serves(heads=1, seqlen_k=keys))
    queries = max(n for n in range(1, SPLIT_KV_ROWS + 1) if serves(seqlen_q=n, heads=1))
    many_queries_keys = next(
        keys for keys in range(1, 1 << 16) if serves(queries + 1, seqlen_k=keys, batch=4 * sm_count)
    )
    tiles = ", ".join(
        f"d{head_dim} {tile.block_m} rows x {tile.block_n} keys, {tile.num_stages} stage(s)"
        f"{' behind a producer warpgroup' if tile.producer else ''}, {tile.blocks_per_sm} block(s)/SM"
        for (head_dim, _), tile in sorted(SPLIT_TILES.items())
    )
    console.print(
        f"decode steps run the split-KV kernels (fa_kernel.decode; tiles by head_dim and rows: {tiles}), "
        f"causal or not: where a group's query rows (group size x seqlen_q) number at most "
        f"{group_rows}; without GQA where the forward kernel's grid, batch x heads at one query, is at most "
        f"{mha_heads} on {sm_count} SMs; where the forward kernel's keys per SM (waves of its tiles x "
        f"seqlen_k) reach {forward_keys}; with at most {queries} queries, or with GQA from {many_queries_keys} keys"
    )
    return 0


def _print_table(console: Console, headers: list[str], rows: list[list[str]], markdown: bool, title: str) -> None:
    if markdown:
        print(f"**{title}**\n")
        print("| " + " | ".join(headers) + " |")
        print("|" + "---|" * len(headers))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    table = Table(*headers, title=title)
    for row in rows:
        table.add_row(*row)
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())
