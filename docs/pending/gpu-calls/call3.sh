# The atomic split model's refit over causal GQA at 8k and 32k (its two wrong picks of session
# 16), and small grids under a right edge, where the fixed-order path keeps the group whole
# (configs.gradient_plan), unmeasured against its splits below a wave of blocks.
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
timeout 560 python -u -m perf.gradient_splits --paths atomic fixed_order --splits 1 2 4 --rounds 2 --repeats 5 --shapes \
  2x12/2x8192x128c 2x16/2x8192x128c 2x28/4x8192x128c 2x48/4x8192x128c 2x128/8x8192x128c 1x16/2x2048x32768x128c \
  1x48/4x2048x32768x128c 1x128/8x2048x32768x128c 2x71/1x8192x64c 1x8/1x1024x128c 1x16/2x2048x128c 1x16/2x1024x256c > $OUT/splits.md 2>&1
echo "splits rc=$? $((SECONDS-t0)) s"; grep "^|" $OUT/splits.md; tail -3 $OUT/splits.md
