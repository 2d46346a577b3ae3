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
    output) and accumulating in fp32 as the tensor cores do (`matmul_fp32_accumulate`).
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
        scores = matmul_fp32_accumulate(q.transpose(1, 2), repeat_kv(k, nheads).permute(0, 2, 3, 1)) * softmax_scale
        scores = capped(scores, softcap).masked_fill(~visible, -math.inf)
    lse, probs, no_key = softmax_with_sinks(scores, sinks)
    lse = lse.float()
    if upcast:
        out = torch.einsum("bhqk,bkhd->bqhd", probs, repeat_kv(v, nheads))
        return out.masked_fill(no_key.transpose(1, 2), 0.0), lse
    out = matmul_fp32_accumulate(probs.to(dtype), repeat_kv(v, nheads).transpose(1, 2)).masked_fill(no_key, 0.0)
    return out.transpose(1, 2).to(dtype), lse


def matmul_fp32_accumulate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
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
    scores = torch.einsum("bqhd,bkhd->bhqk", q, repeat_kv(k, q.shape[2]).to(q.dtype)) * softmax_scale
    visible = visible_keys(q.shape[1], k.shape[1], causal, device=q.device, window_size=window_size)
    return capped(scores, softcap).masked_fill(~visible, -math.inf)


def capped(scores: torch.Tensor, softcap: float) -> torch.Tensor:
    """softcap·tanh(scores / softcap) where softcap > 0 (Gemma 2's logit cap), else the scores."""
    return softcap * torch.tanh(scores / softcap) if softcap > 0 else scores


def softmax_with_sinks(
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
    lse = torch.logsumexp(joined, dim=-1)  # -inf over no keys at all
    if joined.shape[-1]:
        lse = lse.masked_fill(joined.amax(dim=-1) == math.inf, math.nan)
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


def attention_varlen_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    **options: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A ragged batch, as flash-attn's varlen functions take it: q [total_q, nheads, headdim], k
    and v [total_k, nheads_kv, headdim], sequence i in rows cu_seqlens[i]:cu_seqlens[i + 1]
    (int32 [batch + 1], from 0). Each sequence attends on its own: its own bottom-right causal
    alignment and window, no key of another sequence. Returns (out [total_q, nheads, headdim],
    lse [nheads, total_q]); `options` are attention_ref's keywords (causal, softmax_scale,
    window_size, softcap, sinks...). A sequence of length 0 is valid."""
    outs, lses = [], []
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(bounds_q) - 1):
        (q_start, q_end), (k_start, k_end) = bounds_q[i : i + 2], bounds_k[i : i + 2]
        out, lse = attention_ref(q[None, q_start:q_end], k[None, k_start:k_end], v[None, k_start:k_end], **options)
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=-1)


def paged_keys(cache: torch.Tensor, block_table: torch.Tensor, cache_seqlens: torch.Tensor) -> list[torch.Tensor]:
    """Each request's keys (or values) [cache_seqlens[b], nheads_kv, headdim], gathered from a
    paged cache [num_blocks, page_size, nheads_kv, headdim] by its row of block_table [batch,
    max_blocks]: page block_table[b, i] holds its keys i·page_size onward."""
    page_size = cache.shape[1]
    gathered = []
    for pages, length in zip(block_table.tolist(), cache_seqlens.tolist(), strict=True):
        used = pages[: -(-length // page_size)] if length else []
        gathered.append(cache[used].flatten(0, 1)[:length])
    return gathered


def attention_paged_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    **options: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [batch, seqlen_q, nheads, headdim] against a paged KV cache, as
    flash-attn's `flash_attn_with_kvcache` takes it (`paged_keys`): request b sees its
    cache_seqlens[b] keys, its queries aligned to their end (bottom-right). Returns (out, lse
    [batch, nheads, seqlen_q]); `options` are attention_ref's keywords (causal, ...)."""
    keys, values = paged_keys(k_cache, block_table, cache_seqlens), paged_keys(v_cache, block_table, cache_seqlens)
    outs, lses = [], []
    for b, (k, v) in enumerate(zip(keys, values, strict=True)):
        out, lse = attention_ref(q[b : b + 1], k[None], v[None], **options)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


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
    return report_of(error_figures(out, ref, atol, rtol).tolist(), ref.numel())


