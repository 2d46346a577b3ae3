"""The backward's groundwork, on the CPU: the reference backward (reference_backward.attention_backward_ref)
checked against autograd and finite differences, the gradient judge seen failing wrong
gradients, and the emulator's tiled backward (the kernel's specification) judged by it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from suite.strategies import cases

from fa_kernel.emulator import attention_backward_tiled, attention_tiled
from fa_kernel.reference import attention_ref, random_qkv
from fa_kernel.reference_backward import attention_backward_ref, judge_backward

SCALE = 0.3


class ReferenceAttention(torch.autograd.Function):
    """attention_ref's output in float64, with attention_backward_ref as its backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal):
        ctx.save_for_backward(q, k, v)
        ctx.causal = causal
        return attention_ref(q, k, v, causal, SCALE, compute_dtype=torch.float64)[0]

    @staticmethod
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        return (*attention_backward_ref(q, k, v, dout, ctx.causal, SCALE, compute_dtype=torch.float64), None)


def float64_inputs(seqlen_q, seqlen_k, nheads=4, nheads_kv=2, head_dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(2, seqlen_q, nheads, head_dim), (2, seqlen_k, nheads_kv, head_dim), (2, seqlen_k, nheads_kv, head_dim)]
    return [torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True) for shape in shapes]


# Lengths where every row sees a key (autograd through the softmax of a row without one is NaN).
@pytest.mark.parametrize(("seqlen_q", "seqlen_k"), [(5, 5), (3, 7), (1, 4), (6, 6)])
@pytest.mark.parametrize("causal", [False, True])
def test_closed_form_matches_autograd(seqlen_q, seqlen_k, causal):
    q, k, v = float64_inputs(seqlen_q, seqlen_k, seed=seqlen_q * 10 + seqlen_k)
    dout = torch.randn(q.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out, _ = attention_ref(q, k, v, causal, SCALE, compute_dtype=torch.float64)
    want = torch.autograd.grad(out, (q, k, v), dout)
    got = attention_backward_ref(q.detach(), k.detach(), v.detach(), dout, causal, SCALE, compute_dtype=torch.float64)
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        torch.testing.assert_close(g, w, msg=name)


@pytest.mark.parametrize("causal", [False, True])
def test_closed_form_with_an_lse_gradient_matches_autograd(causal):
    # flash_attn_func returns the LSE too: its gradient enters dS as -D (dLSE_i/dS_ij = P_ij).
    q, k, v = float64_inputs(5, 7, seed=3)
    gen = torch.Generator().manual_seed(2)
    dout = torch.randn(q.shape, dtype=torch.float64, generator=gen)
    grad_lse = torch.randn(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float64, generator=gen)
    out, lse = attention_ref(q, k, v, causal, SCALE, compute_dtype=torch.float64)
    want = torch.autograd.grad((out, lse), (q, k, v), (dout, grad_lse))
    got = attention_backward_ref(
        q.detach(), k.detach(), v.detach(), dout, causal, SCALE, compute_dtype=torch.float64, grad_lse=grad_lse
    )
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        torch.testing.assert_close(g, w, msg=name)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(-1, -1), (1, 0), (0, 2), (2, 1)], ids=str)
@pytest.mark.parametrize("softcap", [0.0, 0.7])
@pytest.mark.parametrize("with_sinks", [False, True], ids=["", "sinks"])
def test_the_variants_closed_form_matches_autograd(causal, window, softcap, with_sinks):
    # Windows that keep a key on every row (rows without one have no autograd gradient), a cap
    # that saturates scores of order 1, a sink per head; with an LSE gradient, which the sink
    # gradient reads through D.
    q, k, v = float64_inputs(5, 7, seed=11)
    gen = torch.Generator().manual_seed(5)
    dout = torch.randn(q.shape, dtype=torch.float64, generator=gen)
    grad_lse = torch.randn(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float64, generator=gen)
    sinks = torch.tensor([0.3, -1.0, 1.5, 0.0], dtype=torch.float64, requires_grad=True) if with_sinks else None
    options = dict(window_size=window, softcap=softcap, sinks=sinks)
    out, lse = attention_ref(q, k, v, causal, SCALE, compute_dtype=torch.float64, **options)
    inputs = (q, k, v) if sinks is None else (q, k, v, sinks)
    want = torch.autograd.grad((out, lse), inputs, (dout, grad_lse))
    detached = dict(options, sinks=None if sinks is None else sinks.detach())
    got = attention_backward_ref(
        q.detach(),
        k.detach(),
        v.detach(),
        dout,
        causal,
        SCALE,
        compute_dtype=torch.float64,
        grad_lse=grad_lse,
        **detached,
    )
    assert len(got) == len(inputs)
    for name, g, w in zip(("dq", "dk", "dv", "dsinks"), got, want, strict=False):
        torch.testing.assert_close(g, w, msg=name)


@pytest.mark.parametrize(("seqlen_q", "seqlen_k"), [(4, 4), (6, 3), (2, 5)])
@pytest.mark.parametrize("causal", [False, True])
def test_closed_form_passes_finite_differences(seqlen_q, seqlen_k, causal):
    # Rows without a key included (causal, 6 queries over 3 keys): their output is 0 whatever
    # the inputs, so every derivative through them is 0.
    q, k, v = float64_inputs(seqlen_q, seqlen_k, nheads=2, nheads_kv=1, head_dim=4, seed=7)
    assert torch.autograd.gradcheck(lambda q, k, v: ReferenceAttention.apply(q, k, v, causal), (q, k, v))


