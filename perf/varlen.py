"""Packed training batches on the GPU: flash_attn_varlen_func against the same kernels on a
rectangular batch of the mean length, and against the padded batch, alternated in one process.

From the repository root on the GPU machine:

    python -m perf.varlen [--rounds 5] [--repeats 20] [--tokens 32768] [--backward]

Documents of 512 to 8192 tokens (drawn once, seed 0) packed to about `tokens` tokens, 16 heads,
bf16, causal and not, d64 and d128. Each row: the varlen forward judged per document first
(`reference.judge`), then timed beside flash_attn_func on [tokens / mean, mean] (the same
kernels' speed without raggedness) and on the padded [documents, longest] batch. TFLOP/s are
counted on the pairs each document's mask leaves visible (the padded batch's on the documents'
own, so its figure is the useful work's rate). Issue 55's lines: varlen ≥ 0.95x the rectangular
batch's TFLOP/s, ≥ 1.3x the padded batch's.

`--backward`: the gradients alone (torch.autograd.grad of one forward's graph, kept), each
sequence's judged first (reference_backward.judge_backward); FLOPs 2.5x the forward's.

"varlen" passes the same cu_seqlens every call, as a model's layers do within a step: their host
read (the checks, which wait for the GPU) happens once. "varlen, read each call" alternates two
copies of cu_seqlens_k, so every call reads them: a step's first layer.
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import torch

from fa_kernel import flash_attn_func
from fa_kernel.reference import judge, visible_pairs
from fa_kernel.reference_backward import judge_backward
from fa_kernel.varlen import flash_attn_varlen_func
from fa_kernel.workbench.bench import BACKWARD_FLOPS, alternated, cuda_median_ms, gradient_of


def document_lengths(tokens: int, seed: int = 0) -> list[int]:
    """Lengths from 512 to 8192 (log-uniform), drawn until about `tokens` tokens."""
    generator = torch.Generator().manual_seed(seed)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(int(2 ** (9 + 4 * torch.rand(1, generator=generator).item())))
    return lengths


def row(lengths: list[int], head_dim: int, causal: bool, args) -> None:
    heads, dtype, device = 16, torch.bfloat16, torch.device("cuda")
    total, longest = sum(lengths), max(lengths)
    q, k, v = (torch.randn(total, heads, head_dim, dtype=dtype, device=device) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    out, lse = flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=causal, return_lse=True)
    for start, length in zip(cu.tolist(), lengths, strict=False):
        rows = slice(start, start + length)
        verdict = judge(q[None, rows], k[None, rows], v[None, rows], out[None, rows], lse[None, :, rows], causal)
        if not verdict.passed:
            raise AssertionError(f"document of {length} tokens: {verdict}")
    mean = round(total / len(lengths))
    rectangular = [
        torch.randn(max(1, total // mean), mean, heads, head_dim, dtype=dtype, device=device) for _ in range(3)
    ]
    padded = [torch.randn(len(lengths), longest, heads, head_dim, dtype=dtype, device=device) for _ in range(3)]
    useful = sum(visible_pairs(n, n, causal) for n in lengths)
    passes = BACKWARD_FLOPS if args.backward else 1.0
    flops = {
        "varlen": 4.0 * passes * heads * head_dim * useful,
        "varlen, read each call": 4.0 * passes * heads * head_dim * useful,
        "rectangular": 4.0 * passes * heads * head_dim * visible_pairs(mean, mean, causal) * rectangular[0].shape[0],
        "padded": 4.0 * passes * heads * head_dim * useful,
    }
    copies = itertools.cycle([cu.clone(), cu.clone()])
    calls = {
        "varlen": lambda: flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=causal),
        "varlen, read each call": lambda: flash_attn_varlen_func(
            q, k, v, cu, next(copies), longest, longest, causal=causal
        ),
        "rectangular": lambda: flash_attn_func(*rectangular, causal=causal),
        "padded": lambda: flash_attn_func(*padded, causal=causal),
    }
    if args.backward:
        # The gradient reads no cu_seqlens (the forward's graph keeps them): one varlen column.
        del calls["varlen, read each call"]
        inputs = {"varlen": (q, k, v), "rectangular": rectangular, "padded": padded}
        for tensors in inputs.values():
            for t in tensors:
                t.requires_grad_()
        calls = {name: gradient_of(call, tuple(inputs[name])) for name, call in calls.items()}
        judge_gradients(q, k, v, cu, lengths, longest, causal)
    timers = {
        name: (lambda fn=fn, f=flops[name]: f / cuda_median_ms(fn, repeats=args.repeats) / 1e9)
        for name, fn in calls.items()
    }
    samples = alternated(timers, args.rounds)
    figures = " | ".join(f"{name} {statistics.median(s):.0f}" for name, s in samples.items())
    ratios = []
    for anchor in ("rectangular", "padded"):
        each = [a / b for a, b in zip(samples["varlen"], samples[anchor], strict=True)]
        ratios.append(f"varlen/{anchor} {statistics.median(each):.3f}x ({min(each):.3f}-{max(each):.3f})")
    label = f"{len(lengths)} documents, {total} tokens (mean {mean}, longest {longest}) x16 d{head_dim}"
    print(f"| {label} {'causal' if causal else 'full'} | {figures} | {' | '.join(ratios)} |", flush=True)


def judge_gradients(q, k, v, cu, lengths, longest, causal) -> None:
    """Each document's gradients against the reference's bound, before any timing."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = flash_attn_varlen_func(*leaves, cu, cu, longest, longest, causal=causal)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    for start, length in zip(cu.tolist(), lengths, strict=False):
        rows = slice(start, start + length)
        each = [t[None, rows].detach() for t in (q, k, v)]
        verdict = judge_backward(*each, dout[None, rows], tuple(g[None, rows] for g in grads), causal)
        if not verdict.passed:
            raise AssertionError(f"document of {length} tokens, gradients: {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--backward", action="store_true", help="time the gradients alone")
    args = parser.parse_args()
    lengths = document_lengths(args.tokens)
    which = "backward" if args.backward else "forward"
    print(torch.cuda.get_device_name(), which, "; TFLOP/s on the documents' visible pairs")
    for head_dim in (64, 128):
        for causal in (True, False):
            row(lengths, head_dim, causal, args)


if __name__ == "__main__":
    main()
