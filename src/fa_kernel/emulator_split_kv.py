"""The split-KV kernels of `decode.py` in plain torch: their algorithm, runnable on a CPU.

Each row (a query of one head) is split along its keys into runs of `tiles_per_split` K/V
tiles of `block_n` keys. Per split, the forward's online softmax over the split's tiles, the
mask a select after Q·Kᵀ (keys past seqlen_k, right of the diagonal), P cast to the input
dtype before P·V, one normalisation: O_s (fp32) and lse_s = log2 of the split's sum of
exponentials, −inf where the row sees none of its keys. Then the combine:
LSE₂ = log2 Σₛ 2^lseₛ and O = Σₛ 2^(lseₛ − LSE₂)·Oₛ over the splits the row sees a key of.
The kernel packs a GQA group's heads into one tile's rows; rows are independent, so the
packing changes which thread block computes a row, not what it computes.

The variants (attention_tiled's): with a left edge the splits cover the K/V tiles from the one
holding the first query's first key (`variants.window_first_tile`), each row's window a select after
Q·Kᵀ; a softcap keeps the score as tanh(x·scale / c), c·log2e the exponent's scale, and the
select after the cap; a sink joins each row's sum once, in the combine, against the larger of
the splits' LSE and itself.
"""

from __future__ import annotations

import math

import torch

from fa_kernel.numerics import LN2, LOG2E
from fa_kernel.variants import window_first_tile


def attention_split_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None,
    causal: bool,
    block_n: int,
    tiles_per_split: int,
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) as the split-KV kernels compute them; inputs [batch, seqlen, heads, headdim]."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    cap = (scale / softcap) if softcap > 0 else None  # the score kept is tanh(x·cap)
    scale_log2 = (softcap if softcap > 0 else scale) * LOG2E
    left, right = window_size
    edges = (None if left < 0 else left, 0 if causal else (None if right < 0 else right))
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads, seqlen_q, dtype=torch.float32)
    split_keys = block_n * tiles_per_split
    first_key = window_first_tile(seqlen_q, seqlen_k, left, block_n) * block_n
    splits = range(first_key, max(seqlen_k, first_key + 1), split_keys)  # one split without keys where there are none
    for b in range(batch):
        for head in range(heads):
            kv_head = head // (heads // heads_kv)
            q_head, k_head, v_head = q[b, :, head], k[b, :, kv_head], v[b, :, kv_head]
            partials = [
                _split_partial(q_head, k_head, v_head, scale_log2, edges, block_n, keys, cap)
                for keys in (range(start, min(start + split_keys, seqlen_k), block_n) for start in splits)
            ]
            sink = None if sinks is None else float(sinks[head]) * LOG2E
            out[b, :, head], lse[b, head] = _combine(partials, q.dtype, sink)
    return out, lse


def _split_partial(q, k, v, scale_log2, edges, block_n, tile_starts, cap=None):
    """One split of one head, over the K/V tiles starting at `tile_starts`: (O_s fp32
    [seqlen_q, head_dim], lse_s [seqlen_q], log2 units)."""
    seqlen_q, head_dim = q.shape
    seqlen_k = k.shape[0]
    acc_o = torch.zeros(seqlen_q, head_dim)
    row_sum = torch.zeros(seqlen_q)
    row_max = torch.full((seqlen_q,), -math.inf)
    query = torch.arange(seqlen_q)[:, None]
    for kv_start in tile_starts:
        key = torch.arange(kv_start, kv_start + block_n)[None, :]
        k_tile = torch.nn.functional.pad(k[kv_start : kv_start + block_n].float(), (0, 0, 0, block_n))[:block_n]
        v_tile = torch.nn.functional.pad(v[kv_start : kv_start + block_n].float(), (0, 0, 0, block_n))[:block_n]
        scores = q.float() @ k_tile.T
        if cap is not None:
            scores = torch.tanh(scores * cap)
        left, right = edges
        diagonal = query + seqlen_k - seqlen_q
        visible = key < seqlen_k
        if right is not None:
            visible = visible & (key <= diagonal + right)
        if left is not None:
            visible = visible & (key >= diagonal - left)
        scores = torch.where(visible, scores, -math.inf)
        row_max_prev = row_max
        row_max = torch.maximum(row_max_prev, scores.amax(dim=1))
        row_max_scaled = torch.where(row_max == -math.inf, 0.0, row_max * scale_log2)
        alpha = torch.where(row_max == row_max_prev, 1.0, torch.exp2(row_max_prev * scale_log2 - row_max_scaled))
        p = torch.exp2(scores * scale_log2 - row_max_scaled[:, None])
        row_sum = row_sum * alpha + p.sum(dim=1)
        acc_o = acc_o * alpha[:, None] + p.to(q.dtype).float() @ v_tile
    row_max_scaled = torch.where(row_max == -math.inf, 0.0, row_max * scale_log2)
    seen = row_sum != 0
    out = torch.where(seen[:, None], acc_o / torch.where(seen, row_sum, 1.0)[:, None], 0.0)
    return out, torch.where(seen, row_max_scaled + torch.log2(row_sum), -math.inf)


def _combine(partials, dtype, sink_log2=None):
    """The splits of one head weighed by their LSE, a sink (log2 units) joining the sum: (out
    [seqlen_q, head_dim], lse, natural log)."""
    outs = torch.stack([out for out, _ in partials])
    lses = torch.stack([lse for _, lse in partials])
    lse_max = lses.amax(dim=0)
    if sink_log2 is not None:
        lse_max = torch.clamp(lse_max, min=sink_log2)
    reference = torch.where(lse_max == -math.inf, 0.0, lse_max)
    weights = torch.exp2(lses - reference).sum(dim=0)
    if sink_log2 is not None:
        weights = weights + torch.exp2(sink_log2 - reference)
    lse = torch.where(weights == 0, -math.inf, reference + torch.log2(weights))
    # A split the row sees no key of is left out (not 0 * its O).
    terms = torch.where((lses != -math.inf)[..., None], torch.exp2(lses - lse)[..., None] * outs, 0.0)
    return terms.sum(dim=0).to(dtype), lse * LN2
