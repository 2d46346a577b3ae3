"""The backward kernels on a GPU: each gradient within flash-attn's bound of the fp32 reference
(reference_backward.judge_backward), on the kernel's own boundaries, drawn cases, and through autograd,
eager and under torch.compile.

The kernels are launched into outputs filled with NaN (`gradient.backward_into`), so that an
element no thread block writes fails whatever memory held. The forward is flash_attn_func's.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from suite.strategies import cases

from fa_kernel import flash_attn_func
from fa_kernel.configs import BACKWARD_TILES, DK_DV_TILES, DQ_TILES, dk_dv_tiles, key_tiles, pairs_per_group
from fa_kernel.device import device_target
from fa_kernel.gradient import backward_into
from fa_kernel.reference import random_qkv
from fa_kernel.reference_backward import judge_backward

pytestmark = pytest.mark.gpu

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def kernel_gradients(q, k, v, dout, causal, softmax_scale=None, deterministic=False, head_splits=None):
    """(dq, dk, dv) of the backward kernels for flash_attn_func's forward, written into NaN: dQ by
    atomic adds unless `deterministic`, unrouted (flash_attn_func's tests take the routing)."""
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out, lse = flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, return_lse=True)
    grads = tuple(torch.full_like(t, math.nan) for t in (q, k, v))
    options = dict(head_splits=head_splits, route=False)
    backward_into(*grads, dout, None, q, k, v, out, lse, scale, causal, deterministic, **options)
    return grads


def random_dout(q, seed):
    return torch.randn(q.shape, generator=torch.Generator().manual_seed(seed)).to(q.dtype).to(q.device)


def assert_gradients_within_the_bound(
    q, k, v, causal, label, softmax_scale=None, seed=0, deterministic=False, head_splits=None
):
    dout = random_dout(q, seed)
    grads = kernel_gradients(q, k, v, dout, causal, softmax_scale, deterministic, head_splits)
    verdict = judge_backward(q, k, v, dout, grads, causal, softmax_scale)
    assert verdict.passed, f"{label}: {verdict}"
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    if causal and seqlen_q > seqlen_k:  # rows that see no key: gradient 0, never NaN
        assert torch.all(grads[0][:, : seqlen_q - seqlen_k] == 0), label


def backward_offsets(head_dim: int, tiles: dict = BACKWARD_TILES) -> list[int]:
    """Causal offsets seqlen_k - seqlen_q within 2 of n·block_n - k·block_m, in ±2·block_n: where
    a K/V tile's first key meets a query tile's first row's diagonal (the causal first query
    tile), or its last key a row's (the causal mask); seqlen_k then crosses block_n's multiples."""
    block_m, block_n, _ = tiles[head_dim]
    limit = 2 * block_n
    tiles_n, tiles_m = limit // block_n + 1, 2 * limit // block_m + 1
    centres = {n * block_n - j * block_m for n in range(-tiles_n, tiles_n + 1) for j in range(-tiles_m, tiles_m + 1)}
    return sorted({c + side for c in centres for side in range(-2, 3) if -limit <= c + side <= limit})


# The tiles that divide both of the deterministic gradient's kernels' (DK_DV_TILES, DQ_TILES).
FINEST_GRADIENT_TILES = {
    head_dim: tuple(math.gcd(a, b) for a, b in zip(DK_DV_TILES[head_dim][:2], DQ_TILES[head_dim][:2], strict=True))
    + (None,)
    for head_dim in DK_DV_TILES
}


def sweep_lengths(head_dim: int, tiles: dict = BACKWARD_TILES):
    """(seqlen_q, seqlen_k, offset) of the backward's sweep on a kernel's `tiles`: two query
    lengths, a query tile's last row on the Delta padding's edge (2·block_m, with block_m
    dividing it) and one past it, at every backward_offsets offset that leaves a key."""
    block_m, _, _ = tiles[head_dim]
    for seqlen_q in (2 * block_m, 2 * block_m + 1):
        for offset in backward_offsets(head_dim, tiles):
            if seqlen_q + offset >= 1:
                yield seqlen_q, seqlen_q + offset, offset


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", sorted(BACKWARD_TILES))
def test_backward_boundary_sweep(head_dim, causal, dtype):
    # 3 query heads on 1 K/V head: a GQA group's walk.
    for seqlen_q, seqlen_k, offset in sweep_lengths(head_dim):
        inputs = random_qkv(1, seqlen_q, seqlen_k, 3, 1, head_dim, DTYPES[dtype], seed=seqlen_k)
        assert_gradients_within_the_bound(*inputs, causal, f"{seqlen_q}x{seqlen_k}", seed=offset)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", sorted(BACKWARD_TILES))
