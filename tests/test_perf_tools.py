"""perf/'s patched builds of the kernel still apply to kernel.py (no GPU needed).

perf/variants.py builds its leave-one-out diagnostics and levers by replacing statements of
kernel.py's text; an edit of kernel.py that moves one of those statements must fail here, not
on the GPU machine in the middle of a sweep.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.compile
def test_every_patched_variant_applies_once_to_kernel_py():
    # A subprocess: perf/ is a folder of scripts beside the package, imported from the root.
    code = "from perf import variants\nfor name in variants.PATCHES:\n    variants._patched_kernel_module(name)\n"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_sweep_configs_name_the_turn_taking():
    code = (
        "from perf.sweep import parse_config\n"
        "assert parse_config('192x128/2/384').take_turns\n"
        "assert not parse_config('192x128/2/384/free').take_turns\n"
        "assert str(parse_config('192x128/2/384/free')) == '192x128/2st/384thr/free'\n"
        "assert parse_config('192x128/2/384/free/persistent').persistent\n"
        "assert str(parse_config('128x176/2/256/persistent')) == '128x176/2st/256thr/persistent'\n"
        "assert parse_config('128x176/2st/256thr/persistent/overlap').overlap_epilogue\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
