"""Timing on the GPU, done one way for the CLI and the asv suite alike, and the plot of a sweep.

Kernels are asynchronous, so each repetition is bracketed by CUDA events and the median of
the per-repetition times is reported, after a warm-up that also absorbs the compile.
Competitors (torch SDPA's cuDNN and flash backends) run in the same process on the same
inputs, prepared before timing. cuDNN runs on two layouts, [batch, nheads, seqlen, headdim]
contiguous and the [batch, seqlen, nheads, headdim] memory fa_kernel takes viewed as that
shape, and a ratio is taken against the faster of the two ("cuDNN best"): the layout changes
cuDNN's speed by several percent (docs/benchmarking.md). `measure` alternates the implementations over
rounds, so that the GPU's drift over the rounds falls on all of them alike, and keeps each
round's figure: the median and the spread come from those.

The backward is timed alone (`backward=True`): each implementation's forward graph is built
once, and each timed call takes the gradients of q, k and v from it (retain_graph), which is
the whole of a training step's attention backward (fa_kernel's preprocess, its kernel and dQ's
cast; cuDNN's and flash's own).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from fa_kernel.interface import flash_attn_func
from fa_kernel.reference import attention_flops, random_qkv, visible_pairs
from fa_kernel.variants import Variants

Key = TypeVar("Key", bound=Hashable)  # what alternated timers are named by


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


def host_us_per_call(fn: Callable[[], object], calls: int = 300, warmup: int = 5) -> float:
    """Host microseconds a call of `fn`: `calls` calls issued back to back after `warmup`, the
    GPU not waited for until they are all issued (where the kernels take less GPU time than the
    host spends a call, a timing with CUDA events measures this instead of the kernels)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


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
    def kv_bytes(self) -> int:
        """The bytes of K and V, which a decode step reads once at best."""
        return 2 * self.batch * self.keys * self.heads_kv * self.head_dim * self.dtype.itemsize

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


# The backward's FLOPs against the forward's: five GEMMs of the forward's size (S and dP
# recomputed, then dV, dK and dQ) against two, as flash-attn and cuDNN count them.
BACKWARD_FLOPS = 2.5


