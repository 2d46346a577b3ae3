"""The public API: `flash_attn_func`, shaped like flash-attn's, over the TileLang kernel.

Everything a caller can get wrong is checked here, before anything is compiled or launched,
and each error names the argument, what was expected and what came. The kernel itself is
registered as the torch custom op `fa_kernel::forward`, so `torch.compile` traces through
`flash_attn_func` without a graph break; its gradient is the custom op `fa_kernel::backward`
(the gradient kernels' launch, `fa_kernel.gradient`), registered as its autograd formula. In eager
mode the ops' bodies run without the ops' dispatch (`_EagerAttention`), which would cost the
host more than a decode step's kernels take on the GPU. A decode
step, a few queries against many keys, runs on the split-KV kernels of `fa_kernel.decode`
instead where they measured faster (`configs.split_kv_serves` says which calls).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import torch

from fa_kernel.configs import (
    TileConfig,
    arch_of,
    select_config,
    tiles_per_sm,
)
from fa_kernel.decode import compiled_decode_kernels, row_block, serves_launch, split_kv_attention
from fa_kernel.device import DTYPE_NAMES, device_facts, device_target
from fa_kernel.gradient import backward_into
from fa_kernel.kernel import compiled_forward
from fa_kernel.variants import Variants, exponent_scale, keys_a_row_sees, launch_arguments

SUPPORTED_DTYPES = tuple(DTYPE_NAMES)
SUPPORTED_HEAD_DIMS = (64, 128, 256)


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    return_lse: bool = False,
    deterministic: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ · softmax_scale) v, computed by the FlashAttention forward kernel, or for a
    decode step (a GQA group's queries fit 64 rows; causal only with one query) by the split-KV
    kernels, which read each K/V head once for its group.

    Args:
        q: [batch, seqlen_q, nheads, headdim], float16 or bfloat16, on a Hopper GPU.
        k, v: [batch, seqlen_k, nheads_kv, headdim], same dtype and device as q.
            nheads must be a multiple of nheads_kv (GQA/MQA): query head h reads
            K/V head h // (nheads // nheads_kv). K/V are never copied per query head.
        softmax_scale: a positive finite number; default 1 / sqrt(headdim).
        causal: mask aligned to the bottom-right corner, as flash-attn >= 2.1 does:
            query i sees key j iff j <= i + seqlen_k - seqlen_q. A query row that sees
            no key (possible when seqlen_q > seqlen_k) gets output 0 and LSE -inf.
        return_lse: also return the log-sum-exp of the scaled scores, natural log,
            float32, [batch, nheads, seqlen_q].
        deterministic: the gradients bitwise the same from run to run: dq summed in a fixed
            order by a kernel of its own (two GEMMs more than the atomic sum). The forward
            is deterministic either way.
        window_size: (left, right), -1 for no limit on that side (flash-attn's): query i
            sees key j iff i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q +
            right. causal=True is right = 0, and both may be given.
        softcap: where > 0, each scaled score s becomes softcap * tanh(s / softcap).
        sinks: None, or fp32 [nheads] on q's device: row i of head h gains exp(sinks[h]) in
            its softmax denominator (no value is added for it); the LSE includes it.

    headdim 64, 128 and 256 are supported, on Hopper GPUs (H100, H200); seqlen_q, seqlen_k
    and batch can be any size, including 0 (an empty result, nothing launched). Inputs
    whose memory is not contiguous (for example q, k, v sliced out of one packed qkv
    tensor) are copied once to contiguous memory before the launch; contiguous inputs are
    never copied.

    NaN and Inf inputs (docs/nonfinite.md): a NaN in a row's q, or in k at a key the row
    sees, makes that row's output and LSE NaN; a NaN in v at a key the row sees makes that
    column of its output NaN. A score of +inf gives a NaN row and LSE; a row whose every
    score is -inf gives 0 and LSE -inf, as a row that sees no key. Known limitation: the mask
    is written as -inf into the scores before q kᵀ is added to it, so a NaN (or an Inf giving
    a NaN or +inf score) in k at a key hidden from a row, but in a key tile the row's
    warpgroup computes, or in the q of a row that sees no key, makes that row NaN where the
    fp32 reference keeps it finite; and a NaN or Inf in v at such a hidden key reaches the row
    as 0 times NaN in the P v product, as in any attention that computes it with a GEMM.

    Gradients (autograd, eager and under torch.compile) come from the backward kernels, for
    out and for lse, at every headdim. dq's fp32 sums arrive by atomic adds, in no fixed order,
    unless `deterministic`.

    Returns:
        out [batch, seqlen_q, nheads, headdim] in q's dtype, or (out, lse).
    """
    softmax_scale = check_inputs(q, k, v, softmax_scale, causal, window_size=window_size, softcap=softcap, sinks=sinks)
    check_deterministic(deterministic)
    (left, right), softcap = (int(edge) for edge in window_size), float(softcap)
    leaves = (q, k, v) if sinks is None else (q, k, v, sinks)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in leaves)
    variant_args = (left, right, softcap, sinks)
    if torch.compiler.is_compiling() or any(type(t) is not torch.Tensor for t in (q, k, v)):
        # Traced (torch.compile, export), or a tensor subclass (fake tensors among them): the
        # custom op, which they see as one node with its fake and its gradient.
        out, lse = torch.ops.fa_kernel.forward(q, k, v, softmax_scale, causal, deterministic, *variant_args)
    elif needs_grad:
        transformed = torch._C._are_functorch_transforms_active()
        function = _TransformedAttention if transformed else _EagerAttention
        out, lse = function.apply(q, k, v, softmax_scale, causal, deterministic, *variant_args)
    else:
        out, lse = _attention(q, k, v, softmax_scale, causal, *variant_args)
    return (out, lse) if return_lse else out


