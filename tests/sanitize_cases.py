"""Representative launches for compute-sanitizer (`nox -s sanitize`): odd lengths, both
dtypes, causal and not, GQA, seqlen_q > seqlen_k, the long-sequence table entries, the
gradient kernels (atomic and fixed-order dQ), the split-KV kernels, and ragged batches (packed
sequences forward and backward, a paged KV cache). Small shapes: the
sanitizer slows every access by orders of magnitude. Exits non-zero if any result is wrong, so
a launch that the sanitizer lets through but that computes garbage still fails the session.

    python -m tests.sanitize_cases [--shard I/N] [--kernel NAME ...] [--list]

`--shard I/N` runs every N-th case from the I-th (0-based), so that N sanitizer processes share
the cases; `--kernel` keeps the cases of the kernels named (`--list` shows the names); `--list`
prints the cases of the shard without running them (no GPU needed).
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from dataclasses import dataclass

import torch

Shape = tuple[int, int, int, int, int, int]  # batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim

SHAPES: list[Shape] = [
    (1, 1, 1, 2, 2, 64),
    (2, 65, 65, 2, 1, 64),
    (1, 200, 77, 4, 2, 128),
    (1, 130, 257, 2, 2, 128),
    (1, 353, 353, 2, 1, 128),  # two tiles of 176 and one key
    (1, 67, 67, 2, 2, 256),
]
# The long-sequence table entries (TUNED), which the dispatch above never reaches at these
# lengths, called directly. 200 queries against 400 keys: the last query block's warpgroups
# past seqlen_q release three K/V tiles unread (kernel.warpgroup_kv_blocks), and causal rows
# straddle K/V tile boundaries.
LONG_ENTRY_SHAPES: list[Shape] = [(1, 200, 400, 2, 1, 64), (1, 200, 400, 2, 1, 128)]
# The gradient kernels: a partial query tile and a partial K/V tile, GQA, rows without keys
# (causal, seqlen_q > seqlen_k), head_dim 256's 64-key tiles; the fixed-order path on each, its
# tiles (DK_DV_TILES, DQ_TILES) every head_dim's own.
GRADIENT_SHAPES: list[Shape] = [(1, 65, 130, 4, 2, 64), (1, 100, 150, 4, 2, 256), (1, 200, 77, 2, 1, 128)]
# The split-KV kernels: one query and a GQA group's 16 rows in one row block, keys ending inside
# a tile, several splits.
SPLIT_KV_SHAPES: list[Shape] = [(2, 1, 300, 8, 2, 128), (1, 16, 1000, 4, 1, 64)]
# Ragged batches, as (batch, longest query, longest key, heads, K/V heads, head_dim): packed
# sequences of RAGGED_LENGTHS (a tile's edges either side, an empty sequence, more rows than
# keys), and a paged cache of PAGED_LENGTHS over 16-key pages (a page's edges, an empty request).
RAGGED_LENGTHS_Q, RAGGED_LENGTHS_K = [63, 65, 0, 130, 1], [65, 63, 5, 70, 129]
PAGED_LENGTHS, PAGE_SIZE = [15, 16, 17, 0, 300], 16
RAGGED_SHAPES: list[Shape] = [(5, 130, 129, 4, 2, 64), (5, 130, 129, 4, 2, 128)]
PAGED_SHAPES: list[Shape] = [(5, 1, 300, 8, 2, 128)]


@dataclass(frozen=True)
class Case:
    kernel: str  # "forward", "long entry", "gradients", "gradients deterministic", "split-KV",
    # "varlen", "varlen gradients", "varlen gradients deterministic", "paged"
    shape: Shape
    dtype: torch.dtype
    causal: bool

    def __str__(self) -> str:
        batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim = self.shape
        dtype = str(self.dtype).removeprefix("torch.")
        shape = f"{batch}x{nheads}/{nheads_kv}x{seqlen_q}x{seqlen_k}x{head_dim}"
        return f"{self.kernel}: {shape} {dtype} causal={self.causal}"


def cases() -> list[Case]:
    both = (torch.float16, torch.bfloat16)
    kinds = [("forward", SHAPES, both), ("long entry", LONG_ENTRY_SHAPES, both)]
    kinds += [("gradients", GRADIENT_SHAPES, (torch.bfloat16,)), ("split-KV", SPLIT_KV_SHAPES, (torch.bfloat16,))]
    kinds += [("varlen", RAGGED_SHAPES, (torch.bfloat16,)), ("varlen gradients", RAGGED_SHAPES, (torch.bfloat16,))]
    kinds += [("paged", PAGED_SHAPES, (torch.bfloat16,))]
    found = [
        Case(kernel, shape, dtype, causal)
        for kernel, shapes, dtypes in kinds
        for shape, dtype, causal in itertools.product(shapes, dtypes, (False, True))
    ]
    last_tile_checks = [
        *(Case("gradients deterministic", shape, torch.bfloat16, True) for shape in GRADIENT_SHAPES),
        Case("varlen gradients deterministic", RAGGED_SHAPES[-1], torch.bfloat16, True),
    ]
    return found + last_tile_checks


def run(case: Case) -> bool:
    """Launch the case's kernels and judge what they computed; True if within the bound."""
    from suite.launch import run_config

    from fa_kernel import flash_attn_func
    from fa_kernel.interface import tile_config_for
    from fa_kernel.reference import judge, random_qkv
    from fa_kernel.reference_backward import judge_backward
    from fa_kernel.workbench.bench import split_kv_call

    if case.kernel.startswith("varlen") or case.kernel == "paged":
        return run_ragged(case)
    batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim = case.shape
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, case.dtype, seed=seqlen_q)
    scale = 1.0 / math.sqrt(head_dim)
    if case.kernel.startswith("gradients"):
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        out = flash_attn_func(q, k, v, causal=case.causal, deterministic=case.kernel.endswith("deterministic"))
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        torch.cuda.synchronize()
        return judge_backward(q.detach(), k.detach(), v.detach(), dout, grads, case.causal).passed
    if case.kernel == "forward":
        out, lse = flash_attn_func(q, k, v, causal=case.causal, return_lse=True)
    elif case.kernel == "long entry":
        out, lse = run_config(q, k, v, scale, case.causal, tile_config_for(q.device, head_dim, case.causal, None))
    else:
        out, lse = split_kv_call(q, k, v, case.causal)()
    torch.cuda.synchronize()
    return judge(q, k, v, out, lse, case.causal, scale).passed


