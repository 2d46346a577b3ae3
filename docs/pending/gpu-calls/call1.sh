# dQ's adds in a fixed order in the atomic kernel (backward_program(ordered_dq=True),
# FlashAttention-3's deterministic mode; ordered_dq_late: each turn passed a step after its add):
# the deterministic gradient in one kernel, against the shipped kernel whose adds arrive in any
# order. Issue 53's 0.9x line: the fixed-order path (dK/dV, then dQ recomputed) reads 0.76-0.93x
# the default. Prepared on the CPU: 168 registers, no spills or serialised wgmma at d64 and d128,
# codegen rules clean, shipped programs identical; builds in .gpu/abcache.tar.xz. The A/B judges
# each within the bound and bitwise equal over 5 more runs on its check shapes before timing (a
# wrong turn count would hang a block: the timeout ends it).
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
timeout 330 python -u -m perf.backward_ab --variants ordered_dq ordered_dq_late --rounds 2 --repeats 5 > $OUT/ab_ordered_dq.md 2>&1
echo "ab ordered_dq rc=$? $((SECONDS-t0)) s"; grep "^|\|within\|FAILED\|differs\|d64\|d128" $OUT/ab_ordered_dq.md | head -40
# Then issue 54's softcap cost: the odd polynomial's tanh (no MUFU operation for scores within
# the cap; kernel.forward_program's tanh="polynomial") beside the shipped division and tanh.approx,
# each judged first; its builds in .gpu/tanhcache.tar.xz.
FA_KERNEL_REQUIRE_GPU=1 timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_variants_kernel.py -k polynomial > $OUT/polynomial_test.txt 2>&1
echo "polynomial test rc=$? $((SECONDS-t0)) s"; tail -3 $OUT/polynomial_test.txt
timeout $((570-SECONDS+t0)) python3 -u -m perf.variants --tables tanh --rounds 2 --repeats 10 > $OUT/tanh.md 2>&1
echo "tanh table rc=$? $((SECONDS-t0)) s"; grep "^|\|Error\|FAILED" $OUT/tanh.md | head -30
