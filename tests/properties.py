"""The properties every implementation of the kernel's contract must have.

Each check takes `attend(q, k, v, softmax_scale, causal) -> (out, lse)` and a `Case`; the
GPU suite passes the TileLang kernel, the CPU suite the tile emulator. A failed check
raises AssertionError carrying the error report, so hypothesis prints both the drawn
case (a full reproduction) and what went wrong.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from suite.strategies import Case

from fa_kernel.reference import judge

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, bool], tuple[torch.Tensor, torch.Tensor]]


def assert_same(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Bitwise equality, or an AssertionError that says how many elements differ, by how much
    and where: a race shows as a few scattered elements, a logic error as whole rows or heads."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if torch.equal(actual, expected):
        return
    differ = actual != expected
    first = tuple(differ.nonzero()[0].tolist())
    gap = (actual.double() - expected.double()).abs()[differ].max().item()
    raise AssertionError(
        f"{what}: {int(differ.sum())} of {differ.numel()} elements differ (max |diff| {gap:.3g}); "
        f"first at {first}: {actual[first].item()!r} vs {expected[first].item()!r}"
    )


def check_accuracy(attend: Attend, case: Case, device) -> None:
    """Finite everywhere; output within the flash-attn-style bound of the fp32 reference,
    no element outside atol + rtol·|ref|; LSE within its fp32 error bound."""
    q, k, v = case.inputs(device)
    out, lse = attend(q, k, v, case.scale, case.causal)
    assert out.shape == q.shape and out.dtype == q.dtype, f"output {out.shape} {out.dtype}"
    verdict = judge(q, k, v, out, lse, case.causal, case.scale)
    assert verdict.passed, str(verdict)


def check_causal_past(attend: Attend, case: Case, device) -> None:
    """Changing K/V at keys a row cannot see leaves that row bitwise unchanged."""
    if not case.causal:
        return
    q, k, v = case.inputs(device)
    out, lse = attend(q, k, v, case.scale, case.causal)
    cut = case.seed % case.seqlen_k  # keys >= cut are replaced
    k2, v2 = k.clone(), v.clone()
    k2[:, cut:] = -k2[:, cut:] * 3 + 1
    v2[:, cut:] = v2[:, cut:] * 5 - 2
    out2, lse2 = attend(q, k2, v2, case.scale, case.causal)
    # Row i sees keys j <= i + (seqlen_k - seqlen_q); it sees none of the changed ones while that is < cut.
    rows = max(0, min(case.seqlen_q, cut - (case.seqlen_k - case.seqlen_q)))
    assert_same(out2[:, :rows], out[:, :rows], f"output of rows < {rows} after changing keys >= {cut}")
    assert_same(lse2[:, :, :rows], lse[:, :, :rows], f"LSE of rows < {rows} after changing keys >= {cut}")


def check_equivariance(attend: Attend, case: Case, device) -> None:
    """Permuting the batch, or K/V heads together with their query-head groups, permutes
    the output the same way; scaling V by 2 scales the output by 2; all bitwise."""
    q, k, v = case.inputs(device)
    out, lse = attend(q, k, v, case.scale, case.causal)
    gen = torch.Generator().manual_seed(case.seed)
    batch_perm = torch.randperm(case.batch, generator=gen).to(q.device)
    kv_perm = torch.randperm(case.nheads_kv, generator=gen)
    group = case.nheads // case.nheads_kv
    q_perm = (kv_perm[:, None] * group + torch.arange(group)).flatten().to(q.device)
    kv_perm = kv_perm.to(q.device)
    out_b, _ = attend(q[batch_perm], k[batch_perm], v[batch_perm], case.scale, case.causal)
    assert_same(out_b, out[batch_perm], "output with the batch permuted")
    out_h, lse_h = attend(q[:, :, q_perm], k[:, :, kv_perm], v[:, :, kv_perm], case.scale, case.causal)
    assert_same(out_h, out[:, :, q_perm], "output with the heads permuted")
    assert_same(lse_h, lse[:, q_perm], "LSE with the heads permuted")
    # Doubling is exact in binary floating point, except where an output element is
    # subnormal: there the rounding step is absolute, and 2·round(x) and round(2x) may
    # differ by the smallest subnormal. Near fp32's own subnormals (the 'tiny' bf16 inputs)
    # the kernel flushes to zero, and doubling can lift a value out of the flushed range.
    if case.distribution == "tiny":
        return
    finfo = torch.finfo(case.torch_dtype)
    out_2v, _ = attend(q, k, v * 2, case.scale, case.causal)
    diff = (out_2v.double() - 2 * out.double()).abs()
    # Strictly above the smallest normal: an exact result just below it rounds *up* to it
    # with the subnormal (absolute) step, so an output equal to `tiny` may come from there.
    normal = out.abs() > finfo.tiny
    assert_same(out_2v[normal], (out * 2)[normal], "output with V doubled (normal outputs)")
    assert torch.all(diff[~normal] <= 2 * finfo.smallest_normal * finfo.eps), "scaling V by 2, subnormal outputs"


def check_deterministic(attend: Attend, case: Case, device) -> None:
    """Two runs on the same input are bitwise equal."""
    q, k, v = case.inputs(device)
    out1, lse1 = attend(q, k, v, case.scale, case.causal)
    out2, lse2 = attend(q, k, v, case.scale, case.causal)
    assert_same(out2, out1, "output of a second run on the same input")
    assert_same(lse2, lse1, "LSE of a second run on the same input")


PROPERTIES = (
    check_accuracy,
    check_causal_past,
    check_equivariance,
    check_deterministic,
)
