# The fixed-order routing as shipped (configs.gradient_plan): the gradient GPU files, then the
# model grid's head_dim 128 and 256 backward at 512 and 2k against cuDNN (the default column routed).
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
FA_KERNEL_REQUIRE_GPU=1 FA_KERNEL_GPUS=1 HYPOTHESIS_PROFILE=gpu FA_KERNEL_GPU_MEMORY_FRACTION=0.9 \
  timeout 240 python3 -m pytest -n 8 --dist worksteal -p no:cacheprovider -rf --tb=short -q -m gpu \
  tests/test_backward_kernel.py tests/test_variants_kernel.py -k "backward or split or heavy or gradient or autograd or lse or deterministic" > $OUT/grad_tests.log 2>&1
echo "gradient files rc=$? $((SECONDS-t0)) s"; grep -E "passed|failed|FAILED|Error" $OUT/grad_tests.log | tail -5
timeout $((560-SECONDS+t0)) python3 -u -m fa_kernel bench --grid models --backward --dtype bf16 --head-dim 128 256 \
  --seqlen-q 512 2048 --rounds 2 --repeats 5 --markdown > $OUT/bench_routed.md 2>&1
echo "bench rc=$? $((SECONDS-t0)) s"; grep "^|" $OUT/bench_routed.md
