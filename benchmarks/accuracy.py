"""Gated accuracy figures, lower is better, against the fp32 reference on fixed inputs: the
output (Accuracy) and the gradients (BackwardAccuracy).

The shape is ragged on purpose: 777 queries against 1333 or 3333 keys (partial tiles,
bottom-right causal alignment), 8 query heads on 2 K/V heads (the GQA head mapping). Where a
case's tile config changes between the two key counts (configs.key_ranges; head_dim 128
non-causal: its short-sequence entry serves up to 2048 keys), the two run different configs. The tolerance is
`reference.judge`'s: twice the error of the same computation done by PyTorch in the input
dtype, plus one rounding (`reference_backward.judge_backward`'s for the gradients: flash-attn's rule for
each). A mismatch count going from 0 to anything fails the gate.
"""

import torch

from fa_kernel.interface import flash_attn_func
from fa_kernel.reference import ErrorReport, judge
from fa_kernel.reference_backward import GRADIENTS, BackwardVerdict, judge_backward
from fa_kernel.workbench.bench import Shape

from .cases import DTYPES, require_cuda


class _RaggedGQA:
    """The cases both accuracy suites judge (the module's docstring), their inputs and the
    backward's upstream gradient fixed by seeds; setup compiles and judges once (untimed)."""

    params = ([64, 128], [False, True], list(DTYPES), [1333, 3333])
    param_names = ["head_dim", "causal", "dtype", "seqlen_k"]
    timeout = 300

    def setup(self, head_dim, causal, dtype, seqlen_k):
        require_cuda()
        shape = Shape(2, 8, 777, head_dim, causal, DTYPES[dtype], nheads_kv=2, seqlen_k=seqlen_k)
        self.q, self.k, self.v = shape.inputs(seed=0)
        generator = torch.Generator(self.q.device).manual_seed(1)
        self.dout = torch.randn(self.q.shape, generator=generator, device=self.q.device, dtype=self.q.dtype)
        self.causal = causal
        self._judged()
        torch.cuda.synchronize()

    def _judged(self):
        raise NotImplementedError


class Accuracy(_RaggedGQA):
    """The output against the fp32 reference, within `reference.judge`'s bound."""

    def _judged(self) -> ErrorReport:
        out = flash_attn_func(self.q, self.k, self.v, causal=self.causal)
        return judge(self.q, self.k, self.v, out, causal=self.causal).output

    def track_max_abs_error(self, *params):
        """Largest |out - reference| over the output."""
        return self._judged().max_abs

    track_max_abs_error.unit = "abs error"

    def track_mismatches(self, *params):
        """Output elements outside the tolerance, NaN and Inf included."""
        return self._judged().mismatches

    track_mismatches.unit = "elements"


class BackwardAccuracy(_RaggedGQA):
    """The gradients for a fixed upstream gradient, through flash_attn_func's autograd, judged
    as `reference_backward.judge_backward` does: each of dq, dk, dv against the fp32 reference backward,
    within flash-attn's rule for gradients."""

    def _judged(self) -> BackwardVerdict:
        q, k, v = (t.detach().requires_grad_() for t in (self.q, self.k, self.v))
        out = flash_attn_func(q, k, v, causal=self.causal)
        grads = torch.autograd.grad(out, (q, k, v), self.dout)
        return judge_backward(self.q, self.k, self.v, self.dout, grads, causal=self.causal)

    def track_error_to_bound(self, *params):
        """The largest of dq's, dk's and dv's max |grad - reference| over its bound's atol: below
        1 within flash-attn's rule; each gradient's scale differs, so the ratio, not the error."""
        verdict = self._judged()
        return max(verdict.reports[name].max_abs / verdict.bounds[name].atol for name in GRADIENTS)

    track_error_to_bound.unit = "x bound"

    def track_mismatches(self, *params):
        """Gradient elements outside their bound, NaN and Inf included, over dq, dk and dv."""
        verdict = self._judged()
        return sum(verdict.reports[name].mismatches for name in GRADIENTS)

    track_mismatches.unit = "elements"


class VariantAccuracy:
    """Windows, softcap and sinks on the ragged GQA shape (head_dim 128, bf16, causal): the output
    and the gradients (dsinks too) against the fp32 reference, each over its bound."""

    params = (["window 100", "softcap 30", "sinks"],)
    param_names = ["variant"]
    timeout = 300
    VARIANTS = {"window 100": dict(window_size=(100, -1)), "softcap 30": dict(softcap=30.0), "sinks": {}}

    def setup(self, variant):
        require_cuda()
        shape = Shape(2, 8, 777, 128, True, torch.bfloat16, nheads_kv=2, seqlen_k=1333)
        self.q, self.k, self.v = shape.inputs(seed=0)
        generator = torch.Generator(self.q.device).manual_seed(1)
        self.dout = torch.randn(self.q.shape, generator=generator, device=self.q.device, dtype=self.q.dtype)
        self.variants = dict(self.VARIANTS[variant])
        if variant == "sinks":
            self.variants["sinks"] = torch.randn(8, generator=generator, device=self.q.device)
        self.track_error_to_bound()

    def track_error_to_bound(self, *params):
        """The largest error over its bound's atol among the output and the gradients: below 1
        within the bounds."""
        sinks = self.variants.get("sinks")
        leaves = [t.detach().requires_grad_() for t in (self.q, self.k, self.v)]
        if sinks is not None:
            leaves.append(sinks.detach().requires_grad_())
        given = dict(self.variants, sinks=leaves[3] if sinks is not None else None)
        out, lse = flash_attn_func(*leaves[:3], causal=True, return_lse=True, **given)
        grads = torch.autograd.grad(out, leaves, self.dout)
        forward = judge(self.q, self.k, self.v, out.detach(), lse.detach(), True, **self.variants)
        backward = judge_backward(self.q, self.k, self.v, self.dout, grads, True, **self.variants)
        ratios = [forward.output.max_abs / forward.output_bound.atol]
        ratios += [report.max_abs / backward.bounds[name].atol for name, report in backward.reports.items()]
        return max(ratios)

    track_error_to_bound.unit = "x bound"
