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

from fa_kernel.decode import compiled_decode_kernels, launch_tile, row_block, split_plan
from fa_kernel.device import device_target
from fa_kernel.interface import check_inputs
from fa_kernel.variants import Variants, exponent_scale, launch_arguments

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
    page_size = _check_cache(q, k_cache, v_cache, k, v, cache_seqlens, block_table)
    batch = q.shape[0]
    # flash_attn_func's checks, on views of the caches with q's batch (free: expand).
    k_view, v_view = (cache[:1].expand(batch, -1, -1, -1) for cache in (k_cache, v_cache))
    variants = dict(window_size=window_size, softcap=softcap, sinks=sinks)
    scale = check_inputs(q, k_view, v_view, softmax_scale, causal, **variants)
    if k is not None:
        cache_seqlens = _append(k_cache, v_cache, k, v, cache_seqlens, block_table)
    out, lse = _paged_attention(q, k_cache, v_cache, cache_seqlens, block_table, page_size, scale, causal, **variants)
    return (out, lse) if return_lse else out


def _check_cache(q, k_cache, v_cache, k, v, cache_seqlens, block_table) -> int:
    """Raise unless the caches, the new keys and the table have the shapes, dtypes and devices
    flash_attn_with_kvcache takes; the page size."""
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
    return page_size


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


def _paged_attention(q, k_cache, v_cache, cache_seqlens, block_table, page_size, scale, causal, window_size, softcap,
                     sinks):  # fmt: skip
    """(out, lse) by the paged split-KV kernels; the splits cover the table's capacity."""
    batch, seqlen_q, heads, head_dim = q.shape
    q = q if q.is_contiguous() else q.contiguous()
    sm_count, arch = device_target(q.device)
    tile = launch_tile(q, k_cache)
    heads_kv = k_cache.shape[2]
    row_blocks = -(-(heads // heads_kv * seqlen_q) // tile.block_m)
    splits, tiles_per_split = split_plan(batch, heads_kv, row_blocks, block_table.shape[1] * page_size, tile, sm_count)
    variants = Variants.of(causal, window_size, softcap, sinks)
    build = dict(head_dim=head_dim, causal=causal, dtype=str(q.dtype).removeprefix("torch."), arch=arch)
    block_m = row_block(head_dim, heads // heads_kv * seqlen_q)
    split_kernel, combine_kernel = compiled_decode_kernels(
        **build, block_m=block_m, variants=variants, page_size=page_size
    )
    split_values = launch_arguments(Variants.of(causal, window_size, softcap, None), window_size, softcap, scale, None)
    o_partial = q.new_empty((batch, splits, heads, seqlen_q, head_dim), dtype=torch.float32)
    lse_partial = q.new_empty((batch, splits, heads, seqlen_q), dtype=torch.float32)
    out = torch.empty_like(q)
    lse = q.new_empty((batch, heads, seqlen_q), dtype=torch.float32)
    with torch.cuda.device(q.device):
        arguments = (exponent_scale(scale, softcap), tiles_per_split, *split_values, block_table, cache_seqlens)
        split_kernel(q, k_cache, v_cache, o_partial, lse_partial, *arguments)
        combine_kernel(o_partial, lse_partial, out, lse, *([] if sinks is None else [sinks]))
    return out, lse
