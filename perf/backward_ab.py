"""Variants of the backward kernel against the shipped one, on the GPU, alternated in one process.

From the repository root on the GPU machine:

    python -m perf.backward_ab.py [--variants NAME ...] [--rounds 5] [--repeats 20]

Every variant's kernel is first judged on odd shapes against `reference.judge_backward`; then
the main kernel alone (dQ's accumulator zeroed before each call, as the launch does; the
preprocess and dQ's cast are the same for all) is timed on each shape, the variants alternated
over rounds in this one process (`bench.alternated`, `bench.cuda_median_ms`). TFLOP/s as
`fa-kernel bench --backward` counts them (2.5x the forward's FLOPs); each variant's ratio to
the shipped kernel is taken round by round.

Variants (`--list` prints them):

  shipped          backward.py as it is (Sᵀ and dPᵀ issued together, the key mask only on tiles
                   that hold a hidden key: docs/performance.md has their A/B).
  bottom-up        each block walks its query tiles from the last up
                   (`compiled_backward(rows_bottom_up=True)`): whether causal runs slow for want
                   of L2 sharing between a head's blocks. Causal only: on a non-causal shape
                   the variant is the shipped kernel.
  short_d64        head_dim 64 on 64-row query tiles (128 shipped); head_dim 128 as shipped.
  three_stages     three Q/dO tiles in flight instead of two.
  dq_wait_at_once  the bulk reduce-add of dQ's tile waited for right after it is issued, as
                   TileLang's T.atomic_add(use_tma=True) does (shipped until 2026-12-04; the wait
                   holds the issuing warp's warpgroup from its next GEMMs).
  dq_pad_8         dQ's accumulator rows padded by 8 floats, not 4 (conflict-free stores of the
                   tile's image into shared memory, 3% more bytes added).
  dv_before_ds     the dV GEMM before dS is formed (shipped until 2026-12-04): the fp32 Sᵀ and
                   dPᵀ live across it, and at head_dim 64 ptxas serialises every wgmma (C7512).

Measured and dropped (git history of this file, docs/performance.md): dQ added by atomics from
registers (0.40-0.53x).

Leave-one-out diagnostics, timing only (wrong gradients by design, not judged):

  no_dq            dK and dV alone (`with_dq=False`): what dQ's GEMM, staging and reduce-add cost.
  no_dq_reduce     dQ's tile computed and staged in shared memory, never added to the accumulator.
  (A first measurement of the deferred wait edited the generated CUDA of the kernel before it:
  1.08-1.09x at d128, 1.13-1.15x at d64; its code is in this file's git history.)
"""

from __future__ import annotations

import functools
import itertools
import math
import sys

import torch

from fa_kernel import backward as shipped_backward
from fa_kernel import flash_attn_func
from fa_kernel.backward import compiled_preprocess, padded_rows
from fa_kernel.interface import compile_arch
from fa_kernel.numerics import LOG2E
from fa_kernel.reference import judge_backward, random_qkv
from fa_kernel.workbench.bench import BACKWARD_FLOPS, Shape, cuda_median_ms
from fa_kernel.workbench.builds import quiet_tilelang
from perf import ab

