set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
timeout 150 python -m tools.precompile --gradients > $OUT/precompile.log 2>&1; echo "precompile rc=$? $((SECONDS-t0)) s"
timeout 210 python -u -m perf.gradient_splits --paths atomic fixed_order --splits 1 --rounds 2 --repeats 5 --shapes \
  8x12/2x2048x128c 8x16/2x2048x128c 8x28/4x2048x128c 8x40/8x2048x128c 8x48/4x2048x128c 8x56/8x2048x128c \
  8x64/8x2048x128c 8x128/8x2048x128c 8x32/8x2048x128c 8x24/8x2048x128c \
  2x12/2x8192x128c 2x16/2x8192x128c 2x28/4x8192x128c 2x40/8x8192x128c 2x48/4x8192x128c 2x64/8x8192x128c 2x128/8x8192x128c \
  1x16/2x2048x32768x128c 1x48/4x2048x32768x128c 1x128/8x2048x32768x128c > $OUT/splits.md 2>&1
echo "splits rc=$? $((SECONDS-t0)) s"
# The gradient GPU files with the fixed-order routing (docs/pending/gradient-fixed-order-path.patch's src).
PYTHONPATH=$PWD/.gpu/patched/src:$PYTHONPATH FA_KERNEL_REQUIRE_GPU=1 FA_KERNEL_GPUS=1 HYPOTHESIS_PROFILE=gpu FA_KERNEL_GPU_MEMORY_FRACTION=0.9 \
  timeout $((500-SECONDS+t0)) python3 -m pytest -n 8 --dist worksteal -p no:cacheprovider -rf --tb=short -q -m gpu \
  tests/test_backward_kernel.py tests/test_variants_kernel.py -k "backward or split or heavy or gradient or autograd or lse or deterministic" > $OUT/grad_tests_patched.log 2>&1
echo "gradient files (patched) rc=$? $((SECONDS-t0)) s"; grep -E "passed|failed|FAILED|Error" $OUT/grad_tests_patched.log | tail -5
[ $((SECONDS-t0)) -lt 470 ] && timeout $((545-SECONDS+t0)) python -u -m perf.backward_ab --variants lockstep staggered --rounds 2 --repeats 5 > $OUT/ab.md 2>&1
echo "ab $((SECONDS-t0)) s"
tar -C ~/.tilelang -cf - cache | xz -T16 -1 > $OUT/kernels.tar.xz; ls -la $OUT/kernels.tar.xz
grep "^|" $OUT/splits.md; grep "^|\|within" $OUT/ab.md 2>/dev/null | tail -20
