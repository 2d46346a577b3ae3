"""What a call of flash_attn_func costs the host, layer by layer, against the GPU time of its kernels.

From the repository root on the GPU machine:

    python -m perf.host_overhead.py [--calls 300] [--profile]

A launch whose kernels take less GPU time than the host spends issuing it is timed at the
host's pace: the bench's small shapes (a decode step, 512 tokens of 12 heads) may measure
the Python in front of the kernel, not the kernel. Per shape, each layer's host microseconds
a call (`calls` calls issued back to back, the GPU never waited for, then one synchronise),
outermost first:

  flash_attn_func       the public call: validation, the custom op, autograd's wrapper
  custom op             torch.ops.fa_kernel.forward, validated inputs
  launch                what the op runs: forward_kernel_attention or split_kv_attention
  kernels               the compiled TileLang kernels alone, into buffers made beforehand
  SDPA cuDNN            torch's scaled_dot_product_attention on the cuDNN backend (BHSD)

`--training`: a training call's layers instead (training_layers), on issue 53's small shapes,
with each layer's wall time a call beside its host time.

and the GPU microseconds of the kernels (a CUDA graph of GRAPH_CALLS launches, replayed under
CUDA events: no host in it). `--profile` prints cProfile's top functions of flash_attn_func.
"""

from __future__ import annotations

import argparse
import cProfile
import math
import pstats
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from fa_kernel import decode, flash_attn_func, gradient, interface
from fa_kernel.device import device_target
from fa_kernel.kernel import compiled_forward
from fa_kernel.numerics import LOG2E
from fa_kernel.workbench.bench import Shape, cuda_median_ms, host_us_per_call
from fa_kernel.workbench.builds import quiet_tilelang

SHAPES = [
    Shape(1, 32, 1, 128, False, torch.bfloat16, nheads_kv=8, seqlen_k=32768),  # a decode step
    Shape(64, 8, 1, 64, False, torch.bfloat16, nheads_kv=1, seqlen_k=8192),  # MQA decode
    Shape(32, 12, 512, 128, False, torch.bfloat16, nheads_kv=2),  # the model grid's worst
    Shape(32, 20, 512, 64, True, torch.bfloat16),
    Shape(8, 32, 4096, 128, False, torch.bfloat16),  # long: the GPU's pace
]


GRAPH_CALLS = 20


def layers(shape: Shape) -> dict:
    """name -> a call of that layer on the shape's inputs."""
    q, k, v = shape.inputs(0)
    scale = 1.0 / math.sqrt(shape.head_dim)
    causal = shape.causal
    calls = {
        "flash_attn_func": lambda: flash_attn_func(q, k, v, softmax_scale=scale, causal=causal),
        "custom op": lambda: torch.ops.fa_kernel.forward(q, k, v, scale, causal, False),
    }
    sm_count, arch = device_target(q.device)
    split = decode.serves_launch(shape.batch, shape.seqlen_q, shape.keys, shape.nheads, shape.heads_kv, sm_count)
    out, lse = torch.empty_like(q), q.new_empty((shape.batch, shape.nheads, shape.seqlen_q), dtype=torch.float32)
    if split:
        calls["launch"] = lambda: decode.split_kv_attention(q, k, v, scale, causal, sm_count, arch)
        splits, tiles_per_split = decode.split_plan_for(q, k, sm_count)
        rows = (shape.batch, splits, shape.nheads, shape.seqlen_q)
        o_partial = q.new_empty((*rows, shape.head_dim), dtype=torch.float32)
        lse_partial = q.new_empty(rows, dtype=torch.float32)
        block_m = decode.launch_tile(q, k).block_m  # the tile the launch runs (16 or 64 rows)
        kernels = decode.compiled_decode_kernels(
            head_dim=shape.head_dim, causal=causal, dtype=_name(q), arch=arch, block_m=block_m
        )

        def raw():
            kernels[0](q, k, v, o_partial, lse_partial, scale * LOG2E, tiles_per_split)
            kernels[1](o_partial, lse_partial, out, lse)
    else:
        calls["launch"] = lambda: interface.forward_kernel_attention(q, k, v, scale, causal)
        launch = (shape.batch, shape.nheads, shape.seqlen_q)
        kernel = compiled_forward(
            **interface.kernel_build(q.device, shape.head_dim, causal, q.dtype, shape.keys, launch=launch)
        )

        def raw():
            kernel(q, k, v, out, lse, scale * LOG2E)

    calls["kernels"] = raw
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    gqa = shape.nheads != shape.heads_kv

    def sdpa():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale, enable_gqa=gqa)

    calls["SDPA cuDNN"] = sdpa
    return calls


# Issue 53's small training shapes, where a whole training call took twice cuDNN's wall time.
TRAINING_SHAPES = [
    Shape(1, 16, 512, 64, True, torch.bfloat16),
    Shape(4, 32, 1024, 128, False, torch.bfloat16),
    Shape(1, 8, 4096, 128, False, torch.bfloat16, nheads_kv=1),
]


