"""The forward of this tree (fa_kernel) against a git ref's (fa_kernel_old), alternated in one
process: TFLOP/s medians, ratio round by round, and whether the outputs are the same bits.

Prepare the ref's package once, here (it travels in .gpu/, which `run` carries):

    mkdir -p .gpu/old && git archive REF src/fa_kernel | tar -x -C .gpu/old
    mv .gpu/old/src/fa_kernel .gpu/old/fa_kernel_old && rm -r .gpu/old/src
    grep -rl fa_kernel .gpu/old/fa_kernel_old | xargs sed -i 's/\bfa_kernel\b/fa_kernel_old/g'

then on the GPU machine: `PYTHONPATH=$PWD/.gpu/old:$PYTHONPATH python -m perf.forward_vs_ref`.
"""

import multiprocessing as mp
import statistics
from concurrent.futures import ProcessPoolExecutor

import torch

SHAPES = [  # batch, heads_q, heads_kv, seqlen, head_dim, dtype, causal
    (8, 32, 32, 4096, 128, "float16", False),
    (8, 32, 32, 4096, 128, "float16", True),
    (4, 40, 40, 2048, 128, "float16", False),
    (16, 16, 16, 1024, 128, "float16", True),
    (32, 16, 16, 512, 64, "float16", False),
    (4, 16, 16, 4096, 256, "bfloat16", True),
    (2, 16, 16, 16384, 128, "bfloat16", False),
    (4, 32, 8, 4096, 128, "bfloat16", True),
]


def tensors(shape):
    b, hq, hk, s, d, dtype, causal = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = getattr(torch, dtype)
    q = torch.randn(b, s, hq, d, device="cuda", dtype=dt, generator=g)
    k = torch.randn(b, s, hk, d, device="cuda", dtype=dt, generator=g)
    v = torch.randn(b, s, hk, d, device="cuda", dtype=dt, generator=g)
    return q, k, v, causal


def call(package, shape):
    import importlib

    f = importlib.import_module(package).flash_attn_func
    q, k, v, causal = tensors(shape)
    return lambda: f(q, k, v, causal=causal)


def warm(job):
    package, shape = job
    call(package, shape)()
    torch.cuda.synchronize()
    return job


def main():
    packages = ["fa_kernel", "fa_kernel_old"]
    with ProcessPoolExecutor(12, mp_context=mp.get_context("spawn")) as pool:
        list(pool.map(warm, [(p, s) for s in SHAPES for p in packages]))
    from fa_kernel.workbench.bench import alternated, cuda_median_ms

    print("| shape | HEAD TFLOP/s | a41320f TFLOP/s | HEAD / a41320f (range) | same bits |")
    print("|---|---|---|---|---|")
    for shape in SHAPES:
        b, hq, hk, s, d, dtype, causal = shape
        flops = 4 * b * hq * s * s * d / (2 if causal else 1)
        fns = {p: call(p, shape) for p in packages}
        same = torch.equal(fns["fa_kernel"](), fns["fa_kernel_old"]())
        timers = {p: (lambda fn=fn, flops=flops: flops / cuda_median_ms(fn) / 1e9) for p, fn in fns.items()}
        samples = alternated(timers, 7)
        ratios = [a / b_ for a, b_ in zip(samples["fa_kernel"], samples["fa_kernel_old"], strict=True)]
        label = f"{b}x{hq}/{hk}x{s}x{d} {dtype}{' causal' if causal else ''}"
        print(
            f"| {label} | {statistics.median(samples['fa_kernel']):.0f} | "
            f"{statistics.median(samples['fa_kernel_old']):.0f} | {statistics.median(ratios):.3f}x "
            f"({min(ratios):.3f}-{max(ratios):.3f}) | {same} |",
            flush=True,
        )
    print(torch.cuda.get_device_name())


if __name__ == "__main__":
    main()
