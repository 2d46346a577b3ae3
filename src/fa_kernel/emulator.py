"""The kernel's tile loop in plain torch: an executable specification that runs on a CPU.

Same block sizes, same mask placement (written into the score accumulator before the
Q·Kᵀ GEMM adds to it, and only into the tiles that need one), exp2 with
softmax_scale·log2(e) folded in once, the cast of P to the input dtype before P·V, fp32
row state, one normalisation after the loop. Each statement matches one in `kernel.py`; a
change to the algorithm there belongs here too, and the CPU property suite checks this
loop on every push. The kernel's schedule (producer warpgroup, P·V of tile j-1 under the
softmax of tile j, ping-pong) reorders when work runs, not what it computes: acc_o still
sees, per tile, the rescale and then P·V (by 1, where a row kept its max).

Tensor cores multiply fp16/bf16 operands exactly and accumulate in fp32, which upcasting
the operands to fp32 before each matmul reproduces up to summation order.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from fa_kernel.configs import TileConfig, select_config, tiles_per_sm
from fa_kernel.numerics import LN2, LOG2E, STALE_SUM_LIMIT

H200_SM_COUNT = 132  # the SMs the default config is chosen for (its grid's band)


def attention_tiled(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    config: TileConfig | None = None,
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) as the kernel computes them; inputs [batch, seqlen, nheads, headdim].

    `config` defaults to the tiles the kernel uses on the H200 (sm_90, 132 SMs) for this shape.
    The variants are reference.attention_ref's: a window's tiles outside every row's edges are
    never loaded, and only tiles an edge cuts get a mask; a softcap c keeps each raw score x as
    tanh(x·scale / c), with c·log2e as the exponent's scale (_Cap), so the online softmax runs
    as it does without one, and the mask is then a select after it (an additive -inf before
    the GEMM would come out of tanh as -1); a sink joins each row's sum once, at the
    normalisation, against the larger of its max and the sink.
    """
    batch, seqlen_q, nheads, head_dim = q.shape
    nheads_kv = k.shape[2]
    group_size = nheads // nheads_kv
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    scale_log2 = softmax_scale * LOG2E
    grid = tiles_per_sm(batch, nheads, seqlen_q, H200_SM_COUNT)
    config = config or select_config("sm_90", head_dim, causal, k.shape[1], grid)
    out = torch.empty_like(q)
    lse = torch.empty(batch, nheads, seqlen_q, dtype=torch.float32)
    edges, cap = _Edges.of(causal, window_size), _Cap.of(softcap, softmax_scale)
    # One (batch, head) at a time, as the kernel's grid does: every head then runs the very
    # same torch ops on same-shaped tensors, so results do not depend on a head's position
    # (CPU kernels vectorise across a whole tensor and treat its tail differently).
    for b in range(batch):
        for head in range(nheads):
            kv_head = head // group_size  # GQA/MQA: a group of query heads shares a K/V head
            sink = None if sinks is None else float(sinks[head])
            out[b, :, head], lse[b, head] = _attend_one_head(
                q[b, :, head],
                k[b, :, kv_head],
                v[b, :, kv_head],
                scale_log2 if cap is None else cap.scale_log2,
                edges,
                config,
                cap,
                sink,
            )
    return out, lse


class _Edges(NamedTuple):
    """A row's window around its diagonal: keys from diagonal − left to diagonal + right (None:
    no edge on that side; causal is right = 0)."""

    left: int | None
    right: int | None

    @classmethod
    def of(cls, causal: bool, window_size: tuple[int, int]) -> _Edges:
        left, right = window_size
        return cls(None if left < 0 else left, 0 if causal else (None if right < 0 else right))

    @property
    def limit(self) -> bool:
        """Whether any edge is set (else every key before seqlen_k is seen)."""
        return self.left is not None or self.right is not None

    def hidden(self, keys: torch.Tensor, diagonals: torch.Tensor) -> torch.Tensor:
        """[rows, keys]: which keys (past seqlen_k aside) rows of these diagonals do not see."""
        hidden = torch.zeros(diagonals.shape[0], keys.shape[1], dtype=torch.bool)
        if self.right is not None:
            hidden |= keys > diagonals + self.right
        if self.left is not None:
            hidden |= keys < diagonals - self.left
        return hidden


