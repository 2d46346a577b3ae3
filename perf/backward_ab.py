"""Variants of the backward kernel against the shipped one, on the GPU, alternated in one process.

From the repository root on the GPU machine:

    python -m perf.backward_ab [--dq] [--variants NAME ...] [--head-dims 64 128] [--rounds 5] [--repeats 20]

Every variant's kernel is first judged on odd shapes against `reference_backward.judge_backward`; then
the main kernel alone (dQ's accumulator zeroed before each call, as the launch does; the
preprocess and dQ's cast are the same for all) is timed on each shape, the variants alternated
over rounds in this one process (`bench.alternated`, `bench.cuda_median_ms`). TFLOP/s as
`fa-kernel bench --backward` counts them (2.5x the forward's FLOPs); each variant's ratio to
the shipped kernel is taken round by round.

Variants (`--list` prints them), each a build option of `backward_program` over its
BACKWARD_TILES entry:

  shipped          backward.py as it is.
  no_dq            dK and dV alone (`with_dq=False`): what dQ's GEMM, staging and reduce-add
                   cost (a leave-one-out diagnostic); the fixed-order gradient's dK/dV kernel,
                   at its tile (DK_DV_TILES). Judged with dQ from the shipped fixed-order dQ
                   kernel, as every variant without dQ is.
  kv_pairs         no_dq with two K/V heads a block (`kv_pairs=True`), their walks one pipeline:
                   a short walk's fixed costs (K/V load, pipeline fill) over twice the steps.
  tile_fastest     the blocks by K/V tile fastest, then K/V head and batch (`heavy_first=False`),
                   where the shipped kernel goes heavy first (backward.heavy_first_order: under
                   causal, groups of about a wave's pairs, each by K/V tile slowest).
  dq_writer        the same walk on TileLang's typed warp-specialisation schedule (`dq_writer=True`,
                   backward_writer.py): dQ's bulk adds issued by a warp of their own, off the MMA
                   warpgroups' path, as FlashAttention-3's; dS in two slots, one consumer sync a
                   step (no variants; head_dim 64 and 128).
  dq_writer_ordered  dq_writer with those adds in a fixed order (`ordered_dq=True`, the blocks
                   last K/V tile first, each add waiting for its turn in the writer warp, off the
                   MMA path; two dQ slots): FlashAttention-3's deterministic mode, against the
                   fixed-order path's two kernels (issue 53's 0.9x line). Judged within the
                   bound, then bitwise equal over runs.
  dq_writer_ordered_shifted  dq_writer_ordered with each K/V tile's walk from a query tile of its
                   own without causal (`shifted_walk=True`): the blocks add into different query
                   tiles at each step, each turn waiting on an add a step old, where the plain walk
                   chains every block's wait on one tile (no more K/V tiles than query tiles, and a
                   (batch, K/V head)'s blocks on the SMs at once: every shape here).

`--dq`: the fixed-order dQ kernel's variants instead (DQ_VARIANTS), each a build option of
`dq_program` over its DQ_TILES entry, the dQ kernel alone timed (dK and dV for the judging from
the shipped no_dq kernel):

  shipped            dq_program as DQ_TILES ships it.
  keys_64            64 keys a step (`block_n=64`), two stages: each step's S and dP half as wide,
                     twice the steps (keys_64_three_stages' control).
  keys_64_three_stages  64 keys a step and three stages of K and V (`block_n=64, num_stages=3`):
                     at head_dim 128, where 128 keys leave room for two, the next K/V tiles'
                     loads further ahead of the walk, each step's S and dP half as wide.

A lever measured and decided leaves this list (its figures: docs/performance.md; its code: git).
A new one enters as an argument of `backward_program`, not as an edit of its text.
"""

from __future__ import annotations

import itertools
import math
import sys

import torch

from fa_kernel import flash_attn_func
from fa_kernel.backward import compiled_backward, compiled_dk_dv, heavy_first_order
from fa_kernel.backward_dq import compiled_dq
from fa_kernel.backward_preprocess import compiled_preprocess, dq_row, padded_rows
from fa_kernel.configs import BACKWARD_TILES, pairs_per_group
from fa_kernel.device import device_target
from fa_kernel.interface import compile_arch
from fa_kernel.numerics import LOG2E
from fa_kernel.reference import random_qkv
from fa_kernel.reference_backward import judge_backward
from fa_kernel.variants import PLAIN
from fa_kernel.workbench.bench import BACKWARD_FLOPS, Shape, cuda_median_ms
from fa_kernel.workbench.builds import quiet_tilelang
from perf import ab