def check_deterministic(deterministic) -> None:
    """TypeError unless `deterministic` is a bool (a truthy tensor or int would pass silently)."""
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic: expected a bool, got {type(deterministic).__name__}")


def tile_config_for(
    device: torch.device, head_dim: int, causal: bool, seqlen_k: int | None, grid: float | None = None
) -> TileConfig:
    """The tile configuration the kernel uses on this device for this case (seqlen_k None: the
    long-sequence entry; grid: the launch's work tiles per SM, configs.tiles_per_sm, None: a
    full grid)."""
    return select_config(arch_of(device_facts(device)[0]), head_dim, causal, seqlen_k, grid)


def compile_arch(device: torch.device) -> str:
    """The nvcc architecture to compile for: the 'a' variant unlocks wgmma and setmaxnreg."""
    return device_target(device)[1]


def kernel_build(
    device: torch.device,
    head_dim: int,
    causal: bool,
    dtype: torch.dtype,
    seqlen_k: int | None = None,
    *,
    launch: tuple[int, int, int] | None = None,
    config: TileConfig | None = None,
    sm_count: int | None = None,
    window_size: tuple[int, int] = (-1, -1),
) -> dict:
    """compiled_forward's arguments for this case on this device: the config the table gives
    for the keys a row sees (seqlen_k, or a window's span: variants.keys_a_row_sees) on a launch
    of (batch, heads, seqlen_q) (its grid against the device's SMs; None: a full grid), or
    `config`; the device's architecture and its SM count (the persistent grid's size; or
    `sm_count`). `fa_kernel.workbench.builds` builds the same ahead of use, and the tests build
    other configs and grids through it."""
    device_sm_count, arch = device_target(device)
    grid = None if launch is None else tiles_per_sm(*launch, device_sm_count)
    # A window's row block visits a few tiles however long the sequence: the config of that many keys.
    keys = seqlen_k if seqlen_k is None else keys_a_row_sees(seqlen_k, causal, window_size)
    return dict(
        head_dim=head_dim,
        causal=causal,
        dtype=DTYPE_NAMES[dtype],
        config=config or tile_config_for(device, head_dim, causal, keys, grid),
        arch=arch,
        sm_count=sm_count or device_sm_count,
    )


def split_kv_build(head_dim: int, causal: bool, dtype: str, arch: str, block_m: int) -> dict:
    """compiled_decode_kernels' arguments of the split-KV build flash_attn_func runs for a call
    whose group's rows take the `block_m` tile (decode.row_block)."""
    return dict(head_dim=head_dim, causal=causal, dtype=dtype, arch=arch, block_m=block_m)


