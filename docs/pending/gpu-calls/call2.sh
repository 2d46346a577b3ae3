# The sanitizer over the cases session 16 left (its memcheck reached 44 of 47, racecheck 12), then
# head_dim 256's no-dQ kernel on two stages, then the dK/dV kernel's remaining A/B variants.
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
for tool in memcheck racecheck synccheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 240 compute-sanitizer --tool=$tool --error-exitcode=1 --target-processes=all \
    python3 -m tests.sanitize_cases --kernel forward "long entry" split-KV varlen "varlen gradients" \
    "varlen gradients deterministic" paged > $OUT/sanitize_$tool.log 2>&1 &
done
wait; for tool in memcheck racecheck synccheck; do echo "$tool: $(grep -c ': ok' $OUT/sanitize_$tool.log) cases ok; $(tail -1 $OUT/sanitize_$tool.log)"; done
echo "sanitize $((SECONDS-t0)) s"
timeout 150 python -u -m perf.backward_ab --head-dims 256 --variants no_dq no_dq_two_stages --rounds 2 --repeats 5 > $OUT/ab_d256.md 2>&1
echo "ab d256 rc=$? $((SECONDS-t0)) s"; grep "^|\|within\|FAILED" $OUT/ab_d256.md
timeout 120 python -u -m perf.backward_ab --dq --head-dims 256 --variants two_stages rows_128 --rounds 2 --repeats 5 > $OUT/ab_dq256.md 2>&1
echo "ab dq d256 rc=$? $((SECONDS-t0)) s"; grep "^|\|within\|FAILED" $OUT/ab_dq256.md
timeout $((560-SECONDS+t0)) python -u -m perf.backward_ab --variants lockstep staggered three_stages --rounds 2 --repeats 5 > $OUT/ab.md 2>&1
echo "ab rc=$? $((SECONDS-t0)) s"; grep "^|\|within\|FAILED" $OUT/ab.md