# name -> backward_program's arguments over the BACKWARD_TILES entry
VARIANTS: dict[str, dict] = {
    "shipped": {},
    "no_dq": {"with_dq": False},
    "tile_fastest": {"heavy_first": False},
    "kv_pairs": {"with_dq": False, "kv_pairs": True},
    "dq_writer": {"dq_writer": True},
    "dq_writer_ordered": {"dq_writer": True, "ordered_dq": True, "heavy_first": False},
    "dq_writer_ordered_shifted": {"dq_writer": True, "ordered_dq": True, "shifted_walk": True, "heavy_first": False},
}
# Runs of an ordered variant whose gradients must agree to the bit.
ORDERED_RUNS = 5
# name -> dq_program's arguments over the DQ_TILES entry (`--dq`)
DQ_VARIANTS: dict[str, dict] = {
    "shipped": {},
    "keys_64": {"block_n": 64},
    "keys_64_three_stages": {"block_n": 64, "num_stages": 3},
}
SHAPES = [
    Shape(8, 32, 4096, 128, False, torch.bfloat16),
    Shape(8, 32, 4096, 128, True, torch.bfloat16),
    Shape(2, 16, 16384, 128, False, torch.bfloat16),  # issue 53's 550 TFLOP/s line
    Shape(2, 16, 16384, 128, True, torch.bfloat16),
    Shape(8, 32, 4096, 64, False, torch.bfloat16),
    Shape(8, 32, 4096, 64, True, torch.bfloat16),
    Shape(8, 16, 2048, 64, False, torch.bfloat16),  # the model grid's d64 rows furthest behind (0.92x)
    # The model grid's MHA rows at 512 keys (0.90-0.92x cuDNN, 2026-12-07): eight-step walks on
    # the fixed-order path, where GQA's group walks read 1.11-1.35x (kv_pairs).
    Shape(32, 32, 512, 128, False, torch.bfloat16),
    Shape(32, 32, 512, 128, True, torch.bfloat16),
    # Issue 53's short walks: 1k keys, where a block's fixed cost weighs most.
    Shape(16, 16, 1024, 128, False, torch.bfloat16),
    Shape(16, 16, 1024, 128, True, torch.bfloat16),
    # Causal GQA, the model grid's rows furthest behind: few (K/V head, batch) pairs of long,
    # uneven walks; and MHA at the same length.
    Shape(8, 16, 2048, 128, True, torch.bfloat16, nheads_kv=2),
    Shape(8, 48, 2048, 128, True, torch.bfloat16, nheads_kv=4),
    Shape(8, 128, 2048, 128, True, torch.bfloat16, nheads_kv=8),
    Shape(2, 48, 8192, 128, True, torch.bfloat16, nheads_kv=4),
    Shape(8, 32, 2048, 128, True, torch.bfloat16),
    # head_dim 256's MHA rows behind cuDNN (Gemma 7B's layer; `--head-dims 256`).
    Shape(32, 16, 512, 256, False, torch.bfloat16),
    Shape(32, 16, 512, 256, True, torch.bfloat16),
    Shape(8, 16, 2048, 256, True, torch.bfloat16),
]
# The head dims timed unless --head-dims names others.
DEFAULT_HEAD_DIMS = (64, 128)
# The fixed-order dQ kernel's FLOPs against the forward's: S, dP and dS.K, three GEMMs to its two.
DQ_FLOPS = 1.5
# Odd lengths, both offsets' signs, a GQA group, and nine (batch, K/V head) pairs over 16 K/V tiles
# (heavy_first's groups of 8 on 132 SMs, the last of one): each variant is judged on these first.
CHECKS = [(1, 200, 333, 4, 2), (2, 333, 200, 4, 4), (1, 64, 64, 2, 1), (3, 100, 2000, 6, 3)]


def compiled(name: str, head_dim: int, causal: bool, dtype: str, arch: str):
    """The variant's main backward kernel (dK, dV and dQ's accumulator), as the package caches it;
    one without dQ at the fixed-order path's tiles."""
    options = build_options(name, causal)
    kernels = compiled_backward if options.pop("with_dq", True) else compiled_dk_dv
    return kernels(head_dim=head_dim, causal=causal, dtype=dtype, arch=arch, **options)


def build_options(name: str, causal: bool) -> dict:
    """backward_program's options of the variant: the shipped order, then the variant's own."""
    return {"heavy_first": heavy_first_order(causal, PLAIN, varlen=False, head_splits=False), **VARIANTS[name]}