def serving_build(
    device: torch.device,
    head_dim: int,
    causal: bool,
    dtype: torch.dtype,
    batch: int,
    seqlen_q: int,
    seqlen_k: int,
    heads: int,
    heads_kv: int,
) -> tuple[Callable[..., object] | None, dict]:
    """(builder, arguments) of the kernels flash_attn_func runs for this case, as
    `fa_kernel.workbench.builds` takes them: the split-KV kernels' where they serve the launch, else the
    forward kernel's (None: compiled_forward, kernel_build's arguments)."""
    if serves_launch(batch, seqlen_q, seqlen_k, heads, heads_kv, device_target(device)[0]):
        block_m = row_block(head_dim, heads // heads_kv * seqlen_q)
        return compiled_decode_kernels, split_kv_build(
            head_dim, causal, DTYPE_NAMES[dtype], compile_arch(device), block_m
        )
    return None, kernel_build(device, head_dim, causal, dtype, seqlen_k, launch=(batch, heads, seqlen_q))


def check_inputs(q, k, v, softmax_scale, causal, **variants) -> float:
    """Validate everything (`variants`: window_size, softcap, sinks); return the softmax scale to use."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(
                f"{name}: expected a 4-d tensor [batch, seqlen, nheads, headdim], got shape {tuple(t.shape)}"
            )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name}: expected dtype float16 or bfloat16, got {t.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"k, v: expected the dtype of q ({q.dtype}), got k {k.dtype} and v {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    batch, _, nheads, head_dim = q.shape
    if k.shape[0] != batch:
        raise ValueError(f"k: expected batch {batch} (as q), got {k.shape[0]}")
    if k.shape[3] != head_dim:
        raise ValueError(f"k: expected headdim {head_dim} (as q), got {k.shape[3]}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"q: expected headdim in {SUPPORTED_HEAD_DIMS}, got {head_dim}")
    nheads_kv = k.shape[2]
    if nheads_kv == 0 or nheads % nheads_kv != 0:
        raise ValueError(f"k: expected nheads_kv dividing nheads of q ({nheads}), got {nheads_kv}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    elif not isinstance(softmax_scale, numbers.Real) or isinstance(softmax_scale, bool):
        raise TypeError(f"softmax_scale: expected a real number or None, got {type(softmax_scale).__name__}")
    elif not (math.isfinite(float(softmax_scale)) and float(softmax_scale) > 0):
        # A non-positive scale would turn the -inf of masked keys into +inf or NaN.
        raise ValueError(f"softmax_scale: expected a positive finite number, got {softmax_scale}")
    _check_variants(q, **variants)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cuda":
            raise ValueError(f"{name}: expected a tensor on a CUDA device, got device {t.device}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"k, v: expected q's device {q.device}, got k on {k.device} and v on {v.device}")
    _require_hopper(q.device)
    return float(softmax_scale)


def _check_variants(q, window_size=(-1, -1), softcap=0.0, sinks=None) -> None:
    """Validate the variants' arguments (before the device: a laptop sees these errors too)."""
    if (
        not isinstance(window_size, (tuple, list))
        or len(window_size) != 2
        or not all(isinstance(edge, numbers.Integral) and not isinstance(edge, bool) for edge in window_size)
    ):
        raise TypeError(f"window_size: expected a pair of ints (left, right), got {window_size!r}")
    if any(edge < -1 for edge in window_size):
        raise ValueError(f"window_size: expected each edge >= -1 (-1: no limit), got {tuple(window_size)}")
    if not isinstance(softcap, numbers.Real) or isinstance(softcap, bool):
        raise TypeError(f"softcap: expected a real number, got {type(softcap).__name__}")
    if not (math.isfinite(float(softcap)) and float(softcap) >= 0):
        raise ValueError(f"softcap: expected a finite number >= 0 (0: no cap), got {softcap}")
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor):
            raise TypeError(f"sinks: expected a torch.Tensor or None, got {type(sinks).__name__}")
        if sinks.shape != (q.shape[2],) or sinks.dtype != torch.float32 or sinks.device != q.device:
            raise ValueError(
                f"sinks: expected a float32 tensor of shape ({q.shape[2]},) (q's nheads) on {q.device}, got "
                f"{sinks.dtype} of shape {tuple(sinks.shape)} on {sinks.device}"
            )


