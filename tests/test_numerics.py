"""The error bounds numerics.py states for the kernels' arithmetic, checked over their whole range
in fp32 on the CPU: the kernels compute these with the same operations, in the same order."""

from __future__ import annotations

import math

import torch

from fa_kernel.numerics import CAP_EXPONENT, LOG2E, RECIPROCAL_SEED, TANH_ERROR

EX2_ERROR = 2.0**-22  # MUFU ex2.approx's relative error (PTX ISA)


def kernels_tanh(
    y: torch.Tensor, power_error: float = 0.0, cap_exponent: float = CAP_EXPONENT, seed: int = RECIPROCAL_SEED
) -> torch.Tensor:
    """softmax.capped_score's arithmetic in fp32 for tanh(y) (softcap_log2 = 2·LOG2E here, the
    score y): the clamped exponent, the power by exp2 times (1 + power_error) (ex2.approx's error),
    the seeded reciprocal and three Newton steps, each operation rounded to fp32 (no FMA: a bound
    that holds unfused holds fused)."""
    exponent = y.float() * torch.tensor(2 * LOG2E, dtype=torch.float32)
    exponent = torch.where(exponent > cap_exponent, torch.tensor(cap_exponent), exponent)
    power = torch.exp2(exponent) * (1 + power_error) + 1
    r = (seed - power.view(torch.int32)).view(torch.float32)
    for _ in range(3):
        r = r + r * (1 - power * r)
    return 1 - 2 * r


def test_the_kernels_tanh_errs_by_less_than_tanh_error():
    # Every score from where tanh is -1 in fp32 to where it is 1, densely near 0 (where tanh is
    # steepest) and across the reciprocal seed's mantissa pattern; ex2's error both ways.
    y = torch.cat([torch.linspace(-12, 12, 2_000_001), torch.linspace(-0.01, 0.01, 200_001)])
    exact = torch.tanh(y.double())
    for power_error in (-EX2_ERROR, 0.0, EX2_ERROR):
        error = (kernels_tanh(y, power_error).double() - exact).abs().max().item()
        assert error <= TANH_ERROR, f"power error {power_error}: {error} > {TANH_ERROR}"


def test_the_kernels_tanh_saturates_and_passes_nan():
    y = torch.tensor([-math.inf, -1e30, -100.0, 100.0, 1e30, math.inf, math.nan])
    out = kernels_tanh(y)
    assert out[:6].tolist() == [-1.0, -1.0, -1.0, 1.0, 1.0, 1.0] and math.isnan(out[6])


def test_two_newton_steps_would_not_do():
    # The bound needs the third step: after two the reciprocal errs by about 2^-17.
    y = torch.linspace(-12, 12, 200_001)
    exponent = y * 2 * LOG2E
    power = torch.exp2(exponent.clamp(max=CAP_EXPONENT)) + 1
    r = (RECIPROCAL_SEED - power.view(torch.int32)).view(torch.float32)
    for _ in range(2):
        r = r + r * (1 - power * r)
    assert ((1 - 2 * r).double() - torch.tanh(y.double())).abs().max() > TANH_ERROR


# Scores from where tanh is -1 in fp32 to past every clamp the mutants try, densely.
SCORES = torch.cat([torch.linspace(-60, 60, 2_000_001), torch.linspace(-0.01, 0.01, 200_001)])


def test_the_cap_exponent_only_keeps_the_power_finite():
    # tools/equivalent_mutants.CAP_PAST_SATURATION: a clamp from 26 up to 126 gives the same bits;
    # past that the seed's subtraction leaves the floats, at 128 the power overflows, and near 20
    # tanh is not 1 yet.
    shipped = kernels_tanh(SCORES)
    for cap in (26.0, 32.0, 63.0, 65.0, 126.0):
        assert torch.equal(kernels_tanh(SCORES, cap_exponent=cap), shipped), cap
    assert not torch.equal(kernels_tanh(SCORES, cap_exponent=127.0), shipped)
    assert not torch.equal(kernels_tanh(SCORES, cap_exponent=20.0), shipped)


def test_a_seed_one_off_still_meets_tanh_error():
    # tools/equivalent_mutants.SEED_IS_A_GUESS; a seed with a wrong exponent does not converge.
    exact = torch.tanh(SCORES.double())
    for seed in (RECIPROCAL_SEED + 1, RECIPROCAL_SEED - 1):
        assert (kernels_tanh(SCORES, seed=seed).double() - exact).abs().max() <= TANH_ERROR, hex(seed)
    wrong = kernels_tanh(SCORES, seed=RECIPROCAL_SEED // 2).double()
    assert not ((wrong - exact).abs() <= TANH_ERROR).all()
