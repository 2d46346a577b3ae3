"""The reference backward: attention_ref's gradients in closed form, the same-precision baseline
of a backward kernel, and the gradient judge (flash-attn's rule, with the fp32 terms a kernel
may add where the baseline has none). Tolerances as in `fa_kernel.reference`: derived, never
tuned."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from fa_kernel.numerics import TANH_ERROR
from fa_kernel.reference import (
    Bound,
    ErrorReport,
    capped,
    error_figures,
    largest_finite_abs,
    lse_tolerance,
    matmul_fp32_accumulate,
    repeat_kv,
    report_of,
    softmax_with_sinks,
    unit_roundoff,
    visible_keys,
)


def attention_backward_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    upcast: bool = True,
    compute_dtype: torch.dtype = torch.float32,
    grad_lse: torch.Tensor | None = None,
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv), and dsinks [nheads] where `sinks` are given: the gradient of attention_ref's
    output against `dout` (and of its LSE against `grad_lse` [batch, nheads, seqlen_q], where
    given), from its closed form.

    With S = softmax_scale·Q·Kᵀ (masked), P = softmax(S) and O = P·V:
        dV = Pᵀ·dO,   dP = dO·Vᵀ,   D = rowsum(dO∘O) − dLSE,   dS = P∘(dP − D),
        dQ = softmax_scale·dS·K,   dK = softmax_scale·dSᵀ·Q
    (∂LSE_i/∂S_ij = P_ij, so an LSE gradient joins dS as −D).
    GQA sums dK and dV over each K/V head's group of query heads. A row that sees no key has
    P = 0: it adds nothing to dK and dV and its dQ is 0, never NaN.
    A softcap S = c·tanh(S₀ / c) of the scaled scores S₀ passes dS on times its slope
    1 − tanh²(S₀ / c); a window only hides more keys. A sink's weight P_sink = exp(sink − LSE)
    has no value, so dsink_h = −Σ over the head's rows of P_sink·D.

    upcast=True is the reference: every step in `compute_dtype`, gradients returned in it.
    upcast=False is the same-precision baseline: the inputs, O, and P and dS where they feed a
    GEMM are in the input dtype, the GEMMs accumulate in fp32 (`matmul_fp32_accumulate`), and
    the gradients come back in the input dtype: what a backward kernel of that precision keeps.
    """
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    options: dict[str, Any] = dict(window_size=window_size, softcap=softcap, sinks=sinks)
    parts = _BackwardParts.of(q, k, v, dout, causal, softmax_scale, upcast, compute_dtype, grad_lse, **options)
    return parts.gradients()


