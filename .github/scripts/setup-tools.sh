#!/usr/bin/env bash
# Put nox and asv on PATH for the rest of a GPU job on a self-hosted runner.
#
# Online (default): a fresh venv under $RUNNER_TEMP gets nox and the asv that pyproject.toml pins.
# Offline (FA_KERNEL_OFFLINE=true): nothing is installed; the runner's own Python must already hold
# nox, asv, torch, TileLang and the test tools (see `nox -s wheelhouse`), and this only checks that.
# Either way it points nox's virtualenvs at a folder that outlives the job ($FA_KERNEL_NOX_ENVDIR),
# so a checkout's clean does not throw away a torch install every run.
set -euo pipefail

: "${GITHUB_ENV:?run this inside a GitHub Actions job}"
: "${GITHUB_PATH:?run this inside a GitHub Actions job}"
: "${RUNNER_TEMP:?run this inside a GitHub Actions job}"

echo "FA_KERNEL_NOX_ENVDIR=${FA_KERNEL_NOX_ENVDIR:-${RUNNER_TOOL_CACHE:-$RUNNER_TEMP}/fa-kernel-nox}" >> "$GITHUB_ENV"

if [[ "${FA_KERNEL_OFFLINE:-false}" == "true" ]]; then
  if ! command -v nox > /dev/null || ! python3 -c 'import asv, nox, tilelang, torch'; then
    echo "::error::offline mode needs nox on PATH and asv, nox, tilelang, torch in python3: see nox -s wheelhouse"
    exit 1
  fi
  python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'
  exit 0
fi

asv_pin="$(grep -o '"asv==[^"]*"' pyproject.toml | tr -d '"' || true)"
tools="$RUNNER_TEMP/fa-kernel-tools"
python3 -m venv "$tools"
"$tools/bin/python" -m pip install --quiet --upgrade pip
"$tools/bin/python" -m pip install --quiet nox "${asv_pin:-asv}"
echo "$tools/bin" >> "$GITHUB_PATH"
"$tools/bin/nox" --version
"$tools/bin/asv" --version
