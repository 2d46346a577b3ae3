"""A library call prints nothing of TileLang's: a compile is quiet unless FA_KERNEL_VERBOSE=1
(fa_kernel.toolchain), and a first call with gradients, in a process of its own, says nothing of
TileLang's."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest


@pytest.mark.compile
def test_a_compile_prints_nothing_unless_asked(capfd, monkeypatch):
    from fa_kernel.backward_preprocess import preprocess_program
    from fa_kernel.toolchain import compile_program

    monkeypatch.delenv("FA_KERNEL_VERBOSE", raising=False)
    level = logging.getLogger("tilelang").level
    program = preprocess_program(head_dim=64, dtype="float16")
    compile_program(program, "sm_90a")  # a build (or a disk-cache load)
    compile_program(program, "sm_90a")  # TileLang's memory cache, which warns by default
    assert capfd.readouterr() == ("", "")
    assert logging.getLogger("tilelang").level == level
    monkeypatch.setenv("FA_KERNEL_VERBOSE", "1")
    compile_program(program, "sm_90a")
    assert "memory cache" in "".join(capfd.readouterr())


FIRST_CALL = """
import torch
from fa_kernel import flash_attn_func
q, k, v = (torch.randn(1, 300, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
flash_attn_func(q, k, v, causal=True).sum().backward()
torch.cuda.synchronize()
"""


@pytest.mark.gpu
def test_a_first_call_with_gradients_prints_nothing():
    done = subprocess.run([sys.executable, "-c", FIRST_CALL], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    assert "tilelang" not in (done.stdout + done.stderr).lower(), done.stdout + done.stderr
