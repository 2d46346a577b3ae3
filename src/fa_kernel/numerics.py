"""The numbers the kernel's math is built on, shared by the kernel and its emulator (which runs
on any CPU and must not need TileLang to import them)."""

import math

# exp2 and log2 with the scale folded in: e^x = 2^(x * LOG2E), ln(x) = log2(x) * LN2.
LOG2E = math.log2(math.e)
LN2 = math.log(2.0)

# The largest row sum of P~ against the max before a tile with which the row keeps that max
# (kernel.py's docstring). The sum bounds every P~ of the row, so kept P~ <= 2^12 stay far inside
# fp16 (65504); precision is not at stake, since every weight is relative to the old max, which
# the normalisation cancels, and a max that rose weights the new keys up, not down.
STALE_SUM_LIMIT = 4096.0

# The kernels' tanh (softcap) is 1 - 2 / (2^(2x·LOG2E) + 1): the power by MUFU's ex2.approx
# (relative error 2^-22, PTX ISA) of an exponent rounded to fp32 (2x·LOG2E <= 26 before tanh
# saturates in fp32: 26·ln2·2^-24 relative in the power), both damped by d tanh / d(power) <= 1/2;
# the quotient by the fast division (rcp.approx and a multiply: 2 ulp, under 2^-21 for a quotient
# below 2): an absolute error of tanh below 2^-20, so a capped score errs by at most
# softcap·TANH_ERROR more than the scaled score it caps (tanh is 1-Lipschitz).
# tests/test_numerics.py checks it over the whole range in fp32.
TANH_ERROR = 2.0**-20
# tanh.approx.f32, one MUFU operation (an A/B build option, not shipped: perf/variants.py's tanh
# table): the PTX ISA gives about 2^-11 relative, so 2^-10 absolute for |tanh| <= 1, rounded up.
TANH_APPROX_ERROR = 2.0**-10
