"""The asv suite imports and validates on any machine (every benchmark skips without a GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_asv_check_passes():
    for config in ("asv.conf.json", "asv.offline.conf.json"):
        result = subprocess.run(
            [sys.executable, "-m", "asv", "--config", config, "check", "-E", f"existing:{sys.executable}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0 and "No problems found" in result.stdout, result.stdout + result.stderr
