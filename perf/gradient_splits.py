"""The gradient's GQA group splits, timed: each K/V tile's query heads split between 1, 2, ...
blocks (gradient.backward_into's `head_splits`), alternated in one process, beside the count
configs.gradient_head_splits' model picks. What the model's constants stand on.

From the repository root, on a Hopper GPU:

    python -m perf.gradient_splits [--shapes 8x71/1x2048x64c ...] [--splits 1 2 4 8] [--rounds 3]
                                   [--paths atomic fixed_order]

A shape is BxH/HKVxSxD (or BxH/HKVxSQxSKxD: a chunk of SQ queries against SK keys), `c` at its
end for causal (bf16). `--paths`: the gradient's dQ by the
dK/dV kernel's atomic adds (the default gradient), by the fixed-order dQ kernel
(`deterministic=True`), or both, every count of each alternated in one process. Printed, a row a
shape and path: the backward's TFLOP/s by splits (the whole gradient: preprocess, the kernels and
the partial sums), the model's pick marked with *, the best measured over the model's, and the
best over the atomic path at the model's pick (what the default gradient runs).
"""

from __future__ import annotations

import argparse
import math
import re
import statistics

import torch

from fa_kernel import flash_attn_func, gradient
from fa_kernel.configs import HEAD_SPLIT_DIMS, gradient_head_splits
from fa_kernel.device import device_target
from fa_kernel.mask import Visibility
from fa_kernel.workbench.bench import BACKWARD_FLOPS, Shape, alternated, cuda_median_ms

# The model grid's rows furthest behind cuDNN at the time of writing (docs/perf-log.md), and two
# it should leave alone.
SHAPES = (
    "8x71/1x2048x64c", "2x71/1x8192x64c", "8x52/4x2048x128c", "2x52/4x8192x128c", "8x128/8x2048x128c",
    "2x128/8x8192x128c", "8x56/8x2048x128c", "8x16/2x2048x128c", "8x71/1x2048x64", "1x8/1x4096x128",
)  # fmt: skip
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)


def parse_shape(text: str) -> Shape:
    match = re.fullmatch(r"(\d+)x(\d+)/(\d+)x(\d+)(?:x(\d+))?x(\d+)(c?)", text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"shape: expected BxH/HKVxSxD or BxH/HKVxSQxSKxD with an optional c, got {text!r}"
        )
    batch, heads, heads_kv, seqlen_q = map(int, match.groups()[:4])
    seqlen_k, head_dim, causal = match[5] and int(match[5]), int(match[6]), bool(match[7])
    return Shape(batch, heads, seqlen_q, head_dim, causal, torch.bfloat16, nheads_kv=heads_kv, seqlen_k=seqlen_k)


PATHS = {"atomic": False, "fixed_order": True}  # backward_into's `deterministic`


def split_timers(shape: Shape, runs: list[tuple[str, int]], repeats: int) -> dict[tuple[str, int], object]:
    """(path, splits) -> a timer of the backward's TFLOP/s on that path with that many splits."""
    q, k, v = shape.inputs(0)
    scale = 1.0 / math.sqrt(shape.head_dim)
    with torch.no_grad():
        out, lse = flash_attn_func(q, k, v, softmax_scale=scale, causal=shape.causal, return_lse=True)
    dout = torch.randn_like(q)
    gradients = [torch.empty_like(t) for t in (q, k, v)]
    flops = shape.flops * BACKWARD_FLOPS

    def timer(path: str, count: int):
        def launch():
            gradient.backward_into(
                *gradients, dout, None, q, k, v, out, lse, scale, shape.causal, PATHS[path], head_splits=count
            )

        return lambda: flops / cuda_median_ms(launch, warmup=3, repeats=repeats) / 1e9

    return {run: timer(*run) for run in runs}


def table_rows(label: str, pick: int, medians: dict[tuple[str, int], float]) -> list[str]:
    """A table row a path of `medians` ({(path, splits): TFLOP/s}): its figures by splits (the
    model's `pick` starred), its best count, the best over its own figure at the pick and over
    the atomic path's at the pick (the default gradient), where that was timed."""
    default = medians.get(("atomic", pick))
    rows = []
    for path in dict.fromkeys(path for path, _ in medians):
        mine = {count: figure for (other, count), figure in medians.items() if other == path}
        best = max(mine, key=mine.__getitem__)
        cells = ", ".join(f"{c}{'*' if c == pick else ''}: {t:.0f}" for c, t in mine.items())
        against = f"{mine[best] / default:.3f}x" if default else "-"
        rows.append(f"| {label} | {path} | {cells} | {pick} | {best} | {mine[best] / mine[pick]:.3f}x | {against} |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", type=parse_shape, default=[parse_shape(s) for s in SHAPES])
    parser.add_argument("--splits", nargs="+", type=int, default=list(SPLITS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--paths", nargs="+", choices=list(PATHS), default=["atomic"])
    args = parser.parse_args()
    sm_count = device_target(torch.device("cuda"))[0]
    print(f"Backward TFLOP/s by GQA splits on {torch.cuda.get_device_name()}, medians of {args.rounds} rounds")
    print("alternated; * the model's pick (configs.gradient_head_splits)\n")
    print("| shape | path | TFLOP/s by splits | model's pick | best | best / pick | best / atomic pick |")
    print("|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        group = shape.nheads // shape.heads_kv
        rule = Visibility(shape.seqlen_q, shape.keys, shape.causal)
        pick = gradient_head_splits(shape.batch, rule, shape.heads_kv, group, shape.head_dim, sm_count)
        dims_split = shape.head_dim in HEAD_SPLIT_DIMS
        counts = sorted({c for c in (*args.splits, pick) if c <= group and (c == 1 or dims_split)})
        runs = [(path, count) for path in args.paths for count in counts]
        samples = alternated(split_timers(shape, runs, args.repeats), args.rounds)
        medians = {run: statistics.median(figures) for run, figures in samples.items()}
        print("\n".join(table_rows(shape.label(), pick, medians)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
