"""Time and TFLOP/s of fa_kernel, forward and backward, for the dashboard only.

`nox -s bench` never compares these (it records them for the head commit alone, after the
gate): asv reads TFLOP/s as lower-is-better, which would flag every improvement, and
absolute times drift with the machine more than the gate's factor allows (docs/perf-log.md); `perf`
holds the steadier same-process ratio to cuDNN, which gates.
"""

from fa_kernel.workbench.bench import cuda_median_ms

from . import cases


class _Displayed:
    def track_ms(self, *params):
        """Median time of fa_kernel: its forward, or (Backward) its backward alone."""
        return cuda_median_ms(self.fns["fa_kernel"])

    track_ms.unit = "ms"

    def track_tflops(self, *params):
        """TFLOP/s (causal counts half the FLOPs, as flash-attn and cuDNN report; the backward
        2.5 times the forward's)."""
        return self.flops / cuda_median_ms(self.fns["fa_kernel"]) / 1e9

    track_tflops.unit = "TFLOP/s"


class MHA(_Displayed, cases.MHA):
    pass


class GQA(_Displayed, cases.GQA):
    pass


class Prefill(_Displayed, cases.Prefill):
    pass


class Models(_Displayed, cases.Models):
    pass


class Decode(_Displayed, cases.Decode):
    def track_kv_gb_per_s(self, *params):
        """GB/s of K and V read, each once, as a decode step needs them (HBM: 4.8 TB/s on an H200)."""
        return self.shape.kv_bytes / cuda_median_ms(self.fns["fa_kernel"]) / 1e6

    track_kv_gb_per_s.unit = "GB/s"


class Backward(_Displayed, cases.Backward):
    pass


class Variants(_Displayed, cases.Variants):
    pass
