"""`flash_attn_with_kvcache`, shaped like flash-attn's: a decode or append step against a paged
KV cache, by the split-KV kernels' paged build (`decode.split_program(page_size=...)`).

Request b's keys 0..cache_seqlens[b] - 1 live in pages of `page_size` rows: key i in page
block_table[b, i // page_size], row i % page_size. Pages may come in any order and be shared
between requests. Its queries are the last of its keys' positions (bottom-right, as flash-attn
aligns them). With `k` and `v` the step's new keys are first written into the cache in place, at
positions cache_seqlens[b] onward, and attended with the rest.

The split plan covers the table's capacity (max_pages · page_size keys): a split past a
request's length finds no key and adds nothing in the combine. The values of cache_seqlens and
block_table are not read on the host (that would wait for the GPU every step): the kernel clamps
a page index into the cache and a length into the table, so no load leaves them; a caller's
out-of-range value gives wrong keys, not a fault.
"""

from __future__ import annotations

import torch

from fa_kernel.decode import split_kv_attention
from fa_kernel.device import device_target
from fa_kernel.interface import check_inputs

PAGE_SIZES = (16, 64, 256)


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    *,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ · softmax_scale) v of each request against its keys in a paged cache.

    Args:
        q: [batch, seqlen_q, nheads, headdim], float16 or bfloat16, on a Hopper GPU.
        k_cache, v_cache: [num_pages, page_size, nheads_kv, headdim], q's dtype and device;
            page_size 16, 64 or 256. Written in place where k and v are given.
        k, v: None, or the step's new keys and values [batch, seqlen_new, nheads_kv, headdim],
            written at positions cache_seqlens[b] onward (the table must have their pages).
        cache_seqlens: int32 [batch] on q's device: each request's keys before the step's.
        block_table: int32 [batch, max_pages] on q's device.
        softmax_scale, causal, window_size, softcap, sinks: as flash_attn_func's, per request.
        return_lse: also return the LSE, fp32 [batch, nheads, seqlen_q].

    A request with no key gets output 0 and LSE -inf (its sink's, with sinks).
    """
    _check_cache(q, k_cache, v_cache, k, v, cache_seqlens, block_table)
    batch = q.shape[0]
    # flash_attn_func's checks, on views of the caches with q's batch (free: expand).
    k_view, v_view = (cache[:1].expand(batch, -1, -1, -1) for cache in (k_cache, v_cache))
    variants = dict(window_size=window_size, softcap=softcap, sinks=sinks)
    scale = check_inputs(q, k_view, v_view, softmax_scale, causal, **variants)
    if k is not None:
        cache_seqlens = _append(k_cache, v_cache, k, v, cache_seqlens, block_table)
    if q.numel() == 0:  # no query row: nothing to launch
        out, lse = torch.empty_like(q), q.new_empty((batch, q.shape[2], q.shape[1]), dtype=torch.float32)
    else:
        sm_count, arch = device_target(q.device)
        q = q if q.is_contiguous() else q.contiguous()
        pages = (block_table, cache_seqlens)
        out, lse = split_kv_attention(q, k_cache, v_cache, scale, causal, sm_count, arch, pages=pages, **variants)
    return (out, lse) if return_lse else out


def _check_cache(q, k_cache, v_cache, k, v, cache_seqlens, block_table) -> None:
    """Raise unless the caches, the new keys and the table have the shapes, dtypes and devices
    flash_attn_with_kvcache takes."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise ValueError(
                f"{name}: expected a 4-d tensor [num_pages, page_size, nheads_kv, headdim], got shape {tuple(t.shape)}"
            )
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache: expected the shape of k_cache {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    page_size = k_cache.shape[1]
    if page_size not in PAGE_SIZES:
        raise ValueError(f"k_cache: expected a page size (dim 1) in {PAGE_SIZES}, got {page_size}")
    batch = q.shape[0] if q.dim() == 4 else None
    for name, t, dims in (("cache_seqlens", cache_seqlens, 1), ("block_table", block_table, 2)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.int32 or t.dim() != dims or (batch is not None and t.shape[0] != batch):
            expected = "[batch]" if dims == 1 else "[batch, max_pages]"
            raise ValueError(
                f"{name}: expected an int32 tensor {expected} (batch {batch}), got {t.dtype} {tuple(t.shape)}"
            )
        if t.device != q.device:
            raise ValueError(f"{name}: expected q's device {q.device}, got {t.device}")
    if (k is None) != (v is None):
        raise ValueError(f"k, v: expected both or neither, got k {type(k).__name__} and v {type(v).__name__}")
    if k is not None:
        new_shape = (batch, None, *k_cache.shape[2:])
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4 or (t.shape[0], None, *t.shape[2:]) != new_shape:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(
                    f"{name}: expected [batch {batch}, seqlen_new, {k_cache.shape[2]}, {k_cache.shape[3]}], got {got}"
                )
            if t.dtype != k_cache.dtype or t.device != k_cache.device:
                raise ValueError(f"{name}: expected k_cache's dtype and device, got {t.dtype} on {t.device}")


def _append(k_cache, v_cache, k, v, cache_seqlens, block_table) -> torch.Tensor:
    """Write the step's k and v into the caches at positions cache_seqlens[b] onward, in place,
    by their pages; the lengths after them (a new tensor)."""
    page_size, seqlen_new = k_cache.shape[1], k.shape[1]
    positions = cache_seqlens[:, None].long() + torch.arange(seqlen_new, device=k.device)
    pages = block_table.long().gather(1, positions // page_size)
    rows = positions % page_size
    k_cache[pages, rows] = k
    v_cache[pages, rows] = v
    return cache_seqlens + seqlen_new