def sweep_shape(
    seqlen: int, head_dim: int, causal: bool, dtype: torch.dtype = torch.float16, nheads: int = 16
) -> Shape:
    """The shape at `seqlen` of the sweeps over sequence length (the bench's plot, the tuner's
    ladder): 32k tokens in all, 16 heads unless told, so that the work grows with seqlen only as
    attention's does."""
    return Shape(max(1, 32768 // seqlen), nheads, seqlen, head_dim, causal, dtype)


# (query heads, K/V heads, head_dim) of released models' attention layers: the head counts and
# GQA groups a server runs, odd ones included.
MODEL_HEADS = (
    (12, 12, 64),  # GPT-2
    (16, 16, 64),  # BERT-large
    (20, 20, 64),  # GPT-2 large
    (25, 25, 64),  # GPT-2 XL
    (32, 8, 64),  # Llama 3.2 1B
    (71, 1, 64),  # Falcon 7B: one K/V head
    (12, 2, 128),  # Qwen 2.5 1.5B
    (16, 2, 128),  # Qwen 2.5 3B
    (24, 8, 128),  # Llama 3.2 3B
    (28, 4, 128),  # Qwen 2.5 7B
    (32, 8, 128),  # Llama 3 8B, Mistral 7B
    (32, 32, 128),  # Llama 2 7B
    (40, 8, 128),  # Qwen 2.5 14B
    (40, 10, 128),  # Phi-3 medium
    (48, 4, 128),  # StarCoder2 15B
    (52, 4, 128),  # no released model: the head count between 48 and 56, 13 query heads per K/V head
    (56, 8, 128),  # Yi 34B
    (64, 8, 128),  # Llama 3 70B, Qwen 2.5 72B
    (96, 96, 128),  # GPT-3 175B
    (128, 8, 128),  # Llama 3 405B
    (8, 4, 256),  # Gemma 2 2B
    (16, 8, 256),  # Gemma 2 9B
    (16, 16, 256),  # Gemma 7B
)
MODEL_SEQLENS = (512, 2048, 8192, 32768)
MODEL_TOKENS = 16384  # batch * seqlen_q per launch, where one sequence is shorter
# Prefill chunks: queries against a longer KV cache, causal bottom-right (which SDPA does not
# offer: fa_kernel's figure stands alone there).
MODEL_PREFILLS = ((1024, 8192), (2048, 32768))


def model_grid(dtype: torch.dtype = torch.bfloat16) -> list[Shape]:
    """`fa-kernel bench --grid models`: every MODEL_HEADS layer at each of MODEL_SEQLENS, causal
    and not, MODEL_TOKENS tokens per launch (one sequence where it is longer), then its prefill
    chunks (MODEL_PREFILLS, causal)."""
    shapes = []
    for nheads, nheads_kv, head_dim in MODEL_HEADS:
        for seqlen, causal in itertools.product(MODEL_SEQLENS, (False, True)):
            shapes.append(Shape(max(1, MODEL_TOKENS // seqlen), nheads, seqlen, head_dim, causal, dtype, nheads_kv))
        for queries, keys in MODEL_PREFILLS:
            shapes.append(Shape(1, nheads, queries, head_dim, True, dtype, nheads_kv, seqlen_k=keys))
    return shapes


# Decode and append steps: a few queries against a long KV cache (the two anchors first),
# where the split-KV kernels (`fa_kernel.decode`) are timed beside the forward kernel. SDPA's
# causal is top-left where seqlen_q != seqlen_k, so the causal append step has no competitor.
DECODE_SHAPES = (
    Shape(64, 32, 1, 128, False, torch.bfloat16, nheads_kv=8, seqlen_k=8192),
    Shape(1, 32, 1, 128, False, torch.bfloat16, nheads_kv=8, seqlen_k=32768),
    Shape(16, 32, 4, 128, False, torch.bfloat16, nheads_kv=8, seqlen_k=8192),
    Shape(8, 32, 16, 128, True, torch.bfloat16, nheads_kv=8, seqlen_k=8192),
    Shape(32, 32, 1, 128, False, torch.bfloat16, seqlen_k=4096),
    Shape(64, 8, 1, 64, False, torch.bfloat16, nheads_kv=1, seqlen_k=8192),
    # Next to split_kv_serves' limits: a group's 64 rows without the mask, and no GQA on a grid
    # of 32 tiles (the forward kernel's, as flash_attn_func runs both).
    Shape(8, 32, 16, 128, False, torch.bfloat16, nheads_kv=8, seqlen_k=8192),
    Shape(1, 32, 1, 128, False, torch.bfloat16, seqlen_k=32768),
    # Without GQA, both sides of split_kv_serves' limit, a forward grid (one tile per (batch,
    # head)) of half the SMs: 64 and 96 tiles; then 128 and 512, about one SM wave and four.
    Shape(2, 32, 1, 128, False, torch.bfloat16, seqlen_k=16384),
    Shape(3, 32, 1, 128, False, torch.bfloat16, seqlen_k=16384),
    Shape(4, 32, 1, 128, False, torch.bfloat16, seqlen_k=16384),
    Shape(16, 32, 1, 128, False, torch.bfloat16, seqlen_k=16384),
)
# Queries up to which the forward and split-KV kernels are timed apart too: one row block of a
# K/V head's group.
SPLIT_KV_QUERIES = 64
# HBM bandwidth of an H200 SXM as NVIDIA specifies it (4.8 TB/s), the roof of a decode step.
H200_HBM_BYTES_PER_S = 4.8e12


def sdpa_backends() -> dict[str, object]:
    from torch.nn.attention import SDPBackend

    return {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


# torch SDPA's cuDNN backend on each layout: [B, H, S, D] contiguous, and fa_kernel's
# [B, S, H, D] memory viewed as [B, H, S, D] (strided).
CUDNN_LAYOUTS = ("cudnn BHSD", "cudnn BSHD view")


def runners(shape: Shape, seed: int = 0, backward: bool = False) -> dict[str, Callable[[], object]]:
    """A zero-argument callable per implementation, inputs prepared once: fa_kernel, torch SDPA's
    cuDNN backend on each of CUDNN_LAYOUTS, its flash backend on [B, H, S, D] contiguous, and
    up to SPLIT_KV_QUERIES queries the split-KV kernels (forward only); `backward`: each one's
    backward alone (gradient_of), and fa_kernel's with `deterministic=True` too.

    SDPA takes GQA through enable_gqa, and bottom-right causal only where seqlen_q == seqlen_k
    (its is_causal is top-left aligned otherwise, a different function, so it is left out there).
    """
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    q, k, v = (t.requires_grad_(backward) for t in shape.inputs(seed))

    def timed(forward: Callable[[], Any], inputs: tuple[torch.Tensor, ...]) -> Callable[[], object]:
        return gradient_of(forward, inputs, seed) if backward else forward

    result = {"fa_kernel": timed(lambda: flash_attn_func(q, k, v, causal=shape.causal), (q, k, v))}
    if backward:
        # dQ summed in a fixed order by a kernel of its own, against dQ by atomic adds: what
        # determinism costs, and which of the two ways to dQ is the faster.
        result["fa_kernel deterministic"] = timed(
            lambda: flash_attn_func(q, k, v, causal=shape.causal, deterministic=True), (q, k, v)
        )
    if shape.seqlen_q <= SPLIT_KV_QUERIES and not backward:
        # Each of the two paths flash_attn_func chooses between for a decode step, whichever it runs.
        result["fa_kernel forward kernel"] = forward_kernel_call(q, k, v, shape.causal)
        result["fa_kernel split-KV"] = split_kv_call(q, k, v, shape.causal)
    if shape.causal and shape.keys != shape.seqlen_q:
        return result
    views = tuple(t.transpose(1, 2) for t in (q, k, v))
    # Leaves of their own: cuDNN's gradients come out in this layout, as its inputs are.
    contiguous = tuple(t.detach().contiguous().requires_grad_(backward) for t in views)
    gqa = shape.heads_kv != shape.nheads
    backends = sdpa_backends()
    competitors = {
        "cudnn BHSD": (backends["cudnn"], contiguous),
        "cudnn BSHD view": (backends["cudnn"], views),
        "flash": (backends["flash"], contiguous),
    }
    for name, (backend, (qt, kt, vt)) in competitors.items():

        def call(backend=backend, qt=qt, kt=kt, vt=vt):
            with sdpa_kernel(backend):
                return scaled_dot_product_attention(qt, kt, vt, is_causal=shape.causal, enable_gqa=gqa)

        try:
            # Run once here: a backend that does not take this shape (dtype, head_dim, GQA,
            # layout), forward or backward, raises now rather than inside the timing.
            result[name] = timed(call, (qt, kt, vt))
            result[name]()
        except RuntimeError:
            result.pop(name, None)
    return result


# The variants the asv suite and `perf/variants.py` time: flash_attn_func's keyword arguments
# (sinks: a logit per head, drawn at setup).
VARIANTS: dict[str, dict[str, Any]] = {
    "window 1k": dict(window_size=(1024, 0)),
    "softcap 30": dict(softcap=30.0),
    "sinks": dict(sinks=True),
}


# `fa-kernel bench --grid variants`: each of VARIANTS, causal bf16 at 2k and 8k tokens a sequence
# (32k tokens a launch), at the head dims both the gradients and FlexAttention's anchor take.
VARIANT_SHAPES = tuple(Shape(32768 // s, 16, s, d, True, torch.bfloat16) for d in (64, 128) for s in (2048, 8192))


def variant_flops(shape: Shape, variant: dict) -> float:
    """The forward's FLOPs of `variant` on `shape`: 4·D a (query, key) pair its mask leaves
    visible (a window's work grows with the window, and its TFLOP/s is counted on that)."""
    pairs = visible_pairs(shape.seqlen_q, shape.keys, shape.causal, variant.get("window_size", (-1, -1)))
    return 4.0 * shape.batch * shape.nheads * pairs * shape.head_dim


def variant_build(shape: Shape, variant: dict) -> Variants:
    """The variants the kernels of `variant` (VARIANTS' keywords, sinks=True for drawn sinks) on
    `shape` compile in."""
    window, softcap = variant.get("window_size", (-1, -1)), variant.get("softcap", 0.0)
    return dataclasses.replace(Variants.of(shape.causal, window, softcap, None), sinks=bool(variant.get("sinks")))


def variant_runners(shape: Shape, variant: dict, seed: int = 0, backward: bool = False) -> dict[str, Callable]:
    """fa_kernel with `variant` (flash_attn_func's keywords, sinks=True for drawn sinks), and its
    anchor: FlexAttention compiled with the same block mask and score_mod ("flex"), or, for sinks
    (which FlexAttention has no form for), fa_kernel without them ("fa_kernel plain")."""
    q, k, v = (t.requires_grad_(backward) for t in shape.inputs(seed))
    keywords = dict(variant)
    if keywords.pop("sinks", False):
        generator = torch.Generator(q.device).manual_seed(seed)
        keywords["sinks"] = torch.randn(shape.nheads, device=q.device, generator=generator)

    def ours(**given):
        return lambda: flash_attn_func(q, k, v, causal=shape.causal, **given)

    def timed(forward: Callable[[], Any], inputs: tuple[torch.Tensor, ...]) -> Callable[[], object]:
        return gradient_of(forward, inputs, seed) if backward else forward

    result = {"fa_kernel": timed(ours(**keywords), (q, k, v))}
    if "sinks" in keywords:
        result["fa_kernel plain"] = timed(ours(), (q, k, v))
    else:
        window = keywords.get("window_size", (-1, -1))
        flex, inputs = flex_attention_call(q, k, v, shape.causal, window, keywords.get("softcap", 0.0), backward)
        result["flex"] = timed(flex, inputs)
    return result


def flex_attention_call(q, k, v, causal: bool, window_size: tuple[int, int], softcap: float, backward: bool = False):
    """(FlexAttention compiled on [B, H, S, D] contiguous copies of q, k, v with the block mask of
    the window and causal edge and the softcap as score_mod, those copies): the variants' anchor.
    Bottom-right alignment, as fa_kernel's (seqlen_k - seqlen_q added to each row's diagonal)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    left, right = window_size
    right = 0 if causal else right

    def mask_mod(b, h, q_idx, kv_idx):
        diagonal = q_idx + (seqlen_k - seqlen_q)
        visible = kv_idx >= 0
        if right >= 0:
            visible = visible & (kv_idx <= diagonal + right)
        if left >= 0:
            visible = visible & (kv_idx >= diagonal - left)
        return visible

    def softcap_mod(score, b, h, q_idx, kv_idx):
        return softcap * torch.tanh(score / softcap)

    block_mask = create_block_mask(mask_mod, None, None, seqlen_q, seqlen_k, device=q.device)
    # Each shape, mask and softcap is a compile of its own (dynamic=False: a softcap that varies
    # would become a symbolic float flex cannot lower). Past dynamo's recompile limit flex falls
    # back to eager, which materialises the scores: the limit is raised for a sweep's rows.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
    compiled = torch.compile(flex_attention, dynamic=False)
    inputs = tuple(t.detach().transpose(1, 2).contiguous().requires_grad_(backward) for t in (q, k, v))
    gqa = k.shape[2] != q.shape[2]

    def call():
        return compiled(*inputs, score_mod=softcap_mod if softcap else None, block_mask=block_mask, enable_gqa=gqa)

    return call, inputs


def forward_kernel_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> Callable[[], object]:
    """The forward kernel's launch on these inputs, where flash_attn_func may run the split-KV
    kernels instead."""
    from fa_kernel.interface import forward_kernel_attention

    scale = 1.0 / math.sqrt(q.shape[-1])
    return lambda: forward_kernel_attention(q, k, v, scale, causal)


def split_kv_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> Callable[[], object]:
    """The split-KV kernels' launch on these inputs, for this device's SMs and architecture."""
    from fa_kernel.decode import split_kv_attention
    from fa_kernel.device import device_target

    sm_count, arch = device_target(q.device)
    scale = 1.0 / math.sqrt(q.shape[-1])
    return lambda: split_kv_attention(q, k, v, scale, causal, sm_count, arch)


def gradient_of(
    forward: Callable[[], torch.Tensor], inputs: tuple[torch.Tensor, ...], seed: int = 0
) -> Callable[[], object]:
    """A callable that runs the backward alone: `forward`'s graph is built here, once, and each
    call takes the gradients of `inputs` from it, for a fixed random output gradient."""
    out = forward()
    generator = torch.Generator(out.device).manual_seed(seed + 1)
    grad_out = torch.randn(out.shape, dtype=out.dtype, device=out.device, generator=generator)
    return lambda: torch.autograd.grad(out, inputs, grad_out, retain_graph=True)


@dataclass(frozen=True)
class Timing:
    """TFLOP/s of one implementation on one shape, one figure per alternated round."""

    rounds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.rounds)

    @property
    def spread(self) -> float:
        """(fastest - slowest round) / median."""
        return (max(self.rounds) - min(self.rounds)) / self.median


def alternated(timers: dict[Key, Callable[[], float]], rounds: int) -> dict[Key, list[float]]:
    """Each timer's figures over `rounds`, each round calling every timer once in turn, so that
    the GPU's drift over the rounds falls on all of them alike."""
    samples: dict[Key, list[float]] = {key: [] for key in timers}
    for _ in range(rounds):
        for key, timer in timers.items():
            samples[key].append(timer())
    return samples


def measure(
    shape: Shape, rounds: int = 5, repeats: int = 50, warmup: int = 10, backward: bool = False
) -> dict[str, Timing]:
    """TFLOP/s of each implementation on this shape, measured in this process: `rounds`
    alternated rounds, each the median of `repeats` CUDA-event timings after `warmup` calls;
    `backward`: of the backward alone (runners), at BACKWARD_FLOPS times the forward's FLOPs."""
    flops = shape.flops * (BACKWARD_FLOPS if backward else 1.0)
    return _alternated_tflops(runners(shape, backward=backward), flops, rounds, repeats, warmup)


def measure_variant(
    shape: Shape, variant: dict, rounds: int = 5, repeats: int = 50, warmup: int = 10, backward: bool = False
) -> dict[str, Timing]:
    """TFLOP/s (variant_flops: on the visible pairs) of fa_kernel with `variant` and its anchor
    (variant_runners), measured as `measure` does."""
    flops = variant_flops(shape, variant) * (BACKWARD_FLOPS if backward else 1.0)
    return _alternated_tflops(variant_runners(shape, variant, backward=backward), flops, rounds, repeats, warmup)


def _alternated_tflops(
    fns: dict[str, Callable[[], object]], flops: float, rounds: int, repeats: int, warmup: int
) -> dict[str, Timing]:
    def timer(fn: Callable[[], object]) -> Callable[[], float]:
        return lambda: flops / (cuda_median_ms(fn, warmup, repeats) * 1e-3) / 1e12

    samples = alternated({name: timer(fn) for name, fn in fns.items()}, rounds)
    return {name: Timing(tuple(values)) for name, values in samples.items()}


def variant_anchor(timings: dict[str, Timing]) -> str:
    """The name of the anchor variant_runners timed beside fa_kernel."""
    return "flex" if "flex" in timings else "fa_kernel plain"


def cudnn_best(timings: dict[str, Timing]) -> str | None:
    """The faster of the cuDNN layouts measured (by median), or None where cuDNN took no part."""
    measured = [name for name in CUDNN_LAYOUTS if name in timings]
    return max(measured, key=lambda name: timings[name].median) if measured else None


def ratio_to_cudnn_best(timings: dict[str, Timing], ours: str = "fa_kernel") -> Timing | None:
    """`ours`' TFLOP/s over cuDNN best's, round by round (the two were timed back to back in
    each): the median and spread of the ratio itself. None where cuDNN took no part."""
    best = cudnn_best(timings)
    if best is None or ours not in timings:
        return None
    return ratio_to(timings, best, ours)


def ratio_to(timings: dict[str, Timing], anchor: str, ours: str = "fa_kernel") -> Timing:
    """`ours`' TFLOP/s over `anchor`'s, round by round (timed back to back in each round)."""
    return Timing(
        tuple(mine / theirs for mine, theirs in zip(timings[ours].rounds, timings[anchor].rounds, strict=True))
    )


@dataclass(frozen=True)
class Summary:
    """The ratios to cuDNN best of one head_dim's shapes."""

    head_dim: int
    shapes: int  # shapes measured with a ratio
    median: float
    worst: float
    worst_shape: str


def summarise(results: Iterable[tuple[Shape, dict[str, Timing]]]) -> list[Summary]:
    """Per head_dim, the median and the worst of the median ratios to cuDNN best (shapes cuDNN
    takes no part in are left out)."""
    ratios: dict[int, list[tuple[float, str]]] = {}
    for shape, timings in results:
        ratio = ratio_to_cudnn_best(timings)
        if ratio is not None:
            ratios.setdefault(shape.head_dim, []).append((ratio.median, shape.label()))
    summaries = []
    for head_dim, found in sorted(ratios.items()):
        worst, worst_shape = min(found)
        median = statistics.median(value for value, _ in found)
        summaries.append(Summary(head_dim, len(found), median, worst, worst_shape))
    return summaries


PLOT_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)


PLOT_PANELS = tuple(itertools.product((64, 128), (False, True)))  # (head_dim, causal)


def plot_shapes(dtype: torch.dtype) -> list[Shape]:
    """The shapes plot_seqlen_sweep measures, panel by panel."""
    return [sweep_shape(seqlen, head_dim, causal, dtype) for head_dim, causal in PLOT_PANELS for seqlen in PLOT_SEQLENS]


def plot_seqlen_sweep(
    path: str,
    dtype: torch.dtype,
    repeats: int = 50,
    progress: Callable[[Iterable[int], str], Iterable[int]] = lambda seqlens, description: seqlens,
    rounds: int = 5,
    backward: bool = False,
) -> list[tuple[Shape, dict[str, Timing]]]:
    """TFLOP/s against seq_len (plot_shapes: 32k tokens, 16 heads), one panel per (head_dim,
    causal), drawn to `path`, each point measured as `measure` does (`backward`: of the backward
    alone); returns the measurements by shape. `progress` wraps each panel's lengths (a
    progress bar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = []
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.5), sharey=True)
    for ax, (head_dim, causal) in zip(axes, PLOT_PANELS, strict=True):
        series: dict[str, list[float]] = {}
        for seqlen in progress(PLOT_SEQLENS, f"plot d{head_dim}{' causal' if causal else ''}"):
            shape = sweep_shape(seqlen, head_dim, causal, dtype)
            measured.append((shape, measure(shape, rounds=rounds, repeats=repeats, backward=backward)))
            for name, timing in measured[-1][1].items():
                series.setdefault(name, []).append(timing.median)
        for name, values in series.items():
            ax.plot(PLOT_SEQLENS, values, marker="o", label=name)
        ax.set(
            xscale="log",
            xlabel="seq_len (batch = 32k tokens / seq_len, 16 heads)",
            title=f"head_dim {head_dim}{', causal' if causal else ''}",
        )
        ax.set_xticks(PLOT_SEQLENS, [str(s) for s in PLOT_SEQLENS])
        ax.grid(alpha=0.3)
    passed = "backward" if backward else "forward"
    axes[0].set_ylabel(f"{passed} TFLOP/s ({str(dtype).removeprefix('torch.')})")
    axes[0].legend()
    fig.suptitle(f"fa_kernel vs torch SDPA, the {passed} pass, on {torch.cuda.get_device_name()}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return measured
