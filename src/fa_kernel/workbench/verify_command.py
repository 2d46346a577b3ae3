"""`fa-kernel verify`: every case's output and gradients against the fp32 reference, within
reference.judge's bounds; without a GPU, every shipped forward kernel compiled for sm_90a."""

from __future__ import annotations

import itertools
import math
import shutil
from typing import Any

import torch
from rich.console import Console
from rich.progress import track

from fa_kernel.backward import BACKWARD_TILES, compiled_gradient_kernels
from fa_kernel.interface import SUPPORTED_HEAD_DIMS, compile_arch, flash_attn_func
from fa_kernel.reference import judge
from fa_kernel.reference_backward import GRADIENTS, judge_backward
from fa_kernel.workbench.bench import Shape
from fa_kernel.workbench.builds import kernels_build, quiet_tilelang, served_build, shipped_builds
from fa_kernel.workbench.console import (
    DTYPES,
    EXIT_COMPILED_ONLY,
    EXIT_FAILED,
    EXIT_NO_GPU,
    build_label,
    build_with_progress,
    make_console,
    print_table,
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

# Windows, softcap and sinks: (shape as VERIFY_SHAPES, causal, window_size, softcap, sinks), each
# through flash_attn_func forward and backward (bf16).
VARIANT_CASES = [
    ((2, 8, 2, 1000, 1000, 128), True, (256, -1), 0.0, False),
    ((2, 8, 2, 700, 900, 64), False, (100, 37), 0.0, True),
    ((2, 8, 8, 1000, 1000, 128), True, (-1, -1), 30.0, False),
    ((1, 8, 4, 513, 513, 64), False, (64, 64), 50.0, True),
    ((1, 4, 4, 300, 200, 128), True, (0, -1), 0.0, True),  # rows with no key but their sink
    ((4, 8, 1, 1, 5000, 128), True, (1024, -1), 0.0, True),  # a decode step with a window
]


def run(args) -> int:
    console = make_console()
    quiet_tilelang(args.verbose)
    if not torch.cuda.is_available():
        return _compile_only(console, args.jobs, args.verbose)
    device = torch.device("cuda")
    cases = list(itertools.product(VERIFY_SHAPES, DTYPES.values(), (False, True)))
    # The gradients of the same cases, where the backward has tiles for the head dim.
    gradient_cases = [(shape, dtype, causal) for shape, dtype, causal in cases if shape[5] in BACKWARD_TILES]
    # What flash_attn_func runs for each: the forward kernel, or the split-KV kernels (decode steps).
    served = [served_build(device, _verify_shape(*case)) for case in cases]
    builds = [arguments for _, arguments in served]
    arch = compile_arch(device)
    gradient_builds = [kernels_build(_verify_shape(*case), arch) for case in gradient_cases]
    builders = [builder for builder, _ in served] + [compiled_gradient_kernels] * len(gradient_builds)
    if not build_with_progress(console, builds + gradient_builds, args.jobs, args.verbose, args.markdown, builders):
        return EXIT_FAILED

    def progress(items, description):
        return track(items, description=description, console=console, transient=True, disable=args.markdown)

    rows = [_verify_forward(*case) for case in progress(cases, "verifying")]
    gradient_rows = [_verify_gradients(*case) for case in progress(gradient_cases, "gradients")]
    variant_rows = [_verify_variant(*case) for case in progress(VARIANT_CASES, "variants")]
    title = f"fa-kernel verify on {torch.cuda.get_device_name()}"
    headers = ["shape BxHxSxD", "dtype", "mask", "max err", "bound", "mismatches", "LSE err", "result"]
    print_table(console, headers, rows, args.markdown, title=f"{title}: the forward")
    gradient_headers = ["shape BxHxSxD", "dtype", "mask", *(f"{name} err / bound" for name in GRADIENTS), "result"]
    gradient_title = f"{title}: the gradients of a random loss (flash-attn's rule for each)"
    print_table(console, gradient_headers, gradient_rows, args.markdown, title=gradient_title)
    variant_headers = ["shape BxHxSxD", "dtype", "mask", "window, softcap, sinks", "out err / bound", "gradients"]
    variant_headers.append("result")
    print_table(console, variant_headers, variant_rows, args.markdown, title=f"{title}: windows, softcap and sinks")
    results = [row[-1] for row in rows + gradient_rows + variant_rows]
    failed = results.count("FAIL")
    console.print(f"{len(results) - failed}/{len(results)} cases pass" + ("" if not failed else f", {failed} FAIL"))
    return EXIT_FAILED if failed else 0


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
    each of dq, dk, dv within reference_backward.judge_backward's bound."""
    case = _verify_shape(shape, dtype, causal)
    q, k, v = (t.requires_grad_() for t in _verify_inputs(case))
    out, _ = flash_attn_func(q, k, v, causal=causal, return_lse=True)
    generator = torch.Generator(out.device).manual_seed(case.seqlen_q)
    dout = torch.randn(out.shape, generator=generator, device=out.device, dtype=out.dtype)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    verdict = judge_backward(q.detach(), k.detach(), v.detach(), dout, (dq, dk, dv), causal)
    figures = [f"{verdict.reports[name].max_abs:.1e} / {verdict.bounds[name].atol:.1e}" for name in GRADIENTS]
    return [*_case_cells(case), *figures, "pass" if verdict.passed else "FAIL"]


def _verify_variant(shape: tuple, causal: bool, window_size: tuple[int, int], softcap: float, sinks: bool) -> list[str]:
    """One case with variants: the forward within judge's bound, and the gradients (dsinks too)
    within judge_backward's, through autograd."""
    case = _verify_shape(shape, torch.bfloat16, causal)
    q, k, v = (t.requires_grad_() for t in _verify_inputs(case))
    sink_logits = torch.randn(case.nheads, device=q.device).requires_grad_() if sinks else None
    variants: dict[str, Any] = dict(window_size=window_size, softcap=softcap, sinks=sink_logits)
    out, lse = flash_attn_func(q, k, v, causal=causal, return_lse=True, **variants)
    detached = dict(variants, sinks=None if sink_logits is None else sink_logits.detach())
    inputs = (q.detach(), k.detach(), v.detach())
    forward = judge(*inputs, out.detach(), lse.detach(), causal, **detached)
    dout = torch.randn_like(out)
    leaves = (q, k, v) if sink_logits is None else (q, k, v, sink_logits)
    gradients = judge_backward(*inputs, dout, torch.autograd.grad(out, leaves, dout), causal, **detached)
    report = forward.output
    described = f"{window_size}, {softcap:g}, {'sinks' if sinks else 'no sinks'}"
    passed = forward.passed and gradients.passed
    error = f"{report.max_abs:.1e} / {forward.output_bound.atol:.1e}"
    return [*_case_cells(case), described, error, "pass" if gradients.passed else "FAIL", "pass" if passed else "FAIL"]


def _compile_only(console: Console, jobs: int, verbose: bool) -> int:
    if shutil.which("nvcc") is None:
        console.print("No CUDA GPU and no nvcc: nothing was compiled and nothing was run.")
        return EXIT_NO_GPU
    console.print("No CUDA GPU here: compiling the kernels for sm_90a with nvcc instead.")
    builds = shipped_builds("sm_90", SUPPORTED_HEAD_DIMS)
    if not build_with_progress(console, builds, jobs, verbose):
        return EXIT_FAILED
    for build in builds:
        console.print(f"  compiled {build_label(build)}")
    console.print("[bold]Nothing was run on a GPU[/]: the kernels compile, but correctness is unverified here.")
    return EXIT_COMPILED_ONLY