def test_deterministic_backward_boundary_sweep(head_dim, causal):
    # The fixed-order dQ kernel walks K/V tiles per query tile: its own boundaries are the
    # dK/dV kernel's seen from the other side (a query tile's last K/V tile, rows that see none),
    # on its own tiles. Swept on the tiles that divide both kernels' (DQ_TILES has 128 rows where
    # DK_DV_TILES has 64), so that each kernel's edges are among the lengths.
    for seqlen_q, seqlen_k, offset in sweep_lengths(head_dim, FINEST_GRADIENT_TILES):
        inputs = random_qkv(1, seqlen_q, seqlen_k, 3, 1, head_dim, torch.bfloat16, seed=seqlen_k)
        label = f"deterministic {seqlen_q}x{seqlen_k}"
        assert_gradients_within_the_bound(*inputs, causal, label, seed=offset, deterministic=True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", sorted(BACKWARD_TILES))
def test_deterministic_gradients_are_the_same_bits_in_every_run(head_dim, causal):
    # 30 runs, as the report of FlashAttention-3's deterministic mode counted (dq differed in 29):
    # many K/V tiles per query tile and a GQA group, where an atomic sum's order would show.
    q, k, v = random_qkv(2, 700, 1500, 8, 2, head_dim, torch.bfloat16, seed=3)
    dout = random_dout(q, 4)
    first = kernel_gradients(q, k, v, dout, causal, deterministic=True)
    verdict = judge_backward(q, k, v, dout, first, causal)
    assert verdict.passed, verdict
    for run in range(1, 30):
        again = kernel_gradients(q, k, v, dout, causal, deterministic=True)
        for name, before, after in zip(("dq", "dk", "dv"), first, again, strict=True):
            assert torch.equal(before, after), f"run {run}: {name} differs from run 0"


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "fixed_order"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_a_gqa_group_split_between_blocks_gives_each_key_its_gradients(head_dim, causal, deterministic):
    # The dK/dV kernel splits each K/V tile's GQA group between blocks (backward_into's
    # head_splits; configs.gradient_head_splits picks the count) and the caller sums their fp32
    # partial dK and dV. A group of five over every count from 2 to 5, so the shares come even
    # and uneven (3+2, 2+2+1, 2+1+1+1, five of 1): on one K/V head over three K/V tiles (the last
    # partial), and on two over one partial tile; the fixed-order gradient the same bits twice.
    block_m, block_n, _ = dk_dv_tiles(deterministic)[head_dim]
    for heads, heads_kv, seqlen_q, seqlen_k in (
        (5, 1, 3 * block_m + 1, 2 * block_n + 3),
        (10, 2, 5 * block_m - 1, block_n - 1),
    ):
        q, k, v = random_qkv(1, seqlen_q, seqlen_k, heads, heads_kv, head_dim, torch.bfloat16, seed=seqlen_k)
        for splits in range(2, heads // heads_kv + 1):
            label = f"{heads}/{heads_kv} heads {seqlen_q}x{seqlen_k}, {splits} splits"
            assert_gradients_within_the_bound(
                q, k, v, causal, label, seed=splits, deterministic=deterministic, head_splits=splits
            )
            if deterministic:
                dout = random_dout(q, 5)
                first, again = (kernel_gradients(q, k, v, dout, causal, None, True, splits) for _ in range(2))
                assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True)), label


