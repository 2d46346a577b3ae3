"""Gated accuracy figures, lower is better, against the fp32 reference on fixed inputs.

The shape is ragged on purpose: 777 queries against 1333 or 3333 keys (partial tiles,
bottom-right causal alignment), 8 query heads on 2 K/V heads (the GQA head mapping). Where a
case's tile config changes between the two key counts (configs.key_ranges; head_dim 128
non-causal: its short-sequence entry serves up to 2048 keys), the two run different configs. The tolerance is
`reference.judge`'s: twice the error of the same computation done by PyTorch in the input
dtype, plus one rounding. A mismatch count going from 0 to anything fails the gate.
"""

import torch

from fa_kernel.bench import Shape
from fa_kernel.interface import flash_attn_func
from fa_kernel.reference import ErrorReport, judge

from .cases import DTYPES, require_cuda


class Accuracy:
    params = ([64, 128], [False, True], list(DTYPES), [1333, 3333])
    param_names = ["head_dim", "causal", "dtype", "seqlen_k"]
    timeout = 300

    def setup(self, head_dim, causal, dtype, seqlen_k):
        require_cuda()
        shape = Shape(2, 8, 777, head_dim, causal, DTYPES[dtype], nheads_kv=2, seqlen_k=seqlen_k)
        self.q, self.k, self.v = shape.inputs(seed=0)
        self.causal = causal
        flash_attn_func(self.q, self.k, self.v, causal=causal)  # compile
        torch.cuda.synchronize()

    def _report(self) -> ErrorReport:
        out = flash_attn_func(self.q, self.k, self.v, causal=self.causal)
        return judge(self.q, self.k, self.v, out, causal=self.causal).output

    def track_max_abs_error(self, *params):
        """Largest |out - reference| over the output."""
        return self._report().max_abs

    track_max_abs_error.unit = "abs error"

    def track_mismatches(self, *params):
        """Output elements outside the tolerance, NaN and Inf included."""
        return self._report().mismatches

    track_mismatches.unit = "elements"