def test_rows_that_see_no_key_get_zero_gradient_never_nan():
    q, k, v = float64_inputs(6, 2)
    dout = torch.randn(q.shape, dtype=torch.float64)
    dq, dk, dv = attention_backward_ref(q.detach(), k.detach(), v.detach(), dout, True, SCALE)
    assert torch.all(dq[:, :4] == 0)  # rows 0-3 see no key
    assert all(torch.isfinite(grad).all() for grad in (dq, dk, dv))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_judge_passes_the_baseline_and_fails_a_wrong_gradient(dtype, causal):
    q, k, v = random_qkv(2, 70, 90, 4, 2, 64, dtype, seed=3, device="cpu")
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(4)).to(dtype)
    baseline = attention_backward_ref(q, k, v, dout, causal, upcast=False)
    verdict = judge_backward(q, k, v, dout, baseline, causal)
    assert verdict.passed, str(verdict)
    assert all(bound.baseline_max_abs > 0 for bound in verdict.bounds.values()), str(verdict)
    dq, dk, dv = baseline
    wrong = {
        # a 5% slip in the scale of dQ (1% is within bf16's rounding at |dq| ~ 2: an ulp is 0.4-0.8%)
        "dq": (dq * 1.05, dk, dv),
        # dK of a GQA group from its first query head only
        "dk": (
            dq,
            attention_backward_ref(q[:, :, ::2].contiguous(), k, v, dout[:, :, ::2].contiguous(), causal)[1].to(dtype),
            dv,
        ),
        # dV off by 5% of its largest element everywhere
        "dv": (dq, dk, dv + dv.abs().max() * 0.05 * torch.sign(dv)),
    }
    for name, grads in wrong.items():
        verdict = judge_backward(q, k, v, dout, grads, causal)
        assert not verdict.passed and not verdict.bounds[name].admits(verdict.reports[name]), f"{name}: {verdict}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_judge_of_the_variants_passes_the_baseline_and_fails_their_slips(dtype):
    # A window, a softcap that bends the scores (|s| ~ 1-3 against 2) and a sink per head: the
    # baseline passes; dS without the cap's slope, and dsinks without D (its sign or size), fail.
    q, k, v = random_qkv(2, 70, 90, 4, 2, 64, dtype, seed=3, device="cpu")
    q = q * 3  # scores of a few units: the cap's slope is far from 1
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(4)).to(dtype)
    sinks = torch.tensor([0.5, -1.0, 1.0, 2.0])
    options = dict(window_size=(20, 5), softcap=2.0, sinks=sinks)
    baseline = attention_backward_ref(q, k, v, dout, False, upcast=False, **options)
    verdict = judge_backward(q, k, v, dout, baseline, False, **options)
    assert verdict.passed and set(verdict.bounds) == {"dq", "dk", "dv", "dsinks"}, str(verdict)
    dq, dk, dv, dsinks = baseline
    uncapped = attention_backward_ref(q, k, v, dout, False, upcast=False, **dict(options, softcap=0.0))
    wrong = {
        "dq": (uncapped[0], dk, dv, dsinks),  # the cap's slope left out of dS
        "dsinks": (dq, dk, dv, -dsinks),  # D's sign
    }
    for name, grads in wrong.items():
        verdict = judge_backward(q, k, v, dout, grads, False, **options)
        assert not verdict.passed and not verdict.bounds[name].admits(verdict.reports[name]), f"{name}: {verdict}"
    with pytest.raises(ValueError, match="grads: expected 4 gradients"):
        judge_backward(q, k, v, dout, baseline[:3], False, **options)


def emulated_gradients(q, k, v, dout, causal, softmax_scale=None, **blocks):
    out, lse = attention_tiled(q, k, v, softmax_scale=softmax_scale, causal=causal)
    return attention_backward_tiled(q, k, v, out, lse, dout, softmax_scale=softmax_scale, causal=causal, **blocks)


# Lengths off the tile grid both ways, rows past the last key (causal 200 over 77), one key.
@pytest.mark.parametrize(("seqlen_q", "seqlen_k"), [(130, 130), (200, 77), (77, 200), (1, 1), (65, 300)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_tiled_backward_within_the_bound(seqlen_q, seqlen_k, causal, dtype):
    q, k, v = random_qkv(1, seqlen_q, seqlen_k, 4, 2, 64, dtype, seed=seqlen_q + seqlen_k, device="cpu")
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    grads = emulated_gradients(q, k, v, dout, causal)
    verdict = judge_backward(q, k, v, dout, grads, causal)
    assert verdict.passed, str(verdict)
    if causal and seqlen_q > seqlen_k:  # rows that see no key
        assert torch.all(grads[0][:, : seqlen_q - seqlen_k] == 0)


@given(
    case=cases(head_dims=(64,), max_len=300, max_score_elements=200_000),
    blocks=st.sampled_from([(64, 128), (128, 64), (64, 64)]),
)
def test_tiled_backward_property(case, blocks):
    q, k, v = case.inputs("cpu")
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(case.seed)).to(q.dtype)
    block_m, block_n = blocks
    grads = emulated_gradients(q, k, v, dout, case.causal, case.scale, block_m=block_m, block_n=block_n)
    verdict = judge_backward(q, k, v, dout, grads, case.causal, case.scale)
    assert verdict.passed, f"{case}: {verdict}"