TILES = "block_m, block_n, num_stages = BACKWARD_TILES[head_dim]"
# head_dim 64 on 64 query rows a tile, as head_dim 128 runs: twice the iterations, each GEMM half
# as tall (shipped until 128 rows measured 1.17x causal, 0.98x without the mask).
SHORT_D64 = ((TILES, "block_m, block_n, num_stages = {64: (64, 128, 2), 128: (64, 128, 2)}[head_dim]"),)
THREE_STAGES = ((TILES, "block_m, block_n, num_stages = {64: (128, 128, 3), 128: (64, 128, 3)}[head_dim]"),)
# The wait right after the add, where TileLang's T.atomic_add(use_tma=True) places it; the one
# before the next step's write then finds nothing in flight.
DQ_WAIT_AT_ONCE = (("T.tma_store_arrive()", "T.tma_store_arrive()\nT.tma_store_wait(0)"),)
# dQ's rows padded by 8 floats, not 4: a row 8 banks on from the last, each half-warp of the
# fragment's stores into dQ_shared conflict-free (4: two-way, ncu), for 3% more bytes added.
DQ_PAD_8 = (("head_dim + 4", "head_dim + 8"),)
# The dV GEMM before dS is formed: Sᵀ's and dPᵀ's fp32 tiles then live across it, and at
# head_dim 64 on 128 rows ptxas serialises every wgmma for it (C7512, "insufficient register
# resources", with spills). Same values, same bits.
DV_BEFORE_DS = (
    (
        """for i, j in T.Parallel(block_n, block_m):
    ds_cast[i, j] = acc_s[i, j] * (acc_dp[i, j] - delta[j])
T.gemm(p_cast, dO_shared, acc_dv, policy=T.GemmWarpPolicy.FullRow)""",
        """T.gemm(p_cast, dO_shared, acc_dv, policy=T.GemmWarpPolicy.FullRow)
for i, j in T.Parallel(block_n, block_m):
    ds_cast[i, j] = acc_s[i, j] * (acc_dp[i, j] - delta[j])""",
    ),
)
# The elected thread's branch, which issues the add, never taken.
NO_DQ_REDUCE = (("T.shuffle_elect(threads)", "False"),)
# name -> (patches of backward.py, compiled_backward's own arguments)
VARIANTS: dict[str, tuple[tuple[tuple[str, str], ...], dict]] = {
    "shipped": ((), {}),
    "bottom-up": ((), {"rows_bottom_up": True}),
    "short_d64": (SHORT_D64, {}),
    "three_stages": (THREE_STAGES, {}),
    "dq_wait_at_once": (DQ_WAIT_AT_ONCE, {}),
    "dq_pad_8": (DQ_PAD_8, {}),
    "dv_before_ds": (DV_BEFORE_DS, {}),
    "no_dq": ((), {"with_dq": False}),
    "no_dq_reduce": (NO_DQ_REDUCE, {}),
}
KNOWN_INCORRECT = frozenset({"no_dq", "no_dq_reduce"})
SHAPES = [
    Shape(8, 32, 4096, 128, False, torch.bfloat16),
    Shape(8, 32, 4096, 128, True, torch.bfloat16),
    Shape(2, 16, 16384, 128, True, torch.bfloat16),
    Shape(8, 32, 4096, 64, False, torch.bfloat16),
    Shape(8, 32, 4096, 64, True, torch.bfloat16),
]
# Odd lengths, both offsets' signs, a GQA group: each variant is judged on these first.
CHECKS = [(1, 200, 333, 4, 2), (2, 333, 200, 4, 4), (1, 64, 64, 2, 1)]


@functools.cache
def module(name: str):
    """backward.py as the variant patches it."""
    patches, _ = VARIANTS[name]
    return ab.patched_module(shipped_backward, name, patches) if patches else shipped_backward


def compiled(name: str, head_dim: int, causal: bool, dtype: str, arch: str):
    """The variant's main backward kernel (dK, dV and dQ's accumulator)."""
    _, arguments = VARIANTS[name]
    if not causal:
        arguments = {key: value for key, value in arguments.items() if key != "rows_bottom_up"}
    return module(name).compiled_backward(head_dim=head_dim, causal=causal, dtype=dtype, arch=arch, **arguments)


