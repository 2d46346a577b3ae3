"""flash_attn_varlen_func: its argument checks here (no GPU needed: they run before the device's),
and on a Hopper GPU each sequence of a ragged batch against the reference, no cross-talk between
sequences, and the edges the varlen build adds (sequences of 0 and 1 rows, lengths at block
boundaries, a sequence with no key)."""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from suite.ragged import cu, judge_sequence_gradients, judge_sequences, packed


def call(q, k, v, cu_q, cu_k, max_q=None, max_k=None, **kwargs):
    """flash_attn_varlen_func, the max_seqlens from cu_seqlens unless given."""
    from fa_kernel import flash_attn_varlen_func

    max_q = max((cu_q[1:] - cu_q[:-1]).tolist(), default=0) if max_q is None else max_q
    max_k = max((cu_k[1:] - cu_k[:-1]).tolist(), default=0) if max_k is None else max_k
    return flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)


@pytest.mark.parametrize(
    "change, error",
    [
        (lambda a: a.update(cu_q=a["cu_q"].long()), "cu_seqlens_q: expected an int32 tensor"),
        (lambda a: a.update(cu_k=a["cu_k"][None]), "cu_seqlens_k: expected an int32 tensor"),
        (lambda a: a.update(cu_q=a["cu_q"] + 1), "cu_seqlens_q: expected its first entry 0"),
        (
            lambda a: a.update(cu_q=torch.tensor([0, 5, 3, 9], dtype=torch.int32)),
            "expected non-decreasing entries, got 5 then 3",
        ),
        (lambda a: a.update(cu_k=cu(3, 4, 5)), "cu_seqlens_k: expected its last entry k's total rows 13, got 12"),
        (lambda a: a.update(cu_k=cu(13)), "cu_seqlens_k: expected as many sequences as cu_seqlens_q (3), got 1"),
        (lambda a: a.update(max_q=4), "max_seqlen_q: expected at least the longest sequence's length 5, got 4"),
        (lambda a: a.update(max_k=6.0), "max_seqlen_k: expected an int, got float"),
        (lambda a: a.update(q=a["q"][None]), "q: expected a 3-d tensor [total, nheads, headdim]"),
        (lambda a: a.update(deterministic=1), "deterministic: expected a bool, got int"),
    ],
)
def test_bad_ragged_input_is_refused_by_name_before_launch(change, error):
    q, k, v, cu_q, cu_k = packed([2, 5, 2], [3, 4, 6])
    arguments = dict(q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, max_q=5, max_k=6)
    change(arguments)
    with pytest.raises((ValueError, TypeError), match=re.escape(error)):
        call(**arguments)


def test_good_ragged_input_passes_its_checks_up_to_the_device():
    # The first error a CPU machine meets is the device's: every ragged check above passed.
    q, k, v, cu_q, cu_k = packed([0, 5, 1], [3, 0, 6])
    with pytest.raises(ValueError, match="q: expected a tensor on a CUDA device"):
        call(q, k, v, cu_q, cu_k)


def test_a_pair_of_cu_seqlens_is_read_once_until_written_or_checked_against_other_sizes(monkeypatch):
    # Reading cu_seqlens on the host waits for the GPU: a pair is checked once while neither
    # tensor is written, and again once one is, or another max_seqlen or tensor comes.
    from fa_kernel import varlen

    checks = []
    check = varlen._check_cu_seqlens
    monkeypatch.setattr(varlen, "_check_cu_seqlens", lambda *a: checks.append(1) or check(*a))
    q, k, v, cu_q, cu_k = packed([0, 5, 1], [3, 0, 6])
    for _ in range(2):  # the first error a CPU machine meets is the device's (after the checks)
        with pytest.raises(ValueError, match="q: expected a tensor on a CUDA device"):
            call(q, k, v, cu_q, cu_k, max_q=5, max_k=6)
    assert len(checks) == 1
    for other_cu_k in (cu_k.clone(), cu_k):
        with pytest.raises(ValueError, match="q: expected a tensor on a CUDA device"):
            call(q, k, v, cu_q, other_cu_k, max_q=7, max_k=6)
    assert len(checks) == 3
    cu_k[2] = 1  # in place: 0, 3, 1, 9
    with pytest.raises(ValueError, match=re.escape("cu_seqlens_k: expected non-decreasing entries, got 3 then 1")):
        call(q, k, v, cu_q, cu_k, max_q=7, max_k=6)