def compiled_dq_variant(name: str, head_dim: int, causal: bool, dtype: str, arch: str):
    """The variant's fixed-order dQ kernel."""
    return compiled_dq(head_dim=head_dim, causal=causal, dtype=dtype, arch=arch, **DQ_VARIANTS[name])


def prepared(case, head_dim: int, causal: bool, dtype: torch.dtype, seed: int = 0):
    """(q, k, v, dout, delta, lse_log2) for case = (batch, seqlen_q, seqlen_k, heads, heads_kv):
    random inputs, and the shipped forward's and preprocess's statistics the kernels take."""
    batch, seqlen_q, seqlen_k, heads, heads_kv = case
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, seed)
    dout = torch.randn_like(q)
    out, lse = flash_attn_func(q, k, v, softmax_scale=1.0 / math.sqrt(head_dim), causal=causal, return_lse=True)
    name = str(dtype).removeprefix("torch.")
    preprocess = compiled_preprocess(head_dim=head_dim, dtype=name, arch=compile_arch(q.device))
    delta = torch.empty((batch, heads, padded_rows(seqlen_q)), dtype=torch.float32, device=q.device)
    lse_log2 = torch.empty_like(delta)
    preprocess(out, dout, lse, delta, lse_log2)
    return q, k, v, dout, delta, lse_log2


def launch_order(variant: str, causal: bool, k: torch.Tensor, head_dim: int) -> tuple:
    """The launch arguments after the scales: a heavy-first build's group size, else none."""
    if not build_options(variant, causal)["heavy_first"]:
        return ()
    return (pairs_per_group(k.shape[1], head_dim, device_target(k.device)[0]),)


