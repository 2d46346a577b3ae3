"""TFLOP/s of fa_kernel, for the dashboard only.

Higher is better here, and asv treats every figure as lower-is-better, so `nox -s bench`
never compares these (it runs them for the head commit alone, after the gate); `perf`
holds the same measurements in gated form.
"""

from fa_kernel.bench import cuda_median_ms

from . import cases


class _Displayed:
    def track_tflops(self, *params):
        """Forward TFLOP/s (causal counts half the FLOPs, as flash-attn and cuDNN report)."""
        return self.shape.flops / cuda_median_ms(self.fns["fa_kernel"]) / 1e9

    track_tflops.unit = "TFLOP/s"


class MHA(_Displayed, cases.MHA):
    pass


class GQA(_Displayed, cases.GQA):
    pass


class Prefill(_Displayed, cases.Prefill):
    pass
