"""`fa-kernel bench`: TFLOP/s of fa_kernel beside torch SDPA's cuDNN (both layouts) and flash
backends over a grid of shapes, alternated in rounds, with the ratio to the faster cuDNN; the
variants grid: fa_kernel with a window, a softcap or sinks beside its anchor (FlexAttention, or
for sinks the plain kernel)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import torch
from rich.progress import track

from fa_kernel.backward import BACKWARD_TILES, compiled_gradient_kernels
from fa_kernel.decode import compiled_decode_kernels
from fa_kernel.interface import compile_arch, kernel_build
from fa_kernel.variants import PLAIN
from fa_kernel.workbench.bench import (
    CUDNN_LAYOUTS,
    DECODE_SHAPES,
    H200_HBM_BYTES_PER_S,
    SPLIT_KV_QUERIES,
    VARIANT_SHAPES,
    VARIANTS,
    Shape,
    Timing,
    cudnn_best,
    measure,
    measure_variant,
    model_grid,
    plot_seqlen_sweep,
    plot_shapes,
    ratio_to,
    ratio_to_cudnn_best,
    summarise,
    variant_anchor,
    variant_build,
)
from fa_kernel.workbench.builds import kernels_build, quiet_tilelang, served_build
from fa_kernel.workbench.console import (
    DTYPES,
    EXIT_FAILED,
    EXIT_NO_GPU,
    build_with_progress,
    make_console,
    print_markdown_row,
    print_table,
)

BENCH_SHAPES = (
    [Shape(8, 32, 4096, 128, causal) for causal in (False, True)]
    + [Shape(2, 16, 16384, 128, causal) for causal in (False, True)]
    + [Shape(8, 32, 4096, 64, causal) for causal in (False, True)]
    + [
        Shape(8, 32, 4096, 128, False, nheads_kv=8),  # GQA 4:1
        Shape(8, 32, 2048, 128, False, seqlen_k=8192),  # prefill against a 4x longer cache
    ]
)


def run(args) -> int:
    console = make_console(stderr=args.json)
    quiet_tilelang()
    if not torch.cuda.is_available():
        console.print("fa-kernel bench needs a CUDA GPU; torch.cuda.is_available() is False here.")
        return EXIT_NO_GPU
    if args.grid == "variants":
        return run_variants(args, console)
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
    served = [served_build(device, s) for s in launched]  # what flash_attn_func runs
    builds, builders = [build for _, build in served], [builder for builder, _ in served]
    arch = compile_arch(device)
    # The decode grid times the forward kernel and the split-KV kernels apart too, whichever
    # flash_attn_func runs.
    decodes = [s for s in shapes if s.seqlen_q <= SPLIT_KV_QUERIES and not args.backward]
    for s in decodes:
        launch = (s.batch, s.nheads, s.seqlen_q)
        builds += [
            kernel_build(device, s.head_dim, s.causal, s.dtype, s.keys, launch=launch),
            kernels_build(s, arch),
        ]
        builders += [None, compiled_decode_kernels]
    if args.backward:  # the atomic and the deterministic gradient's (its own dQ kernel)
        builds += [kernels_build(s, arch) for s in launched]
        builds += [kernels_build(s, arch) | {"deterministic": True} for s in launched]
        builders += [compiled_gradient_kernels] * (2 * len(launched))
    if not build_with_progress(console, builds, args.jobs, verbose=False, quiet=args.json, builder=builders):
        return EXIT_FAILED
    names = ("fa_kernel", *(["fa_kernel deterministic"] if args.backward else []), *CUDNN_LAYOUTS, "flash")
    headers = ["shape BxHxSxD", *(COLUMNS[name] for name in names), "vs cuDNN best", "ratio range"]
    title = (
        f"{'Backward' if args.backward else 'Forward'} TFLOP/s on {torch.cuda.get_device_name()}:"
        f" medians of {args.rounds} rounds alternated in this process,"
        f" each the median of {args.repeats} timings; the ratio round by round against the faster cuDNN layout"
    )
    # Markdown rows are printed as each shape is timed: a run stopped early keeps its rows.
    streamed = args.markdown and not args.json
    if streamed:
        print_table(console, headers, [], markdown=True, title=title)
    results: list[tuple[Shape, dict[str, Timing]]] = []
    for shape in track(shapes, description="benchmarking", console=console, transient=True):
        results.append((shape, measure(shape, rounds=args.rounds, repeats=args.repeats, backward=args.backward)))
        if streamed:
            print_markdown_row(_rows(results[-1:], names)[0])
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
    if not streamed:
        print_table(console, headers, _rows(results, names), args.markdown, title=title)
    summary_rows = [
        [str(found.head_dim), str(found.shapes), f"{found.median:.2f}x", f"{found.worst:.2f}x", found.worst_shape]
        for found in summarise(results)
    ]
    summary_headers = ["head_dim", "shapes", "median vs cuDNN best", "worst", "worst shape"]
    print_table(console, summary_headers, summary_rows, args.markdown, title="Ratios to cuDNN best by head_dim")
    if args.plot:
        plot_title = f"{title}: the points of {args.plot}"
        print_table(console, headers, _rows(plotted, names), args.markdown, title=plot_title)
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
        print_table(console, bandwidth_headers, _bandwidth_rows(results), args.markdown, title=bandwidth_title)
    return 0


def run_variants(args, console) -> int:
    """`--grid variants`: fa_kernel with each of bench.VARIANTS on bench.VARIANT_SHAPES, beside
    its anchor, in TFLOP/s on the visible pairs (bench.variant_flops)."""
    cases = [
        (replace(shape, dtype=DTYPES[d]), name)
        for d in args.dtype
        for shape in VARIANT_SHAPES
        if not args.head_dim or shape.head_dim in args.head_dim
        if not args.seqlen_q or shape.seqlen_q in args.seqlen_q
        for name in VARIANTS
    ]
    device = torch.device("cuda")
    arch = compile_arch(device)
    builds: list[dict] = []
    builders: list = []
    for shape, name in cases:
        launch = (shape.batch, shape.nheads, shape.seqlen_q)
        compiled_in = variant_build(shape, VARIANTS[name])
        # fa_kernel's build of the variant, and for sinks the plain one (their anchor).
        ours = (compiled_in, VARIANTS[name].get("window_size", (-1, -1)))
        for variants, window in (ours, (PLAIN, (-1, -1))) if compiled_in.sinks else (ours,):
            forward = kernel_build(
                device, shape.head_dim, shape.causal, shape.dtype, shape.keys, launch=launch, window_size=window
            )
            builds.append(forward | {"variants": variants})
            builders.append(None)
            if args.backward:
                builds.append(kernels_build(shape, arch) | {"variants": variants})
                builders.append(compiled_gradient_kernels)
    if not build_with_progress(console, builds, args.jobs, verbose=False, quiet=args.json, builder=builders):
        return EXIT_FAILED
    results = [
        (shape, name, measure_variant(shape, VARIANTS[name], args.rounds, args.repeats, backward=args.backward))
        for shape, name in track(cases, description="benchmarking", console=console, transient=True)
    ]
    if args.json:
        records = []
        for shape, name, timings in results:
            anchor = variant_anchor(timings)
            records.append(
                {
                    "shape": shape.label(),
                    "variant": name,
                    "anchor": anchor,
                    "tflops": {each: timing.median for each, timing in timings.items()},
                    "rounds": {each: list(timing.rounds) for each, timing in timings.items()},
                    "ratio_to_anchor": ratio_to(timings, anchor).median,
                }
            )
        record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "variants": records}
        record["pass"] = "backward" if args.backward else "forward"
        print(json.dumps(record))
        return 0
    rows = []
    for shape, name, timings in results:
        anchor = variant_anchor(timings)
        ratio = ratio_to(timings, anchor)
        rows.append(
            [
                shape.label(),
                name,
                f"{timings['fa_kernel'].median:.0f}",
                anchor,
                f"{timings[anchor].median:.0f}",
                f"{ratio.median:.2f}x",
                f"{min(ratio.rounds):.2f}-{max(ratio.rounds):.2f}",
            ]
        )
    headers = ["shape BxHxSxD", "variant", "fa_kernel", "anchor", "anchor TFLOP/s", "vs anchor", "ratio range"]
    title = (
        f"{'Backward' if args.backward else 'Forward'} TFLOP/s on the visible pairs, {torch.cuda.get_device_name()}:"
        f" medians of {args.rounds} rounds alternated in this process, each the median of {args.repeats} timings;"
        " the anchor FlexAttention (compiled, the same block mask and score_mod), for sinks the plain kernel"
    )
    print_table(console, headers, rows, args.markdown, title=title)
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
