"""The API's contract on a machine without a GPU: every bad input is refused, before any
launch, with an error that names the argument, what was expected and what came."""

from __future__ import annotations

import pytest
import torch

from fa_kernel import flash_attn_func


def qkv(batch=2, seqlen_q=16, seqlen_k=16, nheads=4, nheads_kv=4, head_dim=64, dtype=torch.float16, device="cpu"):
    q = torch.zeros(batch, seqlen_q, nheads, head_dim, dtype=dtype, device=device)
    k = torch.zeros(batch, seqlen_k, nheads_kv, head_dim, dtype=dtype, device=device)
    return q, k, k.clone()


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (lambda q, k, v: (q.numpy(), k, v), TypeError, r"q: expected a torch.Tensor, got ndarray"),
        (lambda q, k, v: (q[0], k, v), ValueError, r"q: expected a 4-d tensor .* got shape \(16, 4, 64\)"),
        (lambda q, k, v: (q, k[..., None], v), ValueError, r"k: expected a 4-d tensor"),
        (lambda q, k, v: (q.float(), k, v), TypeError, r"q: expected dtype float16 or bfloat16, got torch.float32"),
        (lambda q, k, v: (q, k.bfloat16(), v), TypeError, r"k, v: expected the dtype of q \(torch.float16\)"),
        (
            lambda q, k, v: (q, k, v[:, :8]),
            ValueError,
            r"v: expected the shape of k \(2, 16, 4, 64\), got \(2, 8, 4, 64\)",
        ),
        (lambda q, k, v: (q, k[:1], v[:1]), ValueError, r"k: expected batch 2 \(as q\), got 1"),
        (lambda q, k, v: (q, k[..., :32], v[..., :32]), ValueError, r"k: expected headdim 64 \(as q\), got 32"),
        (
            lambda q, k, v: (q[..., :32], k[..., :32], v[..., :32]),
            ValueError,
            r"q: expected headdim in \(64, 128, 256\), got 32",
        ),
        (
            lambda q, k, v: (q, k[:, :, :3], v[:, :, :3]),
            ValueError,
            r"k: expected nheads_kv dividing nheads of q \(4\), got 3",
        ),
        (
            lambda q, k, v: (q, k[:, :, :0], v[:, :, :0]),
            ValueError,
            r"k: expected nheads_kv dividing nheads of q \(4\), got 0",
        ),
    ],
)
def test_bad_tensors_are_refused(change, error, message):
    with pytest.raises(error, match=message):
        flash_attn_func(*change(*qkv()))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"softmax_scale": float("nan")}, ValueError, r"softmax_scale: expected a positive finite number, got nan"),
        ({"softmax_scale": float("inf")}, ValueError, r"softmax_scale: expected a positive finite number, got inf"),
        ({"softmax_scale": 0.0}, ValueError, r"softmax_scale: expected a positive finite number, got 0.0"),
        ({"softmax_scale": -0.1}, ValueError, r"softmax_scale: expected a positive finite number, got -0.1"),
        ({"softmax_scale": "0.1"}, TypeError, r"softmax_scale: expected a real number or None, got str"),
        ({"softmax_scale": True}, TypeError, r"softmax_scale: expected a real number or None, got bool"),
        ({"causal": 1}, TypeError, r"causal: expected a bool, got int"),
    ],
)
def test_bad_arguments_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        flash_attn_func(*qkv(), **kwargs)


def test_cpu_tensors_are_refused_after_everything_else_checks_out():
    # Valid in every other way, so this is the error a laptop user sees first.
    with pytest.raises(ValueError, match=r"q: expected a tensor on a CUDA device, got device cpu"):
        flash_attn_func(*qkv())


