#!/usr/bin/env bash
# Prove the asv gate on an offline GPU machine (the H200), from a git bundle of this repo.
#
#   git bundle create .gpu/repo.bundle --all     # here, after committing; the tree travels without .git
#   bash benchmarks/prove_asv.sh [a] [b] [c]     # there (carry .gpu), from the tree's root: the experiments
#                                                # named, in that order; all three by default
#   bash benchmarks/prove_asv.sh noise [REGEX]   # there: run-to-run noise, to set ASV_FACTOR in noxfile.py
#
# It clones the bundle to /tmp/repo ($PROVE_ASV_CLONE), commits sed edits on top of main, and runs the CI gate,
# `nox --no-venv -s bench -- main BRANCH REGEX`, once per branch:
#   (a) prove-comment  a comment line in kernel.py                    -> exit 0
#   (b) prove-slow     non-causal cases get the fallback tile config  -> exit 1, naming non-causal perf.*
#   (c) prove-acc      the causal mask also hides the diagonal key    -> exit 1, naming causal accuracy.*
# To stay near 8 minutes of GPU time, REGEX keeps each run small: perf.* is MHA at seq_len
# 4096, head_dim 128, bf16, causal and not; accuracy.* is head_dim 128, bf16, causal and not,
# at both key counts. (a) runs both, (b) perf.* alone, (c) accuracy.* alone.
# prove-comment's code is main's, so its ratios are run-to-run noise (two builds, two
# processes each); `noise` mode measures that over a wider selection, by default MHA at
# seq_len 4096, GQA and Prefill at 4096 (about 5 minutes); pass another REGEX for the rest.
# Logs go to $OUT (or /tmp/prove-asv); summary.txt says PASS or FAIL per experiment.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${OUT:-/tmp/prove-asv}
mkdir -p "$out"
# shellcheck source=/dev/null
source "$root/.gpu/env.sh" || exit 1  # TileLang, asv and nox on PYTHONPATH
# `python` must be the runner's Python, the one holding torch (nox sessions call `python`).
PATH="$(dirname "$(python3 -c 'import sys; print(sys.executable)')"):$PATH"
export FA_KERNEL_ASV_MACHINE=h200
export GIT_AUTHOR_NAME=prove GIT_AUTHOR_EMAIL=prove@localhost GIT_COMMITTER_NAME=prove GIT_COMMITTER_EMAIL=prove@localhost

repo=${PROVE_ASV_CLONE:-/tmp/repo}  # where the bundle is cloned (one per concurrent run)
rm -rf "$repo" && git clone -q "$root/.gpu/repo.bundle" "$repo" && cd "$repo" || exit 1
git checkout -q -B main origin/main || exit 1

branch() {  # branch NAME FILE SED-SCRIPT: commit one edit on top of main
    git checkout -q -B "$1" main && sed -i "$3" "$2"
    if git diff --quiet; then
        echo "prove_asv.sh: sed changed nothing in $2 for $1; update the edit" | tee -a "$out/summary.txt"
        exit 2
    fi
    git commit -qam "$1: $3"
}

gate() {  # gate BRANCH REGEX: the CI gate main -> BRANCH; prints its exit code
    local start=$SECONDS
    python3 -m nox --no-venv -s bench -- main "$1" "$2" >"$out/$1.log" 2>&1
    local rc=$?
    echo "$1: exit $rc after $((SECONDS - start)) s" >&2
    echo "$rc"
}

flagged() {  # flagged BRANCH: the benchmarks the gate marked worse (+) or newly failing (!)
    grep -E '^\| [+!] ' "$out/$1.log" | tr -s ' ' | sort -u
}

noise() {  # noise BRANCH: every ratio main -> BRANCH, and the largest factor among perf.*
    python3 -m asv --config asv.offline.conf.json compare --machine "$FA_KERNEL_ASV_MACHINE" main "$1" >"$out/noise.txt"
    awk -F'|' '$6 ~ /perf\./ { r = $5; gsub(/[ ~]/, "", r); r += 0; if (r > 0) { f = r > 1 ? r : 1 / r; if (f > max) { max = f; at = $6 } } }
        END { if (!max) { print "noise: no perf.* ratio (all skipped or failed?)"; exit }
              printf "noise: largest slowdown-or-speedup factor between identical builds = %.3f at%s\n", max, at
              m = 1 + 2 * (max - 1); if (m < 1.05) m = 1.05
              printf "noise: ASV_FACTOR should sit well above it, e.g. %.2f (1 + twice the excess, at least 1.05)\n", m }' "$out/noise.txt"
}

verdict() {  # verdict NAME OK-CONDITION-TEXT TEST...
    local name=$1 want=$2
    shift 2
    if "$@"; then echo "PASS $name ($want)"; else echo "FAIL $name ($want)"; fi
}

{
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
    git log --oneline -1 main
} >"$out/summary.txt" 2>&1

branch prove-comment src/fa_kernel/kernel.py '1i # A comment-only change: the gate must stay green.'

if [ "${1:-}" = noise ]; then
    git checkout -q main
    rc=$(gate prove-comment "${2:-track_(ms|vs_cudnn)\((4096, |False|True)}")
    { echo "noise run: exit $rc (0 expected)"; noise prove-comment; } | tee -a "$out/summary.txt"
    exit 0
fi

branch prove-slow src/fa_kernel/configs.py 's/return TUNED.get(\(.*\))$/return FALLBACK if not causal else TUNED.get(\1)/'
branch prove-acc src/fa_kernel/kernel.py 's/kv_start + j > q_start + i + diagonal_offset/kv_start + j >= q_start + i + diagonal_offset/'
git checkout -q main

perf="MHA\.track_\w+\(4096, 128, \w+, 'bfloat16'\)"
acc="Accuracy\.track_\w+\(128, \w+, 'bfloat16', \d+\)"
experiments=("$@")
[ $# -eq 0 ] && experiments=(a b c)
{
    for experiment in "${experiments[@]}"; do
        case $experiment in
            a)
                rc_a=$(gate prove-comment "$perf|$acc")
                verdict "(a) comment-only" "exit 0" test "$rc_a" = 0
                flagged prove-comment
                noise prove-comment
                ;;
            b)
                rc_b=$(gate prove-slow "$perf")
                verdict "(b) slowed" "exit 1, flags perf.* with causal False only" \
                    bash -c "[ $rc_b = 1 ] && grep -qE '^\| [+!] .*perf\..*False' '$out/prove-slow.log' && ! grep -qE '^\| [+!] .*True' '$out/prove-slow.log'"
                flagged prove-slow
                ;;
            c)
                rc_c=$(gate prove-acc "$acc")
                verdict "(c) accuracy" "exit 1, flags accuracy.* with causal True only" \
                    bash -c "[ $rc_c = 1 ] && grep -qE '^\| [+!] .*accuracy\..*True' '$out/prove-acc.log' && ! grep -qE '^\| [+!] .*False' '$out/prove-acc.log'"
                flagged prove-acc
                ;;
            *) echo "prove_asv.sh: unknown experiment '$experiment' (a, b, c or noise)" ;;
        esac
    done
    echo "total: $SECONDS s"
} 2>&1 | tee -a "$out/summary.txt"