class _Cap(NamedTuple):
    """The softcap c on raw scores x = q·k: the softmax takes c·tanh(x·scale / c). The kernels
    keep the tanh as the score and fold c into the exponent's scale (c·log2e in place of
    scale·log2e), in the forward and in the backward's recomputed scores alike; the backward's
    slope is then 1 − tanh²."""

    inner: float  # scale / c
    scale_log2: float  # c·log2e

    @classmethod
    def of(cls, softcap: float, softmax_scale: float) -> _Cap | None:
        return cls(softmax_scale / softcap, softcap * LOG2E) if softcap > 0 else None

    def apply(self, raw: torch.Tensor) -> torch.Tensor:
        """The scores as the kernels keep them: tanh(x·scale / c)."""
        return torch.tanh(raw * self.inner)


def _attend_one_head(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale_log2: float,
    edges: _Edges,
    config: TileConfig,
    cap: _Cap | None = None,
    sink: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One (batch, head): q [seqlen_q, head_dim], k and v [seqlen_k, head_dim] -> (out, lse)."""
    seqlen_q, head_dim = q.shape
    seqlen_k = k.shape[0]
    block_m, block_n = config.block_m, config.block_n
    # The last K/V tile reads past seqlen_k; like TMA, it gets zeros there, which the mask must hide.
    padded_k = -(-seqlen_k // block_n) * block_n
    k_all = torch.nn.functional.pad(k.float(), (0, 0, 0, padded_k - seqlen_k))
    v_all = torch.nn.functional.pad(v.float(), (0, 0, 0, padded_k - seqlen_k))
    out = torch.empty(seqlen_q, head_dim, dtype=q.dtype)
    lse = torch.empty(seqlen_q, dtype=torch.float32)
    diagonal_offset = seqlen_k - seqlen_q
    for q_start in range(0, seqlen_q, block_m):
        q_tile = q[q_start : q_start + block_m].float()
        rows = q_tile.shape[0]
        acc_o = torch.zeros(rows, head_dim)
        row_sum = torch.zeros(rows)
        row_max = torch.full((rows,), -math.inf)
        num_kv_blocks = -(-seqlen_k // block_n)
        first_block = 0
        if edges.right is not None:
            # Tiles right of this block's last visible key are never loaded; one tile always is.
            last_visible = q_start + block_m + diagonal_offset + edges.right
            num_kv_blocks = max(1, min(num_kv_blocks, -(-last_visible // block_n)))
        if edges.left is not None:
            # Nor tiles left of its first row's first key: the walk starts at that key's tile.
            first_block = min(max(0, q_start + diagonal_offset - edges.left) // block_n, num_kv_blocks - 1)
        for kv_block in range(first_block, num_kv_blocks):
            kv_start = kv_block * block_n
            k_tile = k_all[kv_start : kv_start + block_n]
            v_tile = v_all[kv_start : kv_start + block_n]
            acc_s = torch.zeros(rows, block_n)
            # Only a tile an edge cuts gets a mask: a key past seqlen_k, right of the block's
            # first row's last key, or left of its last row's first key.
            needs_mask = kv_start + block_n > seqlen_k
            if edges.right is not None:
                needs_mask = needs_mask or kv_start + block_n - 1 > q_start + diagonal_offset + edges.right
            if edges.left is not None:
                needs_mask = needs_mask or kv_start < q_start + block_m - 1 + diagonal_offset - edges.left
            masked = None
            if needs_mask:
                k_idx = torch.arange(kv_start, kv_start + block_n)[None, :]
                # Rows past seqlen_q (the last block's) follow the edges: their output is dropped.
                all_rows = torch.arange(q_start, q_start + block_m)[:, None] + diagonal_offset
                masked = ((k_idx >= seqlen_k) | edges.hidden(k_idx, all_rows))[:rows]
            if cap is None:
                if masked is not None:
                    # The mask goes into the accumulator before the GEMM, which adds Q.K^T to it.
                    acc_s = acc_s.masked_fill(masked, -math.inf)
                acc_s = acc_s + q_tile @ k_tile.T
            else:
                acc_s = cap.apply(q_tile @ k_tile.T)
                if masked is not None:
                    acc_s = acc_s.masked_fill(masked, -math.inf)  # a select, after the cap

            row_max_prev = row_max
            # amax passes a NaN score on where the kernel's max skips it; either way the NaN
            # reaches row_sum through its exponential, so the row ends NaN in both.
            row_max = torch.maximum(row_max_prev, acc_s.amax(dim=-1))
            if kv_block > first_block:
                # P~ against the max before this tile first (the walk's first tile has none): a
                # row keeps that max while its sum stays within the limit (the kernel then needs
                # no row max for the tile). Only a max it has: a row that has seen no key yet
                # (its earlier tiles hidden from it, or -inf) takes this tile's, or its keys'
                # weights, taken against a stand-in, could all underflow to 0.
                stale_scaled = torch.where(row_max_prev == -math.inf, 0.0, row_max_prev * scale_log2)
                stale_sum = torch.exp2(acc_s * scale_log2 - stale_scaled[:, None]).sum(dim=-1)
                moves = (stale_sum > STALE_SUM_LIMIT) | (row_max_prev == -math.inf)
                row_max = torch.where(moves, row_max, row_max_prev)
            # 0 stands in for the max of a row with no visible key yet: -inf - 0, not NaN.
            row_max_scaled = torch.where(row_max == -math.inf, 0.0, row_max * scale_log2)
            alpha = torch.where(row_max == row_max_prev, 1.0, torch.exp2(row_max_prev * scale_log2 - row_max_scaled))
            acc_s = torch.exp2(acc_s * scale_log2 - row_max_scaled[:, None])
            row_sum = row_sum * alpha + acc_s.sum(dim=-1)
            acc_p = acc_s.to(q.dtype)  # the only down-cast

            acc_o = acc_o * alpha[:, None]  # rescale before P.V adds this tile
            acc_o = acc_o + acc_p.float() @ v_tile

        # One normalisation after the loop; a row that saw no key (causal, Sq > Sk) is 0. A NaN
        # row sum is not 0: the NaN reaches the output and LSE (docs/nonfinite.md).
        row_max_scaled = torch.where(row_max == -math.inf, 0.0, row_max * scale_log2)
        if sink is not None:
            # The sink joins the sum once, against the larger of the row's max and itself (no
            # overflow either way); it adds no value to acc_o.
            sink_log2 = torch.tensor(sink * LOG2E)
            joint_max = torch.maximum(row_max_scaled, sink_log2)
            kept = torch.exp2(row_max_scaled - joint_max)
            acc_o = acc_o * kept[:, None]
            row_sum = row_sum * kept + torch.exp2(sink_log2 - joint_max)
            row_max_scaled = joint_max
        no_key = row_sum == 0
        out[q_start : q_start + rows] = torch.where(no_key[:, None], 0.0, acc_o / row_sum[:, None]).to(q.dtype)
        lse[q_start : q_start + rows] = torch.where(no_key, -math.inf, (row_max_scaled + torch.log2(row_sum)) * LN2)
    return out, lse


def attention_backward_tiled(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    block_m: int = 64,
    block_n: int = 128,
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) by FlashAttention-2's backward, tile by tile: the specification a backward
    kernel is to follow (none exists yet; block sizes are FlashAttention-3's at head_dim 128).

    D = rowsum(dO∘O) first (fp32, from the forward's O in the input dtype). Then each K/V tile
    of `block_n` keys keeps dK and dV in fp32 while it walks the query tiles of `block_m` rows
    that see any of its keys, for every query head of its GQA group: it recomputes P from S and
    the forward's saved LSE (no softmax), adds Pᵀ·dO to dV, forms dS = P∘(dO·Vᵀ − D) and adds
    dSᵀ·Q to dK and dS·K to dQ (fp32, as a kernel's atomics would). P and dS are the only
    down-casts, where they enter a GEMM. A row that sees no key (LSE −inf) has P = 0.

    The variants (attention_tiled's): a K/V tile walks only the query tiles whose rows' windows
    reach it; a softcap's scores are recomputed capped, and dS is multiplied by the cap's slope
    1 − tanh²; sinks are already in the LSE (P is right as it is), and dsinks (fp32, returned
    fourth) is −Σ 2^(sink·log2e − LSE₂)·D over each head's rows, summed with D.
    """
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    group_size = nheads // nheads_kv
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    scale_log2 = softmax_scale * LOG2E
    # LSE in log2 units; +inf for a row without a key, so that its P = 2^(S - inf) is 0.
    lse_log2 = torch.where(lse == -math.inf, math.inf, lse * LOG2E)
    delta = (dout.float() * out.float()).sum(dim=-1)  # [batch, seqlen_q, nheads]
    edges = _Edges.of(causal, window_size)
    cap = _Cap.of(softcap, softmax_scale)
    if cap is not None:
        scale_log2 = cap.scale_log2
    dq = torch.zeros(q.shape, dtype=torch.float32)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    diagonal_offset = seqlen_k - seqlen_q
    for b in range(batch):
        for kv_head in range(nheads_kv):
            for kv_start in range(0, seqlen_k, block_n):
                k_tile = k[b, kv_start : kv_start + block_n, kv_head].float()
                v_tile = v[b, kv_start : kv_start + block_n, kv_head].float()
                keys = k_tile.shape[0]
                k_idx = torch.arange(kv_start, kv_start + keys)[None, :]
                acc_dk = torch.zeros(keys, head_dim)
                acc_dv = torch.zeros(keys, head_dim)
                # Right edge: rows before the first whose window reaches this tile's first key add
                # nothing; left edge: nor rows from the first whose window starts past its last.
                first_q = 0 if edges.right is None else max(0, kv_start - diagonal_offset - edges.right)
                end_q = seqlen_q
                if edges.left is not None:
                    end_q = max(0, min(seqlen_q, kv_start + keys - diagonal_offset + edges.left))
                for head in range(kv_head * group_size, (kv_head + 1) * group_size):
                    for q_start in range(first_q // block_m * block_m, end_q, block_m):
                        rows = slice(q_start, q_start + block_m)
                        q_tile = q[b, rows, head].float()
                        do_tile = dout[b, rows, head].float()
                        q_idx = torch.arange(q_start, q_start + q_tile.shape[0])[:, None]
                        acc_s = q_tile @ k_tile.T
                        if cap is not None:
                            acc_s = tanh = cap.apply(acc_s)
                        if edges.limit:
                            acc_s = acc_s.masked_fill(edges.hidden(k_idx, q_idx + diagonal_offset), -math.inf)
                        probs = torch.exp2(acc_s * scale_log2 - lse_log2[b, head, rows][:, None])
                        acc_dv += probs.to(q.dtype).float().T @ do_tile
                        grad_s = probs * (do_tile @ v_tile.T - delta[b, rows, head][:, None])
                        if cap is not None:
                            grad_s = grad_s * (1 - tanh * tanh)
                        grad_s = grad_s.to(q.dtype).float()
                        acc_dk += grad_s.T @ q_tile
                        dq[b, rows, head] += grad_s @ k_tile * softmax_scale
                dk[b, kv_start : kv_start + block_n, kv_head] = (acc_dk * softmax_scale).to(k.dtype)
                dv[b, kv_start : kv_start + block_n, kv_head] = acc_dv.to(v.dtype)
    if sinks is None:
        return dq.to(q.dtype), dk, dv
    sink_probs = torch.exp2(sinks.float()[None, :, None] * LOG2E - lse_log2)  # [batch, nheads, seqlen_q]
    dsinks = -(sink_probs * delta.transpose(1, 2)).sum(dim=(0, 2))
    return dq.to(q.dtype), dk, dv, dsinks
