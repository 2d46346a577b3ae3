"""The error bounds numerics.py states for the kernels' arithmetic, checked over their whole range
in fp32 on the CPU: the kernels compute these with the same operations, in the same order."""

from __future__ import annotations

import math

import torch

from fa_kernel.numerics import LOG2E, TANH_ERROR

EX2_ERROR = 2.0**-22  # MUFU ex2.approx's relative error (PTX ISA)
DIVISION_ERROR = 2.0**-22  # the fast division's 2 ulp, relative (CUDA's __fdividef)


def kernels_tanh(y: torch.Tensor, power_error: float = 0.0, division_error: float = 0.0) -> torch.Tensor:
    """softmax.capped_score's arithmetic in fp32 for tanh(y) (softcap_log2 = 2·LOG2E here, the
    score y): the power by exp2 times (1 + power_error) (ex2.approx's error), the quotient times
    (1 + division_error) (the fast division's), each operation rounded to fp32."""
    power = torch.exp2(y.float() * torch.tensor(2 * LOG2E, dtype=torch.float32)) * (1 + power_error)
    return 1 - 2 / (power + 1) * (1 + division_error)


def test_the_kernels_tanh_errs_by_less_than_tanh_error():
    # Every score from where tanh is -1 in fp32 to where it is 1, densely near 0 (where tanh is
    # steepest); ex2's and the division's errors each way.
    y = torch.cat([torch.linspace(-12, 12, 2_000_001), torch.linspace(-0.01, 0.01, 200_001)])
    exact = torch.tanh(y.double())
    for power_error in (-EX2_ERROR, 0.0, EX2_ERROR):
        for division_error in (-DIVISION_ERROR, 0.0, DIVISION_ERROR):
            error = (kernels_tanh(y, power_error, division_error).double() - exact).abs().max().item()
            assert error <= TANH_ERROR, f"errors {power_error}, {division_error}: {error} > {TANH_ERROR}"


def test_the_bound_is_not_loose_by_more_than_a_factor_of_four():
    # A bound far above the arithmetic's error would let a wrong tanh pass the judge.
    y = torch.linspace(-12, 12, 2_000_001)
    error = (kernels_tanh(y, EX2_ERROR, DIVISION_ERROR).double() - torch.tanh(y.double())).abs().max().item()
    assert error > TANH_ERROR / 4, error


def test_the_kernels_tanh_saturates_and_passes_nan():
    y = torch.tensor([-math.inf, -1e30, -100.0, 100.0, 1e30, math.inf, math.nan])
    out = kernels_tanh(y)
    assert out[:6].tolist() == [-1.0, -1.0, -1.0, 1.0, 1.0, 1.0] and math.isnan(out[6])
