# The tree as it travels (the fixed-order patch applied where call 1's table says so): every
# suite build, the gradient GPU files, the sanitizer over the gradient cases; packs the cache.
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
timeout 280 python -m tools.precompile > $OUT/precompile_all.log 2>&1; echo "precompile rc=$? $((SECONDS-t0)) s"; tail -2 $OUT/precompile_all.log
env FA_KERNEL_REQUIRE_GPU=1 FA_KERNEL_GPUS=1 HYPOTHESIS_PROFILE=gpu FA_KERNEL_GPU_MEMORY_FRACTION=0.9 \
  timeout 170 python3 -m pytest -n 8 --dist worksteal -p no:cacheprovider -rf --tb=short -q -m gpu \
  tests/test_backward_kernel.py tests/test_variants_kernel.py -k "backward or split or heavy or gradient or autograd or lse or deterministic" > $OUT/grad_tests.log 2>&1
echo "gradient files rc=$? $((SECONDS-t0)) s"; tail -4 $OUT/grad_tests.log
for tool in memcheck racecheck synccheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 100 compute-sanitizer --tool=$tool --error-exitcode=1 --target-processes=all \
    python3 -m tests.sanitize_cases --kernel gradients "gradients deterministic" > $OUT/sanitize_$tool.log 2>&1 &
done
wait; for tool in memcheck racecheck synccheck; do echo "$tool: $(tail -1 $OUT/sanitize_$tool.log)"; done
echo "sanitize $((SECONDS-t0)) s"
tar -C ~/.tilelang -cf - cache | xz -T16 -1 > $OUT/kernels.tar.xz; ls -la $OUT/kernels.tar.xz