@dataclass(frozen=True)
class _BackwardParts:
    """The backward's per-head tensors, [batch, nheads, seqlen, ·] (K and V repeated over each
    GQA group's heads): computed once, for the gradients and for their fp32 error terms."""

    qh: torch.Tensor
    kh: torch.Tensor
    vh: torch.Tensor
    dout_h: torch.Tensor
    out_h: torch.Tensor  # O as the forward of this precision gives it
    probs: torch.Tensor  # P, 0 on rows that see no key (the sink's weight not among them)
    grad_probs: torch.Tensor  # dP = dO·Vᵀ
    delta: torch.Tensor  # D = rowsum(dO∘O)
    softmax_scale: float
    upcast: bool
    dtype: torch.dtype  # the inputs'
    nheads_kv: int
    cap_slope: torch.Tensor | None  # 1 − tanh²(S₀ / softcap) where capped
    sink_probs: torch.Tensor | None  # P_sink = exp(sink − LSE) [b, h, q, 1] where sinks are given

    @classmethod
    def of(
        cls,
        q,
        k,
        v,
        dout,
        causal,
        softmax_scale,
        upcast,
        compute_dtype,
        grad_lse=None,
        *,
        window_size=(-1, -1),
        softcap=0.0,
        sinks=None,
    ) -> _BackwardParts:
        nheads = q.shape[2]
        qh, dout_h = q.transpose(1, 2), dout.transpose(1, 2)
        kh, vh = (repeat_kv(t, nheads).transpose(1, 2) for t in (k, v))
        if upcast:
            qh, kh, vh, dout_h = (t.to(compute_dtype) for t in (qh, kh, vh, dout_h))
        matmul = _backward_matmul(upcast)
        visible = visible_keys(q.shape[1], k.shape[1], causal, device=q.device, window_size=window_size)
        raw = matmul(qh, kh.transpose(-1, -2)) * softmax_scale
        cap_slope = 1 - torch.tanh(raw / softcap) ** 2 if softcap > 0 else None
        scores = capped(raw, softcap).masked_fill(~visible, -math.inf)
        del raw  # [b, h, q, k]: not held while the rest is computed
        lse, probs, _ = softmax_with_sinks(scores, sinks)
        sink_probs = None
        if sinks is not None:
            sink_probs = torch.exp(sinks.to(probs.dtype).view(1, -1, 1, 1) - lse.to(probs.dtype).unsqueeze(-1))
        # O as attention_ref gives it in this precision (P down-cast before P.V in the baseline).
        out_h = matmul(probs if upcast else probs.to(q.dtype), vh)
        out_h = out_h if upcast else out_h.to(q.dtype)
        delta = (dout_h.to(probs.dtype) * out_h.to(probs.dtype)).sum(dim=-1, keepdim=True)
        if grad_lse is not None:
            delta = delta - grad_lse.to(probs.dtype).unsqueeze(-1)
        grad_probs = matmul(dout_h, vh.transpose(-1, -2))
        return cls(
            qh,
            kh,
            vh,
            dout_h,
            out_h,
            probs,
            grad_probs,
            delta,
            softmax_scale,
            upcast,
            q.dtype,
            k.shape[2],
            cap_slope,
            sink_probs,
        )

    def gradients(self) -> tuple[torch.Tensor, ...]:
        """(dq, dk, dv), and dsinks (fp32, or the compute dtype) where there are sinks."""
        matmul = _backward_matmul(self.upcast)
        probs, grad_scores = self.probs, self.probs * (self.grad_probs - self.delta)
        if self.cap_slope is not None:
            grad_scores = grad_scores * self.cap_slope
        if not self.upcast:  # P and dS enter their GEMMs in the input dtype, as a kernel's do
            probs, grad_scores = probs.to(self.dtype), grad_scores.to(self.dtype)
        dq = (matmul(grad_scores, self.kh) * self.softmax_scale).transpose(1, 2)
        dk = self.per_kv_head(matmul(grad_scores.transpose(-1, -2), self.qh) * self.softmax_scale)
        dv = self.per_kv_head(matmul(probs.transpose(-1, -2), self.dout_h))
        grads = (dq, dk, dv) if self.upcast else (dq.to(self.dtype), dk.to(self.dtype), dv.to(self.dtype))
        if self.sink_probs is None:
            return grads
        return (*grads, -(self.sink_probs * self.delta).sum(dim=(0, 2, 3)))

    def per_kv_head(self, grad: torch.Tensor) -> torch.Tensor:
        """[b, nheads, s, d] summed over each GQA group -> [b, s, nheads_kv, d]."""
        grad = grad.unflatten(1, (self.nheads_kv, grad.shape[1] // self.nheads_kv)).sum(dim=2)
        return grad.transpose(1, 2)


def _backward_matmul(upcast: bool):
    """The reference multiplies in its compute dtype; the baseline as tensor cores do."""
    return torch.matmul if upcast else matmul_fp32_accumulate


@dataclass(frozen=True)
class BackwardVerdict:
    """A kernel's (dq, dk, dv) judged against the reference backward, each with its bound."""

    reports: dict[str, ErrorReport]
    bounds: dict[str, Bound]

    @property
    def passed(self) -> bool:
        return all(self.bounds[name].admits(report) for name, report in self.reports.items())

    def __str__(self) -> str:
        return "; ".join(f"{name} {report} vs {self.bounds[name]}" for name, report in self.reports.items())


GRADIENTS = ("dq", "dk", "dv")


def judge_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    grads: tuple[torch.Tensor, ...],
    causal: bool = False,
    softmax_scale: float | None = None,
    grad_lse: torch.Tensor | None = None,
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> BackwardVerdict:
    """Judge (dq, dk, dv), and dsinks where there are sinks, with flash-attn's rule for
    gradients: each within twice the error of the same-precision baseline, plus
    2·max|(g + 0.3 − 0.3) − g| over the reference gradient g rounded to the input dtype (a
    gradient the baseline happens to get exact must still be rounded once; dsinks is fp32 and
    takes none), plus the fp32 error a kernel may add where the baseline had none
    (`_gradient_fp32_terms`). `grad_lse`: an upstream gradient of the LSE as well (None: 0).
    Every figure is computed on the device and read back at once."""
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    options: dict[str, Any] = dict(window_size=window_size, softcap=softcap, sinks=sinks)
    parts = _BackwardParts.of(q, k, v, dout, causal, scale, True, torch.float32, grad_lse, **options)
    reference = parts.gradients()
    baseline = _BackwardParts.of(q, k, v, dout, causal, scale, False, torch.float32, grad_lse, **options).gradients()
    fp32_terms = _gradient_fp32_terms(parts, lse_tolerance(q, k, scale, softcap), softcap)
    if len(grads) != len(reference):
        raise ValueError(f"grads: expected {len(reference)} gradients ({', '.join(GRADIENTS)}), got {len(grads)}")
    figures = []
    for grad, ref, base, fp32_term in zip(grads, reference, baseline, fp32_terms, strict=True):
        rounded = ref.to(q.dtype) if ref.dim() > 1 else ref
        rounding_err = 2 * largest_finite_abs((rounded + 0.3) - 0.3 - rounded)
        baseline_err = error_figures(base, ref)[0]
        atol = 2 * baseline_err + rounding_err + fp32_term
        figures += [torch.stack([baseline_err, rounding_err, atol]), error_figures(grad, ref, atol)]
    values = torch.cat(figures).tolist()
    reports, bounds = {}, {}
    for index, (name, ref) in enumerate(zip(GRADIENTS + ("dsinks",), reference, strict=False)):
        baseline_err, rounding_err, atol, *report = values[8 * index : 8 * index + 8]
        bounds[name] = Bound(baseline_max_abs=baseline_err, rounding_max_abs=rounding_err, atol=atol, rtol=0.0)
        reports[name] = report_of(report, ref.numel())
    return BackwardVerdict(reports, bounds)


def _gradient_fp32_terms(parts: _BackwardParts, lse_atol: torch.Tensor, softcap: float = 0.0) -> list[torch.Tensor]:
    """[dq, dk, dv] (and dsinks where there are sinks): worst-case errors of a backward kernel
    that the baseline may not show, from the reference's `parts` and the forward's LSE bound.

    dS = P∘(dP − D) is a difference of two fp32 dot products of length D (dP = dO·Vᵀ by a GEMM,
    D = rowsum(dO∘O) by a sum) that cancel where P is near one-hot, and the kernel recomputes P
    from the saved LSE rather than by a softmax. Each dot product errs by at most
    D·u·Σ|x||y| (u = 2^-24, any summation order), and P by a relative 2·lse_atol (the score's
    and the LSE's errors, lse_bound); so |ΔdS| ≤ E = P·(D·u·(|dO|·|V|ᵀ + rowsum|dO∘O|)
    + |dP − D|·2·lse_atol), and the gradients move by at most softmax_scale·E·|K|,
    softmax_scale·Eᵀ·|Q| and (P·2·lse_atol)ᵀ·|dO|. Where the baseline's two dot products round
    alike (one key: dS is exactly 0 there, as in exact arithmetic) this is the whole margin.
    D is summed from the forward's O, rounded to the input dtype: |ΔO| ≤ u'·|O| elementwise (u'
    that dtype's unit roundoff; the forward's fp32 error before the rounding is orders smaller),
    so |ΔD| ≤ Σ u'·|dO∘O| more in E. The baseline shows none of it where P is one-hot: its O is
    then a row of V, exact in the input dtype (large logits: dQ 0.034 off with a bound of 0.009).

    A softcap scales dS by its slope 1 − tanh², which the kernel's tanh (numerics.TANH_ERROR)
    moves by at most 2·TANH_ERROR: E becomes E·slope + |dS|·2·TANH_ERROR. dsinks =
    −Σ P_sink·D over a head's rows: P_sink errs by a relative 2·lse_atol and D as above, and
    the fp32 sum of the head's n rows adds n·u·Σ|P_sink·D|."""
    u = torch.finfo(torch.float32).eps / 2
    head_dim, scale = parts.qh.shape[-1], parts.softmax_scale
    dout_h, out_h, probs = parts.dout_h, parts.out_h, parts.probs
    p_rel = 2 * lse_atol.float()
    dots = (
        head_dim * u * (dout_h.abs() @ parts.vh.abs().transpose(-1, -2) + (dout_h * out_h).abs().sum(-1, keepdim=True))
    )
    delta_err = unit_roundoff(parts.dtype) * (dout_h * out_h).abs().sum(-1, keepdim=True)
    grad_s_err = probs * (dots + delta_err + (parts.grad_probs - parts.delta).abs() * p_rel)
    if parts.cap_slope is not None:
        grad_scores = probs * (parts.grad_probs - parts.delta)
        grad_s_err = grad_s_err * parts.cap_slope + grad_scores.abs() * 2 * TANH_ERROR
    terms = [
        scale * (grad_s_err @ parts.kh.abs()),
        scale * parts.per_kv_head(grad_s_err.transpose(-1, -2) @ parts.qh.abs()),
        parts.per_kv_head((probs * p_rel).transpose(-1, -2) @ dout_h.abs()),
    ]
    if parts.sink_probs is not None:
        delta_dot_err = head_dim * u * (dout_h * out_h).abs().sum(-1, keepdim=True)
        per_row = parts.sink_probs * (delta_dot_err + delta_err + parts.delta.abs() * p_rel)
        rows = parts.delta.shape[0] * parts.delta.shape[2]
        terms.append(per_row.sum(dim=(0, 2, 3)) + rows * u * (parts.sink_probs * parts.delta).abs().sum(dim=(0, 2, 3)))
    return [largest_finite_abs(term) for term in terms]
