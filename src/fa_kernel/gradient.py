"""The gradient's launch: `backward_into` writes flash_attn_func's gradients into the caller's
tensors. D = rowsum(dO∘O) and the LSE in base 2 come from the preprocess kernel; dK and dV from
the dK/dV kernel, on the atomic path with dQ's fp32 sums added into one accumulator, cast once
here, or on the fixed-order path with dQ from a kernel of its own (`fa_kernel.backward_dq`),
as `configs.gradient_plan` routes each launch. A GQA group split between blocks leaves fp32
partial dK and dV, summed here in a fixed order. The sinks' gradient is computed here from D
and the LSE (`sink_gradient`).
"""

from __future__ import annotations

import dataclasses

import torch

from fa_kernel.backward import compiled_gradient_kernels, heavy_first_order
from fa_kernel.backward_preprocess import dq_row, padded_rows
from fa_kernel.configs import HEAD_SPLIT_DIMS, gradient_plan, pairs_per_group
from fa_kernel.device import DTYPE_NAMES, device_target
from fa_kernel.mask import Visibility
from fa_kernel.numerics import LOG2E
from fa_kernel.variants import Variants, exponent_scale, launch_arguments


def backward_into(
    dq,
    dk,
    dv,
    dout,
    grad_lse,
    q,
    k,
    v,
    out,
    lse,
    softmax_scale: float,
    causal: bool,
    deterministic: bool = False,
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    head_splits: int | None = None,
    route: bool = True,
) -> torch.Tensor | None:
    """The gradients of flash_attn_func's (out, lse) against (dout, grad_lse; None: 0), written
    into the caller's contiguous dq, dk, dv: the `fa_kernel::backward` op's launch (the tests
    hand it outputs filled with NaN, so that an element no thread block writes fails).
    `deterministic`: dq from the fixed-order kernel, as configs.gradient_plan also routes it unless
    `route` is False (the kernels' tests). `head_splits`: the blocks each K/V tile's GQA group is
    split between (1 to the group, more at HEAD_SPLIT_DIMS; tests and perf: dq then as
    `deterministic` says), None: gradient_plan's. Returns dsinks (fp32 [nheads]) with sinks, else None."""
    batch, seqlen_q, nheads, head_dim = q.shape
    _, seqlen_k, nheads_kv, _ = k.shape
    group = nheads // nheads_kv
    most_splits = group if head_dim in HEAD_SPLIT_DIMS else 1
    if head_splits is not None and not 1 <= head_splits <= most_splits:
        raise ValueError(
            f"head_splits: expected 1 to the GQA group's {group} heads (more than 1 at "
            f"head_dim {' or '.join(map(str, HEAD_SPLIT_DIMS))}), got {head_splits} at head_dim {head_dim}"
        )
    if dq.numel() == 0 or dk.numel() == 0:
        # No query rows, or no keys: no score exists, and every gradient is 0 but the sinks'.
        for grad in (dq, dk, dv):
            grad.zero_()
        if sinks is None:
            return None
        delta = (dout.float() * out.float()).sum(dim=-1).transpose(1, 2)  # [batch, nheads, seqlen_q]
        return sink_gradient(sinks, lse * LOG2E, delta if grad_lse is None else delta - grad_lse)
    dtype, (sm_count, arch) = DTYPE_NAMES[q.dtype], device_target(q.device)
    # The kernels assume dense BSHD strides: these are the backward's documented copies (an
    # upstream gradient is often a broadcast view).
    dout, q, k, v, out = (t if t.is_contiguous() else t.contiguous() for t in (dout, q, k, v, out))
    rows = padded_rows(seqlen_q)
    delta = torch.empty((batch, nheads, rows), dtype=torch.float32, device=q.device)
    lse_log2 = torch.empty_like(delta)
    variants = Variants.of(causal, window_size, softcap, sinks)
    fixed_order, splits = deterministic, head_splits  # as the caller forces them, or as planned
    if splits is None:
        rule = Visibility.of_window(seqlen_q, seqlen_k, causal, window_size)
        fixed_order, splits = gradient_plan(batch, rule, nheads_kv, group, head_dim, sm_count, deterministic, route)
    preprocess, dk_dv, dq_kernel = compiled_gradient_kernels(
        head_dim=head_dim, causal=causal, dtype=dtype, arch=arch, deterministic=fixed_order, variants=variants,
        head_splits=splits > 1,
    )  # fmt: skip
    heavy_first = heavy_first_order(causal, variants, varlen=False, head_splits=splits > 1)
    launch_order = (pairs_per_group(seqlen_k, head_dim, sm_count),) if heavy_first else ()
    # A GQA group split between blocks: each block's dK and dV are fp32 partial sums, summed here
    # over the splits in a fixed order (backward_program's head_splits).
    dk_part, dv_part = dk, dv
    if splits > 1:
        dk_part, dv_part = (torch.empty((splits, *k.shape), dtype=torch.float32, device=q.device) for _ in range(2))
    # The sinks are in the LSE already (P is right as it is): the kernels take the window and the
    # cap, and dsinks comes from Delta and the LSE here.
    kernel_variants = dataclasses.replace(variants, sinks=False)
    scales = (exponent_scale(softmax_scale, softcap), softmax_scale)
    scales += tuple(launch_arguments(kernel_variants, window_size, softcap, softmax_scale, None))
    # dQ's fp32 sums for the atomic kernel (rows and columns padded: backward_preprocess.dq_row); a
    # one-element placeholder for the fixed-order dQ's.
    accum_shape = (batch, nheads, rows, dq_row(head_dim)) if dq_kernel is None else (1,)
    dq_accum = torch.zeros(accum_shape, dtype=torch.float32, device=q.device)
    with torch.cuda.device(q.device):
        preprocess(out, dout, lse.contiguous(), delta, lse_log2)
        if grad_lse is not None:
            # d LSE_i / d S_ij = P_ij: an upstream gradient of the LSE joins dS = P∘(dP − D) as −D.
            delta[:, :, :seqlen_q] -= grad_lse
        dk_dv(q, k, v, dout, delta, lse_log2, dq_accum, dk_part, dv_part, *scales, *launch_order)
        if splits > 1:
            dk.copy_(dk_part.sum(dim=0))
            dv.copy_(dv_part.sum(dim=0))
        if dq_kernel is not None:
            dq_kernel(q, k, v, dout, delta, lse_log2, dq, *scales)
        else:
            # dQ = softmax_scale · Σ dS·K, summed in fp32 by the kernel, cast once.
            torch.mul(dq_accum[:, :, :seqlen_q, :head_dim].transpose(1, 2), softmax_scale, out=dq)
    return None if sinks is None else sink_gradient(sinks, lse_log2[:, :, :seqlen_q], delta[:, :, :seqlen_q])


def sink_gradient(sinks: torch.Tensor, lse_log2: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """dsinks[h] = −Σ over h's rows of P_sink·D, P_sink = exp(sink − LSE) the weight the sink took
    and D = rowsum(dO∘O) (minus the LSE's upstream gradient): fp32 [nheads]."""
    sink_weights = torch.exp2(sinks[None, :, None] * LOG2E - lse_log2)
    return -(sink_weights * delta).sum(dim=(0, 2))
