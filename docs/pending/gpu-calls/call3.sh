# The whole GPU suite on the tree as it travels; then head_dim 256's backward against cuDNN.
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
timeout 430 python3 -m nox --no-venv -s gpu > $OUT/nox_gpu.log 2>&1; echo "nox gpu rc=$? $((SECONDS-t0)) s"; grep -E "passed|failed" $OUT/nox_gpu.log | tail -3
timeout $((560-SECONDS+t0)) python3 -u -m fa_kernel bench --grid models --backward --dtype bf16 --head-dim 256 --rounds 2 --repeats 5 --markdown > $OUT/bench_d256.md 2>&1
echo "bench d256 rc=$? $((SECONDS-t0)) s"; grep "^|" $OUT/bench_d256.md | head -40