def error_figures(
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


def report_of(figures: list[float], numel: int) -> ErrorReport:
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
    baseline_err = error_figures(baseline, ref)[0]
    largest_output = largest_finite_abs(ref)
    rounding_err = torch.maximum(error_figures(ref.to(dtype), ref)[0], unit_roundoff(dtype) * largest_output)
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
    return Bound(baseline_max_abs=0.0, rounding_max_abs=0.0, atol=lse_tolerance(q, k, softmax_scale).item(), rtol=0.0)


def lse_tolerance(
    q: torch.Tensor, k: torch.Tensor, softmax_scale: float, softcap: float = 0.0, tanh_error: float = TANH_ERROR
) -> torch.Tensor:
    """lse_bound's atol, float64 on q's device; a softcap's tanh adds softcap·tanh_error to each
    score's error (the cap itself is 1-Lipschitz: it does not grow the dot product's)."""
    u = torch.finfo(torch.float32).eps / 2
    head_dim, seqlen_k = q.shape[-1], k.shape[1]
    abs_dots = torch.einsum("bqhd,bkhd->bhqk", q.float().abs(), repeat_kv(k, q.shape[2]).float().abs())
    score_err = head_dim * u * largest_finite_abs(abs_dots) * softmax_scale
    return score_err + seqlen_k * u + 2 * 2.0**-22 + softcap * tanh_error


def largest_finite_abs(t: torch.Tensor) -> torch.Tensor:
    """max |t| over its finite elements, 0 if none, float64 on t's device: the scale of a bound.
    Where a NaN or Inf input reaches the reference, that element is judged exactly
    (error_report); the error of every other element comes from finite values."""
    if not t.numel():
        return torch.zeros((), dtype=torch.float64, device=t.device)
    return t.abs().nan_to_num(0.0, posinf=0.0).max().double()


def repeat_kv(k: torch.Tensor, nheads: int) -> torch.Tensor:
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
    tanh_error: float = TANH_ERROR,
) -> Verdict:
    """Judge a kernel's (out, lse) for these inputs against the fp32 reference, with the
    output bound from the same-precision baseline and the fp32 LSE bound (attention_ref's
    variants alike).

    With a softcap the baseline computes tanh exactly in fp32 and the kernel by ex2 and a fast
    division (numerics.TANH_ERROR; `tanh_error` for another tanh): each capped score may err by
    softcap·tanh_error more, which moves the LSE by as much and an output by at most twice that
    times max|v| (a perturbation δ of a row's scores moves its weights by P∘(δ − P·δ), at most
    2·max δ in sum)."""
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    options: dict[str, Any] = dict(window_size=window_size, softcap=softcap, sinks=sinks)
    ref, ref_lse = attention_ref(q, k, v, causal, scale, **options)
    baseline, _ = attention_ref(q, k, v, causal, scale, upcast=False, **options)
    # Largest attention weight in any row is exp(max score - lse); times max|v| it is the
    # largest single term of any output.
    # A temporary: the judge of a long sequence holds [b, h, q, k] tensors enough.
    peak_weight = largest_finite_abs(
        torch.exp(
            masked_scores(q.float(), k.float(), causal, scale, window_size=window_size, softcap=softcap).amax(dim=-1)
            - ref_lse
        ).nan_to_num(0.0)
        if q.numel() and k.numel()
        else q.new_zeros(0)
    )
    tanh_term = 2 * softcap * tanh_error * largest_finite_abs(v)
    bound_terms = _output_bound_terms(
        ref, baseline, q.dtype, k.shape[1], peak_weight * largest_finite_abs(v), extra=tanh_term
    )
    rtol = 2 * unit_roundoff(q.dtype)
    # Everything on the device, read back in one transfer (one sync per judged launch).
    parts = [bound_terms, error_figures(out, ref, bound_terms[2], rtol)]
    if lse is not None:
        lse_atol = lse_tolerance(q, k, scale, softcap, tanh_error)
        parts += [lse_atol[None], error_figures(lse, ref_lse, lse_atol)]
    figures = torch.cat(parts).tolist()
    baseline_err, rounding_err, atol = figures[:3]
    bound = Bound(baseline_max_abs=baseline_err, rounding_max_abs=rounding_err, atol=atol, rtol=rtol)
    report = report_of(figures[3:8], ref.numel())
    if lse is None:
        return Verdict(report, bound, None, None)
    lse_tol = Bound(baseline_max_abs=0.0, rounding_max_abs=0.0, atol=figures[8], rtol=0.0)
    return Verdict(report, bound, report_of(figures[9:14], ref_lse.numel()), lse_tol)


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


def attention_flops(batch: int, nheads: int, seqlen_q: int, seqlen_k: int, head_dim: int, causal: bool) -> float:
    """4·B·H·Sq·Sk·D (two GEMMs), halved for causal: the convention flash-attn and cuDNN report."""
    flops = 4.0 * batch * nheads * seqlen_q * seqlen_k * head_dim
    return flops / 2 if causal else flops


def visible_pairs(seqlen_q: int, seqlen_k: int, causal: bool, window_size: tuple[int, int] = (-1, -1)) -> int:
    """The (query, key) pairs visible_keys leaves visible, counted row by row without the
    [seqlen_q, seqlen_k] mask (a window's work: 4·D flops a pair)."""
    left, right = window_size
    right = 0 if causal else right
    diagonal = torch.arange(seqlen_q, dtype=torch.int64) + (seqlen_k - seqlen_q)
    last = (diagonal + right).clamp(max=seqlen_k - 1) if right >= 0 else torch.full_like(diagonal, seqlen_k - 1)
    first = (diagonal - left).clamp(min=0) if left >= 0 else torch.zeros_like(diagonal)
    return int((last - first + 1).clamp(min=0).sum())
