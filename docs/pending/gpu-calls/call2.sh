# racecheck's last two split-KV cases, and the fixed-order path's cases (every head_dim) under all
# three tools; then the atomic split model's refit over causal GQA at 8k and 32k (its two wrong
# picks of session 16), and small grids under a right edge, where the fixed-order path keeps the
# group whole (configs.gradient_plan), unmeasured against its splits below a wave of blocks.
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 compute-sanitizer --tool=racecheck --error-exitcode=1 --target-processes=all \
  python3 -m tests.sanitize_cases --kernel split-KV > $OUT/race_split.log 2>&1 &
# The fixed-order path at every head_dim, on its own tiles since session 17 (DK_DV_TILES, DQ_TILES).
for tool in memcheck racecheck synccheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 compute-sanitizer --tool=$tool --error-exitcode=1 --target-processes=all \
    python3 -m tests.sanitize_cases --kernel "gradients deterministic" > $OUT/fixed_order_$tool.log 2>&1 &
done
wait
echo "racecheck split-KV: $(grep -c ': ok' $OUT/race_split.log) ok; $(tail -1 $OUT/race_split.log)"
for tool in memcheck racecheck synccheck; do echo "$tool fixed-order: $(grep -c ': ok' $OUT/fixed_order_$tool.log) ok; $(tail -1 $OUT/fixed_order_$tool.log)"; done
echo "sanitize $((SECONDS-t0)) s"
timeout $((540-SECONDS+t0)) python -u -m perf.gradient_splits --paths atomic fixed_order --splits 1 2 4 --rounds 2 --repeats 5 --shapes \
  2x12/2x8192x128c 2x16/2x8192x128c 2x28/4x8192x128c 2x48/4x8192x128c 2x128/8x8192x128c 1x16/2x2048x32768x128c \
  1x48/4x2048x32768x128c 1x128/8x2048x32768x128c 2x71/1x8192x64c 1x8/1x1024x128c 1x16/2x2048x128c 1x16/2x1024x256c > $OUT/splits.md 2>&1
echo "splits rc=$? $((SECONDS-t0)) s"; grep "^|" $OUT/splits.md; tail -3 $OUT/splits.md
