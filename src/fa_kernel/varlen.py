"""`flash_attn_varlen_func`, shaped like flash-attn's: attention over a ragged batch packed into
one stream, by the forward kernel's varlen build (`kernel.forward_program(varlen=True)`).

Sequence i is rows cu_seqlens_q[i]:cu_seqlens_q[i + 1] of q and cu_seqlens_k[i]:cu_seqlens_k[i + 1]
of k and v; it is attended on its own, with its own bottom-right diagonal and window, and no key
of another sequence. One thread block runs each of a sequence's own query blocks (per head), the
longest K/V walks first (scheduler.ragged_tile_order, from the lengths read on the host to check
them, sent to the device with the launch). Reading cu_seqlens on the host waits for the GPU, so
a pair is read once while both tensors live unwritten (_RaggedLayout): a model's layers pass the
same pair for a whole step. The gradient runs the preprocess and the backward kernel's varlen
build on the packed rows as a batch of one, one thread block per K/V tile of a sequence's own
(scheduler.ragged_key_tile_order), dQ summed by atomic adds, or with `deterministic` by the
fixed-order dQ kernel's varlen build, a block per query tile (scheduler.ragged_tile_order).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import weakref

import torch

from fa_kernel.backward import compiled_gradient_kernels
from fa_kernel.backward_preprocess import PREPROCESS_ROWS, dq_row, statistics_index, statistics_rows
from fa_kernel.configs import DQ_TILES, dk_dv_tiles
from fa_kernel.gradient import sink_gradient
from fa_kernel.interface import check_deterministic, check_inputs, compile_arch, kernel_build
from fa_kernel.kernel import compiled_forward
from fa_kernel.numerics import LOG2E
from fa_kernel.scheduler import ragged_key_tile_order, ragged_tile_order
from fa_kernel.variants import Variants, exponent_scale, launch_arguments


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float | None = None,
    causal: bool = False,
    return_lse: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    deterministic: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ · softmax_scale) v of each sequence of a ragged batch.

    Args:
        q: [total_q, nheads, headdim], float16 or bfloat16, on a Hopper GPU.
        k, v: [total_k, nheads_kv, headdim], same dtype and device as q (GQA as flash_attn_func).
        cu_seqlens_q, cu_seqlens_k: int32 [batch + 1] on q's device, from 0, non-decreasing, the
            last entry q's (k's) total rows: sequence i's rows start at entry i. A sequence may be
            empty. Their values are read on the host (one copy to it) to check them.
        max_seqlen_q, max_seqlen_k: ints at least the longest sequence's length.
        softmax_scale, causal, window_size, softcap, sinks: as flash_attn_func's, per sequence
            (causal and windows around each sequence's own bottom-right diagonal).
        return_lse: also return the LSE, fp32 [nheads, total_q] (flash-attn's varlen layout).
        deterministic: dq by the fixed-order kernel, bitwise repeatable, not by atomic adds.

    Differentiable in q, k, v and sinks (and through the LSE): the gradient kernels' varlen
    builds (_varlen_gradients).

    A sequence with queries and no keys gets output 0 and LSE -inf (its sink's, with sinks).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if isinstance(t, torch.Tensor) and t.dim() != 3:
            raise ValueError(f"{name}: expected a 3-d tensor [total, nheads, headdim], got shape {tuple(t.shape)}")
    inputs = (q, k, v) if sinks is None else (q, k, v, sinks)
    needs_grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)
    check_deterministic(deterministic)
    traced = torch.compiler.is_compiling() or any(type(t) is not torch.Tensor for t in (q, k, v))
    # Traced (torch.compile, export) or on tensor subclasses: the cu_seqlens are read in the op's
    # body, at run time (a host read in the trace would break the graph).
    layout = None if traced else _ragged_layout(cu_seqlens_q, cu_seqlens_k, q, k, max_seqlen_q, max_seqlen_k)
    variants = dict(window_size=window_size, softcap=softcap, sinks=sinks)
    scale = check_inputs(q[None], k[None], v[None], softmax_scale, causal, **variants)
    (left, right), softcap = (int(edge) for edge in window_size), float(softcap)
    ragged = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if traced:
        out, lse = torch.ops.fa_kernel.varlen_forward(
            q, k, v, *ragged, scale, causal, left, right, softcap, sinks, deterministic
        )
    elif needs_grad:
        transformed = torch._C._are_functorch_transforms_active()
        function = _TransformedVarlenAttention if transformed else _VarlenAttention
        out, lse = function.apply(q, k, v, sinks, *ragged, layout, scale, causal, (left, right), softcap, deterministic)
    else:
        out, lse = _varlen_forward(q, k, v, sinks, *ragged, layout, scale, causal, (left, right), softcap)
    return (out, lse) if return_lse else out


# ---- the custom ops: what torch.compile sees (one node each, with a fake and a gradient) ----


@torch.library.custom_op("fa_kernel::varlen_forward", mutates_args=(), device_types="cuda")
def _varlen_forward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    sinks: torch.Tensor | None,
    deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    # `deterministic` is the gradient's (the autograd formula reads it); the forward always is.
    ragged = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    layout = _ragged_layout(*ragged[:2], q, k, *ragged[2:])
    return _varlen_forward(q, k, v, sinks, *ragged, layout, softmax_scale, causal, (window_left, window_right), softcap)


@_varlen_forward_op.register_fake
def _varlen_forward_fake(q, k, v, *_):
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(
        (q.shape[1], q.shape[0]), dtype=torch.float32
    )


@torch.library.custom_op("fa_kernel::varlen_backward", mutates_args=(), device_types="cuda")
def _varlen_backward_op(
    dout: torch.Tensor,
    grad_lse: torch.Tensor | None,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    sinks: torch.Tensor | None,
    deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsinks; empty without sinks)."""
    layout = _ragged_layout(cu_seqlens_q, cu_seqlens_k, q, k, max_seqlen_q, max_seqlen_k)
    options = (layout, softmax_scale, causal, (window_left, window_right), softcap, sinks, deterministic)
    dq, dk, dv, dsinks = _varlen_gradients(dout, grad_lse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *options)
    return dq, dk, dv, q.new_empty(0, dtype=torch.float32) if dsinks is None else dsinks


