#!/usr/bin/env bash
# Append the benchmark tables of a GPU job to $GITHUB_STEP_SUMMARY:
# `fa-kernel bench --markdown`, then `asv compare --split BASE HEAD` in a fenced block.
# Usage: bench-summary.sh BASE_REF HEAD_REF
set -uo pipefail

base="$(git rev-parse "$1")"
head="$(git rev-parse "$2")"
here="$(dirname "$0")"
summary="${GITHUB_STEP_SUMMARY:-/dev/stdout}"
machine="${FA_KERNEL_ASV_MACHINE:-gpu-runner}"
status=0

{
  echo "## Benchmarks"
  echo
  if ! "$here/in-session.sh" gpu python -m fa_kernel bench --markdown; then
    echo "_fa-kernel bench --markdown failed: see the job log._"
    status=1
  fi
  echo
  echo "### asv compare ${base:0:10} → ${head:0:10} (machine $machine)"
  echo
  echo '```'
  # --factor: ASV_FACTOR in noxfile.py
  if ! "$here/nox.sh" -s asv -- compare --split --factor 1.10 --machine "$machine" "$base" "$head"; then
    echo "asv compare failed: see the job log"
    status=1
  fi
  echo '```'
} >> "$summary"
exit "$status"