@pytest.mark.parametrize(
    ("capability", "name"), [((8, 0), "NVIDIA A100-SXM4-80GB"), ((10, 0), "NVIDIA B200"), ((12, 0), "RTX 5090")]
)
def test_gpus_other_than_hopper_are_refused_by_name(monkeypatch, capability, name):
    # The check reads only the device's facts and its name, so it can be exercised without a GPU.
    from fa_kernel import interface

    monkeypatch.setattr(interface, "device_facts", lambda device=None: (capability, 132))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    expected = rf"q: expected a tensor on a Hopper GPU \(compute capability 9\.x\), got cuda:1 \({name}, "
    with pytest.raises(ValueError, match=expected + rf"compute capability {capability[0]}\.{capability[1]}\)"):
        interface._require_hopper(torch.device("cuda:1"))


def test_hopper_gpus_pass_the_check(monkeypatch):
    from fa_kernel import interface

    monkeypatch.setattr(interface, "device_facts", lambda device=None: ((9, 0), 132))
    interface._require_hopper(torch.device("cuda:0"))


def test_gqa_shapes_pass_validation():
    # 8 query heads over 2 K/V heads and seqlen_q != seqlen_k are valid: only the device is wrong.
    with pytest.raises(ValueError, match=r"CUDA device"):
        flash_attn_func(*qkv(nheads=8, nheads_kv=2, seqlen_q=5, seqlen_k=300))


def test_the_op_is_registered_for_torch_compile():
    # A fake (meta) implementation lets torch.compile trace shapes without running the kernel.
    q, k, v = qkv(nheads=8, nheads_kv=2, seqlen_q=5, seqlen_k=300, device="meta")
    out, lse = torch.ops.fa_kernel.forward(q, k, v, 0.125, True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (2, 8, 5) and lse.dtype == torch.float32


def test_the_backward_op_is_registered_for_torch_compile():
    q, k, v = qkv(nheads=8, nheads_kv=2, seqlen_q=5, seqlen_k=300, device="meta")
    out, lse = torch.ops.fa_kernel.forward(q, k, v, 0.125, True)
    for deterministic in (False, True):
        dq, dk, dv, _ = torch.ops.fa_kernel.backward(out, None, q, k, v, out, lse, 0.125, True, deterministic)
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)


def test_deterministic_must_be_a_bool(monkeypatch):
    from fa_kernel import interface

    monkeypatch.setattr(interface, "check_inputs", lambda q, k, v, scale, causal, **variants: 0.0625)
    monkeypatch.setattr(interface, "_attention", lambda *args: pytest.fail("launched"))
    with pytest.raises(TypeError, match=r"deterministic: expected a bool, got int"):
        flash_attn_func(*qkv(), deterministic=1)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"window_size": (-2, 0)}, ValueError, r"window_size: expected each edge >= -1 \(-1: no limit\), got \(-2,"),
        ({"window_size": (4, -3)}, ValueError, r"window_size: expected each edge >= -1 .*got \(4, -3\)"),
        ({"window_size": (4,)}, TypeError, r"window_size: expected a pair of ints \(left, right\), got \(4,\)"),
        ({"window_size": (4.0, 2)}, TypeError, r"window_size: expected a pair of ints .*got \(4.0, 2\)"),
        ({"window_size": (True, 2)}, TypeError, r"window_size: expected a pair of ints"),
        ({"softcap": -1.0}, ValueError, r"softcap: expected a finite number >= 0 \(0: no cap\), got -1.0"),
        ({"softcap": float("inf")}, ValueError, r"softcap: expected a finite number >= 0 .*got inf"),
        ({"softcap": float("nan")}, ValueError, r"softcap: expected a finite number >= 0 .*got nan"),
        ({"softcap": "30"}, TypeError, r"softcap: expected a real number, got str"),
        ({"sinks": [0.0] * 4}, TypeError, r"sinks: expected a torch.Tensor or None, got list"),
        (
            {"sinks": torch.zeros(3)},
            ValueError,
            r"sinks: expected a float32 tensor of shape \(4,\) \(q's nheads\) on cpu, got torch.float32 of shape \(3",
        ),
        ({"sinks": torch.zeros(4, dtype=torch.float16)}, ValueError, r"sinks: expected a float32 .*got torch.float16"),
        ({"sinks": torch.zeros(4, device="meta")}, ValueError, r"sinks: expected .* on cpu, got .* on meta"),
    ],
)
def test_bad_variants_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        flash_attn_func(*qkv(), **kwargs)