def launcher(case, head_dim: int, causal: bool, dtype: torch.dtype, variant: str, seed: int = 0):
    """(call, grads, inputs) for case = (batch, seqlen_q, seqlen_k, heads, heads_kv): a call of
    the variant's main kernel, the gradients it wrote, and (q, k, v, dout)."""
    batch, seqlen_q, seqlen_k, heads, heads_kv = case
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, seed)
    dout = torch.randn_like(q)
    scale = 1.0 / math.sqrt(head_dim)
    out, lse = flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, return_lse=True)
    name = str(dtype).removeprefix("torch.")
    arch = compile_arch(q.device)
    preprocess = compiled_preprocess(head_dim=head_dim, dtype=name, arch=arch)
    kernel = compiled(variant, head_dim, causal, name, arch)
    delta = torch.empty((batch, heads, padded_rows(seqlen_q)), dtype=torch.float32, device=q.device)
    lse_log2 = torch.empty_like(delta)
    preprocess(out, dout, lse, delta, lse_log2)
    # A kernel without dQ (`with_dq=False`) takes a one-element placeholder; the variant's own
    # dq_row its accumulator's rows.
    with_dq = VARIANTS[variant][1].get("with_dq", True)
    dq_shape = (batch, heads, padded_rows(seqlen_q), module(variant).dq_row(head_dim)) if with_dq else (1,)
    dq_accum = torch.zeros(dq_shape, dtype=torch.float32, device=q.device)
    dk, dv = torch.full_like(k, math.nan), torch.full_like(v, math.nan)

    def call():
        dq_accum.zero_()
        kernel(q, k, v, dout, delta, lse_log2, dq_accum, dk, dv, scale * LOG2E, scale)

    def grads():
        if not with_dq:
            return torch.zeros_like(q), dk, dv
        return (dq_accum[:, :, :seqlen_q, :head_dim].transpose(1, 2) * scale).to(dtype), dk, dv

    return call, grads, (q, k, v, dout)


def main() -> int:
    args, variants = ab.arguments(__doc__.splitlines()[0], VARIANTS, repeats=20)
    if args.list:
        print("\n".join(VARIANTS))
        return 0
    if args.compile_only:
        # tools/codegen_rules.py's rule too: nothing asynchronous (a wgmma, a TMA store) may
        # outlive the block, which no output of a single kernel would show.
        from tools.codegen_rules import outstanding_at_exit

        quiet_tilelang()
        broken = 0
        for name in variants:
            for head_dim in sorted({shape.head_dim for shape in SHAPES}):
                for causal in (False, True):
                    source = compiled(name, head_dim, causal, "bfloat16", args.compile_only).get_kernel_source()
                    for problem in outstanding_at_exit(source):
                        print(f"{name} d{head_dim} causal={causal}: {problem}")
                        broken += 1
            print(f"{name}: compiled for {args.compile_only}", flush=True)
        return 1 if broken else 0

    def failures(name: str):
        for head_dim in sorted({shape.head_dim for shape in SHAPES}):
            for causal, case in itertools.product((False, True), CHECKS):
                call, grads, (q, k, v, dout) = launcher(case, head_dim, causal, torch.bfloat16, name)
                call()
                verdict = judge_backward(q, k, v, dout, grads(), causal)
                if not verdict.passed:
                    yield f"d{head_dim} causal={causal} {case}: {verdict}"

    judged = ab.within_the_bound([name for name in variants if name not in KNOWN_INCORRECT], failures)
    variants = None if judged is None else [name for name in variants if name in judged or name in KNOWN_INCORRECT]
    if variants is None:
        return 1
    print("within the bound on", CHECKS, ":", ", ".join(variants), flush=True)
    ab.print_header("TFLOP/s of the main backward kernel", variants)
    for shape in SHAPES:
        case = (shape.batch, shape.seqlen_q, shape.keys, shape.nheads, shape.heads_kv)
        flops = shape.flops * BACKWARD_FLOPS
        timers = {}
        for name in variants:
            call, _, _ = launcher(case, shape.head_dim, shape.causal, shape.dtype, name)
            timers[name] = lambda call=call, flops=flops: flops / (cuda_median_ms(call, 5, args.repeats) * 1e-3) / 1e12
        ab.print_row(shape.label(), timers, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
