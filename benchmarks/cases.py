"""The shape families the suite times, and the setup their benchmarks share.

Each family is a class with asv `params` and a `shape_for(*params)`; `perf` and
`throughput` add the benchmark methods. One launch fills the H200: batch * seqlen_q is
TOKENS, so every case has thousands of (query block, head, batch) tiles for 132 SMs.
"""

import torch

from fa_kernel.workbench.bench import (
    BACKWARD_FLOPS,
    MODEL_TOKENS,
    VARIANTS,
    Shape,
    runners,
    variant_flops,
    variant_runners,
)

TOKENS = 32768  # batch * seqlen_q
HIDDEN = 2048  # nheads * head_dim of the MHA grid: the same bytes per token at every head_dim
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def require_cuda() -> None:
    """Raise in setup where there is no GPU: asv then records the benchmark as skipped."""
    if not torch.cuda.is_available():
        raise NotImplementedError("no CUDA device")


class Case:
    """setup: inputs, kernel compile and a first call of every implementation (untimed).
    `backward`: each implementation's backward alone (the gradients of q, k and v from a forward
    graph built once, bench.gradient_of), at BACKWARD_FLOPS times the forward's FLOPs."""

    timeout = 300  # seconds per benchmark process: a cold TileLang compile is part of setup
    backward = False

    def setup(self, *params):
        require_cuda()
        self.shape = self.shape_for(*params)
        # fa_kernel, and torch SDPA's cuDNN/flash where they take it
        self.fns = runners(self.shape, backward=self.backward)
        for fn in self.fns.values():
            fn()
        torch.cuda.synchronize()

    @property
    def flops(self) -> float:
        return self.shape.flops * (BACKWARD_FLOPS if self.backward else 1.0)

    def shape_for(self, *params) -> Shape:
        raise NotImplementedError


class MHA(Case):
    """Multi-head attention, nheads = HIDDEN / head_dim."""

    params = ([1024, 4096, 16384], [64, 128], [False, True], list(DTYPES))
    param_names = ["seq_len", "head_dim", "causal", "dtype"]

    def shape_for(self, seq_len, head_dim, causal, dtype):
        return Shape(TOKENS // seq_len, HIDDEN // head_dim, seq_len, head_dim, causal, DTYPES[dtype])


class GQA(Case):
    """Grouped-query attention: 32 query heads share 8 K/V heads, head_dim 128, 4096 tokens."""

    params = ([False, True], list(DTYPES))
    param_names = ["causal", "dtype"]

    def shape_for(self, causal, dtype):
        return Shape(TOKENS // 4096, 32, 4096, 128, causal, DTYPES[dtype], nheads_kv=8)


class Prefill(Case):
    """A prefill chunk against a KV cache 4x longer (GQA 32/8, head_dim 128, bf16).

    Causal is bottom-right aligned, which torch SDPA does not offer when seqlen_q != seqlen_k,
    so causal prefill has no cuDNN figure.
    """

    params = ([1024, 4096], [False, True])
    param_names = ["seqlen_q", "causal"]

    def shape_for(self, seqlen_q, causal):
        return Shape(TOKENS // seqlen_q, 32, seqlen_q, 128, causal, torch.bfloat16, nheads_kv=8, seqlen_k=4 * seqlen_q)


class Models(Case):
    """A subset of `fa-kernel bench --grid models` (bench.MODEL_HEADS): odd head counts and GQA
    groups, and d256, at bench.MODEL_TOKENS tokens per launch, bf16. A layer is written
    "query heads/K/V heads x head_dim"."""

    params = (["71/1x64", "28/4x128", "40/10x128", "16/8x256"], [2048, 8192], [False, True])
    param_names = ["layer", "seq_len", "causal"]

    def shape_for(self, layer, seq_len, causal):
        heads, head_dim = layer.split("x")
        nheads, nheads_kv = (int(count) for count in heads.split("/"))
        batch = max(1, MODEL_TOKENS // seq_len)
        return Shape(batch, nheads, seq_len, int(head_dim), causal, torch.bfloat16, nheads_kv=nheads_kv)


class Decode(Case):
    """A decode step: one or four queries of 32 query heads on 8 K/V heads (head_dim 128, bf16)
    against a KV cache of 8k or 32k keys, 16 sequences, which flash_attn_func gives the
    split-KV kernels (configs.split_kv_serves). The measure of a decode step is the K/V it
    reads: throughput's GB/s."""

    params = ([1, 4], [8192, 32768])
    param_names = ["seqlen_q", "seqlen_k"]

    def shape_for(self, seqlen_q, seqlen_k):
        return Shape(16, 32, seqlen_q, 128, False, torch.bfloat16, nheads_kv=8, seqlen_k=seqlen_k)


class HostPath(Case):
    """A call whose kernels take less GPU time than the host spends issuing it: a decode step of
    one sequence against 4096 keys (the split-KV kernels) and 128 tokens of one sequence (the
    forward kernel). What such a call costs is flash_attn_func's Python and its launches."""

    params = (["split-KV", "forward"],)
    param_names = ["path"]

    def shape_for(self, path):
        if path == "split-KV":
            return Shape(1, 32, 1, 128, False, torch.bfloat16, nheads_kv=8, seqlen_k=4096)
        return Shape(1, 16, 128, 128, False, torch.bfloat16)


class Backward(Case):
    """The backward alone of the MHA grid's shapes, bf16 (what training runs), at the head dims
    the gradient kernels serve."""

    backward = True
    params = ([1024, 4096, 16384], [64, 128], [False, True])
    param_names = ["seq_len", "head_dim", "causal"]

    def shape_for(self, seq_len, head_dim, causal):
        return Shape(TOKENS // seq_len, HIDDEN // head_dim, seq_len, head_dim, causal, torch.bfloat16)


class Variants(Case):
    """A sliding window of 1k keys, a softcap of 30 and attention sinks on causal 8k sequences
    (32 heads, head_dim 128, bf16, 32k tokens), forward and backward: fa_kernel against its
    anchor (bench.variant_runners: FlexAttention compiled with the same mask and score_mod, or
    for sinks the plain kernel). FLOPs are counted on the pairs the mask leaves visible
    (bench.variant_flops), as `fa-kernel bench --grid variants` counts them."""

    params = (list(VARIANTS), [False, True])
    param_names = ["variant", "backward"]

    def setup(self, variant, backward):
        require_cuda()
        self.backward = backward
        self.shape = Shape(TOKENS // 8192, 32, 8192, 128, True, torch.bfloat16)
        self.variant = VARIANTS[variant]
        self.fns = variant_runners(self.shape, self.variant, backward=backward)
        for fn in self.fns.values():
            fn()
        torch.cuda.synchronize()

    @property
    def flops(self) -> float:
        return variant_flops(self.shape, self.variant) * (BACKWARD_FLOPS if self.backward else 1.0)
