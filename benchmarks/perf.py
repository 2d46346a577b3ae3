"""The gated speed figure, lower is better: fa_kernel's time relative to cuDNN's.

Kernels run asynchronously and asv's own timer is wall-clock, so the figure is a `track_`
benchmark built from medians of CUDA-event timings (`fa_kernel.bench`), taken after setup
has compiled and warmed everything up. Absolute times are not gated: on the H200 they moved
9% between two builds of the same code, while this ratio moved 0.2% and 2.7% (docs/perf-log.md).
"""

from asv_runner.benchmarks.mark import SkipNotImplemented

from fa_kernel.bench import CUDNN_LAYOUTS, cuda_median_ms

from . import cases


class _Gated:
    def track_vs_cudnn_best(self, *params):
        """fa_kernel time / torch SDPA cuDNN time on its faster layout (bench.CUDNN_LAYOUTS), all
        measured here on the same inputs.

        Machine drift (clocks, temperature, driver) moves both alike, so this ratio is
        steadier than either time; above 1 means slower than cuDNN.
        """
        layouts = [self.fns[name] for name in CUDNN_LAYOUTS if name in self.fns]
        if not layouts:
            raise SkipNotImplemented("torch SDPA's cuDNN backend does not take this case")
        return cuda_median_ms(self.fns["fa_kernel"]) / min(cuda_median_ms(fn) for fn in layouts)

    track_vs_cudnn_best.unit = "x cuDNN best time"


class MHA(_Gated, cases.MHA):
    pass


class GQA(_Gated, cases.GQA):
    pass


class Prefill(_Gated, cases.Prefill):
    pass


class Models(_Gated, cases.Models):
    pass


class Decode(_Gated, cases.Decode):
    pass


class Backward(_Gated, cases.Backward):
    pass
