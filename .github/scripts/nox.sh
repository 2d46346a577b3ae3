#!/usr/bin/env bash
# nox for the GPU jobs: `nox --no-venv` when FA_KERNEL_OFFLINE=true (the runner's preinstalled
# offline Python), plain `nox` otherwise; virtualenvs live in $FA_KERNEL_NOX_ENVDIR (setup-tools.sh).
set -euo pipefail

args=(--envdir "${FA_KERNEL_NOX_ENVDIR:-.nox}")
if [[ "${FA_KERNEL_OFFLINE:-false}" == "true" ]]; then
  args+=(--no-venv)
fi
exec nox "${args[@]}" "$@"