def launcher(case, head_dim: int, causal: bool, dtype: torch.dtype, variant: str, seed: int = 0):
    """(call, grads, inputs) for case = (batch, seqlen_q, seqlen_k, heads, heads_kv): a call of
    the variant's main kernel, the gradients it wrote, and (q, k, v, dout)."""
    batch, seqlen_q, _, heads, _ = case
    q, k, v, dout, delta, lse_log2 = prepared(case, head_dim, causal, dtype, seed)
    scale = 1.0 / math.sqrt(head_dim)
    kernel = compiled(variant, head_dim, causal, str(dtype).removeprefix("torch."), compile_arch(q.device))
    # A kernel without dQ (`with_dq=False`) takes a one-element placeholder.
    with_dq = VARIANTS[variant].get("with_dq", True)
    dq_shape = (batch, heads, padded_rows(seqlen_q), dq_row(head_dim)) if with_dq else (1,)
    dq_accum = torch.zeros(dq_shape, dtype=torch.float32, device=q.device)
    dk, dv = torch.full_like(k, math.nan), torch.full_like(v, math.nan)
    order = launch_order(variant, causal, k, head_dim)
    # ordered_dq's turns, one a (batch, head, query tile), zeroed before each call as dQ's sums are.
    ordered = VARIANTS[variant].get("ordered_dq", False)
    query_tiles = -(-seqlen_q // BACKWARD_TILES[head_dim][0])
    turns = torch.zeros((batch, heads, query_tiles) if ordered else (0,), dtype=torch.int32, device=q.device)
    order += (turns,) if ordered else ()

    def call():
        dq_accum.zero_()
        turns.zero_()
        kernel(q, k, v, dout, delta, lse_log2, dq_accum, dk, dv, scale * LOG2E, scale, *order)

    def grads():
        if not with_dq:  # dQ from the shipped fixed-order kernel: the variant's dK and dV judged with it
            dq, name = torch.empty_like(q), str(dtype).removeprefix("torch.")
            dq_kernel = compiled_dq(head_dim=head_dim, causal=causal, dtype=name, arch=compile_arch(q.device))
            dq_kernel(q, k, v, dout, delta, lse_log2, dq, scale * LOG2E, scale)
            return dq, dk, dv
        return (dq_accum[:, :, :seqlen_q, :head_dim].transpose(1, 2) * scale).to(dtype), dk, dv

    return call, grads, (q, k, v, dout)


def dq_launcher(case, head_dim: int, causal: bool, dtype: torch.dtype, variant: str, seed: int = 0):
    """launcher's (call, grads, inputs) for a fixed-order dQ variant (`--dq`): a call of its dQ
    kernel, and its dQ beside dK and dV from one run of the shipped no_dq kernel."""
    q, k, v, dout, delta, lse_log2 = prepared(case, head_dim, causal, dtype, seed)
    scale = 1.0 / math.sqrt(head_dim)
    name, arch = str(dtype).removeprefix("torch."), compile_arch(q.device)
    dk, dv = torch.full_like(k, math.nan), torch.full_like(v, math.nan)
    placeholder = torch.zeros(1, dtype=torch.float32, device=q.device)
    order = launch_order("no_dq", causal, k, head_dim)
    compiled("no_dq", head_dim, causal, name, arch)(
        q, k, v, dout, delta, lse_log2, placeholder, dk, dv, scale * LOG2E, scale, *order
    )
    kernel = compiled_dq_variant(variant, head_dim, causal, name, arch)
    dq = torch.full_like(q, math.nan)

    def call():
        kernel(q, k, v, dout, delta, lse_log2, dq, scale * LOG2E, scale)

    return call, lambda: (dq, dk, dv), (q, k, v, dout)


def bitwise_stable(call, grads) -> bool:
    """Whether ORDERED_RUNS more calls give the first's gradients to the bit."""
    first = [t.clone() for t in grads()]
    for _ in range(ORDERED_RUNS):
        call()
        if not all(torch.equal(a, b) for a, b in zip(first, grads(), strict=True)):
            return False
    return True


def main() -> int:
    dq = "--dq" in sys.argv[1:]
    family = DQ_VARIANTS if dq else VARIANTS

    def more_flags(parser):
        parser.add_argument("--dq", action="store_true", help="the fixed-order dQ kernel's variants (DQ_VARIANTS)")
        parser.add_argument(
            "--head-dims", type=int, nargs="+", default=DEFAULT_HEAD_DIMS, help="the SHAPES of these head dims"
        )
        parser.add_argument(
            "--check-only", action="store_true", help="judge the variants on CHECKS and stop (exit 1 if one fails)"
        )

    args, variants = ab.arguments(__doc__.splitlines()[0], family, repeats=20, more=more_flags)
    launch = dq_launcher if dq else launcher
    shapes = [shape for shape in SHAPES if shape.head_dim in args.head_dims]
    head_dims = sorted({shape.head_dim for shape in shapes})
    if args.list:
        print("\n".join(family))
        return 0
    if args.compile_only:
        # tools/codegen_rules.py's rules too, which no output of a single kernel would show
        # (nothing asynchronous outlives the block, no bulk store's source rewritten in flight,
        # TMA copies aligned).
        from tools.codegen_rules import broken_rules

        quiet_tilelang()
        broken = 0
        for name in variants:
            for head_dim in head_dims:
                for causal in (False, True):
                    build = compiled_dq_variant if dq else compiled
                    source = build(name, head_dim, causal, "bfloat16", args.compile_only).get_kernel_source()
                    for problem in broken_rules(source):
                        print(f"{name} d{head_dim} causal={causal}: {problem}")
                        broken += 1
            print(f"{name}: compiled for {args.compile_only}", flush=True)
        return 1 if broken else 0

    def failures(name: str):
        for head_dim in head_dims:
            for causal, case in itertools.product((False, True), CHECKS):
                call, grads, (q, k, v, dout) = launch(case, head_dim, causal, torch.bfloat16, name)
                call()
                verdict = judge_backward(q, k, v, dout, grads(), causal)
                if not verdict.passed:
                    yield f"d{head_dim} causal={causal} {case}: {verdict}"
                elif family[name].get("ordered_dq") and not bitwise_stable(call, grads):
                    yield f"d{head_dim} causal={causal} {case}: dQ differs between runs"

    asked = variants
    judged = ab.within_the_bound(variants, failures)
    variants = None if judged is None else [name for name in variants if name in judged]
    if variants is None:
        return 1
    print("within the bound on", CHECKS, ":", ", ".join(variants), flush=True)
    if args.check_only:
        return 0 if len(variants) == len(asked) else 1
    ab.print_header("TFLOP/s of the fixed-order dQ kernel" if dq else "TFLOP/s of the main backward kernel", variants)
    for shape in shapes:
        case = (shape.batch, shape.seqlen_q, shape.keys, shape.nheads, shape.heads_kv)
        flops = shape.flops * (DQ_FLOPS if dq else BACKWARD_FLOPS)
        timers = {}
        for name in variants:
            call, _, _ = launch(case, shape.head_dim, shape.causal, shape.dtype, name)
            timers[name] = lambda call=call, flops=flops: flops / (cuda_median_ms(call, 5, args.repeats) * 1e-3) / 1e12
        ab.print_row(shape.label(), timers, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
