"""Representative launches for compute-sanitizer (`nox -s sanitize`): odd lengths, both
dtypes, causal and not, GQA, seqlen_q > seqlen_k. Small shapes: the sanitizer slows every
access by orders of magnitude. Exits non-zero if any result is wrong, so a launch that the
sanitizer lets through but that computes garbage still fails the session."""

from __future__ import annotations

import itertools
import sys

import torch

from fa_kernel import flash_attn_func
from fa_kernel.reference import judge, random_qkv

SHAPES = [  # batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim
    (1, 1, 1, 2, 2, 64),
    (2, 65, 65, 2, 1, 64),
    (1, 200, 77, 4, 2, 128),
    (1, 130, 257, 2, 2, 128),
    (1, 353, 353, 2, 1, 128),  # two tiles of 176 and one key
    (1, 67, 67, 2, 2, 256),
]


def main() -> int:
    failures = 0
    for (batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim), dtype, causal in itertools.product(
        SHAPES, (torch.float16, torch.bfloat16), (False, True)
    ):
        q, k, v = random_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, dtype, seed=seqlen_q)
        out = flash_attn_func(q, k, v, causal=causal)
        torch.cuda.synchronize()
        ok = judge(q, k, v, out, causal=causal).passed
        failures += not ok
        print(
            f"{batch}x{nheads}/{nheads_kv}x{seqlen_q}x{seqlen_k}x{head_dim} {dtype} causal={causal}: "
            f"{'ok' if ok else 'WRONG RESULT'}",
            flush=True,
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