@pytest.mark.parametrize("head_dim", sorted(BACKWARD_TILES))
def test_heavy_first_groups_end_on_a_short_one(head_dim):
    # Under causal the dK/dV blocks go heavy first: the (batch, K/V slot) pairs in groups of
    # configs.pairs_per_group, each group's blocks by K/V tile slowest (scheduler.heavy_first_block).
    # Every other test's launch fits in one group. Keys over a third of the SMs' count of K/V
    # tiles make groups of 3; 5 pairs (five batches) and 4 (two batches of two K/V heads) end on
    # a group of 2 and of 1.
    sm_count, _ = device_target(torch.device("cuda"))
    block_n = BACKWARD_TILES[head_dim][1]
    seqlen_k = sm_count // 3 * block_n - 3
    assert pairs_per_group(seqlen_k, head_dim, sm_count) == 3
    for batch, heads, heads_kv in ((5, 2, 1), (2, 4, 2)):
        q, k, v = random_qkv(batch, seqlen_k + 5, seqlen_k, heads, heads_kv, head_dim, torch.bfloat16, seed=batch)
        label = f"{batch}x{heads}/{heads_kv}x{seqlen_k}"
        assert_gradients_within_the_bound(q, k, v, True, label, seed=heads, head_splits=1)


def test_flash_attn_func_takes_deterministic_through_autograd():
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 300, 400, 4, 2, 64, torch.bfloat16, seed=8))
    dout = random_dout(q, 9)
    grads = []
    for _ in range(2):
        out = flash_attn_func(q, k, v, causal=True, deterministic=True)
        grads.append(torch.autograd.grad(out, (q, k, v), dout))
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
    verdict = judge_backward(q.detach(), k.detach(), v.detach(), dout, grads[0], True)
    assert verdict.passed, verdict


# (batch, seqlen_q, seqlen_k, nheads, nheads_kv): one row and key, ragged lengths both ways,
# rows past the last key (causal), MQA, and a length past the Delta padding's second block.
NAMED_SHAPES = [
    (2, 1, 1, 2, 1),
    (2, 127, 129, 4, 4),
    (1, 200, 77, 4, 2),
    (1, 77, 200, 4, 1),
    (1, 1000, 1000, 2, 2),
    (2, 257, 300, 8, 2),
]


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", sorted(BACKWARD_TILES))
def test_backward_named_shapes(head_dim, causal, dtype):
    for shape in NAMED_SHAPES:
        inputs = random_qkv(*shape, head_dim, DTYPES[dtype], seed=sum(shape))
        assert_gradients_within_the_bound(*inputs, causal, "x".join(map(str, shape)), seed=shape[1])


def test_backward_softmax_scale():
    inputs = random_qkv(2, 300, 260, 4, 2, 128, torch.bfloat16, seed=11)
    for scale in (0.01, 0.5):
        assert_gradients_within_the_bound(*inputs, True, f"scale {scale}", softmax_scale=scale)


# One property run per head dim, each with that share of the profile's examples: the same cases in
# all, in tests that pytest-xdist spreads over its workers (test_properties.py's SHARDS).
SHARDS = [(head_dim,) for head_dim in sorted(BACKWARD_TILES)]