def training_layers(shape: Shape) -> dict:
    """name -> a call of that layer of a training call (forward and backward) on the shape:

    training call     flash_attn_func with requires_grad, then backward: what a trainer pays
    training call, one thread
                      the same with autograd's engine on the calling thread
                      (set_multithreading_enabled(False)): what the hop to its device thread costs,
                      and the call --profile reads (cProfile sees the calling thread only)
    forward, grad     flash_attn_func with requires_grad alone (its graph dropped): the forward's share
    backward op       torch.ops.fa_kernel.backward on saved outputs: the gradient's custom op
    backward_into     the gradient's launches into gradients made beforehand
    SDPA cuDNN        torch's cuDNN backend forward and backward (BHSD), the anchor
    """
    q, k, v = (t.requires_grad_() for t in shape.inputs(0))
    scale = 1.0 / math.sqrt(shape.head_dim)
    causal = shape.causal
    dout = torch.randn_like(q)

    def training_call():
        out = flash_attn_func(q, k, v, softmax_scale=scale, causal=causal)
        torch.autograd.grad(out, (q, k, v), dout)

    with torch.no_grad():
        out, lse = flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, return_lse=True)
    detached = [t.detach() for t in (q, k, v)]
    gradients = [torch.empty_like(t) for t in detached]
    qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    dout_t = dout.transpose(1, 2).contiguous()
    gqa = shape.nheads != shape.heads_kv

    def sdpa_training_call():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out_t = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale, enable_gqa=gqa)
        torch.autograd.grad(out_t, (qt, kt, vt), dout_t)

    def training_call_one_thread():
        with torch.autograd.set_multithreading_enabled(False):
            training_call()

    return {
        "training call": training_call,
        "training call, one thread": training_call_one_thread,
        "forward, grad": lambda: flash_attn_func(q, k, v, softmax_scale=scale, causal=causal),
        "backward op": lambda: torch.ops.fa_kernel.backward(dout, None, *detached, out, lse, scale, causal, False),
        "backward_into": lambda: gradient.backward_into(*gradients, dout, None, *detached, out, lse, scale, causal),
        "SDPA cuDNN": sdpa_training_call,
    }


def _name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def graph_us(call, calls: int) -> float | None:
    """GPU microseconds a call, from a CUDA graph of `calls` launches, the fastest of three
    replays (None: not capturable). Kept short: each call's outputs live in the graph's pool."""
    try:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            call()  # warm, off the default stream, as capture requires
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                call()
        graph.replay()
        replays = []
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            replays.append(start.elapsed_time(end) * 1e3 / calls)
        return min(replays)
    except Exception as error:  # noqa: BLE001 (a layer that cannot be captured is reported, not fatal)
        print(f"    (not capturable: {type(error).__name__}: {str(error).splitlines()[0][:120]})")
        torch.cuda.synchronize()
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--profile", action="store_true", help="cProfile's top functions of flash_attn_func")
    parser.add_argument(
        "--training", action="store_true", help="a training call's layers (forward and backward) on TRAINING_SHAPES"
    )
    args = parser.parse_args()
    quiet_tilelang()
    if args.training:
        return training(args)
    print("| shape | layer | host µs a call | GPU µs a call (CUDA graph) |\n|---|---|---|---|")
    for shape in SHAPES:
        for name, call in layers(shape).items():
            host = host_us_per_call(call, args.calls)
            gpu = graph_us(call, GRAPH_CALLS) if name in ("kernels", "SDPA cuDNN", "flash_attn_func") else None
            gpu_text = "-" if gpu is None else f"{gpu:.1f}"
            print(f"| {shape.label()} | {name} | {host:.1f} | {gpu_text} |", flush=True)
    if args.profile:
        print_profile(layers(SHAPES[2])["flash_attn_func"], args.calls)
    return 0


def print_profile(call, calls: int) -> None:
    """cProfile's top 25 functions by own time over `calls` calls of `call`."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        call()
    profile.disable()
    torch.cuda.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    pstats.Stats(profile).sort_stats("cumulative").print_stats(30)


def training(args) -> int:
    """--training: each layer's host µs a call and its wall µs (a call, then a synchronise: what a
    training step waits for), and with --profile cProfile's top functions of the first shape's
    training call, its backward on the calling thread."""
    print("| shape | layer | host µs a call | wall µs a call | GPU µs a call (CUDA graph) |\n|---|---|---|---|---|")
    for shape in TRAINING_SHAPES:
        for name, call in training_layers(shape).items():
            host = host_us_per_call(call, args.calls)
            wall = cuda_median_ms(call) * 1e3
            gpu = graph_us(call, GRAPH_CALLS) if name in ("backward_into", "forward, grad") else None
            gpu_text = "-" if gpu is None else f"{gpu:.1f}"
            print(f"| {shape.label()} | {name} | {host:.1f} | {wall:.1f} | {gpu_text} |", flush=True)
    if args.profile:
        print_profile(training_layers(TRAINING_SHAPES[0])["training call, one thread"], args.calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
