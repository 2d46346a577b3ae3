# Builds no GPU test launched before session 20: the paged split-KV builds with a window, a
# softcap and sinks (test_paged's test_each_request_within_the_bound_with_the_variants) and at
# head_dim 256, and the atomic path's ragged gradients under each variant beyond d64 causal
# (test_varlen, forward and gradient). Their first run on the tree, then the paged one seen failing against a planted
# bug (the split kernel's softcap dropped, in a copy of src/ put first on the path).
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
export FA_KERNEL_REQUIRE_GPU=1 FA_KERNEL_GPUS=1 FA_KERNEL_GPU_MEMORY_FRACTION=0.9 HYPOTHESIS_PROFILE=gpu
timeout 300 python3 -m pytest -q -p no:cacheprovider -n 8 --dist worksteal -m gpu tests/test_paged.py \
  tests/test_varlen.py::test_each_sequences_gradients_within_the_bound_with_the_variants \
  tests/test_varlen.py::test_each_sequence_within_the_bound_with_the_variants -k "variants or 256" \
  > $OUT/paged_variants.txt 2>&1
echo "paged variants rc=$? (0 expected) $((SECONDS-t0)) s"; tail -3 $OUT/paged_variants.txt
rm -rf /tmp/planted && mkdir -p /tmp/planted && cp -r src /tmp/planted/
sed -i 's/return capped_score(score, softcap_log2) if variants.softcap else score/return score/' /tmp/planted/src/fa_kernel/decode.py
echo "planted: $(diff -r src /tmp/planted/src | grep -c '^>') line(s) changed"
PYTHONPATH=/tmp/planted/src:$PYTHONPATH timeout $((560-SECONDS+t0)) python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu \
  tests/test_paged.py -k variants > $OUT/paged_variants_planted.txt 2>&1
echo "planted rc=$? (1 expected) $((SECONDS-t0)) s"; grep -E "passed|failed" $OUT/paged_variants_planted.txt | tail -2
