# Sourced first by each call of this folder, run from the repository root on the GPU machine
# (`bash docs/pending/gpu-calls/call2.sh`, carrying .gpu/). .gpu/ is git-ignored: a new checkout
# makes it with `bash docs/pending/gpu-calls/make-gpu-dir.sh` (its parts and their times there):
# the bundle's TileLang, asv and nox (every call), .gpu/triage_backward.json (call4.sh), and,
# optional, .gpu/abcache.tar.xz (the A/Bs' builds) and .gpu/kernels.tar.xz (the suite's builds;
# session 20's also held the 109 kernels the GPU suite compiled beyond tools.precompile's, from
# call2.sh's suite_kernels.tar.xz: 14 MB in all at -9e). All of .gpu/ under 64 MiB.
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