def run_ragged(case: Case) -> bool:
    """A ragged case's launches, each sequence or request judged on its own (suite.ragged)."""
    from suite import ragged

    from fa_kernel import flash_attn_varlen_func, flash_attn_with_kvcache

    _, _, _, nheads, nheads_kv, head_dim = case.shape
    try:
        if case.kernel == "paged":
            cache = ragged.paged_cache(PAGED_LENGTHS, PAGE_SIZE, nheads, nheads_kv, head_dim, case.dtype, "cuda")
            q, k_cache, v_cache, seqlens, table = cache
            out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                               causal=case.causal, return_lse=True)  # fmt: skip
            torch.cuda.synchronize()
            ragged.judge_requests(q, k_cache, v_cache, seqlens, table, out, lse, causal=case.causal)
            return True
        q, k, v, cu_q, cu_k = ragged.packed(RAGGED_LENGTHS_Q, RAGGED_LENGTHS_K, nheads, nheads_kv, head_dim, case.dtype,
                                            "cuda")  # fmt: skip
        longest = dict(max_seqlen_q=max(RAGGED_LENGTHS_Q), max_seqlen_k=max(RAGGED_LENGTHS_K), causal=case.causal)
        if case.kernel == "varlen":
            out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, **longest, return_lse=True)
            torch.cuda.synchronize()
            ragged.judge_sequences(q, k, v, cu_q, cu_k, out, lse, causal=case.causal)
            return True
        leaves = [t.requires_grad_() for t in (q, k, v)]
        out = flash_attn_varlen_func(
            *leaves, cu_q, cu_k, **longest, deterministic=case.kernel.endswith("deterministic")
        )
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, leaves, dout)
        torch.cuda.synchronize()
        ragged.judge_sequence_gradients(q.detach(), k.detach(), v.detach(), dout, cu_q, cu_k, grads, causal=case.causal)
        return True
    except AssertionError as verdict:
        print(verdict, flush=True)
        return False


def shard(all_cases: list[Case], text: str) -> list[Case]:
    """The cases of shard 'I/N': every N-th from the I-th."""
    index, count = (int(part) for part in text.split("/"))
    if not 0 <= index < count:
        raise ValueError(f"--shard: expected I/N with 0 <= I < N, got {text}")
    return all_cases[index::count]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shard", default="0/1", help="I/N: run every N-th case from the I-th")
    parser.add_argument("--kernel", nargs="+", help="only the cases of these kernels (as --list names them)")
    parser.add_argument("--list", action="store_true", help="print the shard's cases, run nothing")
    args = parser.parse_args()
    kept = [case for case in cases() if args.kernel is None or case.kernel in args.kernel]
    chosen = shard(kept, args.shard)
    failures = 0
    for case in chosen:
        ok = None if args.list else run(case)
        failures += ok is False
        print(f"{case}{'' if ok is None else ': ok' if ok else ': WRONG RESULT'}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
