"""Forward time and TFLOP/s of fa_kernel, for the dashboard only.

`nox -s bench` never compares these (it records them for the head commit alone, after the
gate): asv reads TFLOP/s as lower-is-better, which would flag every improvement, and
absolute times drift with the machine more than the gate's factor allows (docs/perf-log.md); `perf`
holds the steadier same-process ratio to cuDNN, which gates.
"""

from fa_kernel.bench import cuda_median_ms

from . import cases


class _Displayed:
    def track_ms(self, *params):
        """Median forward time of fa_kernel."""
        return cuda_median_ms(self.fns["fa_kernel"])

    track_ms.unit = "ms"

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


class Models(_Displayed, cases.Models):
    pass
