#!/usr/bin/env bash
# asv as `nox -s bench` runs it, for workflow steps that call asv themselves (asv compare, asv run NEW).
#
# Online: asv.conf.json, with the asv that setup-tools.sh installed.
# Offline (FA_KERNEL_OFFLINE=true): asv.offline.conf.json with this Python's asv, PIP_NO_INDEX=1 and
# ASV_PYTHONPATH set to this Python's PYTHONPATH entries and site-packages, as the noxfile's
# _runner_site() does for `nox --no-venv -s bench` (keep the two in step).
# Subcommands that take --machine should get --machine "$FA_KERNEL_ASV_MACHINE" (default gpu-runner).
set -euo pipefail

if [[ "${FA_KERNEL_OFFLINE:-false}" != "true" ]]; then
  exec asv "$@"
fi

ASV_PYTHONPATH="$(
  python3 - << 'PY'
import os
import site
from pathlib import Path

root = Path.cwd().resolve()
entries = [*os.environ.get("PYTHONPATH", "").split(os.pathsep), *site.getsitepackages()]
paths = [Path(entry) for entry in dict.fromkeys(entries) if entry]
print(os.pathsep.join(str(p) for p in paths if p.is_dir() and root not in p.resolve().parents))
PY
)"
export ASV_PYTHONPATH PIP_NO_INDEX=1
exec python3 -m asv --config asv.offline.conf.json "$@"
