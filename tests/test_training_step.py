"""A training step through flash_attn_func: a small pre-norm transformer block (GQA, causal)
under torch.compile, forward and backward, against the same block in fp32.

The bound is flash-attn's rule at the block's edges: the output, the input's gradient and every
parameter's gradient each within twice the error of the same block in the same precision with
attention in plain PyTorch (its error is what any correct attention of that precision adds on
top of the other layers'), plus one rounding of the fp32 result to bf16. It catches the wiring:
a gradient dropped, a row or the mask wrong (15-100x the bound, tried with such attentions);
a kernel's subtler errors are the kernel judges' (a 2% error of the scale stays within it here).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from fa_kernel import flash_attn_func


def plain_attention(q, k, v):
    """Causal attention in q's dtype as flash-attn's tests' baseline computes it (scores and
    P·V by PyTorch's GEMMs, the softmax in fp32, P rounded to the dtype), with autograd."""
    group = q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
    scores = torch.einsum("bshd,bthd->bhst", q, k) / math.sqrt(q.shape[-1])
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    hidden = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=q.device).triu(seqlen_k - seqlen_q + 1)
    weights = torch.softmax(scores.masked_fill(hidden, -math.inf).float(), dim=-1).to(v.dtype)
    return torch.einsum("bhst,bthd->bshd", weights, v)


def kernel_attention(q, k, v):
    return flash_attn_func(q, k, v, causal=True)


class Block(nn.Module):
    """x + out(attention(norm(x))), then x + mlp(norm(x)): a decoder layer's shape."""

    def __init__(self, head_dim: int, heads: int, heads_kv: int):
        super().__init__()
        self.shape = (head_dim, heads, heads_kv)
        dim = head_dim * heads
        self.norm_attention, self.norm_mlp = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, (heads + 2 * heads_kv) * head_dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.attention = plain_attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        head_dim, heads, heads_kv = self.shape
        batch, seqlen, _ = x.shape
        q, k, v = self.qkv(self.norm_attention(x)).split([heads * head_dim, *(2 * [heads_kv * head_dim])], dim=-1)
        q = q.view(batch, seqlen, heads, head_dim)
        k, v = (t.view(batch, seqlen, heads_kv, head_dim) for t in (k, v))
        x = x + self.out(self.attention(q, k, v).flatten(2))
        return x + self.mlp(self.norm_mlp(x))


def step(block: nn.Module, x: torch.Tensor, dout: torch.Tensor) -> dict[str, torch.Tensor]:
    """The block's output and the gradients of x and of every parameter, by name."""
    x = x.detach().requires_grad_()
    out = block(x)
    out.backward(dout)
    module = getattr(block, "_orig_mod", block)  # torch.compile's wrapper names them "_orig_mod.*"
    return {"out": out.detach(), "x": x.grad, **{name: p.grad for name, p in module.named_parameters()}}


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim, heads, heads_kv", [(64, 4, 2), (128, 4, 1), (256, 2, 1)])
def test_a_compiled_block_trains_within_the_bound_of_its_plain_twin(head_dim, heads, heads_kv):
    torch.manual_seed(head_dim)
    model = Block(head_dim, heads, heads_kv).cuda().to(torch.bfloat16)
    x = torch.randn(2, 333, head_dim * heads, device="cuda", dtype=torch.bfloat16)  # partial tiles
    dout = torch.randn_like(x)
    reference = step(copy.deepcopy(model).float(), x.float(), dout.float())  # the same weights, in fp32
    baseline = step(copy.deepcopy(model), x, dout)
    model.attention = kernel_attention
    compiled = torch.compile(model, fullgraph=True)  # flash_attn_func as its custom ops
    result = step(compiled, x, dout)
    for name, ref in reference.items():
        rounded = ref.to(torch.bfloat16).float()
        rounding = 2 * ((rounded + 0.3) - 0.3 - rounded).abs().max().item()
        bound = 2 * (baseline[name].float() - ref).abs().max().item() + rounding
        error = (result[name].float() - ref).abs().max().item()
        assert error <= bound, f"{name}: max error {error:.3g} against the bound {bound:.3g}"