def test_good_variants_pass_validation():
    # Only the device is wrong: a window on either side or both, with causal, a cap, sinks.
    for kwargs in ({"window_size": (0, 0)}, {"window_size": (5, -1), "causal": True}, {"softcap": 30}):
        with pytest.raises(ValueError, match=r"CUDA device"):
            flash_attn_func(*qkv(), sinks=torch.zeros(4), **kwargs)


def test_the_backward_op_takes_the_variants_and_gives_dsinks_for_torch_compile():
    q, k, v = qkv(nheads=8, nheads_kv=2, seqlen_q=5, seqlen_k=300, device="meta")
    sinks = torch.zeros(8, device="meta")
    out, lse = torch.ops.fa_kernel.forward(q, k, v, 0.125, True, False, 128, -1, 30.0, sinks)
    variant_args = (128, -1, 30.0, sinks)
    dq, dk, dv, dsinks = torch.ops.fa_kernel.backward(out, None, q, k, v, out, lse, 0.125, True, False, *variant_args)
    assert (dq.shape, dk.shape, dv.shape, dsinks.shape) == (q.shape, k.shape, v.shape, (8,))
    assert torch.ops.fa_kernel.backward(out, None, q, k, v, out, lse, 0.125, True)[3].shape == (0,)


def test_causal_with_a_window_on_its_right_is_still_causal(monkeypatch):
    # flash-attn: causal is right = 0, whatever window_size's right says.
    from fa_kernel import interface
    from fa_kernel.variants import Variants

    assert Variants.of(True, (4, 7), 0.0, None) == Variants(window_left=True)
    assert Variants.of(False, (-1, 7), 0.0, None) == Variants(window_right=True)
    monkeypatch.setattr(interface, "check_inputs", lambda q, k, v, scale, causal, **variants: 0.125)
    launched = []
    monkeypatch.setattr(interface, "_attention", lambda *args: launched.append(args) or (None, None))
    flash_attn_func(*qkv(), causal=True, window_size=(4, 7))
    assert launched[0][4:] == (True, 4, 7, 0.0, None)


def test_torch_func_grad_takes_the_same_gradient_as_autograd(monkeypatch):
    # torch.func's transforms take an autograd.Function only with a setup_context, which eager
    # calls do without (it costs the host an inspect.signature a call): under a transform
    # flash_attn_func takes the Function that has one. The kernels stood in for by the emulators.
    from fa_kernel import interface
    from fa_kernel.emulator import attention_backward_tiled, attention_tiled
    from fa_kernel.reference import random_qkv

    def attention(q, k, v, scale, causal, *variants):
        return attention_tiled(q, k, v, scale, causal)

    def backward_into(dq, dk, dv, dout, grad_lse, q, k, v, out, lse, scale, causal, deterministic, **given):
        grads = attention_backward_tiled(q, k, v, out, lse, dout, scale, causal)[:3]
        for into, grad in zip((dq, dk, dv), grads, strict=True):
            into.copy_(grad)

    monkeypatch.setattr(interface, "check_inputs", lambda q, k, v, scale, causal, **variants: 0.125)
    monkeypatch.setattr(interface, "_attention", attention)
    monkeypatch.setattr(interface, "backward_into", backward_into)
    q, k, v = random_qkv(1, 70, 90, 4, 2, 64, torch.float16, seed=5, device="cpu")
    through_func = torch.func.grad(lambda q: flash_attn_func(q, k, v, causal=True).float().sum())(q)
    q.requires_grad_()
    flash_attn_func(q, k, v, causal=True).float().sum().backward()
    assert torch.equal(through_func, q.grad)


