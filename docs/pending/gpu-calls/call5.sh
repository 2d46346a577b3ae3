# head_dim 256's fixed-order kernels as shipped (DK_DV_TILES: two stages; DQ_TILES: 128 rows): its
# GPU tests, the whole fixed-order gradient against the atomic one (for FIXED_ORDER_FASTER's d256
# entry), and the model grid's d256 backward against cuDNN.
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
FA_KERNEL_REQUIRE_GPU=1 FA_KERNEL_GPUS=1 HYPOTHESIS_PROFILE=gpu FA_KERNEL_GPU_MEMORY_FRACTION=0.9 \
  timeout 200 python3 -m pytest -n 8 --dist worksteal -p no:cacheprovider -rf --tb=short -q -m gpu \
  tests/test_backward_kernel.py tests/test_variants_kernel.py tests/test_varlen.py -k 256 > $OUT/d256_tests.log 2>&1
echo "d256 tests rc=$? $((SECONDS-t0)) s"; grep -E "passed|failed|FAILED|Error" $OUT/d256_tests.log | tail -5
timeout 170 python -u -m perf.gradient_splits --paths atomic fixed_order --splits 1 --rounds 2 --repeats 5 --shapes \
  32x16/16x512x256 32x16/16x512x256c 8x16/16x2048x256 8x16/16x2048x256c 2x16/16x8192x256 2x16/16x8192x256c \
  32x8/4x512x256 8x16/8x2048x256c 8x16/8x2048x256 2x16/8x8192x256c > $OUT/splits_d256.md 2>&1
echo "splits rc=$? $((SECONDS-t0)) s"; grep "^|" $OUT/splits_d256.md
timeout $((540-SECONDS+t0)) python3 -u -m fa_kernel bench --grid models --backward --dtype bf16 --head-dim 256 \
  --seqlen-q 512 2048 --rounds 2 --repeats 5 --markdown > $OUT/bench_d256.md 2>&1
echo "bench rc=$? $((SECONDS-t0)) s"; grep "^|" $OUT/bench_d256.md
