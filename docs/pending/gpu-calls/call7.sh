# Why the backward trails where it does (session 18's bench): ncu on each kernel of one backward
# call, ours and cuDNN's, on short MHA walks (32x32x512x128: 0.90x, beside the GQA row that reads
# 1.16x on the same path), MHA at 2k (8x96 0.84x, 8x32 0.94x) and d128 at 8k (2x32 0.93x).
# The timed call is the last of four, inside an NVTX range that ncu alone profiles.
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
cat > /tmp/one_backward.py <<'PY'
import sys

import torch

from fa_kernel.workbench.bench import Shape, runners

batch, heads, heads_kv, seqlen, causal, name = sys.argv[1:7]
shape = Shape(int(batch), int(heads), int(seqlen), 128, causal == "causal", torch.bfloat16, int(heads_kv))
call = runners(shape, backward=True)[name]
for _ in range(3):
    call()
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("timed")
call()
torch.cuda.synchronize()
torch.cuda.nvtx.range_pop()
PY
# Each shape's kernels built (or loaded) first, outside ncu, the five at once.
for shape in "32 32 32 512 full" "32 32 8 512 full" "8 96 96 2048 full" "8 32 32 2048 causal" "2 32 32 8192 full"; do
  timeout 240 python3 /tmp/one_backward.py $shape fa_kernel > /dev/null 2>&1 &
done
wait; echo "built $((SECONDS-t0)) s"
SECTIONS="--section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section WarpStateStats"
for shape in "32 32 32 512 full" "32 32 8 512 full" "8 96 96 2048 full" "8 32 32 2048 causal" "2 32 32 8192 full"; do
  for name in "fa_kernel" "cudnn BSHD view"; do
    out=$OUT/ncu_$(echo $shape | tr ' ' _)_$(echo $name | tr ' ' _).csv
    timeout $((570-SECONDS+t0)) ncu --nvtx --nvtx-include "timed/" $SECTIONS --csv --page details \
      python3 /tmp/one_backward.py $shape "$name" > $out 2> $out.err
    echo "== $shape $name rc=$? $((SECONDS-t0)) s"
    # A line a kernel: its name, time, SM and memory throughput, L2 hit rate, occupancy, registers.
    python3 - "$out" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 14]
if not rows:
    sys.exit(print("  no rows"))
header, data = rows[0], rows[1:]
col = {n: header.index(n) for n in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
wanted = ("Duration", "Compute (SM) Throughput", "Memory Throughput", "L2 Hit Rate", "DRAM Throughput",
          "Achieved Occupancy", "Registers Per Thread", "Grid Size", "Warp Cycles Per Issued Instruction")
kernels = {}
for r in data:
    if r[col["Metric Name"]] in wanted:
        kernels.setdefault((r[col["ID"]], r[col["Kernel Name"]][:60]), {})[r[col["Metric Name"]]] = r[col["Metric Value"]]
for (_, kernel), metrics in kernels.items():
    print("  " + kernel + ": " + ", ".join(f"{k} {metrics[k]}" for k in wanted if k in metrics))
PY
  done
done
