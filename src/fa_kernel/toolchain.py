"""How every kernel of the package is compiled: its element types, pass configs and the compile
call, written once for the forward, gradient and split-KV kernels.

A compile is quiet: TileLang's log lines ("begins to compile kernel", "Found kernel in memory
cache") reach no caller unless FA_KERNEL_VERBOSE=1 is set.
"""

from __future__ import annotations

import contextlib
import logging
import os

import tilelang
import tilelang.language as T

DTYPES = {"float16": T.float16, "bfloat16": T.bfloat16}

# exp2 goes to the MUFU unit's ex2.approx: its relative error (2^-22) is far below the fp16/bf16
# rounding of P (and dS), the only down-casts in the algorithm.
FAST_MATH = {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True}
# For a kernel that places its own syncs and barriers: TileLang's planner would add its own.
OWN_SYNCS = {**FAST_MATH, tilelang.PassConfigKey.TL_DISABLE_THREAD_STORAGE_SYNC: True}
# For a kernel without TileLang's producer warpgroup (its loads then by cp.async in the loop).
NO_PRODUCER = {**FAST_MATH, tilelang.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True}


def target_of(arch: str | None):
    """TileLang's target: the current CUDA device where `arch` is None, else that nvcc
    architecture ("sm_90a": nvcc only, no GPU needed)."""
    return "auto" if arch is None else {"kind": "cuda", "arch": arch}


def compile_program(program, arch: str | None, pass_configs: dict = FAST_MATH):
    """`program` compiled for `arch` (target_of), quietly (the module docstring). TileLang's
    caches key it by the program and the pass configs, in this process and on disk."""
    with _tilelang_logs():
        return tilelang.compile(program, target=target_of(arch), pass_configs=pass_configs)


@contextlib.contextmanager
def _tilelang_logs():
    """TileLang's log handlers at ERROR for the block (INFO with FA_KERNEL_VERBOSE=1), then as
    they were. Its modules' loggers set levels of their own and pass their records up to the
    `tilelang` logger's handlers, so the handlers are where a threshold holds for all of them."""
    verbose = os.environ.get("FA_KERNEL_VERBOSE") == "1"
    logger = logging.getLogger("tilelang")
    saved = logger.level, [(handler, handler.level) for handler in logger.handlers]
    if verbose:
        logger.setLevel(logging.INFO)
    for handler, _ in saved[1]:
        handler.setLevel(logging.INFO if verbose else logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(saved[0])
        for handler, level in saved[1]:
            handler.setLevel(level)
