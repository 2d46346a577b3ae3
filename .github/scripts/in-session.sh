#!/usr/bin/env bash
# Run a command in the environment a nox session used: `in-session.sh gpu python -m fa_kernel verify`.
#
# Online: with that session's virtualenv ($FA_KERNEL_NOX_ENVDIR/SESSION) first on PATH.
# Offline (FA_KERNEL_OFFLINE=true): with the runner's Python and src/ on PYTHONPATH, as `nox --no-venv` does.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 SESSION COMMAND [ARGS...]" >&2
  exit 2
fi
session="$1"
shift

if [[ "${FA_KERNEL_OFFLINE:-false}" == "true" ]]; then
  PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONPATH
else
  venv="${FA_KERNEL_NOX_ENVDIR:-.nox}/$session"
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "::error::no virtualenv for nox session '$session' at $venv: run that session first"
    exit 1
  fi
  PATH="$(cd "$venv/bin" && pwd):$PATH"
  export PATH VIRTUAL_ENV="$venv"
fi
exec "$@"