@_varlen_backward_op.register_fake
def _varlen_backward_fake(dout, grad_lse, q, k, v, *arguments):
    sinks = arguments[11]  # after out, lse, the cu_seqlens, the max_seqlens and five scalars
    grads = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    return *grads, q.new_empty(0 if sinks is None else sinks.shape[0], dtype=torch.float32)


def _varlen_op_context(ctx, inputs, output) -> None:
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *scalars, sinks = inputs[:13]
    ctx.save_for_backward(q, k, v, *output, cu_seqlens_q, cu_seqlens_k, sinks)
    ctx.max_seqlens, ctx.scalars = (max_seqlen_q, max_seqlen_k), tuple(scalars)
    ctx.deterministic = inputs[13] if len(inputs) > 13 else False  # the op called without it: False


def _varlen_op_gradient(ctx, grad_out, grad_lse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sinks = ctx.saved_tensors
    if grad_out is None:  # only the LSE was used
        grad_out = torch.zeros_like(out)
    ragged = (cu_seqlens_q, cu_seqlens_k, *ctx.max_seqlens)
    dq, dk, dv, dsinks = torch.ops.fa_kernel.varlen_backward(
        grad_out, grad_lse, q, k, v, out, lse, *ragged, *ctx.scalars, sinks, ctx.deterministic
    )
    # None for the cu_seqlens, the max_seqlens, the scale, the flag and the window's and cap's values,
    # and deterministic.
    return dq, dk, dv, *([None] * 9), None if sinks is None else dsinks, None


torch.library.register_autograd("fa_kernel::varlen_forward", _varlen_op_gradient, setup_context=_varlen_op_context)


def _varlen_forward(
    q, k, v, sinks, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, layout, scale, causal, window_size, softcap
):
    """(out, lse) of a checked ragged batch: the forward's launch."""
    variants = dict(window_size=window_size, softcap=softcap, sinks=sinks)
    total_q, nheads, head_dim = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((nheads, total_q), dtype=torch.float32, device=q.device)
    if total_q and not k.shape[0]:
        # No keys anywhere: nothing to load (a TMA map of an empty tensor is invalid).
        out.zero_()
        lse.copy_((sinks if sinks is not None else torch.full_like(lse[:, 0], -math.inf))[:, None].expand_as(lse))
    elif total_q:
        q, k, v = (t if t.is_contiguous() else t.contiguous() for t in (q, k, v))
        kernel, config, arguments = _varlen_launch(q, k, max_seqlen_k, scale, causal, **variants)
        order = layout.tile_order(config.block_m, config.block_n, causal, window_size, q.device)
        with torch.cuda.device(q.device):
            kernel(q, k, v, out, lse, *arguments, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, order)
    return out, lse


def _save_for_gradient(ctx, q, k, v, sinks, arguments, output) -> None:
    ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None
    cu_seqlens_q, cu_seqlens_k, _, _, layout, scale, causal, window_size, softcap, deterministic = arguments
    ctx.save_for_backward(q, k, v, *output, cu_seqlens_q, cu_seqlens_k, sinks)
    ctx.options = (layout, scale, causal, window_size, softcap, deterministic)


def _eager_gradient(ctx, grad_out, grad_lse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sinks = ctx.saved_tensors
    if grad_out is None:  # only the LSE was used
        grad_out = torch.zeros_like(out)
    *options, deterministic = ctx.options
    dq, dk, dv, dsinks = _varlen_gradients(
        grad_out, grad_lse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *options, sinks, deterministic
    )
    return dq, dk, dv, dsinks, *([None] * 10)


class _VarlenAttention(torch.autograd.Function):
    """flash_attn_varlen_func's autograd: the forward's launch, and the gradient kernels' varlen
    builds (_varlen_gradients)."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, *arguments):
        # ctx in forward, not setup_context (interface._EagerAttention says why).
        output = _varlen_forward(q, k, v, sinks, *arguments[:-1])  # the last, deterministic, is the gradient's
        _save_for_gradient(ctx, q, k, v, sinks, arguments, output)
        return output

    backward = staticmethod(_eager_gradient)


class _TransformedVarlenAttention(torch.autograd.Function):
    """_VarlenAttention under torch.func's transforms, which need a setup_context."""

    @staticmethod
    def forward(q, k, v, sinks, *arguments):
        return _varlen_forward(q, k, v, sinks, *arguments[:-1])

    @staticmethod
    def setup_context(ctx, inputs, output):
        _save_for_gradient(ctx, *inputs[:4], inputs[4:], output)

    backward = staticmethod(_eager_gradient)


def _varlen_gradients(dout, grad_lse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, layout, scale, causal, window_size,
                      softcap, sinks, deterministic=False):  # fmt: skip
    """(dq, dk, dv, dsinks; None without sinks) of a ragged batch: the preprocess over the packed
    rows as a batch of one, the backward kernel's varlen build over the key tile order, dQ cast
    from its fp32 sums, or `deterministic` the fixed-order dQ kernel's varlen build over the query
    tile order. Each sequence's Delta and LSE₂ rows start aligned, zeros between them
    (backward_preprocess.statistics_start), and dQ's sums have room for one query tile past the
    last row: a tile past a sequence's end reads finite values there (it takes P = 0 by the
    select, and 0·NaN would not be 0)."""
    total_q, nheads, head_dim = q.shape
    dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    dout, q, k, v, out = (t if t.is_contiguous() else t.contiguous() for t in (dout, q, k, v, out))
    delta = torch.zeros(
        (1, nheads, statistics_rows(total_q, len(layout.lengths_q))), dtype=torch.float32, device=q.device
    )
    lse_log2 = torch.zeros_like(delta)
    if total_q and k.shape[0]:
        dtype, arch = str(q.dtype).removeprefix("torch."), compile_arch(q.device)
        variants = Variants.of(causal, window_size, softcap, None)  # the sinks are in the LSE already
        build = dict(head_dim=head_dim, causal=causal, dtype=dtype, arch=arch, variants=variants, varlen=True)
        preprocess, dk_dv, dq_kernel = compiled_gradient_kernels(**build, deterministic=deterministic)
        block_m, block_n, _ = dk_dv_tiles(deterministic)[head_dim]
        order = layout.key_tile_order(block_m, block_n, causal, window_size, q.device)
        scales = (exponent_scale(scale, softcap), scale, *launch_arguments(variants, window_size, softcap, scale, None))
        # dQ's fp32 sums for the atomic kernel, as many rows as Delta's (the kernel takes both at
        # one length; at least one query tile past the last row); a one-element placeholder for
        # the fixed-order dQ's.
        accum_shape = (1, nheads, delta.shape[-1], dq_row(head_dim)) if dq_kernel is None else (1,)
        dq_accum = torch.zeros(accum_shape, dtype=torch.float32, device=q.device)
        with torch.cuda.device(q.device):
            preprocess_order = layout.tile_order(PREPROCESS_ROWS, PREPROCESS_ROWS, False, (-1, -1), q.device)
            preprocess(out[None], dout[None], lse[None], delta, lse_log2, cu_seqlens_q, preprocess_order)
            if grad_lse is not None:
                delta[0, :, layout.statistics_index(q.device)] -= grad_lse
            dk_dv(q[None], k[None], v[None], dout[None], delta, lse_log2, dq_accum, dk[None], dv[None], *scales,
                  cu_seqlens_q, cu_seqlens_k, order)  # fmt: skip
            if dq_kernel is not None:
                dq_m, dq_n, _ = DQ_TILES[head_dim]
                query_order = layout.tile_order(dq_m, dq_n, causal, window_size, q.device)
                dq_kernel(q[None], k[None], v[None], dout[None], delta, lse_log2, dq[None], *scales,
                          cu_seqlens_q, cu_seqlens_k, query_order)  # fmt: skip
            else:
                torch.mul(dq_accum[0, :, :total_q, :head_dim].transpose(0, 1), scale, out=dq)
    else:  # no score anywhere: every gradient 0 but the sinks' (the LSE the sink's, or -inf)
        for grad in (dq, dk, dv):
            grad.zero_()
    if sinks is None:
        return dq, dk, dv, None
    if total_q and k.shape[0]:
        index = layout.statistics_index(q.device)  # each packed row's in Delta and LSE₂
        delta_rows, lse_log2_rows = delta[:, :, index], lse_log2[:, :, index]
    else:  # no preprocess ran: D and LSE₂ from the packed rows
        delta_rows = ((dout.float() * out.float()).sum(dim=-1).T - (0 if grad_lse is None else grad_lse))[None]
        lse_log2_rows = (lse * LOG2E)[None]
    return dq, dk, dv, sink_gradient(sinks, lse_log2_rows, delta_rows)


def _varlen_launch(q, k, max_seqlen_k: int, scale: float, causal: bool, window_size, softcap, sinks):
    """(the varlen build's kernel, its config, its arguments after LSE up to the variants'): the
    config the table gives for the keys a row sees, on the per-tile grid (a ragged batch's own)."""
    head_dim = q.shape[-1]
    batched = kernel_build(q.device, head_dim, causal, q.dtype, max(1, max_seqlen_k), window_size=window_size)
    build = dict(batched, config=batched["config"].per_tile())
    variants = Variants.of(causal, window_size, softcap, sinks)
    kernel = compiled_forward(**build, variants=variants, varlen=True)
    values = launch_arguments(variants, window_size, softcap, scale, sinks)
    return kernel, build["config"], [exponent_scale(scale, softcap), *values]


@dataclasses.dataclass
class _RaggedLayout:
    """What a pair of cu_seqlens was checked to describe (`stamp`: their version counters,
    which torch bumps on every in-place write, and every size the checks read) and the tile
    orders made from their lengths, on the device."""

    cu_seqlens_q: weakref.ref | None  # None: not kept (a layout of tensors without versions)
    cu_seqlens_k: weakref.ref | None
    stamp: tuple | None
    lengths_q: list[int]
    lengths_k: list[int]
    orders: dict = dataclasses.field(default_factory=dict)

    def refers_to(self, cu_seqlens_q, cu_seqlens_k) -> bool:
        """Whether this layout was checked for these very tensors (both still alive)."""
        if self.cu_seqlens_q is None or self.cu_seqlens_k is None:
            return False
        return self.cu_seqlens_q() is cu_seqlens_q and self.cu_seqlens_k() is cu_seqlens_k

    def tile_order(self, block_m, block_n, causal, window_size, device) -> torch.Tensor:
        """The forward's (scheduler.ragged_tile_order), on the device."""
        return self._order(ragged_tile_order, block_m, block_n, causal, window_size, device)

    def key_tile_order(self, block_m, block_n, causal, window_size, device) -> torch.Tensor:
        """The backward's (scheduler.ragged_key_tile_order), on the device."""
        return self._order(ragged_key_tile_order, block_m, block_n, causal, window_size, device)

    def statistics_index(self, device) -> torch.Tensor:
        """Each packed query row's row in the gradient's Delta and LSE₂ (statistics_index), on the device."""
        key = ("statistics_index", device)
        if key not in self.orders:
            self.orders[key] = torch.from_numpy(statistics_index(self.lengths_q)).to(device)
        return self.orders[key]

    def _order(self, make, block_m, block_n, causal, window_size, device) -> torch.Tensor:
        key = (make.__name__, block_m, block_n, causal, tuple(window_size), device)
        if key not in self.orders:
            self.orders[key] = make(self.lengths_q, self.lengths_k, block_m, block_n, causal, window_size).to(device)
        return self.orders[key]


# By id(cu_seqlens_q), dropped when it dies (a tensor's == is elementwise: no WeakKeyDictionary).
_LAYOUTS: dict[int, _RaggedLayout] = {}


def _ragged_layout(cu_seqlens_q, cu_seqlens_k, q, k, max_seqlen_q, max_seqlen_k) -> _RaggedLayout:
    """The checked layout of this pair: the one kept for it if neither tensor was written since
    and the sizes checked against are the same, else checked now (_check_cu_seqlens) and kept."""
    stamp = None
    tensors = (cu_seqlens_q, cu_seqlens_k, q, k)
    if all(isinstance(t, torch.Tensor) for t in tensors) and not any(t.is_inference() for t in tensors[:2]):
        stamp = (
            *((t._version, t.dtype, t.shape, t.device) for t in (cu_seqlens_q, cu_seqlens_k)),
            q.shape[0], k.shape[0], q.device, k.device, max_seqlen_q, max_seqlen_k,
        )  # fmt: skip
        kept = _LAYOUTS.get(id(cu_seqlens_q))
        if kept is not None and kept.stamp == stamp and kept.refers_to(cu_seqlens_q, cu_seqlens_k):
            return kept
    lengths_q, lengths_k = _check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, q, k, max_seqlen_q, max_seqlen_k)
    if stamp is None:
        return _RaggedLayout(None, None, None, lengths_q, lengths_k)
    layout = _RaggedLayout(weakref.ref(cu_seqlens_q), weakref.ref(cu_seqlens_k), stamp, lengths_q, lengths_k)
    if id(cu_seqlens_q) not in _LAYOUTS:
        weakref.finalize(cu_seqlens_q, _LAYOUTS.pop, id(cu_seqlens_q), None)
    _LAYOUTS[id(cu_seqlens_q)] = layout
    return layout


def _check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, q, k, max_seqlen_q, max_seqlen_k) -> tuple[list, list]:
    """Raise unless the cu_seqlens describe q's and k's rows and the max_seqlens bound them; the
    sequences' lengths (q's, k's). Reads their values on the host (one copy each)."""
    lengths = {}
    for name, cu, t, total_name in (("cu_seqlens_q", cu_seqlens_q, q, "q"), ("cu_seqlens_k", cu_seqlens_k, k, "k")):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 1:
            raise ValueError(f"{name}: expected an int32 tensor [batch + 1], got {cu.dtype} of shape {tuple(cu.shape)}")
        if isinstance(t, torch.Tensor) and cu.device != t.device:
            raise ValueError(f"{name}: expected {total_name}'s device {t.device}, got {cu.device}")
        values = cu.tolist()
        if values[0] != 0:
            raise ValueError(f"{name}: expected its first entry 0, got {values[0]}")
        steps = [b - a for a, b in zip(values, values[1:], strict=False)]
        if any(step < 0 for step in steps):
            index = next(i for i, step in enumerate(steps) if step < 0)
            raise ValueError(f"{name}: expected non-decreasing entries, got {values[index]} then {values[index + 1]}")
        if isinstance(t, torch.Tensor) and values[-1] != t.shape[0]:
            raise ValueError(
                f"{name}: expected its last entry {total_name}'s total rows {t.shape[0]}, got {values[-1]}"
            )
        lengths[name] = steps
    if len(lengths["cu_seqlens_q"]) != len(lengths["cu_seqlens_k"]):
        raise ValueError(
            f"cu_seqlens_k: expected as many sequences as cu_seqlens_q ({len(lengths['cu_seqlens_q'])}), "
            f"got {len(lengths['cu_seqlens_k'])}"
        )
    for name, bound, steps in (
        ("max_seqlen_q", max_seqlen_q, lengths["cu_seqlens_q"]),
        ("max_seqlen_k", max_seqlen_k, lengths["cu_seqlens_k"]),
    ):
        if not isinstance(bound, numbers.Integral) or isinstance(bound, bool):
            raise TypeError(f"{name}: expected an int, got {type(bound).__name__}")
        if bound < max(steps, default=0):
            raise ValueError(f"{name}: expected at least the longest sequence's length {max(steps)}, got {bound}")
    return lengths["cu_seqlens_q"], lengths["cu_seqlens_k"]
