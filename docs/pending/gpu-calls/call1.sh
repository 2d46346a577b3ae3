# The gradient as routed at ea3f70c (configs.FIXED_ORDER_FASTER's regions; head_dim 256's fixed-order
# kernels re-tiled): the gradient GPU files, then the model grid's backward against cuDNN at every
# head_dim over 512, 2k and 8k (issue 53's line is every d64 and d128 shape from 1k keys).
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
FA_KERNEL_REQUIRE_GPU=1 FA_KERNEL_GPUS=1 HYPOTHESIS_PROFILE=gpu FA_KERNEL_GPU_MEMORY_FRACTION=0.9 \
  timeout 200 python3 -m pytest -n 8 --dist worksteal -p no:cacheprovider -rf --tb=short -q -m gpu \
  tests/test_backward_kernel.py tests/test_variants_kernel.py -k "backward or split or heavy or gradient or autograd or lse or deterministic or routes" > $OUT/grad_tests.log 2>&1
echo "gradient files rc=$? $((SECONDS-t0)) s"; grep -E "passed|failed|FAILED|Error" $OUT/grad_tests.log | tail -5
# One bench a head_dim, so that a timeout keeps the tables already printed (each prints at its end).
for dim in 128 64 256; do
  timeout $((570-SECONDS+t0)) python3 -u -m fa_kernel bench --grid models --backward --dtype bf16 --head-dim $dim \
    --seqlen-q 512 2048 8192 --rounds 2 --repeats 5 --markdown > $OUT/bench_routed_$dim.md 2>&1
  echo "bench d$dim rc=$? $((SECONDS-t0)) s"; grep "^|" $OUT/bench_routed_$dim.md
done
