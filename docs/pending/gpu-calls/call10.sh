# dQ's bulk adds issued by a warp of their own (`backward_program(dq_writer=True)`,
# backward_writer.py, on TileLang's typed warp-specialisation schedule), FlashAttention-3's
# dQ writer, against the shipped kernel, whose MMA warpgroups' elected thread issues each add.
# Prepared on the CPU (session 21): lowers for sm_90a at head_dim 64 and 128, causal (heavy first)
# and not; 168 registers, no spills, no serialised wgmma; codegen rules clean
# (tests/test_codegen.py::test_the_dq_writer_build_hands_ds_and_dq_over_in_order). Never run on a
# GPU: the A/B judges it on its check shapes first (a wrong mbarrier protocol would hang: the
# timeout bounds it) and drops it from the timing if outside the bound. dq_writer_ordered: the
# same adds in a fixed order, each waiting for its turn in the writer warp (FlashAttention-3's
# deterministic mode; judged bitwise equal over runs too): issue 53's 0.9x determinism line.
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
timeout 420 python -u -m perf.backward_ab --variants dq_writer dq_writer_ordered --rounds 2 --repeats 5 > $OUT/ab_dq_writer.md 2>&1
echo "ab dq_writer rc=$? $((SECONDS-t0)) s"; grep "^|\|within\|FAILED\|Error\|error" $OUT/ab_dq_writer.md | head -40
# Then the model grid's MHA rows at 2k and d128 at 8k end to end, where the backward trails cuDNN
# most (the A/B times the main kernel alone; this is the shipped gradient, for the baseline).
timeout $((570-SECONDS+t0)) python -u -m fa_kernel bench --backward --dtype bf16 --rounds 2 --repeats 10 \
  --head-dim 128 > $OUT/bench_backward.md 2>&1
echo "bench rc=$? $((SECONDS-t0)) s"; grep "^|" $OUT/bench_backward.md | head -20
