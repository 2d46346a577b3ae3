"""flash_attn_with_kvcache: its argument checks here (no GPU needed: they run before the device's),
and on a Hopper GPU each request against the reference over its pages: page sizes 16, 64 and 256,
lengths at page boundaries ±1 beside empty ones, a table out of order with pages shared between
requests, windows, a softcap and sinks through the pages, and the step's new keys appended in
place."""

from __future__ import annotations

import re

import pytest
import torch
from suite.ragged import judge_requests, paged_cache
from suite.strategies import sinks_for

from fa_kernel.reference import paged_keys


def call(q, k_cache, v_cache, cache_seqlens, block_table, *args, **kwargs):
    from fa_kernel import flash_attn_with_kvcache

    return flash_attn_with_kvcache(q, k_cache, v_cache, *args, cache_seqlens=cache_seqlens, block_table=block_table,
                                   **kwargs)  # fmt: skip


@pytest.mark.parametrize(
    "change, error",
    [
        (lambda a: a.update(k_cache=a["k_cache"][0]), "k_cache: expected a 4-d tensor [num_pages, page_size"),
        (lambda a: a.update(k_cache=a["k_cache"][:, :32], v_cache=a["v_cache"][:, :32]), "expected a page size"),
        (lambda a: a.update(v_cache=a["v_cache"][:1]), "v_cache: expected the shape of k_cache"),
        (lambda a: a.update(cache_seqlens=a["cache_seqlens"].long()), "cache_seqlens: expected an int32 tensor"),
        (lambda a: a.update(block_table=a["block_table"][0]), "block_table: expected an int32 tensor [batch, max"),
        (lambda a: a.update(k=a["q"][:, :, :2]), "k, v: expected both or neither"),
        (lambda a: a.update(k=a["q"], v=a["q"]), "k: expected [batch 2, seqlen_new, 2, 128]"),
        (lambda a: a.update(q=a["q"].float()), "q: expected dtype float16 or bfloat16"),
    ],
)
def test_bad_cache_input_is_refused_by_name_before_launch(change, error):
    q, k_cache, v_cache, seqlens, table = paged_cache([70, 5], 64)
    arguments = dict(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=seqlens, block_table=table)
    change(arguments)
    q, k_cache, v_cache = arguments.pop("q"), arguments.pop("k_cache"), arguments.pop("v_cache")
    new = [arguments.pop(name) for name in ("k", "v") if name in arguments]
    new += [None] * (2 - len(new))
    with pytest.raises((ValueError, TypeError), match=re.escape(error)):
        call(q, k_cache, v_cache, arguments["cache_seqlens"], arguments["block_table"], *new)


def test_good_cache_input_passes_its_checks_up_to_the_device():
    q, k_cache, v_cache, seqlens, table = paged_cache([70, 0], 16)
    with pytest.raises(ValueError, match="q: expected a tensor on a CUDA device"):
        call(q, k_cache, v_cache, seqlens, table)


# ---- on the GPU ----


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [16, 64, 256])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_each_request_within_the_bound(page_size, head_dim):
    # Lengths at a page's boundary and one either side, a tile's, empty and one-key requests.
    lengths = [page_size - 1, page_size, page_size + 1, 0, 1, 128, 129, 3 * page_size + 7]
    q, k_cache, v_cache, seqlens, table = paged_cache(
        lengths, page_size, head_dim=head_dim, device="cuda", spare_pages=1
    )
    out, lse = call(q, k_cache, v_cache, seqlens, table, causal=True, return_lse=True)
    judge_requests(q, k_cache, v_cache, seqlens, table, out, lse, causal=True)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [4, 64], ids=["group4", "group64"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_each_request_within_the_bound_with_the_variants(head_dim, rows):
    # The paged builds with a window, a softcap and sinks compiled in (flash_attn_with_kvcache
    # takes them as flash_attn_func does): left edges on a page's boundary and a key either side,
    # a right edge under causal, caps that saturate and that do not, sinks of either sign; a group
    # of 4 query rows (the 16-row tile; head_dim 256 has the 64-row one alone) and of 64, lengths
    # at the page's boundary, empty and one-key requests.
    page_size = 64
    lengths = [page_size - 1, page_size + 1, 0, 1, 3 * page_size + 7, 200]
    q, k_cache, v_cache, seqlens, table = paged_cache(
        lengths, page_size, nheads=rows, nheads_kv=1, head_dim=head_dim, device="cuda", spare_pages=1
    )
    sinks = sinks_for(rows, seed=head_dim)
    cases = [dict(window_size=(left, -1), sinks=sinks) for left in (0, page_size - 1, page_size, page_size + 1)]
    cases += [dict(window_size=(page_size, 0), softcap=30.0), dict(softcap=0.05, sinks=sinks)]
    failures = []
    for variants in cases:
        out, lse = call(q, k_cache, v_cache, seqlens, table, causal=True, return_lse=True, **variants)
        try:
            judge_requests(q, k_cache, v_cache, seqlens, table, out, lse, causal=True, **variants)
        except AssertionError as error:
            failures.append(
                f"{ {k: v for k, v in variants.items() if k != 'sinks'} } sinks {'sinks' in variants}: {error}"
            )
    assert not failures, "\n".join(failures)


@pytest.mark.gpu
def test_pages_shared_between_requests_and_a_group_of_64_rows():
    # Request 1 reads request 0's first page; 32 query heads on one K/V head (the 64-row tile).
    lengths = [300, 200, 64]
    q, k_cache, v_cache, seqlens, table = paged_cache(lengths, 64, nheads=32, nheads_kv=1, device="cuda", shared=True)
    out, lse = call(q, k_cache, v_cache, seqlens, table, return_lse=True)
    judge_requests(q, k_cache, v_cache, seqlens, table, out, lse)


@pytest.mark.gpu
def test_the_steps_new_keys_are_appended_in_place_and_attended():
    lengths = [63, 64, 0]
    q, k_cache, v_cache, seqlens, table = paged_cache(lengths, 64, device="cuda", spare_pages=1)
    q = q.expand(-1, 2, -1, -1).contiguous()  # an append step of two queries
    k_new, v_new = (torch.randn(3, 2, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    before = paged_keys(k_cache, table, seqlens)
    out, lse = call(q, k_cache, v_cache, seqlens, table, k_new, v_new, causal=True, return_lse=True)
    after = seqlens + 2
    for b, keys in enumerate(paged_keys(k_cache, table, after)):
        assert torch.equal(keys[: lengths[b]], before[b]) and torch.equal(keys[lengths[b] :], k_new[b])
    judge_requests(q, k_cache, v_cache, after, table, out, lse, causal=True)
