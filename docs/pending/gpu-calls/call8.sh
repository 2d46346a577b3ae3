# The fixed-order dQ kernel on 64 keys a step, on two stages and on three (prepared on the CPU:
# 168 registers, no spills, codegen rules clean; builds in .gpu/abcache.tar.xz).
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
timeout 560 python -u -m perf.backward_ab --dq --variants keys_64 keys_64_three_stages --rounds 3 --repeats 5 > $OUT/ab_dq.md 2>&1
echo "ab dq rc=$? $((SECONDS-t0)) s"; grep "^|\|within\|FAILED" $OUT/ab_dq.md