def test_the_op_takes_the_variants_for_torch_compile():
    q, k, v = qkv(nheads=8, nheads_kv=2, seqlen_q=5, seqlen_k=300, device="meta")
    sinks = torch.zeros(8, device="meta")
    out, lse = torch.ops.fa_kernel.forward(q, k, v, 0.125, True, False, 128, -1, 30.0, sinks)
    assert out.shape == q.shape and lse.shape == (2, 8, 5)


def test_autograd_hands_the_variants_to_the_backward_and_dsinks_to_the_sinks(monkeypatch):
    # The plumbing, on the CPU: the kernels stood in for by the emulators, whose gradients the
    # leaves must receive exactly (dsinks in the sinks' slot), the variants passed through.
    from fa_kernel import interface
    from fa_kernel.emulator import attention_backward_tiled, attention_tiled
    from fa_kernel.reference import random_qkv

    variants = dict(window_size=(40, 9), softcap=30.0)

    def attention(q, k, v, scale, causal, left, right, softcap, sinks):
        assert ((left, right), softcap) == (variants["window_size"], variants["softcap"])
        return attention_tiled(q, k, v, scale, causal, window_size=(left, right), softcap=softcap, sinks=sinks)

    def backward_into(dq, dk, dv, dout, grad_lse, q, k, v, out, lse, scale, causal, deterministic, **given):
        assert grad_lse is None and given["window_size"] == variants["window_size"]
        *grads, dsinks = attention_backward_tiled(q, k, v, out, lse, dout, scale, causal, **given)
        for into, grad in zip((dq, dk, dv), grads, strict=True):
            into.copy_(grad)
        return dsinks

    monkeypatch.setattr(interface, "check_inputs", lambda q, k, v, scale, causal, **variants: 0.125)
    monkeypatch.setattr(interface, "_attention", attention)
    monkeypatch.setattr(interface, "backward_into", backward_into)
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 70, 90, 4, 2, 64, torch.float16, seed=5, device="cpu"))
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)
    out = flash_attn_func(q, k, v, causal=True, sinks=sinks, **variants)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
    out.backward(dout)
    detached = (q.detach(), k.detach(), v.detach())
    variants["sinks"] = sinks.detach()
    expected_out, lse = attention_tiled(*detached, 0.125, True, **variants)
    expected = attention_backward_tiled(*detached, expected_out, lse, dout, 0.125, True, **variants)
    got = (q.grad, k.grad, v.grad, sinks.grad)
    for name, grad, want in zip(("dq", "dk", "dv", "dsinks"), got, expected, strict=True):
        assert torch.equal(grad, want), name


@pytest.mark.parametrize(
    ("heads", "head_dim", "splits", "refused"),
    [(4, 64, 2, False), (4, 64, 3, True), (4, 64, 0, True), (8, 128, 1, False), (8, 256, 1, False), (8, 256, 2, True)],
)
def test_head_splits_outside_the_group_or_the_split_dims_are_refused_first(heads, head_dim, splits, refused):
    # backward_into's head_splits: 1 to the GQA group's size (2 K/V heads here), more than 1 at
    # head_dim 64 and 128 only; checked before the launch's early exit (no query rows here), so a
    # count kept runs to it on the CPU and returns.
    from fa_kernel.gradient import backward_into

    q, k = torch.zeros(1, 0, heads, head_dim), torch.zeros(1, 5, 2, head_dim)
    grads = (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(k))
    call = lambda: backward_into(*grads, q, None, q, k, k, q, q, 0.125, False, head_splits=splits)  # noqa: E731
    if refused:
        with pytest.raises(ValueError, match=rf"head_splits: expected 1 to the GQA group's {heads // 2} heads"):
            call()
    else:
        assert call() is None