def _require_hopper(device: torch.device) -> None:
    """ValueError naming the GPU unless it is a Hopper (compute capability 9.x)."""
    capability = device_facts(device)[0]
    if capability[0] != 9:
        # The kernel is built from TMA, wgmma and setmaxnreg: Hopper's instructions only.
        raise ValueError(
            f"q: expected a tensor on a Hopper GPU (compute capability 9.x), got {device} "
            f"({torch.cuda.get_device_name(device)}, compute capability {capability[0]}.{capability[1]})"
        )


@torch.library.custom_op("fa_kernel::forward", mutates_args=(), device_types="cuda")
def _forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    deterministic: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    # `deterministic` is the gradient's (the autograd formula reads it); the forward always is.
    return _attention(q, k, v, softmax_scale, causal, window_left, window_right, softcap, sinks)


def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of validated inputs: the forward op's body."""
    if q.numel() == 0:
        return _outputs_like(q)
    if k.shape[1] == 0:
        # No keys at all: every row is fully masked (and a zero-length TMA box is invalid): output
        # 0, and the LSE -inf, or the sink's alone.
        out, lse = _outputs_like(q)
        return out.zero_(), lse.fill_(-math.inf) if sinks is None else lse.copy_(sinks[None, :, None].expand_as(lse))
    # The kernels assume dense BSHD strides; this is the one documented copy.
    q, k, v = (t if t.is_contiguous() else t.contiguous() for t in (q, k, v))
    batch, seqlen_q, heads, _ = q.shape
    sm_count, arch = device_target(q.device)
    variants: dict[str, Any] = dict(window_size=(window_left, window_right), softcap=softcap, sinks=sinks)
    if serves_launch(batch, seqlen_q, k.shape[1], heads, k.shape[2], sm_count):
        return split_kv_attention(q, k, v, softmax_scale, causal, sm_count, arch, **variants)
    return forward_kernel_attention(q, k, v, softmax_scale, causal, **variants)


def forward_kernel_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) by the forward kernel, in the config the table gives for the keys a row sees
    and the launch's grid (kernel_build), whatever flash_attn_func would choose: q,
    k, v dense [batch, seqlen, heads, head_dim] on one Hopper GPU as flash_attn_func checks and
    makes them, seqlen_k >= 1."""
    out, lse = _outputs_like(q)
    batch, seqlen_q, heads, head_dim = q.shape
    variants = Variants.of(causal, window_size, softcap, sinks)
    launch = (batch, heads, seqlen_q)
    build = kernel_build(q.device, head_dim, causal, q.dtype, k.shape[1], launch=launch, window_size=window_size)
    kernel = compiled_forward(**build, variants=variants)
    variant_args = launch_arguments(variants, window_size, softcap, softmax_scale, sinks)
    with torch.cuda.device(q.device):
        kernel(q, k, v, out, lse, exponent_scale(softmax_scale, softcap), *variant_args)
    return out, lse


def _outputs_like(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised (out, lse) for q: out contiguous in q's dtype, lse fp32 [batch, heads, seqlen_q]."""
    batch, seqlen_q, nheads, _ = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(
        (batch, nheads, seqlen_q), dtype=torch.float32
    )


@_forward.register_fake
def _forward_fake(q, k, v, softmax_scale, causal, deterministic=False, *variant_args):
    return _outputs_like(q)


