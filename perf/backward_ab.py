"""The backward kernel's query-tile order, top-down (shipped) against bottom-up, on the GPU.

From the repository root on the GPU machine:

    PYTHONPATH=$PWD/src:$PWD python perf/backward_ab.py [--rounds 5] [--repeats 20]

Each variant's kernel (`backward.compiled_backward(rows_bottom_up=...)`) is first judged on odd
shapes against `reference.judge_backward`, then the main kernel alone (dQ's accumulator zeroed
before each call, as the launch does; the preprocess and dQ's cast are the same for both) is
timed on each shape, the variants alternated over rounds in this one process
(`bench.alternated`, `bench.cuda_median_ms`). TFLOP/s as `fa-kernel bench --backward` counts
them (2.5x the forward's FLOPs).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(path) for path in (ROOT, ROOT / "src") if str(path) not in sys.path]

import torch  # noqa: E402

from fa_kernel import flash_attn_func  # noqa: E402
from fa_kernel.backward import compiled_backward, compiled_preprocess, padded_rows  # noqa: E402
from fa_kernel.bench import BACKWARD_FLOPS, Shape, alternated, cuda_median_ms  # noqa: E402
from fa_kernel.interface import compile_arch  # noqa: E402
from fa_kernel.numerics import LOG2E  # noqa: E402
from fa_kernel.reference import judge_backward, random_qkv  # noqa: E402

VARIANTS = {"top-down": False, "bottom-up": True}
SHAPES = [
    Shape(8, 32, 4096, 128, True, torch.bfloat16),
    Shape(2, 16, 16384, 128, True, torch.bfloat16),
    Shape(8, 32, 4096, 64, True, torch.bfloat16),
    Shape(8, 32, 4096, 128, False, torch.bfloat16),
]
# Odd lengths, both offsets' signs, a GQA group: each variant is judged on these first.
CHECKS = [(1, 200, 333, 4, 2), (2, 333, 200, 4, 4), (1, 64, 64, 2, 1)]


def launcher(case, head_dim: int, causal: bool, dtype: torch.dtype, rows_bottom_up: bool, seed: int = 0):
    """(call, grads, inputs) for case = (batch, seqlen_q, seqlen_k, heads, heads_kv): a call of
    the main kernel, the gradients it wrote, and (q, k, v, dout)."""
    batch, seqlen_q, seqlen_k, heads, heads_kv = case
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, seed)
    dout = torch.randn_like(q)
    scale = 1.0 / math.sqrt(head_dim)
    out, lse = flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, return_lse=True)
    name = str(dtype).removeprefix("torch.")
    arch = compile_arch(q.device)
    preprocess = compiled_preprocess(head_dim=head_dim, dtype=name, arch=arch)
    kernel = compiled_backward(head_dim=head_dim, causal=causal, dtype=name, arch=arch, rows_bottom_up=rows_bottom_up)
    delta = torch.empty((batch, heads, padded_rows(seqlen_q)), dtype=torch.float32, device=q.device)
    lse_log2 = torch.empty_like(delta)
    preprocess(out, dout, lse, delta, lse_log2)
    dq_accum = torch.zeros((batch, heads, seqlen_q, head_dim), dtype=torch.float32, device=q.device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)

    def call():
        dq_accum.zero_()
        kernel(q, k, v, dout, delta, lse_log2, dq_accum, dk, dv, scale * LOG2E, scale)

    def grads():
        return (dq_accum.transpose(1, 2) * scale).to(dtype), dk, dv

    return call, grads, (q, k, v, dout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    for head_dim in sorted({shape.head_dim for shape in SHAPES}):
        for causal in sorted({shape.causal for shape in SHAPES if shape.head_dim == head_dim}):
            for name, bottom_up in VARIANTS.items():
                for case in CHECKS:
                    call, grads, (q, k, v, dout) = launcher(case, head_dim, causal, torch.bfloat16, bottom_up)
                    call()
                    verdict = judge_backward(q, k, v, dout, grads(), causal)
                    if not verdict.passed:
                        print(f"{name} d{head_dim} causal={causal} {case}: FAILED {verdict}")
                        return 1
    print("every variant within the bound on", CHECKS)
    print(f"| shape | {' | '.join(VARIANTS)} | bottom-up / top-down (range) |")
    print("|---|" + "---|" * (len(VARIANTS) + 1))
    for shape in SHAPES:
        case = (shape.batch, shape.seqlen_q, shape.keys, shape.nheads, shape.heads_kv)
        flops = shape.flops * BACKWARD_FLOPS
        timers = {}
        for name, bottom_up in VARIANTS.items():
            call, _, _ = launcher(case, shape.head_dim, shape.causal, shape.dtype, bottom_up)
            timers[name] = lambda call=call, flops=flops: flops / (cuda_median_ms(call, 5, args.repeats) * 1e-3) / 1e12
        samples = alternated(timers, args.rounds)
        ratios = [up / down for up, down in zip(samples["bottom-up"], samples["top-down"], strict=True)]
        medians = " | ".join(f"{statistics.median(samples[name]):.0f}" for name in VARIANTS)
        spread = f"{statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f})"
        print(f"| {shape.label()} | {medians} | {spread} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
