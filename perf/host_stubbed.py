"""A training call's host cost on the CPU, its kernels stubbed: flash_attn_func's Python and
autograd's engine alone, beside SDPA's whole training call on the same CPU.

From the repository root, no GPU needed:

    python -m perf.host_stubbed [--calls 3000] [--profile]

perf/host_overhead.py measures these layers on the GPU host, launches included; this measures
what of them is ours, where a change of the host path can be timed without a GPU. interface.py
and gradient.py (the gradient's launch) are loaded from their source as modules of their own
(custom ops renamed, so that the package's stay registered), with the CUDA device check and
device guards made the CPU's, the device an H100's (132 SMs, sm_90a), and every kernel a no-op:
each layer runs all of the call's Python, its allocations and autograd's engine, on tensors of
one row of one head, where no kernel works.
The anchor, SDPA's training call on the same tensors (its math backend, compute included), is
what torch's own attention costs the same CPU with its autograd in C++.

  no grad forward    flash_attn_func under torch.no_grad
  forward, grad      flash_attn_func with requires_grad (its graph dropped)
  training call      that and torch.autograd.grad: what a trainer pays
  backward_into      the gradient's launches into gradients made beforehand
  empty Function     an autograd.Function of the same arguments doing nothing, and its grad
  SDPA training      torch's scaled_dot_product_attention forward and grad
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import sys
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

from fa_kernel import device

SOURCES = Path(__file__).resolve().parents[1] / "src" / "fa_kernel"
# Each module's text -> the stub's: each must occur (a renamed line fails here, not silently).
REWRITES = {
    "interface.py": {
        't.device.type != "cuda"': 't.device.type != "cpu"',
        "torch.cuda.device(q.device)": "contextlib.nullcontext()",
        'device_types="cuda"': 'device_types="cpu"',
        '"fa_kernel::': '"fa_kernel_stub::',
        "torch.ops.fa_kernel.": "torch.ops.fa_kernel_stub.",
    },
    "gradient.py": {"torch.cuda.device(q.device)": "contextlib.nullcontext()"},
}


def _stubbed_module(file: str) -> types.ModuleType:
    """fa_kernel's `file` loaded from its source as a module of its own, REWRITES applied."""
    source = (SOURCES / file).read_text()
    for old, new in REWRITES[file].items():
        if old not in source:
            raise SystemExit(f"{file}: expected {old!r} to stub, found none")
        source = source.replace(old, new)
    module = types.ModuleType(f"fa_kernel_{file.removesuffix('.py')}_stub")
    exec(compile(source, str(SOURCES / file), "exec"), module.__dict__)  # noqa: S102 (our own source)
    module.contextlib = contextlib
    return module


def stubbed_interface() -> types.ModuleType:
    """interface.py on the CPU with no-op kernels, its gradient's launch gradient.py's likewise
    (the module docstring)."""

    def no_op(*_arguments):
        return None

    device._device_facts = lambda _index: ((9, 0), 132)  # an H100: 132 SMs, sm_90a
    torch.cuda.current_device = lambda: 0
    gradient = _stubbed_module("gradient.py")
    gradient.compiled_gradient_kernels = lambda **_build: (no_op, no_op, None)
    module = _stubbed_module("interface.py")
    module._require_hopper = lambda _device: None
    module.compile_arch = lambda _device: "sm_90a"
    module.compiled_forward = lambda **_build: no_op
    module.backward_into = gradient.backward_into
    return module


class EmptyFunction(torch.autograd.Function):
    """flash_attn_func's Function's arguments and saved tensors, no work: autograd's own cost."""

    @staticmethod
    def forward(ctx, q, k, v, *_options):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q), q.new_empty(q.shape[:3])

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        return (torch.empty_like(grad_out),) * 3 + (None,) * 7


def layers(interface: types.ModuleType) -> dict:
    """name -> a call of that layer (the module docstring) on one row of one head, d64, causal."""
    q, k, v = (torch.randn(1, 1, 1, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    with torch.no_grad():
        out, lse = interface.flash_attn_func(q, k, v, causal=True, return_lse=True)
    leaves = [t.detach() for t in (q, k, v)]
    gradients = [torch.empty_like(t) for t in leaves]
    qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))

    def no_grad_forward():
        with torch.no_grad():
            interface.flash_attn_func(q, k, v, causal=True)

    def training_call():
        torch.autograd.grad(interface.flash_attn_func(q, k, v, causal=True), (q, k, v), dout)

    def empty_function():
        out, _ = EmptyFunction.apply(q, k, v, 0.125, True, False, -1, -1, 0.0, None)
        torch.autograd.grad(out, (q, k, v), dout)

    def sdpa_training():
        torch.autograd.grad(F.scaled_dot_product_attention(qt, kt, vt, is_causal=True), (qt, kt, vt), dout)

    return {
        "no grad forward": no_grad_forward,
        "forward, grad": lambda: interface.flash_attn_func(q, k, v, causal=True),
        "training call": training_call,
        "backward_into": lambda: interface.backward_into(*gradients, dout, None, *leaves, out, lse, 0.125, True),
        "empty Function": empty_function,
        "SDPA training": sdpa_training,
    }


def us_per_call(call, calls: int) -> float:
    """Microseconds a call, the fastest of three runs of `calls` calls (the box's other work
    only ever adds)."""
    call()
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return min(runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--profile", action="store_true", help="cProfile's top functions of the training call")
    args = parser.parse_args()
    calls = layers(stubbed_interface())
    print("| layer | host µs a call (CPU, kernels stubbed) |\n|---|---|")
    for name, call in calls.items():
        print(f"| {name} | {us_per_call(call, args.calls):.1f} |", flush=True)
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.calls):
            calls["training call"]()
        profile.disable()
        pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