@torch.library.custom_op("fa_kernel::backward", mutates_args=(), device_types="cuda")
def _backward(
    dout: torch.Tensor,
    grad_lse: torch.Tensor | None,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    deterministic: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    arguments = (softmax_scale, causal, deterministic, window_left, window_right, softcap, sinks)
    return _gradients(dout, grad_lse, q, k, v, out, lse, *arguments)


def _gradients(dout, grad_lse, q, k, v, out, lse, softmax_scale, causal, deterministic, *variant_args) -> tuple:
    """(dq, dk, dv, dsinks), contiguous, dsinks empty without sinks: the backward op's body, its
    arguments the op's (`variant_args`: window_left, window_right, softcap, sinks)."""
    window_left, window_right, softcap, sinks = variant_args
    dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    variants: dict[str, Any] = dict(window_size=(window_left, window_right), softcap=softcap, sinks=sinks)
    arguments = (dout, grad_lse, q, k, v, out, lse, softmax_scale, causal, deterministic)
    dsinks = backward_into(dq, dk, dv, *arguments, **variants)
    return dq, dk, dv, q.new_empty(0, dtype=torch.float32) if dsinks is None else dsinks


@_backward.register_fake
def _backward_fake(dout, grad_lse, q, k, v, out, lse, softmax_scale, causal, deterministic=False, *variant_args):
    sinks = variant_args[3] if len(variant_args) > 3 else None
    return (
        torch.empty_like(q, memory_format=torch.contiguous_format),
        torch.empty_like(k, memory_format=torch.contiguous_format),
        torch.empty_like(v, memory_format=torch.contiguous_format),
        q.new_empty(0 if sinks is None else sinks.shape[0], dtype=torch.float32),
    )


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, softmax_scale, causal, deterministic, *variant_args = inputs
    # The op called without the variants' arguments takes their defaults.
    defaults: tuple = (-1, -1, 0.0, None)
    window_left, window_right, softcap, sinks = tuple(variant_args) + defaults[len(variant_args) :]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sinks)
    ctx.softmax_scale = softmax_scale
    ctx.causal = causal
    ctx.deterministic = deterministic
    ctx.variant_args = (window_left, window_right, softcap)


def _saved_gradients(ctx, grad_out, grad_lse, backward: Callable) -> tuple:
    """(dq, dk, dv, dsinks; None without sinks)."""
    q, k, v, out, lse, sinks = ctx.saved_tensors
    if grad_out is None:  # only the LSE was used
        grad_out = torch.zeros_like(out)
    arguments = (ctx.softmax_scale, ctx.causal, ctx.deterministic, *ctx.variant_args, sinks)
    dq, dk, dv, dsinks = backward(grad_out, grad_lse, q, k, v, out, lse, *arguments)
    return dq, dk, dv, None if sinks is None else dsinks


def _forward_gradient(ctx, grad_out, grad_lse):
    # The forward op's autograd formula: under torch.compile the backward is traced as an op too.
    dq, dk, dv, dsinks = _saved_gradients(ctx, grad_out, grad_lse, torch.ops.fa_kernel.backward)
    # None for the scale, the flags and the window's and cap's values.
    return dq, dk, dv, None, None, None, None, None, None, dsinks


torch.library.register_autograd("fa_kernel::forward", _forward_gradient, setup_context=_setup_context)


def _eager_gradient(ctx, grad_out, grad_lse):
    dq, dk, dv, dsinks = _saved_gradients(ctx, grad_out, grad_lse, _gradients)
    return dq, dk, dv, None, None, None, None, None, None, dsinks


class _EagerAttention(torch.autograd.Function):
    """flash_attn_func's autograd in eager mode: the ops' bodies, the same gradient formula, and
    not the custom ops' dispatch, which costs the host about 60 µs a call on the H200
    (perf/host_overhead.py): more than a decode step's or a short sequence's kernels take."""

    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal, deterministic, window_left, window_right, softcap, sinks):
        # ctx in forward, not a setup_context: with one, apply binds each call's arguments to
        # forward's signature through inspect, tens of µs of host time a call (docs/perf-log.md).
        output = _attention(q, k, v, softmax_scale, causal, window_left, window_right, softcap, sinks)
        # An unused output's gradient arrives as None, as the op's formula takes it.
        ctx.set_materialize_grads(False)
        inputs = (q, k, v, softmax_scale, causal, deterministic, window_left, window_right, softcap, sinks)
        _setup_context(ctx, inputs, output)
        return output

    backward = staticmethod(_eager_gradient)


class _TransformedAttention(torch.autograd.Function):
    """_EagerAttention under torch.func's transforms (grad, vjp, ...), which take an
    autograd.Function only with a setup_context."""

    @staticmethod
    def forward(q, k, v, softmax_scale, causal, deterministic, window_left, window_right, softcap, sinks):
        return _attention(q, k, v, softmax_scale, causal, window_left, window_right, softcap, sinks)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.set_materialize_grads(False)
        _setup_context(ctx, inputs, output)

    backward = staticmethod(_eager_gradient)
