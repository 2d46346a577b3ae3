# The fixed-order path's kernels at head_dim 64 and 128 with deeper pipelines (prepared on the CPU:
# 168 registers, no spills, codegen rules clean; builds in .gpu/abcache.tar.xz): the dK/dV kernel
# without dQ on three stages, and the dQ kernel on 64 keys a step with three K/V stages.
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
timeout 300 python -u -m perf.backward_ab --variants no_dq no_dq_three_stages --rounds 2 --repeats 5 > $OUT/ab_no_dq.md 2>&1
echo "ab no_dq rc=$? $((SECONDS-t0)) s"; grep "^|\|within\|FAILED" $OUT/ab_no_dq.md
timeout $((540-SECONDS+t0)) python -u -m perf.backward_ab --dq --variants keys_64 keys_64_three_stages --rounds 2 --repeats 5 > $OUT/ab_dq.md 2>&1
echo "ab dq rc=$? $((SECONDS-t0)) s"; grep "^|\|within\|FAILED" $OUT/ab_dq.md
