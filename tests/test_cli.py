"""The CLI where there is no GPU: it says so plainly and exits with a code that tells why."""

from __future__ import annotations

import pytest
import torch

from fa_kernel.cli import EXIT_COMPILED_ONLY, EXIT_NO_GPU, main
from fa_kernel.configs import TUNED_SHORT

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")


def test_info_lists_a_config_for_every_case(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    # six (head_dim, causal) cases, and the short-sequence entries of the causal ones
    assert "tilelang 0.1.15" in out and out.count("thr") == 6 + len(TUNED_SHORT)


@no_gpu
@pytest.mark.parametrize("command", ["bench", "tune"])
def test_gpu_only_commands_say_they_need_a_gpu(command, capsys):
    assert main([command]) == EXIT_NO_GPU
    assert "needs a CUDA GPU" in capsys.readouterr().out


@no_gpu
@pytest.mark.compile
def test_verify_without_gpu_compiles_and_says_nothing_ran(capsys):
    assert main(["verify"]) == EXIT_COMPILED_ONLY
    out = capsys.readouterr().out
    # every (head_dim, causal) case's config, and the short-sequence configs beside them
    assert "Nothing was run on a GPU" in out and out.count("compiled bfloat16") == 6 + len(TUNED_SHORT)
