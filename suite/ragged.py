"""Ragged batches as the tests and the sanitizer's cases build and judge them: packed sequences
(`cu`, `packed`) and a paged KV cache (`paged_cache`), each sequence or request judged on its
own against the reference (`judge_sequences`, `judge_sequence_gradients`, `judge_requests`)."""

from __future__ import annotations

import itertools

import torch

from fa_kernel.reference import attention_varlen_ref, judge, paged_keys
from fa_kernel.reference_backward import judge_backward


def cu(*lengths: int, device="cpu") -> torch.Tensor:
    """cu_seqlens of these lengths: int32 [len + 1], from 0."""
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)


def packed(lengths_q, lengths_k, nheads=4, nheads_kv=2, head_dim=64, dtype=torch.float16, device="cpu", seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lengths_q), nheads, head_dim, generator=generator).to(dtype=dtype, device=device)
    k = torch.randn(sum(lengths_k), nheads_kv, head_dim, generator=generator).to(dtype=dtype, device=device)
    v = torch.randn(sum(lengths_k), nheads_kv, head_dim, generator=generator).to(dtype=dtype, device=device)
    return q, k, v, cu(*lengths_q, device=device), cu(*lengths_k, device=device)


def judge_sequences(q, k, v, cu_q, cu_k, out, lse, **options):
    """Each sequence judged on its own (reference.judge); the packed reference agrees too."""
    bounds_q, bounds_k = cu_q.tolist(), cu_k.tolist()
    for i in range(len(bounds_q) - 1):
        (q0, q1), (k0, k1) = bounds_q[i : i + 2], bounds_k[i : i + 2]
        if q1 == q0:
            continue
        if k1 == k0:
            assert torch.equal(out[q0:q1], torch.zeros_like(out[q0:q1])), f"sequence {i}: no key, output not 0"
            continue
        verdict = judge(
            q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], out[None, q0:q1], lse[None, :, q0:q1], **options
        )
        assert verdict.passed, f"sequence {i} ({q1 - q0} queries, {k1 - k0} keys): {verdict}"
    reference, _ = attention_varlen_ref(q, k, v, cu_q, cu_k, **options)
    assert reference.shape == out.shape


def judge_sequence_gradients(q, k, v, dout, cu_q, cu_k, grads, **options):
    """Each sequence's (dq, dk, dv) judged on its own (reference_backward.judge_backward); a
    sequence with no key or no row: its gradients 0."""
    dq, dk, dv = grads
    bounds_q, bounds_k = cu_q.tolist(), cu_k.tolist()
    for i in range(len(bounds_q) - 1):
        (q0, q1), (k0, k1) = bounds_q[i : i + 2], bounds_k[i : i + 2]
        if q1 == q0 or k1 == k0:
            for grad in (dq[q0:q1], dk[k0:k1], dv[k0:k1]):
                assert torch.equal(grad, torch.zeros_like(grad)), f"sequence {i}: no score, a gradient not 0"
            continue
        rows, keys = slice(q0, q1), slice(k0, k1)
        verdict = judge_backward(
            q[None, rows], k[None, keys], v[None, keys], dout[None, rows],
            (dq[None, rows], dk[None, keys], dv[None, keys]), **options,
        )  # fmt: skip
        assert verdict.passed, f"sequence {i} ({q1 - q0} rows, {k1 - k0} keys): {verdict}"


def paged_cache(lengths, page_size, nheads=8, nheads_kv=2, head_dim=128, dtype=torch.bfloat16, device="cpu", seed=0,
                spare_pages=0, shared=False):  # fmt: skip
    """(q [batch, 1, nheads, head_dim], k_cache, v_cache, cache_seqlens, block_table): each
    request's pages in a shuffled order (`spare_pages` more in each row of the table, pointing at
    pages of its own); `shared`: request 1 reads request 0's first page as its own first."""
    generator = torch.Generator().manual_seed(seed)
    pages_per = [-(-length // page_size) + spare_pages for length in lengths]
    most = max(max(pages_per), 1)
    total = sum(pages_per) + 1
    order = torch.randperm(total, generator=generator).tolist()
    table = torch.zeros(len(lengths), most, dtype=torch.int32)
    taken = 0
    for b, count in enumerate(pages_per):
        table[b, :count] = torch.tensor(order[taken : taken + count], dtype=torch.int32)
        taken += count
    if shared and len(lengths) > 1:
        table[1, 0] = table[0, 0]
    k_cache = torch.randn(total, page_size, nheads_kv, head_dim, generator=generator).to(dtype)
    v_cache = torch.randn(total, page_size, nheads_kv, head_dim, generator=generator).to(dtype)
    q = torch.randn(len(lengths), 1, nheads, head_dim, generator=generator).to(dtype)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    return tuple(t.to(device) for t in (q, k_cache, v_cache, seqlens, table))


def judge_requests(q, k_cache, v_cache, seqlens, table, out, lse, **options):
    """Each request judged against the reference over its own keys (reference.paged_keys)."""
    keys, values = paged_keys(k_cache, table, seqlens), paged_keys(v_cache, table, seqlens)
    for b, (k, v) in enumerate(zip(keys, values, strict=True)):
        if k.shape[0] == 0:
            assert torch.equal(out[b], torch.zeros_like(out[b])), f"request {b}: no key, output not 0"
            continue
        verdict = judge(q[b : b + 1], k[None], v[None], out[b : b + 1], lse[b : b + 1], **options)
        assert verdict.passed, f"request {b} ({k.shape[0]} keys): {verdict}"
