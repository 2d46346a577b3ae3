# Sourced first by each call of this folder, run from the repository root on the GPU machine
# (`bash docs/pending/gpu-calls/call2.sh`, carrying .gpu/). .gpu/ is made here (git-ignored):
#   mkdir -p .gpu && cp ../shared/gpu/site.tar.xz ../shared/gpu/env.sh .gpu/
#   optional, to spare the GPU's compiles (docs/ci.md): .gpu/kernels.tar.xz (the suite's builds,
#   `TILELANG_CACHE_DIR=/tmp/k/cache python -m tools.precompile --arch sm_90a --sm-count 132`, then
#   `tar -C /tmp/k -cf - cache | xz -9e > .gpu/kernels.tar.xz`; session 20's also holds the 109
#   kernels the GPU suite compiled beyond those, call2.sh's suite_kernels.tar.xz unpacked into
#   /tmp/k/cache too: 14 MB in all at -9e) and .gpu/abcache.tar.xz (the A/Bs' builds:
#   `TILELANG_CACHE_DIR=/tmp/ab/cache python -m perf.backward_ab --compile-only sm_90a --head-dims 64 128
#   --variants no_dq kv_pairs`, the same with `--dq --variants keys_64 keys_64_three_stages`, then
#   `tar -C /tmp/ab -cf - cache | xz -9e > .gpu/abcache.tar.xz`). call4.sh needs
#   .gpu/triage_backward.json (`python -m tools.mutants --target backward --generated --triage-only
#   --triage-cache .gpu/triage_backward.json`, about 40 minutes on 2 cores). All of .gpu/ under 64 MiB.
# It sources the bundle's TileLang/asv/nox, puts this tree's package first, and unpacks those archives.
source .gpu/env.sh
export PYTHONPATH=$PWD/src:$PWD:$PYTHONPATH
export OMP_NUM_THREADS=2
if [ ! -d ~/.tilelang/cache/0.1.15 ]; then
  mkdir -p ~/.tilelang
  [ -f .gpu/kernels.tar.xz ] && tar -C ~/.tilelang -xJf .gpu/kernels.tar.xz
  [ -f .gpu/abcache.tar.xz ] && tar -C ~/.tilelang -xJf .gpu/abcache.tar.xz
fi
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
