"""The reference and the error metrics the whole suite leans on, checked on the CPU."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from fa_kernel.reference import (
    attention_flops,
    attention_ref,
    error_report,
    judge,
    output_bound,
    visible_keys,
    visible_pairs,
)


def naive_attention(q, k, v, causal, scale, window=(-1, -1), softcap=0.0, sinks=None):
    """Row by row in fp64, straight from the definition (bottom-right causal, GQA by groups; a
    window around each row's diagonal, the cap on each scaled score, a sink in each row's sum)."""
    batch, seqlen_q, nheads, _ = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((batch, nheads, seqlen_q), -math.inf, dtype=torch.float64)
    left, right = window[0], 0 if causal else window[1]
    for b in range(batch):
        for h in range(nheads):
            kv = h // (nheads // nheads_kv)
            for i in range(seqlen_q):
                diagonal = i + seqlen_k - seqlen_q
                keys = [
                    j
                    for j in range(seqlen_k)
                    if (right < 0 or j <= diagonal + right) and (left < 0 or j >= diagonal - left)
                ]
                sink = [] if sinks is None else [float(sinks[h])]
                scores = k[b, keys, kv].double() @ q[b, i, h].double() * scale
                if softcap > 0:
                    scores = softcap * torch.tanh(scores / softcap)
                if not keys and not sink:
                    continue
                lse[b, h, i] = torch.logsumexp(torch.cat([scores, torch.tensor(sink, dtype=torch.float64)]), dim=0)
                if keys:
                    out[b, i, h] = torch.exp(scores - lse[b, h, i]) @ v[b, keys, kv].double()
    return out, lse


def random_inputs(seqlen_q, seqlen_k, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, seqlen_q, 4, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, seqlen_k, 2, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, seqlen_k, 2, 8, generator=gen, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize(("seqlen_q", "seqlen_k"), [(5, 5), (3, 7), (7, 3), (1, 4)])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_the_definition(seqlen_q, seqlen_k, causal):
    q, k, v = random_inputs(seqlen_q, seqlen_k, seqlen_q * 10 + seqlen_k)
    out, lse = attention_ref(q, k, v, causal, 0.3, compute_dtype=torch.float64)
    want_out, want_lse = naive_attention(q, k, v, causal, 0.3)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(lse.double(), want_lse)


@pytest.mark.parametrize(("seqlen_q", "seqlen_k"), [(5, 5), (3, 7), (7, 3), (1, 4)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(0, 0), (1, -1), (-1, 1), (2, 0), (0, 2), (9, 9)], ids=str)
@pytest.mark.parametrize("softcap", [0.0, 0.5])
@pytest.mark.parametrize("with_sinks", [False, True], ids=["", "sinks"])
def test_the_variants_match_the_definition(seqlen_q, seqlen_k, causal, window, softcap, with_sinks):
    # Windows of one key, one side, both, and wider than the sequence; a cap that saturates
    # (scores of order 1 against a cap of 0.5); a sink per head, one of them -inf (no sink).
    q, k, v = random_inputs(seqlen_q, seqlen_k, seqlen_q * 10 + seqlen_k)
    sinks = torch.tensor([0.5, -1.0, 2.0, -math.inf]) if with_sinks else None
    options = dict(window_size=window, softcap=softcap, sinks=sinks)
    out, lse = attention_ref(q, k, v, causal, 0.3, compute_dtype=torch.float64, **options)
    want_out, want_lse = naive_attention(q, k, v, causal, 0.3, window, softcap, sinks)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(lse.double(), want_lse)
    # The same-precision baseline computes the same attention (fp32 here: within fp32's error).
    baseline, baseline_lse = attention_ref(q.float(), k.float(), v.float(), causal, 0.3, upcast=False, **options)
    torch.testing.assert_close(baseline.double(), want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(baseline_lse.double(), want_lse, rtol=1e-5, atol=1e-5)


def test_a_row_outside_its_window_outputs_zero_and_its_lse_is_the_sink_or_minus_inf():
    q, k, v = random_inputs(4, 2, 0)
    out, lse = attention_ref(q, k, v, window_size=(0, 0))  # rows 0 and 1: diagonals -2 and -1
    assert torch.all(out[:, :2] == 0) and torch.all(lse[..., :2] == -math.inf)
    sinks = torch.tensor([0.5, -1.0, 2.0, 3.0])
    out, lse = attention_ref(q, k, v, window_size=(0, 0), sinks=sinks)
    assert torch.all(out[:, :2] == 0) and torch.equal(lse[0, :, 0], sinks)


def test_bottom_right_causal_alignment():
    # flash-attn >= 2.1: with 2 queries and 5 keys, query 0 sees keys 0..3 and query 1 all 5.
    assert visible_keys(2, 5, causal=True).tolist() == [[True] * 4 + [False], [True] * 5]
    # 5 queries over 2 keys: the first 3 rows see nothing.
    assert visible_keys(5, 2, causal=True).sum(dim=1).tolist() == [0, 0, 0, 1, 2]


def test_rows_that_see_no_key_output_zero_and_lse_minus_inf():
    q, k, v = torch.randn(1, 5, 1, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
    out, lse = attention_ref(q, k, v, causal=True)
    assert torch.all(out[:, :3] == 0) and torch.all(lse[..., :3] == -math.inf)
    assert torch.isfinite(out).all() and torch.isfinite(lse[..., 3:]).all()


def test_baseline_rounds_what_the_kernel_rounds():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 300, 2, 64, generator=gen).half() for _ in range(3))
    ref, _ = attention_ref(q, k, v)
    baseline, _ = attention_ref(q, k, v, upcast=False)
    assert baseline.dtype == torch.float16 and ref.dtype == torch.float32
    bound = output_bound(ref, baseline, torch.float16, seqlen_k=k.shape[1], dominant_term=0.0)
    # The baseline is wrong by far less than fp16's worst case; the bound is twice that plus
    # one rounding of the output: half an ulp at the largest output.
    assert 0 < bound.baseline_max_abs < 1e-2
    assert bound.rounding_max_abs == pytest.approx(2.0**-11 * ref.abs().max().item())
    assert bound.atol == pytest.approx(2 * bound.baseline_max_abs + bound.rounding_max_abs)


def test_the_output_rounding_counts_where_the_exact_output_is_representable():
    # One key per row: the exact output is v itself, representable in fp16, and the baseline
    # is exact too. A kernel's fp32 result a hair off v still rounds, by up to an ulp.
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 5, 2, 64, generator=gen).half() for _ in range(3))
    ref, _ = attention_ref(q, k[:, :1], v[:, :1])
    baseline, _ = attention_ref(q, k[:, :1], v[:, :1], upcast=False)
    bound = output_bound(ref, baseline, torch.float16, seqlen_k=1, dominant_term=0.0)
    assert bound.baseline_max_abs == 0 and torch.equal(ref.half().float(), ref)
    assert bound.atol >= 2.0**-11 * v[:, :1].abs().max().item() > 0


def test_error_report_counts_what_it_should():
    ref = torch.tensor([1.0, 2.0, -math.inf, 4.0])
    out = torch.tensor([1.0, 2.5, -math.inf, math.nan])
    report = error_report(out, ref, atol=0.1, rtol=0.0)
    assert report.nonfinite == 1 and report.mismatches == 2 and report.max_abs == math.inf
    assert error_report(ref, ref).max_abs == 0.0


def test_a_broken_output_is_outside_the_bound():
    # The bound must be able to fail: an off-by-one causal mask is a small, local error.
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 200, 2, 64, generator=gen).half() for _ in range(3))
    ref, _ = attention_ref(q, k, v, causal=True)
    baseline, _ = attention_ref(q, k, v, causal=True, upcast=False)
    k_shifted, v_shifted = torch.roll(k, 1, dims=1), torch.roll(v, 1, dims=1)
    wrong, _ = attention_ref(q, k_shifted, v_shifted, causal=True, upcast=False)
    bound = output_bound(ref, baseline, torch.float16, seqlen_k=k.shape[1], dominant_term=0.0)
    assert not bound.admits(error_report(wrong, ref, bound.atol, bound.rtol))


def test_flops_convention():
    assert attention_flops(8, 32, 4096, 4096, 128, False) == 4 * 8 * 32 * 4096 * 4096 * 128
    assert attention_flops(8, 32, 4096, 4096, 128, True) == 2 * 8 * 32 * 4096 * 4096 * 128


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1, 1), (7, 7), (5, 19), (19, 5), (64, 130)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window_size", [(-1, -1), (0, 0), (3, -1), (-1, 2), (4, 1), (0, 25), (100, 100)])
def test_visible_pairs_counts_the_mask(seqlen_q, seqlen_k, causal, window_size):
    # Every edge in both directions, the diagonal off the grid on either side (Sq > Sk, Sk > Sq),
    # rows with no key, windows wider than the sequence.
    mask = visible_keys(seqlen_q, seqlen_k, causal, window_size=window_size)
    assert visible_pairs(seqlen_q, seqlen_k, causal, window_size) == int(mask.sum())


def test_error_report_requires_nan_where_the_reference_is_nan():
    ref = torch.tensor([1.0, math.nan, math.nan, 4.0, math.inf, -math.inf])
    matching = torch.tensor([1.0, math.nan, math.nan, 4.0, math.inf, -math.inf])
    report = error_report(matching, ref, atol=0.1, rtol=0.0)
    assert report.max_abs == 0.0 and report.mismatches == 0 and report.nonfinite == 0
    assert report.rel_l2 == 0.0
    # A finite value, or an infinity, where the reference is NaN; NaN where it is finite or inf.
    wrong = torch.tensor([math.nan, 0.0, math.inf, 4.0, math.nan, math.inf])
    report = error_report(wrong, ref, atol=0.1, rtol=0.0)
    assert report.nonfinite == 5 and report.mismatches == 5 and report.max_abs == math.inf


def test_judge_accepts_nan_where_the_reference_has_it_and_nowhere_else():
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 40, 2, 64, generator=gen).half() for _ in range(3))
    q[0, 7, 1, 3] = math.nan
    same_precision, lse = attention_ref(q, k, v, causal=True, upcast=False)
    assert torch.isnan(same_precision[0, 7, 1]).all() and torch.isnan(lse[0, 1, 7])
    verdict = judge(q, k, v, same_precision, lse, causal=True)
    # The baseline is compared the same way: its NaN row matches the reference's, zero error.
    assert verdict.passed and 0 < verdict.output_bound.baseline_max_abs < 1e-2, str(verdict)
    finite_row = same_precision.clone()
    finite_row[0, 7, 1] = 0.0
    assert not judge(q, k, v, finite_row, lse, causal=True).passed
    finite_lse = lse.clone()
    finite_lse[0, 1, 7] = 0.0
    assert not judge(q, k, v, same_precision, finite_lse, causal=True).passed
    stray_nan = same_precision.clone()
    stray_nan[0, 8, 1, 0] = math.nan
    assert not judge(q, k, v, stray_nan, lse, causal=True).passed


def test_inf_inputs_leave_the_bounds_finite():
    # The bounds scale with the largest finite values: an Inf in V must not make every finite
    # output pass.
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 40, 2, 64, generator=gen).half() for _ in range(3))
    v[0, 0, 1, 5] = math.inf
    same_precision, lse = attention_ref(q, k, v, upcast=False)
    verdict = judge(q, k, v, same_precision, lse)
    assert verdict.passed, str(verdict)
    assert math.isfinite(verdict.output_bound.atol) and math.isfinite(verdict.lse_bound.atol)
    off = same_precision.clone()
    off[0, 3, 0, 0] += 0.25
    assert not judge(q, k, v, off, lse).passed


def test_the_mask_keeps_hidden_keys_and_rows_without_keys_out():
    # q and K reach a row only through the keys it sees; V reaches every row that has a key
    # (P.V is a GEMM over all keys: 0 times NaN); a row with no key is 0 and -inf regardless.
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(1, 6, 1, 8, generator=gen)
    k, v = torch.randn(1, 4, 1, 8, generator=gen), torch.randn(1, 4, 1, 8, generator=gen)
    out, lse = attention_ref(q, k, v, causal=True)  # rows 0-1 see no key, row 2 keys 0, row 5 keys 0-3
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    q2[0, 0, 0, 0] = math.nan  # a row without keys
    k2[0, 3, 0, 0] = math.nan  # seen by row 5 only
    v2[0, 3, 0, 1] = math.nan  # hidden from rows 2-4, seen by row 5
    out2, lse2 = attention_ref(q2, k2, v2, causal=True)
    assert torch.all(out2[0, :2] == 0) and torch.all(lse2[0, 0, :2] == -math.inf)
    assert torch.isnan(out2[0, 5]).all() and torch.isnan(lse2[0, 0, 5])
    assert torch.isnan(out2[0, 2:5, 0, 1]).all()  # 0 times NaN
    torch.testing.assert_close(out2[0, 2:5, 0, [0, *range(2, 8)]], out[0, 2:5, 0, [0, *range(2, 8)]])
    torch.testing.assert_close(lse2[0, 0, :5], lse[0, 0, :5])


def test_infinite_scores():
    # +inf: the softmax is inf/inf, NaN output and LSE. Every score of a row -inf: no key
    # weighs anything, output 0 and LSE -inf, as for a row that sees no key.
    q, k, v = torch.ones(1, 2, 1, 4), torch.ones(1, 3, 1, 4), torch.randn(1, 3, 1, 4)
    q[0, 0, 0, 0] = math.inf
    q[0, 1, 0, 0] = -math.inf
    out, lse = attention_ref(q, k, v)
    assert torch.isnan(out[0, 0]).all() and torch.isnan(lse[0, 0, 0])
    assert torch.all(out[0, 1] == 0) and lse[0, 0, 1] == -math.inf


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_judge_of_the_variants_passes_the_baseline_and_fails_their_slips(dtype):
    # The slips a kernel of the variants could make: the cap applied before the scale, a window
    # edge one key off, the sink left out of the LSE (and so out of the weights).
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 40, 2, 64, generator=gen).to(dtype) for _ in range(3))
    scale, sinks = 0.125 * 3, torch.tensor([0.5, 1.5])
    options = dict(window_size=(6, 2), softcap=2.0, sinks=sinks)
    out, lse = attention_ref(q, k, v, False, scale, upcast=False, **options)
    assert judge(q, k, v, out, lse, False, scale, **options).passed
    # The cap before the scale: scale·c·tanh(q·k / c), which is a cap of scale·c on the scaled score.
    cap_first = dict(options, softcap=2.0 * scale)
    slips = {
        "cap before the scale": attention_ref(q, k, v, False, scale, upcast=False, **cap_first),
        "left edge one key wider": attention_ref(
            q, k, v, False, scale, upcast=False, **dict(options, window_size=(7, 2))
        ),
        "sink left out": attention_ref(q, k, v, False, scale, upcast=False, **dict(options, sinks=None)),
    }
    for name, (wrong_out, wrong_lse) in slips.items():
        assert not judge(q, k, v, wrong_out, wrong_lse, False, scale, **options).passed, name


def test_a_ragged_batch_is_each_sequence_on_its_own():
    # Lengths 0, 1 and long beside each other, queries and keys of different counts; each
    # sequence is a batch of one to attention_ref (its own bottom-right diagonal and window),
    # and perturbing one sequence's keys moves no other sequence's output (no cross-talk).
    from fa_kernel.reference import attention_varlen_ref

    gen = torch.Generator().manual_seed(3)
    lengths_q, lengths_k = [3, 0, 1, 9], [5, 2, 1, 4]
    cu_q = torch.tensor([0, *itertools.accumulate(lengths_q)], dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools.accumulate(lengths_k)], dtype=torch.int32)
    q = torch.randn(sum(lengths_q), 4, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(sum(lengths_k), 2, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    options = dict(causal=True, softmax_scale=0.3, window_size=(2, -1), compute_dtype=torch.float64)
    out, lse = attention_varlen_ref(q, k, v, cu_q, cu_k, **options)
    assert out.shape == q.shape and lse.shape == (4, sum(lengths_q))
    for i in range(len(lengths_q)):
        rows, keys = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        want_out, want_lse = naive_attention(q[None, rows], k[None, keys], v[None, keys], True, 0.3, (2, -1))
        torch.testing.assert_close(out[rows], want_out[0])
        torch.testing.assert_close(lse[:, rows].double(), want_lse[0])
    k2 = k.clone()
    k2[cu_k[3] : cu_k[4]] += 1.0  # the last sequence's keys
    out2, _ = attention_varlen_ref(q, k2, v, cu_q, cu_k, **options)
    assert torch.equal(out2[: cu_q[3]], out[: cu_q[3]]) and not torch.equal(out2[cu_q[3] :], out[cu_q[3] :])


@pytest.mark.parametrize("page_size", [4, 16])
def test_a_paged_cache_is_its_requests_keys_in_page_order(page_size):
    # Pages handed out out of order and one page shared by two requests; lengths at a page
    # boundary, one past it, one short of it, and 0.
    from fa_kernel.reference import attention_paged_ref, paged_keys

    gen = torch.Generator().manual_seed(4)
    num_blocks, nheads_kv = 8, 2
    k_cache, v_cache = (torch.randn(num_blocks, page_size, nheads_kv, 8, generator=gen) for _ in range(2))
    block_table = torch.tensor([[5, 2, 7], [2, 0, 1], [3, 6, 4], [1, 1, 1]], dtype=torch.int32)
    cache_seqlens = torch.tensor([2 * page_size, 2 * page_size + 1, page_size - 1, 0], dtype=torch.int32)
    keys = paged_keys(k_cache, block_table, cache_seqlens)
    assert [len(each) for each in keys] == cache_seqlens.tolist()
    assert torch.equal(keys[1][page_size : 2 * page_size], k_cache[0]) and torch.equal(keys[1][-1], k_cache[1, 0])
    q = torch.randn(4, 3, 4, 8, generator=gen)
    out, lse = attention_paged_ref(q, k_cache, v_cache, block_table, cache_seqlens, causal=True)
    for b in range(4):
        values = paged_keys(v_cache, block_table, cache_seqlens)[b]
        want_out, want_lse = attention_ref(q[b : b + 1], keys[b][None], values[None], causal=True)
        torch.testing.assert_close(out[b : b + 1], want_out)
        torch.testing.assert_close(lse[b : b + 1], want_lse)
    assert torch.all(out[3] == 0) and torch.all(lse[3] == -math.inf)  # no key: 0 and -inf
