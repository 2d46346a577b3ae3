#!/usr/bin/env bash
# Registers, spills and serialised wgmma (C7512) of a generated kernel, no GPU needed:
#   python -c "...; open('k.cu','w').write(compiled.get_kernel_source())"; tools/ptxas_report.sh k.cu
# sm_90a by -gencode (setmaxnreg and wgmma need the 'a' target); TileLang's headers from its package.
set -euo pipefail
TL=$(python -c "import os, tilelang; print(os.path.dirname(tilelang.__file__))")
nvcc -gencode arch=compute_90a,code=sm_90a -std=c++17 -O3 --use_fast_math -Xptxas -v -c "$1" -o /dev/null \
  -I"$TL/src" -I"$TL/3rdparty/cutlass/include" -I"$TL/3rdparty/tvm/include" -I"$TL/3rdparty/tvm/ffi/include" \
  -DENABLE_BF16 -w 2>&1 | grep -E "registers|spill|C7512|error"
