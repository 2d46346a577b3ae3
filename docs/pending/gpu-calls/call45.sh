# call4 and call5 in one call, for a session with little device time left: the whole GPU suite
# (stopped at 330 s), then the fixed-order path's deeper-pipeline A/B in what remains.
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
timeout 330 python3 -m nox --no-venv -s gpu -- --durations 20 --timeout 300 > $OUT/nox_gpu.log 2>&1; echo "nox gpu rc=$? $((SECONDS-t0)) s"
grep -E "passed|failed|FAILED" $OUT/nox_gpu.log | tail -8
timeout $((570-SECONDS+t0)) python -u -m perf.backward_ab --variants no_dq no_dq_three_stages --rounds 2 --repeats 5 > $OUT/ab_no_dq.md 2>&1
echo "ab no_dq rc=$? $((SECONDS-t0)) s"; grep "^|\|within\|FAILED" $OUT/ab_no_dq.md
