"""Decode steps against a paged KV cache on the GPU: flash_attn_with_kvcache against the same
split-KV kernels on a contiguous cache, alternated in one process.

From the repository root on the GPU machine:

    python -m perf.paged [--rounds 5] [--repeats 50] [--batch 64]

One query a request, 32 query heads on 8 K/V heads, d128, bf16. Two batches: every request at
8192 keys, and lengths from 1k to 32k (log-uniform, seed 0). Each page size (16, 64, 256)
gets its own cache, its pages in a shuffled order, judged first against the reference
(`reference.judge`, a few requests each). GB/s count the K and V bytes the requests hold (the
ragged batch's contiguous column pads every request to the longest, so its figure is the
useful bytes' rate). Issue 55's lines: paged >= 90% of the contiguous split-KV's GB/s, >= 70%
of HBM (H100 SXM 3.35 TB/s, H200 4.8 TB/s, NVIDIA's figures).
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch

from fa_kernel.decode import split_kv_attention
from fa_kernel.device import device_target
from fa_kernel.paged import PAGE_SIZES, flash_attn_with_kvcache
from fa_kernel.reference import judge
from fa_kernel.workbench.bench import alternated, cuda_median_ms

HBM_BYTES_PER_S = {"H100": 3.35e12, "H200": 4.8e12}
HEADS, HEADS_KV, HEAD_DIM, DTYPE = 32, 8, 128, torch.bfloat16


def ragged_lengths(batch: int, seed: int = 0) -> list[int]:
    """Lengths from 1024 to 32768 keys, log-uniform."""
    generator = torch.Generator().manual_seed(seed)
    return [int(2 ** (10 + 5 * torch.rand(1, generator=generator).item())) for _ in range(batch)]


def paged_cache(k: torch.Tensor, v: torch.Tensor, lengths: list[int], page_size: int, seed: int = 0):
    """(k_cache, v_cache, block_table, cache_seqlens): request b's first lengths[b] keys of the
    contiguous k and v, copied into pages of `page_size` rows taken in a shuffled order."""
    batch, longest = k.shape[:2]
    max_pages = math.ceil(longest / page_size)
    order = torch.randperm(batch * max_pages, generator=torch.Generator().manual_seed(seed)).to(k.device)
    block_table = order.view(batch, max_pages).int()
    caches = []
    for source in (k, v):
        pages = source.new_zeros(batch * max_pages, page_size, *source.shape[2:])
        padded = torch.nn.functional.pad(source, (0, 0, 0, 0, 0, max_pages * page_size - longest))
        pages[block_table.long().flatten()] = padded.view(batch * max_pages, page_size, *source.shape[2:])
        caches.append(pages)
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device=k.device)
    return (*caches, block_table, cache_seqlens)


def row(label: str, lengths: list[int], args, hbm: float) -> None:
    device = torch.device("cuda")
    batch, longest = len(lengths), max(lengths)
    q = torch.randn(batch, 1, HEADS, HEAD_DIM, dtype=DTYPE, device=device)
    k, v = (torch.randn(batch, longest, HEADS_KV, HEAD_DIM, dtype=DTYPE, device=device) for _ in range(2))
    useful = 2 * sum(lengths) * HEADS_KV * HEAD_DIM * q.element_size()
    sm_count, arch = device_target(device)
    scale = 1.0 / math.sqrt(HEAD_DIM)
    calls = {"contiguous": lambda: split_kv_attention(q, k, v, scale, False, sm_count, arch)}
    for page_size in PAGE_SIZES:
        k_cache, v_cache, table, seqlens = paged_cache(k, v, lengths, page_size)
        out, lse = flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table, return_lse=True
        )
        for b in sorted({0, batch // 2, batch - 1}):
            keys = slice(0, lengths[b])
            verdict = judge(q[b : b + 1], k[b : b + 1, keys], v[b : b + 1, keys], out[b : b + 1], lse[b : b + 1], False)
            if not verdict.passed:
                raise AssertionError(f"{label}, page {page_size}, request {b} ({lengths[b]} keys): {verdict}")
        calls[f"paged {page_size}"] = lambda c=(k_cache, v_cache, table, seqlens): flash_attn_with_kvcache(
            q, c[0], c[1], cache_seqlens=c[3], block_table=c[2]
        )
    timers = {
        name: (lambda fn=fn: useful / cuda_median_ms(fn, repeats=args.repeats) / 1e6) for name, fn in calls.items()
    }
    samples = alternated(timers, args.rounds)
    figures = " | ".join(f"{statistics.median(s):.0f}" for s in samples.values())
    ratios = []
    for page_size in PAGE_SIZES:
        each = [a / b for a, b in zip(samples[f"paged {page_size}"], samples["contiguous"], strict=True)]
        share = statistics.median(samples[f"paged {page_size}"]) * 1e9 / hbm
        ratios.append(f"{statistics.median(each):.3f}x ({min(each):.3f}-{max(each):.3f}), {share:.0%} HBM")
    print(f"| {label} | {figures} | {' | '.join(ratios)} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    name = torch.cuda.get_device_name()
    hbm = next((rate for card, rate in HBM_BYTES_PER_S.items() if card in name), math.nan)
    print(f"{name}: GB/s of the requests' K and V; paged/contiguous and share of HBM ({hbm / 1e12:.2f} TB/s)")
    pages = " | ".join(f"paged {size}" for size in PAGE_SIZES)
    print(f"| batch x{HEADS}/{HEADS_KV} heads d{HEAD_DIM} | contiguous | {pages} | {pages} (ratio, HBM) |")
    row(f"{args.batch} x 8192 keys", [8192] * args.batch, args, hbm)
    lengths = ragged_lengths(args.batch)
    row(f"{args.batch} x 1k-32k keys (sum {sum(lengths)}), contiguous padded", lengths, args, hbm)


if __name__ == "__main__":
    main()