def walk_length(length_q, length_k, first_row, block_m, block_n, causal, window_size):
    """K/V tiles of `block_n` keys from the first any row of the block sees to the last (at
    least one), by visiting every row: row r sees key j when j - (r + length_k - length_q) is
    within the window (right edge 0 when causal)."""
    left, right = window_size[0], 0 if causal else window_size[1]
    tiles = set()
    for row in range(first_row, min(first_row + block_m, length_q)):
        diagonal = row + length_k - length_q
        for key in range(length_k):
            if (left < 0 or key >= diagonal - left) and (right < 0 or key <= diagonal + right):
                tiles.add(key // block_n)
    return max(1, max(tiles) - min(tiles) + 1) if tiles else 1


@pytest.mark.parametrize("window_size", [(-1, -1), (100, -1), (50, 30)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("block_m", "block_n"), [(64, 128), (128, 128), (192, 128), (128, 176)])
def test_the_tile_order_holds_each_sequences_own_blocks_once_longest_walk_first(block_m, block_n, causal, window_size):
    from fa_kernel.scheduler import ragged_tile_order

    # Empty and one-row sequences, lengths at and one past a block, more keys than queries and fewer.
    lengths_q = [0, 1, block_m, block_m + 1, 3 * block_m - 1, 500, 37, 0, 260]
    lengths_k = [5, 0, block_m, 2 * block_m + 1, 3 * block_m - 1, 300, 900, 0, 260]
    order = ragged_tile_order(lengths_q, lengths_k, block_m, block_n, causal, window_size)
    assert_each_tile_once_longest_first(
        order, lengths_q, block_m,
        lambda s, b: walk_length(lengths_q[s], lengths_k[s], b * block_m, block_m, block_n, causal, window_size),
    )  # fmt: skip


def assert_each_tile_once_longest_first(order, lengths, block, walk_of) -> None:
    """`order` (int32 [tiles, 2] of (sequence, tile)) holds every tile of `block` rows of each
    sequence's `lengths` once, none past an end, their walk_of(sequence, tile) non-increasing."""
    assert order.dtype == torch.int32 and order.shape[1] == 2
    tiles = [tuple(entry) for entry in order.tolist()]
    assert sorted(tiles) == [(s, t) for s, length in enumerate(lengths) for t in range(math.ceil(length / block))]
    walks = [walk_of(s, t) for s, t in tiles]
    assert walks == sorted(walks, reverse=True), walks


def query_tiles_walked(length_q, length_k, kv_start, block_m, block_n, causal, window_size):
    """Query tiles of `block_m` rows from the first row that sees a key of the K/V tile from
    kv_start to the last, by visiting every row (0 if none sees one)."""
    left, right = window_size[0], 0 if causal else window_size[1]
    rows = [
        row
        for row in range(length_q)
        for key in range(kv_start, min(kv_start + block_n, length_k))
        if (left < 0 or key >= row + length_k - length_q - left)
        and (right < 0 or key <= row + length_k - length_q + right)
    ]
    return max(rows) // block_m - min(rows) // block_m + 1 if rows else 0


@pytest.mark.parametrize("window_size", [(-1, -1), (100, -1), (50, 30)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("block_m", "block_n"), [(64, 128), (128, 64)])
def test_the_key_tile_order_holds_each_sequences_own_key_tiles_once_longest_walk_first(
    block_m, block_n, causal, window_size
):
    from fa_kernel.scheduler import ragged_key_tile_order

    # As the forward's order's test, keys and rows swapped: a sequence with keys and no rows keeps its tiles.
    lengths_k = [0, 1, block_n, block_n + 1, 3 * block_n - 1, 500, 37, 0, 260]
    lengths_q = [5, 0, block_n, 2 * block_n + 1, 3 * block_n - 1, 300, 900, 0, 260]
    order = ragged_key_tile_order(lengths_q, lengths_k, block_m, block_n, causal, window_size)
    assert_each_tile_once_longest_first(
        order, lengths_k, block_n,
        lambda s, t: query_tiles_walked(lengths_q[s], lengths_k[s], t * block_n, block_m, block_n, causal, window_size),
    )  # fmt: skip


# ---- on the GPU ----

# Lengths next to the varlen builds' 64-, 128- and 192-row query blocks and 128/176-key tiles,
# empty and one-row sequences beside long ones, one sequence holding most of the tokens, and a
# sequence with queries and no key.
RAGGED = [
    ([1, 127, 128, 129, 0, 64], [1, 127, 128, 129, 3, 64]),
    ([300, 0, 1, 5], [300, 7, 1, 177]),
    ([2000, 3, 17], [2000, 3, 17]),
    ([5, 9], [0, 12]),
    ([191, 192, 193], [175, 176, 177]),
]


@settings(deadline=None)
@given(st.lists(st.integers(0, 700), min_size=1, max_size=12))
def test_each_sequences_row_statistics_start_aligned_and_its_tiles_never_reach_the_next(lengths):
    # The gradient kernels load a query tile's Delta and LSE₂ rows as one TMA box, from its
    # sequence's statistics_start: 16-byte aligned (an unaligned box faults), and short of the
    # next sequence's rows and of the buffer's end, whatever the lengths.
    from fa_kernel.backward_preprocess import PREPROCESS_ROWS, statistics_index, statistics_rows, statistics_start
    from fa_kernel.configs import BACKWARD_TILES, DK_DV_TILES, DQ_TILES

    tables = (BACKWARD_TILES, DK_DV_TILES, DQ_TILES)
    assert all(PREPROCESS_ROWS % tiles[0] == 0 for table in tables for tiles in table.values())
    offsets = [0, *itertools.accumulate(lengths)]
    starts = [statistics_start(offset, sequence) for sequence, offset in enumerate(offsets[:-1])]
    ends = [*starts[1:], statistics_rows(offsets[-1], len(lengths))]
    for start, length, end in zip(starts, lengths, ends, strict=True):
        assert start % PREPROCESS_ROWS == 0
        assert start + math.ceil(length / PREPROCESS_ROWS) * PREPROCESS_ROWS <= end  # its last tile's box
    assert statistics_index(lengths).tolist() == [
        start + i for start, n in zip(starts, lengths, strict=True) for i in range(n)
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("lengths_q, lengths_k", RAGGED)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_each_sequence_within_the_bound(lengths_q, lengths_k, head_dim, causal):
    q, k, v, cu_q, cu_k = packed(lengths_q, lengths_k, head_dim=head_dim, device="cuda", dtype=torch.bfloat16)
    out, lse = call(q, k, v, cu_q, cu_k, causal=causal, return_lse=True)
    judge_sequences(q, k, v, cu_q, cu_k, out, lse, causal=causal)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize(
    "options",
    [
        dict(window_size=(50, 0)),
        dict(window_size=(7, 20), causal=False),
        dict(window_size=(50, -1), softcap=20.0),
        dict(sinks=True),
    ],
    ids=["left-window", "two-sided-window", "softcap-left-window", "sinks"],
)
def test_each_sequence_within_the_bound_with_the_variants(options, head_dim):
    # The ragged forward builds with each variant at every head_dim (their configs differ), a
    # two-sided window without causal, the cap under a left edge (its mask a select after the cap).
    variants = dict(options)
    causal = variants.pop("causal", True)
    lengths_q, lengths_k = [1, 127, 128, 129, 0, 64], [1, 127, 128, 129, 3, 64]
    q, k, v, cu_q, cu_k = packed(lengths_q, lengths_k, head_dim=head_dim, device="cuda")
    if variants.get("sinks"):
        variants = dict(sinks=torch.randn(q.shape[1], device="cuda"))
    out, lse = call(q, k, v, cu_q, cu_k, causal=causal, return_lse=True, **variants)
    judge_sequences(q, k, v, cu_q, cu_k, out, lse, causal=causal, **variants)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_no_sequence_reads_another(causal):
    # Each sequence's keys and values changed in turn (finite values): every other sequence's
    # output and LSE bitwise the same. The tiles at a sequence's end hold the next one's keys; a
    # tile that forgets its sequence's offset reads the first's.
    q, k, v, cu_q, cu_k = packed([127, 129, 64], [127, 129, 64], device="cuda")
    before, lse_before = call(q, k, v, cu_q, cu_k, causal=causal, return_lse=True)
    for start, end in itertools.pairwise(cu_k.tolist()):
        k2, v2 = k.clone(), v.clone()
        k2[start:end] = torch.randn_like(k2[start:end]) * 30
        v2[start:end] = torch.randn_like(v2[start:end]) * 30
        after, lse_after = call(q, k2, v2, cu_q, cu_k, causal=causal, return_lse=True)
        others = torch.cat([torch.arange(0, start), torch.arange(end, q.shape[0])]).cuda()
        assert torch.equal(before[others], after[others]), f"keys {start}:{end} changed"
        assert torch.equal(lse_before[:, others], lse_after[:, others])
        assert not torch.equal(before[start:end], after[start:end])


@pytest.mark.gpu
def test_no_keys_anywhere_gives_zero_and_minus_infinity():
    q, k, v, cu_q, cu_k = packed([3, 4], [0, 0], device="cuda")
    out, lse = call(q, k, v, cu_q, cu_k, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and (lse == -math.inf).all()


# ---- the gradients ----


def gradients(q, k, v, cu_q, cu_k, dout, **options):
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = call(*leaves, cu_q, cu_k, **options)
    out.backward(dout)
    return tuple(t.grad for t in leaves)


@pytest.mark.gpu
@pytest.mark.parametrize("lengths_q, lengths_k", RAGGED)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_each_sequences_gradients_within_the_bound(lengths_q, lengths_k, head_dim, causal):
    q, k, v, cu_q, cu_k = packed(lengths_q, lengths_k, head_dim=head_dim, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn_like(q)
    grads = gradients(q, k, v, cu_q, cu_k, dout, causal=causal)
    judge_sequence_gradients(q, k, v, dout, cu_q, cu_k, grads, causal=causal)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize(
    "options",
    [dict(window_size=(50, 0)), dict(window_size=(7, 20), causal=False), dict(window_size=(50, -1), softcap=20.0)],
    ids=["left-window", "two-sided-window", "softcap-left-window"],
)
def test_each_sequences_gradients_within_the_bound_with_the_variants(options, head_dim):
    # The atomic path's ragged builds with each variant at every head_dim (the fixed-order path's
    # are the deterministic test's below): a two-sided window without causal, and the cap under a
    # left edge (its mask a select after the cap).
    variants = dict(options)
    causal = variants.pop("causal", True)
    lengths_q, lengths_k = [1, 127, 128, 129, 0, 64], [1, 127, 128, 129, 3, 64]
    q, k, v, cu_q, cu_k = packed(lengths_q, lengths_k, head_dim=head_dim, device="cuda")
    dout = torch.randn_like(q)
    grads = gradients(q, k, v, cu_q, cu_k, dout, causal=causal, **variants)
    judge_sequence_gradients(q, k, v, dout, cu_q, cu_k, grads, causal=causal, **variants)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize(
    "variants", [{}, dict(window_size=(50, 0)), dict(softcap=20.0)], ids=["plain", "window", "softcap"]
)
def test_deterministic_gradients_are_within_the_bound_and_the_same_bits_every_run(head_dim, variants):
    # Both kernels' query tiles (the fixed-order dQ's, the dK/dV kernel's) end one row before,
    # at and after a sequence's end; a sequence with keys and no rows, one with more rows than keys.
    from fa_kernel.configs import DK_DV_TILES, DQ_TILES

    edges = [rows + side for rows in sorted({DQ_TILES[head_dim][0], DK_DV_TILES[head_dim][0]}) for side in (-1, 0, 1)]
    lengths_q, lengths_k = [1, *edges, 0, 200], [1, *edges, 3, 130]
    q, k, v, cu_q, cu_k = packed(lengths_q, lengths_k, head_dim=head_dim, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn_like(q)
    first = gradients(q, k, v, cu_q, cu_k, dout, causal=True, deterministic=True, **variants)
    judge_sequence_gradients(q, k, v, dout, cu_q, cu_k, first, causal=True, **variants)
    for _ in range(3):
        again = gradients(q, k, v, cu_q, cu_k, dout, causal=True, deterministic=True, **variants)
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


@pytest.mark.gpu
def test_the_sinks_gradient_sums_each_sequences():
    # dsinks[h] = -Σ over the batch's rows of P_sink·D: against the sum of flash_attn_func's
    # dsinks of each sequence alone (itself judged in tests/test_variants_kernel.py). The same
    # rows' terms, from two kernels: each row's P_sink = exp(sink - LSE) <= 1 may differ by the
    # two LSEs' errors (each within lse_tolerance), its D by the two outputs' difference (exact,
    # from both), and the sums by fp32 rounding in another order (a relative 2·n·u).
    from fa_kernel import flash_attn_func
    from fa_kernel.reference import lse_tolerance

    lengths = [127, 129, 64]
    q, k, v, cu_q, cu_k = packed(lengths, lengths, device="cuda")
    sinks = torch.randn(q.shape[1], device="cuda", requires_grad=True)
    dout = torch.randn_like(q)
    out = call(q, k, v, cu_q, cu_k, causal=True, sinks=sinks)
    out.backward(dout)
    expected, bound = torch.zeros_like(sinks), torch.zeros_like(sinks)
    u = torch.finfo(torch.float32).eps / 2
    for start, length in zip(cu_q.tolist(), lengths, strict=False):
        rows = slice(start, start + length)
        each = sinks.detach().requires_grad_()
        alone = flash_attn_func(q[None, rows], k[None, rows], v[None, rows], causal=True, sinks=each)
        alone.backward(dout[None, rows])
        expected += each.grad
        delta = (dout[rows].float() * out[rows].detach().float()).sum(dim=-1)  # [rows, heads]
        delta_alone = (dout[rows].float() * alone[0].detach().float()).sum(dim=-1)
        lse_error = 2 * lse_tolerance(q[None, rows], k[None, rows], q.shape[-1] ** -0.5).float()
        bound += delta.abs().sum(dim=0) * (lse_error + 2 * q.shape[0] * u) + (delta - delta_alone).abs().sum(dim=0)
    assert ((sinks.grad - expected).abs() <= bound).all(), (sinks.grad, expected, bound)


@pytest.mark.gpu
def test_the_lse_gradient_reaches_each_sequence():
    # An upstream gradient of the LSE joins dS as -D (gradient.backward_into's rule): each
    # sequence's gradients of the LSE alone judged as flash_attn_func's are.
    from fa_kernel.reference_backward import judge_backward

    lengths = [127, 129, 64]
    q, k, v, cu_q, cu_k = packed(lengths, lengths, device="cuda")
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    _, lse = call(*leaves, cu_q, cu_k, causal=True, return_lse=True)
    grad_lse = torch.randn_like(lse)
    lse.backward(grad_lse)
    for start, length in zip(cu_q.tolist(), lengths, strict=False):
        rows = slice(start, start + length)
        each = [t[None, rows] for t in (q, k, v)]
        grads = tuple(leaf.grad[None, rows] for leaf in leaves)
        verdict = judge_backward(*each, torch.zeros_like(each[0]), grads, True, grad_lse=grad_lse[None, :, rows])
        assert verdict.passed, f"sequence of {length} rows: {verdict}"


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "fixed_order"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_no_sequences_gradients_read_another(causal, deterministic):
    # Another sequence's keys, values, rows and output gradient changed: every other sequence's
    # gradients bitwise the same. The tiles at a sequence's end hold the next one's keys and rows
    # (taken at P = 0), and its last query tile reads the padding of its Delta and LSE₂ rows,
    # which the next sequence's follow. Finite values only: P = 0 times a neighbour's NaN row in
    # P^T·dO is NaN (docs/nonfinite.md, "Ragged batches").
    # Each sequence changed in turn: the first too, whose rows a tile that forgets its sequence's
    # offset reads.
    lengths = [127, 129, 64]
    q, k, v, cu_q, cu_k = packed(lengths, lengths, device="cuda")
    dout = torch.randn_like(q)
    options = dict(causal=causal, deterministic=deterministic)
    before = gradients(q, k, v, cu_q, cu_k, dout, **options)
    for start, end in itertools.pairwise(cu_q.tolist()):
        changed = [t.clone() for t in (q, k, v, dout)]
        for t in changed:
            t[start:end] = torch.randn_like(t[start:end]) * 3
        after = gradients(*changed[:3], cu_q, cu_k, changed[3], **options)
        others = torch.cat([torch.arange(0, start), torch.arange(end, q.shape[0])]).cuda()
        for grad_before, grad_after in zip(before, after, strict=True):
            assert torch.equal(grad_before[others], grad_after[others]), f"rows {start}:{end} changed"
            assert not torch.equal(grad_before[start:end], grad_after[start:end])


# ---- the custom ops (torch.compile) ----


def test_the_custom_ops_fakes_give_the_kernels_shapes():
    # On meta tensors the ops run their fakes: what torch.compile traces the graph with.
    import fa_kernel.varlen  # noqa: F401 (registers the ops)

    q = torch.empty(10, 4, 64, device="meta", dtype=torch.bfloat16)
    k = torch.empty(12, 2, 64, device="meta", dtype=torch.bfloat16)
    cu_q, cu_k = cu(4, 6, device="meta"), cu(5, 7, device="meta")
    sinks = torch.empty(4, device="meta")
    out, lse = torch.ops.fa_kernel.varlen_forward(q, k, k, cu_q, cu_k, 6, 7, 0.125, True, -1, -1, 0.0, sinks, True)
    assert (out.shape, out.dtype, lse.shape, lse.dtype) == (q.shape, q.dtype, (4, 10), torch.float32)
    grads = torch.ops.fa_kernel.varlen_backward(
        out, lse, q, k, k, out, lse, cu_q, cu_k, 6, 7, 0.125, True, -1, -1, 0.0, sinks, True
    )
    assert [(g.shape, g.dtype) for g in grads] == [
        (q.shape, q.dtype), (k.shape, k.dtype), (k.shape, k.dtype), ((4,), torch.float32)
    ]  # fmt: skip


@pytest.mark.gpu
def test_torch_compile_traces_forward_and_gradient_without_graph_breaks():
    q, k, v, cu_q, cu_k = packed([127, 129, 64], [127, 129, 64], device="cuda", dtype=torch.bfloat16)
    dout = torch.randn_like(q)

    def layer(q, k, v):
        # Only exact arithmetic around the op, so compiled and eager must agree bitwise.
        return call(q * 2, k, v, cu_q, cu_k, max_q=129, max_k=129, causal=True) * 4

    explanation = torch._dynamo.explain(layer)(q, k, v)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(layer, fullgraph=True)
    for run in (layer, compiled):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = run(*leaves)
        out.backward(dout)
        if run is layer:
            expected = (out, *(t.grad for t in leaves))
        else:
            for got, want in zip((out, *(t.grad for t in leaves)), expected, strict=True):
                assert torch.equal(got, want)


@pytest.mark.gpu
def test_the_custom_ops_pass_opcheck():
    q, k, v, cu_q, cu_k = packed([127, 0, 64], [100, 3, 64], device="cuda")
    arguments = (q, k, v, cu_q, cu_k, 127, 100, 0.125, True, -1, -1, 0.0, None)
    torch.library.opcheck(torch.ops.fa_kernel.varlen_forward.default, arguments)
    out, lse = torch.ops.fa_kernel.varlen_forward(*arguments)
    backward = (torch.randn_like(out), None, q, k, v, out, lse, *arguments[3:])
    torch.library.opcheck(torch.ops.fa_kernel.varlen_backward.default, backward)


def test_autograd_hands_the_options_to_the_gradient_and_its_gradients_to_the_leaves(monkeypatch):
    # The plumbing, on the CPU: the launches stood in for, the options must reach the gradient
    # as given and its four gradients the four leaves (dsinks in the sinks' slot).
    from fa_kernel import varlen

    q, k, v, cu_q, cu_k = packed([3, 5], [4, 6])
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)
    monkeypatch.setattr(varlen, "check_inputs", lambda q, k, v, scale, causal, **variants: scale)
    monkeypatch.setattr(varlen, "_varlen_forward", lambda q, k, v, sinks, *args: (q * 2, q.new_zeros(4, 8).float()))
    markers = [torch.full_like(t, i + 1.0) for i, t in enumerate((q, k, v, sinks))]
    given = {}

    def gradients(dout, grad_lse, q_, k_, v_, out, lse, cu_q_, cu_k_, layout, scale, causal, window, softcap, sinks_,
                  deterministic):  # fmt: skip
        given.update(scale=scale, causal=causal, window=window, softcap=softcap, deterministic=deterministic)
        assert grad_lse is None and torch.equal(dout, torch.ones_like(dout))
        handed = (q_, k_, v_, cu_q_, cu_k_, sinks_)
        assert all(a is b for a, b in zip(handed, (q, k, v, cu_q, cu_k, sinks), strict=True))
        return markers

    monkeypatch.setattr(varlen, "_varlen_gradients", gradients)
    options = dict(softmax_scale=0.25, causal=True, window_size=(4, -1), softcap=2.0, sinks=sinks, deterministic=True)
    call(q, k, v, cu_q, cu_k, **options).sum().backward()
    assert given == dict(scale=0.25, causal=True, window=(4, -1), softcap=2.0, deterministic=True)
    for leaf, marker in zip((q, k, v, sinks), markers, strict=True):
        assert torch.equal(leaf.grad, marker)


def test_torch_func_grad_runs_through_the_varlen_autograd(monkeypatch):
    # Under torch.func's transforms the Function with a setup_context runs (they refuse one
    # without); the same stand-ins as above.
    from fa_kernel import varlen

    q, k, v, cu_q, cu_k = packed([3, 5], [4, 6])
    monkeypatch.setattr(varlen, "check_inputs", lambda q, k, v, scale, causal, **variants: scale)
    monkeypatch.setattr(varlen, "_varlen_forward", lambda q, k, v, sinks, *args: (q * 2, q.new_zeros(4, 8).float()))
    monkeypatch.setattr(varlen, "_varlen_gradients", lambda dout, *args: (dout * 3, None, None, None))
    dq = torch.func.grad(lambda q: call(q, k, v, cu_q, cu_k, softmax_scale=0.25).float().sum())(q)
    assert torch.equal(dq, torch.full_like(q, 3))
