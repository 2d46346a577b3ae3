# dQ's bulk adds issued by a warp of their own (`backward_program(dq_writer=True)`,
# backward_writer.py, on TileLang's typed warp-specialisation schedule), FlashAttention-3's
# dQ writer, against the shipped kernel, whose MMA warpgroups' elected thread issues each add;
# then the same adds in a fixed order, each waiting for its turn in the writer warp
# (dq_writer_ordered: FlashAttention-3's deterministic mode, issue 53's 0.9x determinism line),
# and with each K/V tile's walk from a query tile of its own without causal
# (dq_writer_ordered_shifted: no chain of waits on one tile).
# Prepared on the CPU (session 21): each lowers and compiles for sm_90a at head_dim 64 and 128,
# causal and not; 168 registers (a few bytes spilled in the 24-register warpgroup at d64 ordered);
# codegen rules clean (tests/test_codegen.py::test_the_dq_writer_build_hands_ds_and_dq_over_in_order).
# Never run on a GPU: each variant is first judged alone, in a process of its own under a timeout
# (a wrong mbarrier protocol would hang; a turn never passed ends its wait in seconds with a wrong
# dQ); the ordered ones bitwise equal over runs too. Those that pass are timed together.
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
passed=()
for variant in dq_writer dq_writer_ordered dq_writer_ordered_shifted; do
  timeout 100 python -u -m perf.backward_ab --check-only --variants "$variant" > $OUT/check_$variant.txt 2>&1
  rc=$?; echo "check $variant rc=$rc $((SECONDS-t0)) s"; grep "FAILED\|within\|Error" $OUT/check_$variant.txt | head -5
  [ $rc -eq 0 ] && passed+=("$variant")
done
if [ ${#passed[@]} -gt 0 ]; then
  timeout $((560-SECONDS+t0)) python -u -m perf.backward_ab --variants "${passed[@]}" --rounds 2 --repeats 5 \
    > $OUT/ab_dq_writer.md 2>&1
  echo "ab ${passed[*]} rc=$? $((SECONDS-t0)) s"; grep "^|" $OUT/ab_dq_writer.md | head -40
fi
