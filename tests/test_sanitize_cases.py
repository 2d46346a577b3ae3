"""tests/sanitize_cases.py (`nox -s sanitize`): its shards split the cases without loss or
overlap, and every kernel family is among them (no GPU needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import sanitize_cases


def test_the_shards_hold_every_case_once():
    every = sanitize_cases.cases()
    for count in (1, 3, 5, len(every) + 2):
        shards = [sanitize_cases.shard(every, f"{index}/{count}") for index in range(count)]
        assert sorted(map(str, sum(shards, []))) == sorted(map(str, every))


def test_each_kernel_family_is_sanitized():
    kinds = {case.kernel for case in sanitize_cases.cases()}
    assert kinds == {
        *("forward", "long entry", "gradients", "gradients deterministic", "split-KV"),
        *("varlen", "varlen gradients", "varlen gradients deterministic", "paged"),
    }


def test_the_fixed_order_path_is_sanitized_at_every_head_dim():
    # Its tiles are each head_dim's own (configs.DK_DV_TILES, DQ_TILES).
    from fa_kernel.configs import DK_DV_TILES

    cases = sanitize_cases.cases()
    assert {case.shape[-1] for case in cases if case.kernel == "gradients deterministic"} == set(DK_DV_TILES)


@pytest.mark.parametrize("text", ["3/3", "-1/2", "1/0"])
def test_a_shard_out_of_range_is_refused(text):
    with pytest.raises(ValueError, match="--shard"):
        sanitize_cases.shard(sanitize_cases.cases(), text)


def test_the_cases_run_as_nox_runs_them_with_their_helpers_on_the_path():
    # `nox -s sanitize` runs `python -m tests.sanitize_cases` from the root, the package from src/
    # alone on PYTHONPATH: the cases' helpers (suite/) must import there. Run as a file, the
    # script had tests/ on its path instead, and every launch failed on `import suite`.
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    listed = subprocess.run(
        [sys.executable, "-m", "tests.sanitize_cases", "--list", "--kernel", "paged"],
        cwd=root, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert listed.returncode == 0 and listed.stdout.count("paged:") == 2, listed.stderr[-2000:]
    helpers = "import tests.sanitize_cases, suite.launch, suite.ragged"
    imported = subprocess.run([sys.executable, "-c", helpers], cwd=root, env=env, capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr[-2000:]
    assert '"-m", "tests.sanitize_cases"' in (root / "noxfile.py").read_text(), "nox -s sanitize runs the module"
