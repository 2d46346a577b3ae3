"""Timing on the GPU, done one way for the CLI and the asv suite alike, and the plot of a sweep.

Kernels are asynchronous, so each repetition is bracketed by CUDA events and the median of
the per-repetition times is reported, after a warm-up that also absorbs the compile.
Competitors (torch SDPA's cuDNN and flash backends) run in the same process on the same
inputs, in their own [batch, nheads, seqlen, headdim] layout prepared before timing.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from fa_kernel.interface import flash_attn_func
from fa_kernel.reference import attention_flops, random_qkv


def cuda_median_ms(fn: Callable[[], object], warmup: int = 10, repeats: int = 50) -> float:
    """Median milliseconds of `fn` over `repeats` event-timed calls, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


@dataclass(frozen=True)
class Shape:
    batch: int
    nheads: int
    seqlen_q: int
    head_dim: int
    causal: bool
    dtype: torch.dtype = torch.float16
    nheads_kv: int | None = None  # None: as nheads (MHA)
    seqlen_k: int | None = None  # None: as seqlen_q

    @property
    def heads_kv(self) -> int:
        return self.nheads_kv or self.nheads

    @property
    def keys(self) -> int:
        return self.seqlen_k or self.seqlen_q

    @property
    def flops(self) -> float:
        return attention_flops(self.batch, self.nheads, self.seqlen_q, self.keys, self.head_dim, self.causal)

    def label(self) -> str:
        heads = f"{self.nheads}" if self.heads_kv == self.nheads else f"{self.nheads}/{self.heads_kv}"
        lens = f"{self.seqlen_q}" if self.keys == self.seqlen_q else f"{self.seqlen_q}x{self.keys}"
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{self.batch}x{heads}x{lens}x{self.head_dim} {dtype}{' causal' if self.causal else ''}"

    def inputs(self, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return random_qkv(
            self.batch, self.seqlen_q, self.keys, self.nheads, self.heads_kv, self.head_dim, self.dtype, seed
        )


def sweep_shape(
    seqlen: int, head_dim: int, causal: bool, dtype: torch.dtype = torch.float16, nheads: int = 16
) -> Shape:
    """The shape at `seqlen` of the sweeps over sequence length (the bench's plot, the tuner's
    ladder): 32k tokens in all, 16 heads unless told, so that the work grows with seqlen only as
    attention's does."""
    return Shape(max(1, 32768 // seqlen), nheads, seqlen, head_dim, causal, dtype)


def sdpa_backends() -> dict[str, object]:
    from torch.nn.attention import SDPBackend

    return {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def runners(shape: Shape, seed: int = 0) -> dict[str, Callable[[], object]]:
    """A zero-argument callable per implementation, inputs prepared once.

    torch SDPA gets [B, H, S, D] contiguous tensors (its native layout), GQA through
    enable_gqa, and bottom-right causal only where seqlen_q == seqlen_k (its is_causal is
    top-left aligned otherwise, a different function, so it is left out there).
    """
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    q, k, v = shape.inputs(seed)
    result: dict[str, Callable[[], object]] = {"fa_kernel": lambda: flash_attn_func(q, k, v, causal=shape.causal)}
    if shape.causal and shape.keys != shape.seqlen_q:
        return result
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    gqa = shape.heads_kv != shape.nheads
    for name, backend in sdpa_backends().items():

        def call(backend=backend):
            with sdpa_kernel(backend):
                return scaled_dot_product_attention(qt, kt, vt, is_causal=shape.causal, enable_gqa=gqa)

        try:
            call()
        except RuntimeError:  # this backend does not take this shape (dtype, head_dim, GQA)
            continue
        result[name] = call
    return result


def measure(shape: Shape, warmup: int = 10, repeats: int = 50) -> dict[str, float]:
    """TFLOP/s of each implementation on this shape, measured in this process."""
    return {
        name: shape.flops / (cuda_median_ms(fn, warmup, repeats) * 1e-3) / 1e12 for name, fn in runners(shape).items()
    }


PLOT_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)


def plot_seqlen_sweep(
    path: str,
    dtype: torch.dtype,
    repeats: int = 50,
    progress: Callable[[Iterable[int], str], Iterable[int]] = lambda seqlens, description: seqlens,
) -> list[tuple[str, dict[str, float]]]:
    """TFLOP/s against seq_len (sweep_shape: 32k tokens, 16 heads), one panel per (head_dim,
    causal), drawn to `path`; returns the measurements, labelled like the bench's. `progress`
    wraps each panel's lengths (a progress bar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = []
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.5), sharey=True)
    for ax, (head_dim, causal) in zip(axes, itertools.product((64, 128), (False, True)), strict=True):
        series: dict[str, list[float]] = {}
        for seqlen in progress(PLOT_SEQLENS, f"plot d{head_dim}{' causal' if causal else ''}"):
            shape = sweep_shape(seqlen, head_dim, causal, dtype)
            measured.append((shape.label(), measure(shape, repeats=repeats)))
            for name, value in measured[-1][1].items():
                series.setdefault(name, []).append(value)
        for name, values in series.items():
            ax.plot(PLOT_SEQLENS, values, marker="o", label=name)
        ax.set(
            xscale="log",
            xlabel="seq_len (batch = 32k tokens / seq_len, 16 heads)",
            title=f"head_dim {head_dim}{', causal' if causal else ''}",
        )
        ax.set_xticks(PLOT_SEQLENS, [str(s) for s in PLOT_SEQLENS])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"TFLOP/s ({str(dtype).removeprefix('torch.')})")
    axes[0].legend()
    fig.suptitle(f"fa_kernel vs torch SDPA on {torch.cuda.get_device_name()}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return measured