@pytest.mark.examples
@pytest.mark.parametrize("head_dims", SHARDS, ids=lambda dims: f"d{dims[0]}")
def test_backward_property(head_dims):
    @settings(max_examples=max(1, settings.default.max_examples // len(SHARDS)))
    @given(case=cases(head_dims=head_dims, max_len=1100, max_score_elements=2_000_000))
    def holds(case):
        q, k, v = case.inputs("cuda")
        assert_gradients_within_the_bound(q, k, v, case.causal, repr(case), case.scale, seed=case.seed)

    holds()


def autograd_gradients(attention, q, k, v, dout, causal):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    attention(q, k, v, causal=causal).backward(dout)
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_autograd_through_flash_attn_func(compiled):
    attention = torch.compile(flash_attn_func, fullgraph=True) if compiled else flash_attn_func
    q, k, v = random_qkv(2, 300, 333, 8, 2, 128, torch.float16, seed=5)
    dout = random_dout(q, 6)
    for causal in (False, True):
        grads = autograd_gradients(attention, q, k, v, dout, causal)
        verdict = judge_backward(q, k, v, dout, grads, causal)
        assert verdict.passed, f"causal={causal}: {verdict}"


@pytest.mark.parametrize(
    ("head_dim", "heads", "seqlen_k", "causal", "wave", "fixed_order"),
    [
        # configs.FIXED_ORDER_FASTER's regions from both sides (tests/test_configs.py: every bound),
        # on a batch whose unsplit blocks fill a wave of SMs (`wave`) or on one sequence
        (128, 5, 2048, True, True, True),  # head_dim 128's causal GQA: at its keys and group
        (128, 5, 2048, True, False, False),  # on fewer blocks than SMs
        (128, 5, 2049, True, True, False),  # a key past them
        (128, 4, 2048, True, True, False),  # a head short of the group
        (128, 5, 2048, False, True, False),  # no right edge
        (128, 1, 1024, True, True, True),  # its causal 1k
        (128, 1, 1025, True, True, False),
        (128, 1, 512, False, True, True),  # its short walks without causal
        (128, 1, 513, False, True, False),
        (256, 2, 1024, False, True, True),  # head_dim 256's
        (256, 2, 1025, True, True, False),
    ],
)
def test_the_default_gradient_takes_the_fixed_order_path_where_the_table_routes_it(
    monkeypatch, head_dim, heads, seqlen_k, causal, wave, fixed_order
):
    import fa_kernel.gradient as gradient

    paths = []
    kernels = gradient.compiled_gradient_kernels
    monkeypatch.setattr(
        gradient,
        "compiled_gradient_kernels",
        lambda **build: paths.append(build["deterministic"]) or kernels(**build),
    )
    sm_count = device_target(torch.device("cuda"))[0]
    batch = -(-sm_count // key_tiles(seqlen_k, head_dim)) if wave else 1  # a wave of unsplit blocks
    q, k, v = random_qkv(batch, 192, seqlen_k, heads, 1, head_dim, torch.bfloat16, seed=seqlen_k)
    dout = random_dout(q, heads)
    grads = autograd_gradients(flash_attn_func, q, k, v, dout, causal)
    assert paths == [fixed_order]
    verdict = judge_backward(q, k, v, dout, grads, causal)
    assert verdict.passed, str(verdict)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_lse_gradient(causal):
    # A loss of out and lse: autograd hands the LSE's gradient to the backward, which folds it
    # into D (rows past the last key included, causal 300 queries over 200 keys: P = 0 there,
    # so theirs reaches nothing).
    q, k, v = random_qkv(2, 300, 200, 4, 2, 64, torch.bfloat16, seed=9)
    dout = random_dout(q, 10)
    grad_lse = torch.randn(2, 4, 300, generator=torch.Generator().manual_seed(11)).cuda()
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    out, lse = flash_attn_func(*leaves, causal=causal, return_lse=True)
    torch.autograd.backward((out, lse), (dout, grad_lse))
    verdict = judge_backward(q, k, v, dout, tuple(t.grad for t in leaves), causal, grad_lse=grad_lse)
    assert verdict.passed, str(verdict)


@pytest.mark.parametrize("used", ["out", "lse", "both"])
def test_eager_gradients_are_the_custom_ops_bit_for_bit(used):
    # In eager mode flash_attn_func runs the ops' bodies under an autograd.Function of its own
    # (the ops' dispatch costs the host more than short kernels take): its outputs and gradients
    # must be the op's, whichever outputs the loss uses (an unused one's gradient comes as None).
    q, k, v = random_qkv(2, 200, 300, 4, 2, 64, torch.bfloat16, seed=12)
    dout = random_dout(q, 13)
    grad_lse = torch.randn(2, 4, 200, generator=torch.Generator().manual_seed(14)).cuda()

    def outputs_and_gradients(attention):
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
        out, lse = attention(*leaves)
        used_outputs = {"out": ((out,), (dout,)), "lse": ((lse,), (grad_lse,)), "both": ((out, lse), (dout, grad_lse))}
        torch.autograd.backward(*used_outputs[used])
        return (out, lse, *(t.grad for t in leaves))

    eager = outputs_and_gradients(
        lambda q, k, v: flash_attn_func(q, k, v, 0.125, causal=True, return_lse=True, deterministic=True)
    )
    op = outputs_and_gradients(lambda q, k, v: torch.ops.fa_kernel.forward(q, k, v, 0.125, True, True))
    for name, eager_tensor, op_tensor in zip(("out", "lse", "dq", "dk", "dv"), eager, op, strict=True):
        assert torch.equal(eager_tensor, op_tensor), name


class AttentionBlock(torch.nn.Module):
    """A pre-norm causal self-attention block with GQA: norm, q/k/v projections, attention, output
    projection, residual. `attention(q, k, v)` takes and returns [batch, seqlen, heads, head_dim]."""

    def __init__(self, attention, width=256, heads=4, heads_kv=2, head_dim=64):
        super().__init__()
        self.attention, self.heads, self.heads_kv, self.head_dim = attention, heads, heads_kv, head_dim
        self.norm = torch.nn.LayerNorm(width)
        self.q = torch.nn.Linear(width, heads * head_dim)
        self.kv = torch.nn.Linear(width, 2 * heads_kv * head_dim)
        self.out = torch.nn.Linear(heads * head_dim, width)

    def forward(self, x):
        batch, seqlen, _ = x.shape
        h = self.norm(x)
        q = self.q(h).view(batch, seqlen, self.heads, self.head_dim)
        k, v = self.kv(h).view(batch, seqlen, 2, self.heads_kv, self.head_dim).unbind(2)
        return x + self.out(self.attention(q, k, v).reshape(batch, seqlen, -1))


def kernel_attention(q, k, v):
    return flash_attn_func(q, k, v, causal=True)


def sdpa_math_attention(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
        )
    return out.transpose(1, 2)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_compiled_training_step_matches_sdpa_math(dtype):
    # One step's loss and parameter gradients, the block compiled whole (fullgraph: no graph
    # break), against the same block on SDPA's math backend in fp32 (the reference). Bound:
    # flash-attn's rule, per tensor: twice the error of the math backend in the same dtype (the
    # baseline), plus twice one rounding of the reference to the dtype.
    torch.manual_seed(0)
    reference = AttentionBlock(sdpa_math_attention).cuda()
    baseline = AttentionBlock(sdpa_math_attention).cuda().to(DTYPES[dtype])
    kernel = AttentionBlock(kernel_attention).cuda().to(DTYPES[dtype])
    baseline.load_state_dict(reference.state_dict())
    kernel.load_state_dict(reference.state_dict())
    x = torch.randn(2, 333, 256, device="cuda", dtype=DTYPES[dtype])

    def step(model, inputs):
        model.zero_grad()
        loss = model(inputs).float().square().mean()
        loss.backward()
        return [loss.detach()] + [p.grad for p in model.parameters()]

    want = step(reference, x.float())
    same_precision = step(baseline, x)
    got = step(torch.compile(kernel, fullgraph=True), x)
    names = ["loss"] + [name for name, _ in kernel.named_parameters()]
    for name, g, b, w in zip(names, got, same_precision, want, strict=True):
        rounded = w.to(DTYPES[dtype])
        atol = 2 * (b.float() - w).abs().max() + 2 * ((rounded + 0.3) - 0.3 - rounded).float().abs().max()
        error = (g.float() - w).abs().max()
        assert torch.isfinite(g).all() and error <= atol, f"{name}: error {error:.3g} > bound {atol:.3g}"


def test_bench_backward_runners_take_each_implementations_gradients():
    # `fa-kernel bench --backward` times these calls: each must give the gradients of its own
    # forward's inputs (in that forward's layout), every one finite and not all zero.
    from fa_kernel.workbench.bench import Shape, runners

    shape = Shape(2, 4, 200, 64, True, torch.bfloat16, nheads_kv=2)
    timed = runners(shape, backward=True)
    assert {"fa_kernel", "fa_kernel deterministic", "cudnn BHSD", "flash"} <= set(timed)
    ours = (shape.seqlen_q, shape.nheads)
    layouts = {"fa_kernel": ours, "fa_kernel deterministic": ours, "cudnn BHSD": (shape.nheads, shape.seqlen_q)}
    for name, call in timed.items():
        dq, dk, dv = call()
        rows = layouts.get(name, (shape.nheads, shape.seqlen_q))
        assert dq.shape == (shape.batch, *rows, shape.head_dim), name
        assert dk.shape[0] == shape.batch and dk.shape == dv.shape, name
        for grad in (dq, dk, dv):
            assert torch.isfinite(grad).all() and grad.abs().max() > 0, name
