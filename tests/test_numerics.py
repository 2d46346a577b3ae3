"""The error bounds numerics.py states for the kernels' arithmetic, checked over their whole range
in fp32 on the CPU: the kernels compute these with the same operations, in the same order."""

from __future__ import annotations

import math

import torch

from fa_kernel.numerics import CAP_EXPONENT, LOG2E, RECIPROCAL_SEED, TANH_ERROR

EX2_ERROR = 2.0**-22  # MUFU ex2.approx's relative error (PTX ISA)


def kernels_tanh(y: torch.Tensor, power_error: float = 0.0) -> torch.Tensor:
    """softmax.capped_score's arithmetic in fp32 for tanh(y) (softcap_log2 = 2·LOG2E here, the
    score y): the clamped exponent, the power by exp2 times (1 + power_error) (ex2.approx's error),
    the seeded reciprocal and three Newton steps, each operation rounded to fp32 (no FMA: a bound
    that holds unfused holds fused)."""
    exponent = y.float() * torch.tensor(2 * LOG2E, dtype=torch.float32)
    exponent = torch.where(exponent > CAP_EXPONENT, torch.tensor(CAP_EXPONENT), exponent)
    power = torch.exp2(exponent) * (1 + power_error) + 1
    r = (RECIPROCAL_SEED - power.view(torch.int32)).view(torch.float32)
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
