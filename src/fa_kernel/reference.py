"""Reference attention, the same-precision baseline, and error metrics.

Tolerances follow flash-attn's tests: a kernel is judged against an fp32 (or fp64)
reference, and may be at most twice as far from it as the same computation done by
PyTorch in the input dtype, plus one rounding of the output to that dtype. A bound derived
this way scales with shape, dtype and input distribution by itself; no number in it was
tuned to make a test pass.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from fa_kernel.numerics import TANH_ERROR


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    upcast: bool = True,
    compute_dtype: torch.dtype = torch.float32,
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain attention over [batch, seqlen, nheads, headdim] inputs; returns (out, lse).

    upcast=True is the reference: every step in `compute_dtype` (fp32, or fp64 where fp32
    is not enough), out returned in that dtype. upcast=False is the same-precision
    baseline: what PyTorch does with these inputs on tensor cores, keeping in the input
    dtype everything the kernel keeps there (inputs, the probabilities P fed to P.V, the
    output) and accumulating in fp32 as the tensor cores do (`_matmul_fp32_accumulate`).
    Where scores are large the tensor cores' fp32 accumulation, not the input rounding,
    dominates the output's error; an fp32 GEMM on CUDA cores would miss that share. It
    differs from the kernel only in algorithm (no tiles, no online softmax, P normalised
    before the cast), so its error is the error any correct kernel of this precision has.

    Semantics match `fa_kernel.flash_attn_func`: GQA by head groups, bottom-right causal
    alignment, output 0 and LSE -inf for a query that sees no key. NaN and Inf inputs
    (docs/nonfinite.md): the mask replaces the scores of hidden keys, so no q or K value
    reaches a row through a key it cannot see; a score of +inf leaves the row's softmax
    undefined, NaN output and LSE; a row whose every score is -inf (no key, or -Inf inputs)
    outputs 0 with LSE -inf; P.V is a GEMM over all keys, so a NaN or Inf in V reaches every
    row that has a key, through 0 times NaN where the key is hidden.

    The variants, as flash-attn has them: `window_size` = (left, right) keys around each row's
    diagonal (`visible_keys`); `softcap` > 0 turns each scaled score s into softcap·tanh(s /
    softcap), before the mask; `sinks` [nheads] (fp32) adds exp(sinks[h]) to every row's softmax
    denominator with no value, so the LSE includes it, P sums to less than 1, and a row that
    sees no key has output 0 and LSE sinks[h].
    """
    dtype = q.dtype
    seqlen_q, nheads, head_dim = q.shape[1], q.shape[2], q.shape[3]
    seqlen_k = k.shape[1]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    visible = visible_keys(seqlen_q, seqlen_k, causal, device=q.device, window_size=window_size)
    if upcast:
        q, k, v = (t.to(compute_dtype) for t in (q, k, v))
        scores = masked_scores(q, k, causal, softmax_scale, window_size=window_size, softcap=softcap)
    else:
        scores = _matmul_fp32_accumulate(q.transpose(1, 2), _repeat_kv(k, nheads).permute(0, 2, 3, 1)) * softmax_scale
        scores = capped(scores, softcap).masked_fill(~visible, -math.inf)
    lse, probs, no_key = _softmax_with_sinks(scores, sinks)
    lse = lse.float()
    if upcast:
        out = torch.einsum("bhqk,bkhd->bqhd", probs, _repeat_kv(v, nheads))
        return out.masked_fill(no_key.transpose(1, 2), 0.0), lse
    out = _matmul_fp32_accumulate(probs.to(dtype), _repeat_kv(v, nheads).transpose(1, 2)).masked_fill(no_key, 0.0)
    return out.transpose(1, 2).to(dtype), lse


