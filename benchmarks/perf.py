"""The gated speed figure, lower is better: fa_kernel's time relative to cuDNN's.

Kernels run asynchronously and asv's own timer is wall-clock, so the figure is a `track_`
benchmark built from medians of CUDA-event timings (`fa_kernel.workbench.bench`), taken after setup
has compiled and warmed everything up. Absolute times are not gated: on the H200 they moved
9% between two builds of the same code, while this ratio moved 0.2% and 2.7% (docs/perf-log.md).
`HostPath` gates the host's cost of a call the same way: relative to SDPA's, on the same host.
"""

import statistics

from asv_runner.benchmarks.mark import SkipNotImplemented

from fa_kernel.workbench.bench import CUDNN_LAYOUTS, alternated, cuda_median_ms, host_us_per_call

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


class Variants(cases.Variants):
    def track_vs_anchor(self, *params):
        """fa_kernel time / its anchor's on the same inputs: FlexAttention compiled with the same
        mask and score_mod, or for sinks fa_kernel without them (what sinks cost). Above 1:
        slower than the anchor."""
        anchor = self.fns.get("flex") or self.fns["fa_kernel plain"]
        return cuda_median_ms(self.fns["fa_kernel"]) / cuda_median_ms(anchor)

    track_vs_anchor.unit = "x anchor time"


class HostPath(cases.HostPath):
    # Rounds of host timings, alternated between fa_kernel and cuDNN: one batch of 300 calls
    # reads a few percent apart from the next (the host's clock, the allocator).
    rounds = 5

    def track_host_vs_cudnn(self, *params):
        """fa_kernel's host microseconds a call / torch SDPA cuDNN's on its faster layout, median
        of alternated rounds on the same inputs (bench.host_us_per_call). The host's own speed
        moved SDPA's cost 2x between two H200 hosts; the ratio cancels it. Above 1: flash_attn_func
        costs the host more than SDPA does."""
        layouts = [name for name in CUDNN_LAYOUTS if name in self.fns]
        if not layouts:
            raise SkipNotImplemented("torch SDPA's cuDNN backend does not take this case")
        timers = {name: (lambda fn=self.fns[name]: host_us_per_call(fn)) for name in ["fa_kernel", *layouts]}
        samples = alternated(timers, self.rounds)
        ratios = [
            fa_us / min(samples[name][round_] for name in layouts) for round_, fa_us in enumerate(samples["fa_kernel"])
        ]
        return statistics.median(ratios)

    track_host_vs_cudnn.unit = "x cuDNN host time"
