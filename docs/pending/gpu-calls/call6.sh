# The rows not measured lately: the backward at the model grid's 32k (head_dim 128 and 256), and
# the small causal rows of session 18's bench again with more rounds (two rounds read 141 and 195
# for one plan at 32x12/2x512x128 causal: host-sensitive shapes, a median of two is their mean).
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
for dim in 128 256; do
  timeout $((280-SECONDS+t0)) python3 -u -m fa_kernel bench --grid models --backward --dtype bf16 --head-dim $dim \
    --seqlen-q 32768 --rounds 2 --repeats 5 --markdown > $OUT/bench_32k_$dim.md 2>&1
  echo "bench 32k d$dim rc=$? $((SECONDS-t0)) s"; grep "^|" $OUT/bench_32k_$dim.md
done
timeout $((560-SECONDS+t0)) python3 -u -m fa_kernel bench --grid models --backward --dtype bf16 --head-dim 64 128 \
  --seqlen-q 512 --rounds 5 --repeats 10 --markdown > $OUT/bench_512.md 2>&1
echo "bench 512 rc=$? $((SECONDS-t0)) s"; grep "^|" $OUT/bench_512.md
