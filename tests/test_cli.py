"""The CLI where there is no GPU: it says so plainly and exits with a code that tells why."""

from __future__ import annotations

import pytest
import torch

from fa_kernel.cli import EXIT_COMPILED_ONLY, EXIT_NO_GPU, main
from fa_kernel.configs import TUNED_SHORT

SHORT_ENTRIES = sum(len(entries) for entries in TUNED_SHORT.values())
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")


def test_info_lists_a_config_for_every_case(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    # six (head_dim, causal) cases, and the short-sequence entries beside them
    assert "tilelang 0.1.15" in out and out.count("thr") == 6 + SHORT_ENTRIES


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
    assert "Nothing was run on a GPU" in out and out.count("compiled bfloat16") == 6 + SHORT_ENTRIES


def test_tune_searches_both_tables_and_prints_pasteable_entries(monkeypatch, capsys):
    # The search and the printout, with the GPU parts stubbed: which configs each table's
    # search times, and that what it prints is valid Python for configs.py.
    import fa_kernel.cli as cli
    from fa_kernel.bench import Shape
    from fa_kernel.configs import TileConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (9, 0))
    device = type("Properties", (), {"multi_processor_count": 132})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *args: device)
    monkeypatch.setattr(Shape, "inputs", lambda self, seed=0: (torch.empty(1, 1, 1, 1),) * 3)
    timed = []

    def compile_stub(*, head_dim, causal, dtype, config, sm_count):
        timed.append((head_dim, causal, config))
        return lambda *args: None

    monkeypatch.setattr(cli, "compiled_forward", compile_stub)
    monkeypatch.setattr(cli, "cuda_median_ms", lambda fn, warmup, repeats: 1.0)
    assert main(["tune", "--head-dim", "128"]) == 0
    out = capsys.readouterr().out
    assert "# Paste into TUNED in" in out and "# Paste into TUNED_SHORT in" in out
    # each timing line names its table, shape and config
    assert "TUNED_SHORT 32x16x1024x128 float16 causal 64x64/2st/128thr/2persm: " in out
    entries = [line.split("  #")[0].strip().rstrip(",") for line in out.splitlines() if line.startswith("    ('sm_90'")]
    table = eval("{" + ", ".join(entries) + "}", {"TileConfig": TileConfig})  # noqa: S307 - our own printout
    assert set(table) == {("sm_90", 128, False), ("sm_90", 128, True)}  # and again for short keys
    assert len(entries) == 4
    assert sum("((1024, TileConfig(" in entry for entry in entries) == 2, "short entries serve up to 1024 keys"
    assert "TUNED_SHORT 32x16x1024x128 float16 128x176/2st/256thr/persistent: " in out
    long_causal = [line for line in out.splitlines() if line.strip().startswith("TUNED 8x32x4096x128 float16 causal ")]
    assert long_causal and not any("/persistent" in line for line in long_causal), "long causal grids stay per tile"
    assert "TUNED_SHORT 32x16x1024x128 float16 causal 128x128/2st/256thr/persistent: " in out
    assert any(config.blocks_per_sm == 2 for _, causal, config in timed if causal), "two per SM for short causal"
    assert any(config.persistent for _, causal, config in timed if not causal)


def test_bench_prints_the_numbers_behind_its_plot(monkeypatch, capsys, tmp_path):
    import json

    import fa_kernel.cli as cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Test GPU")
    monkeypatch.setattr(cli, "measure", lambda shape, repeats: {"fa_kernel": 110.0, "cudnn": 100.0, "flash": 50.0})
    point = ("1x16x512x64 float16", {"fa_kernel": 90.0, "cudnn": 100.0})
    monkeypatch.setattr(cli, "_plot", lambda path, dtype, repeats, console: [point])
    plot = str(tmp_path / "plot.png")
    assert main(["bench", "--markdown", "--plot", plot]) == 0
    out = capsys.readouterr().out
    assert f"the points of {plot}" in out and "| 1x16x512x64 float16 | 90 | 100 | - | 0.90x |" in out
    assert "| 8x32x4096x128 float16 | 110 | 100 | 50 | 1.10x |" in out
    assert main(["bench", "--json", "--plot", plot]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["plot"][0]["shape"] == point[0] and record["plot"][0]["ratio_to_cudnn"] == pytest.approx(0.9)