def _matmul_fp32_accumulate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b over the two last dimensions, operands in their (half) dtype, accumulated and
    returned in fp32: on a GPU, PyTorch's tensor-core GEMM with an fp32 result (the
    accumulation a kernel's wgmma does, with the hardware's own rounding of the partial
    sums); on a CPU, which has no tensor cores, the operands upcast exactly to fp32."""
    if a.is_cuda:
        batch_shape = a.shape[:-2]
        result = torch.bmm(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]), out_dtype=torch.float32)
        return result.view(*batch_shape, a.shape[-2], b.shape[-1])
    return a.float() @ b.float()


def masked_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    causal: bool,
    softmax_scale: float,
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
) -> torch.Tensor:
    """[batch, nheads, seqlen_q, seqlen_k]: scaled (and capped) scores in q's dtype, -inf where a
    query may not see a key; K heads are shared by query-head groups (GQA)."""
    scores = torch.einsum("bqhd,bkhd->bhqk", q, _repeat_kv(k, q.shape[2]).to(q.dtype)) * softmax_scale
    visible = visible_keys(q.shape[1], k.shape[1], causal, device=q.device, window_size=window_size)
    return capped(scores, softcap).masked_fill(~visible, -math.inf)


def capped(scores: torch.Tensor, softcap: float) -> torch.Tensor:
    """softcap·tanh(scores / softcap) where softcap > 0 (Gemma 2's logit cap), else the scores."""
    return softcap * torch.tanh(scores / softcap) if softcap > 0 else scores


def _softmax_with_sinks(
    scores: torch.Tensor, sinks: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lse, P, rows that see no key) of masked scores [b, h, q, k], each row's denominator
    joined by exp(sinks[h]) where sinks are given (a logit without a value)."""
    if sinks is not None:
        sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        joined = torch.cat([scores, sink], dim=-1)
    else:
        joined = scores
    # logsumexp says +inf where a score is +inf, but the softmax there is inf/inf: the row is
    # NaN, its LSE with it, as a max-subtracted LSE (the kernel's) gives.
    lse = torch.logsumexp(joined, dim=-1).masked_fill(joined.amax(dim=-1) == math.inf, math.nan)
    # softmax of an all -inf row is NaN; such a row attends to nothing and outputs 0, also
    # where the P.V GEMM would carry a NaN of V into it as 0 times NaN.
    no_key = (scores == -math.inf).all(dim=-1, keepdim=True)
    probs = torch.softmax(joined, dim=-1)[..., : scores.shape[-1]].masked_fill(no_key, 0.0)
    return lse, probs, no_key


def visible_keys(
    seqlen_q: int, seqlen_k: int, causal: bool, device=None, window_size: tuple[int, int] = (-1, -1)
) -> torch.Tensor:
    """[seqlen_q, seqlen_k] bool: may query i attend to key j. Around row i's diagonal
    d = i + seqlen_k - seqlen_q (bottom-right), key j is seen iff d - left <= j <= d + right,
    each side only where its edge is not -1 (flash-attn's window_size = (left, right));
    causal is right = 0, whatever window_size's right."""
    left, right = window_size
    right = 0 if causal else right
    rows = torch.arange(seqlen_q, device=device)[:, None]
    cols = torch.arange(seqlen_k, device=device)[None, :]
    diagonal = rows + (seqlen_k - seqlen_q)
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if right >= 0:
        visible &= cols <= diagonal + right
    if left >= 0:
        visible &= cols >= diagonal - left
    return visible


def random_qkv(
    batch: int,
    seqlen_q: int,
    seqlen_k: int,
    nheads: int,
    nheads_kv: int,
    head_dim: int,
    dtype: torch.dtype,
    seed: int = 0,
    device: str | torch.device = "cuda",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standard-normal q [B, Sq, H, D], k and v [B, Sk, Hkv, D] from their own seeded generator."""
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(batch, seqlen_q, nheads, head_dim, device=device, generator=gen)
    k = torch.randn(batch, seqlen_k, nheads_kv, head_dim, device=device, generator=gen)
    v = torch.randn(batch, seqlen_k, nheads_kv, head_dim, device=device, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@dataclass(frozen=True)
class ErrorReport:
    """How far `out` is from `ref`; counts are over all elements."""

    max_abs: float
    mean_abs: float
    rel_l2: float
    mismatches: int  # elements with |out - ref| > atol + rtol * |ref|
    nonfinite: int  # out NaN or Inf where ref is finite, or not what ref is where ref is NaN or Inf
    numel: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def error_report(out: torch.Tensor, ref: torch.Tensor, atol: float = 0.0, rtol: float = 0.0) -> ErrorReport:
    """Compare out against ref elementwise, in float64. Positions where ref is not finite
    must match exactly and count as zero error: the same infinity (-inf is the LSE of a row
    that sees no key), NaN for NaN (a NaN input that reaches the element). Anything else
    there, a finite value included, is a mismatch of infinite error."""
    return _report(_error_figures(out, ref, atol, rtol).tolist(), ref.numel())


def _error_figures(
    out: torch.Tensor, ref: torch.Tensor, atol: float | torch.Tensor = 0.0, rtol: float = 0.0
) -> torch.Tensor:
    """error_report's figures as a float64 tensor on ref's device, not yet read back: each read
    is a sync, and the judge runs once per launch in sweeps of thousands of small shapes, so it
    reads all of its figures in one transfer."""
    out, ref = out.double(), ref.double()
    if not ref.numel():
        return torch.zeros(5, dtype=torch.float64, device=ref.device)
    same_nonfinite = (torch.isinf(ref) & (out == ref)) | (torch.isnan(ref) & torch.isnan(out))
    diff = torch.where(same_nonfinite, 0.0, (out - ref).abs())
    diff = torch.where(torch.isnan(diff), math.inf, diff)
    finite_ref = torch.where(torch.isfinite(ref), ref, 0.0)
    return torch.stack(
        [
            diff.max(),
            diff.mean(),
            torch.linalg.vector_norm(torch.where(torch.isinf(diff), 0.0, diff))
            / torch.linalg.vector_norm(finite_ref).clamp_min(1e-30),
            (diff > atol + rtol * finite_ref.abs()).sum().double(),
            ((~torch.isfinite(out) | ~torch.isfinite(ref)) & ~same_nonfinite).sum().double(),
        ]
    )


def _report(figures: list[float], numel: int) -> ErrorReport:
    max_abs, mean_abs, rel_l2, mismatches, nonfinite = figures
    return ErrorReport(max_abs, mean_abs, rel_l2, int(mismatches), int(nonfinite), numel)


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half an ulp at 1.0: the largest relative error of rounding one value to `dtype`."""
    return torch.finfo(dtype).eps / 2


@dataclass(frozen=True)
class Bound:
    """The pass/fail criterion for one comparison, with its ingredients kept for reports."""

    baseline_max_abs: float  # same-precision PyTorch against the reference
    rounding_max_abs: float  # one rounding of the output to its dtype
    atol: float
    rtol: float

    def admits(self, report: ErrorReport) -> bool:
        return report.nonfinite == 0 and report.max_abs <= self.atol and report.mismatches == 0


def output_bound(
    ref: torch.Tensor, baseline: torch.Tensor, dtype: torch.dtype, *, seqlen_k: int, dominant_term: float
) -> Bound:
    """Kernel error must be <= 2 x (baseline error) + (one rounding of the output).

    The factor 2 is flash-attn's: the kernel may reorder sums and use exp2 with a folded
    scale, but it must not be a different class of accurate than PyTorch in the same
    dtype. The rounding term keeps the bound honest where the baseline happens to be
    exact (a single key, say) yet the kernel must still round its fp32 result once: half
    an ulp at the largest output, u·max|ref| (the role of flash-attn's `out_ref + 0.3 - 0.3`
    term), or the exact output's own rounding error where that is larger (subnormal outputs
    round by an absolute step). The exact output's rounding error alone is not enough: it is
    zero where that output is representable (one dominant key makes it a row of v), while
    the kernel's fp32 result, off by the P~ rounding below, still rounds, and by up to an
    ulp (seen on the GPU: fp16 d64 causal, large logits, 799 queries on 3 keys, an error of
    2^-9 at |v| < 4; docs/perf-log.md).
    The elementwise count uses the same atol plus one rounding relative to |ref|.

    The kernel rounds the unnormalised weights P~ to the input dtype, the baseline the
    normalised P. Where one key dominates a row, the baseline's P is exactly 1 and rounds
    without error, while the kernel's P~ = 2^(tiny) still rounds by up to one unit
    roundoff u: `dominant_term` = max over rows of (largest weight · max|v|), times u, is
    that error, the one part of the kernel's error the baseline can miss by luck.

    The kernel also flushes fp32 values below FLT_MIN to zero (fast math, tensor cores).
    At most seqlen_k + 1 such values (the products P·v and the division) reach one output,
    each with weight <= 1, so flushing moves it by at most (seqlen_k + 1)·FLT_MIN: about
    5e-35 at 4k keys, visible only for inputs near FLT_MIN, like bf16 subnormals.
    """
    baseline_err, rounding_err, atol = _output_bound_terms(ref, baseline, dtype, seqlen_k, dominant_term).tolist()
    return Bound(baseline_max_abs=baseline_err, rounding_max_abs=rounding_err, atol=atol, rtol=2 * unit_roundoff(dtype))


def _output_bound_terms(
    ref: torch.Tensor,
    baseline: torch.Tensor,
    dtype: torch.dtype,
    seqlen_k: int,
    dominant_term: float | torch.Tensor,
    extra: float | torch.Tensor = 0.0,
) -> torch.Tensor:
    """[baseline error, rounding error, atol] of output_bound, float64 on ref's device; `extra`:
    an error of the kernel's own the baseline does not make (judge's softcap term)."""
    baseline_err = _error_figures(baseline, ref)[0]
    largest_output = _largest_finite_abs(ref)
    rounding_err = torch.maximum(_error_figures(ref.to(dtype), ref)[0], unit_roundoff(dtype) * largest_output)
    flush_to_zero = (seqlen_k + 1) * torch.finfo(torch.float32).tiny
    atol = 2 * baseline_err + rounding_err + unit_roundoff(dtype) * dominant_term + flush_to_zero + extra
    return torch.stack([baseline_err, rounding_err, atol])


def lse_bound(q: torch.Tensor, k: torch.Tensor, softmax_scale: float) -> Bound:
    """A worst-case bound on the kernel's LSE error, from fp32 error analysis.

    The kernel computes each score as a fp32 dot product of length D of exactly
    representable products: |error| <= D·u·(|q|·|k|) with u = 2^-24. LSE moves by at
    most the largest score error times the scale, plus the relative error of the sum of
    Sk exponentials in fp32 (Sk·u) and of the hardware ex2/lg2 approximations (2^-22
    each, PTX ISA). Roundings of the scaled scores and of the final log are each below
    u·|score|, which the D·u term (D >= 64) already covers. The baseline is no help
    here: it computes the same fp32 scores.
    A wrong scale, a missing max or a mask error moves LSE by O(1).
    """
    return Bound(baseline_max_abs=0.0, rounding_max_abs=0.0, atol=_lse_atol(q, k, softmax_scale).item(), rtol=0.0)


def _lse_atol(q: torch.Tensor, k: torch.Tensor, softmax_scale: float, softcap: float = 0.0) -> torch.Tensor:
    """lse_bound's atol, float64 on q's device; a softcap's tanh adds softcap·TANH_ERROR to each
    score's error (the cap itself is 1-Lipschitz: it does not grow the dot product's)."""
    u = torch.finfo(torch.float32).eps / 2
    head_dim, seqlen_k = q.shape[-1], k.shape[1]
    abs_dots = torch.einsum("bqhd,bkhd->bhqk", q.float().abs(), _repeat_kv(k, q.shape[2]).float().abs())
    score_err = head_dim * u * _largest_finite_abs(abs_dots) * softmax_scale
    return score_err + seqlen_k * u + 2 * 2.0**-22 + softcap * TANH_ERROR


def _largest_finite_abs(t: torch.Tensor) -> torch.Tensor:
    """max |t| over its finite elements, 0 if none, float64 on t's device: the scale of a bound.
    Where a NaN or Inf input reaches the reference, that element is judged exactly
    (error_report); the error of every other element comes from finite values."""
    if not t.numel():
        return torch.zeros((), dtype=torch.float64, device=t.device)
    return t.abs().nan_to_num(0.0, posinf=0.0).max().double()


def _repeat_kv(k: torch.Tensor, nheads: int) -> torch.Tensor:
    return k.repeat_interleave(nheads // k.shape[2], dim=2)


@dataclass(frozen=True)
class Verdict:
    """A kernel result judged against the reference: reports, bounds, pass or fail."""

    output: ErrorReport
    output_bound: Bound
    lse: ErrorReport | None
    lse_bound: Bound | None

    @property
    def passed(self) -> bool:
        lse_ok = self.lse is None or (self.lse_bound is not None and self.lse_bound.admits(self.lse))
        return self.output_bound.admits(self.output) and lse_ok

    def __str__(self) -> str:
        text = f"output {self.output} vs {self.output_bound}"
        return text + (f"; LSE {self.lse} vs {self.lse_bound}" if self.lse is not None else "")


def judge(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> Verdict:
    """Judge a kernel's (out, lse) for these inputs against the fp32 reference, with the
    output bound from the same-precision baseline and the fp32 LSE bound (attention_ref's
    variants alike).

    With a softcap the baseline computes tanh exactly in fp32 and the kernel by ex2 and a fast
    division: each capped score may err by softcap·TANH_ERROR more, which moves the LSE by as
    much and an output by at most twice that times max|v| (a perturbation δ of a row's scores
    moves its weights by P∘(δ − P·δ), at most 2·max δ in sum)."""
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    options: dict[str, Any] = dict(window_size=window_size, softcap=softcap, sinks=sinks)
    ref, ref_lse = attention_ref(q, k, v, causal, scale, **options)
    baseline, _ = attention_ref(q, k, v, causal, scale, upcast=False, **options)
    # Largest attention weight in any row is exp(max score - lse); times max|v| it is the
    # largest single term of any output.
    scores = masked_scores(q.float(), k.float(), causal, scale, window_size=window_size, softcap=softcap)
    peak_weight = _largest_finite_abs(
        torch.exp(scores.amax(dim=-1) - ref_lse).nan_to_num(0.0) if q.numel() and k.numel() else q.new_zeros(0)
    )
    tanh_term = 2 * softcap * TANH_ERROR * _largest_finite_abs(v)
    bound_terms = _output_bound_terms(
        ref, baseline, q.dtype, k.shape[1], peak_weight * _largest_finite_abs(v), extra=tanh_term
    )
    rtol = 2 * unit_roundoff(q.dtype)
    # Everything on the device, read back in one transfer (one sync per judged launch).
    parts = [bound_terms, _error_figures(out, ref, bound_terms[2], rtol)]
    if lse is not None:
        lse_atol = _lse_atol(q, k, scale, softcap)
        parts += [lse_atol[None], _error_figures(lse, ref_lse, lse_atol)]
    figures = torch.cat(parts).tolist()
    baseline_err, rounding_err, atol = figures[:3]
    bound = Bound(baseline_max_abs=baseline_err, rounding_max_abs=rounding_err, atol=atol, rtol=rtol)
    report = _report(figures[3:8], ref.numel())
    if lse is None:
        return Verdict(report, bound, None, None)
    lse_tol = Bound(baseline_max_abs=0.0, rounding_max_abs=0.0, atol=figures[8], rtol=0.0)
    return Verdict(report, bound, _report(figures[9:14], ref_lse.numel()), lse_tol)


def rounding_apart(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    other_out: torch.Tensor,
    other_lse: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
) -> str | None:
    """None where two kernels' results for these inputs differ by rounding only, else how far
    apart they are: out within the judge's output allowance (twice the same-precision baseline's
    error and one rounding: what a kernel of that precision may round by) of other_out, LSE
    within the LSE bound of other_lse, and the same non-finite elements. For a change that
    computes the same attention in exact arithmetic; one that computes another moves some output
    by far more."""
    allowed = judge(q, k, v, other_out, other_lse, causal, softmax_scale)
    output, lse_error = error_report(out, other_out), error_report(lse, other_lse)
    assert allowed.lse_bound is not None  # judge was given an LSE
    if (
        output.nonfinite == 0
        and output.max_abs <= allowed.output_bound.atol
        and lse_error.nonfinite == 0
        and lse_error.max_abs <= allowed.lse_bound.atol
    ):
        return None
    return f"out {output} vs atol {allowed.output_bound.atol:.3g}; LSE {lse_error} vs atol {allowed.lse_bound.atol:.3g}"


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
    GEMM are in the input dtype, the GEMMs accumulate in fp32 (`_matmul_fp32_accumulate`), and
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
        kh, vh = (_repeat_kv(t, nheads).transpose(1, 2) for t in (k, v))
        if upcast:
            qh, kh, vh, dout_h = (t.to(compute_dtype) for t in (qh, kh, vh, dout_h))
        matmul = _backward_matmul(upcast)
        visible = visible_keys(q.shape[1], k.shape[1], causal, device=q.device, window_size=window_size)
        raw = matmul(qh, kh.transpose(-1, -2)) * softmax_scale
        cap_slope = 1 - torch.tanh(raw / softcap) ** 2 if softcap > 0 else None
        scores = capped(raw, softcap).masked_fill(~visible, -math.inf)
        lse, probs, _ = _softmax_with_sinks(scores, sinks)
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
    return torch.matmul if upcast else _matmul_fp32_accumulate


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
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
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
    fp32_terms = _gradient_fp32_terms(parts, _lse_atol(q, k, scale, softcap), softcap)
    if len(grads) != len(reference):
        raise ValueError(f"grads: expected {len(reference)} gradients ({', '.join(GRADIENTS)}), got {len(grads)}")
    figures = []
    for grad, ref, base, fp32_term in zip(grads, reference, baseline, fp32_terms, strict=True):
        rounded = ref.to(q.dtype) if ref.dim() > 1 else ref
        rounding_err = 2 * _largest_finite_abs((rounded + 0.3) - 0.3 - rounded)
        baseline_err = _error_figures(base, ref)[0]
        atol = 2 * baseline_err + rounding_err + fp32_term
        figures += [torch.stack([baseline_err, rounding_err, atol]), _error_figures(grad, ref, atol)]
    values = torch.cat(figures).tolist()
    reports, bounds = {}, {}
    for index, (name, ref) in enumerate(zip(GRADIENTS + ("dsinks",), reference, strict=False)):
        baseline_err, rounding_err, atol, *report = values[8 * index : 8 * index + 8]
        bounds[name] = Bound(baseline_max_abs=baseline_err, rounding_max_abs=rounding_err, atol=atol, rtol=0.0)
        reports[name] = _report(report, ref.numel())
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
    return [_largest_finite_abs(term) for term in terms]


def attention_flops(batch: int, nheads: int, seqlen_q: int, seqlen_k: int, head_dim: int, causal: bool) -> float:
    """4·B·H·Sq·Sk·D (two GEMMs), halved for causal: the convention flash-attn and cuDNN report."""
    flops = 4.0 * batch * nheads * seqlen_q * seqlen_k * head_dim
    return flops / 2 if causal else flops
