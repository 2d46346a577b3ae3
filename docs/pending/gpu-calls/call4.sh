# The generated mutants on the GPU: the backward's (triage made on the CPU into .gpu/; docs/pending/README.md gives its counts)
# within the call's time, recorded; a later call goes on from the record.
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
timeout 560 python3 -u -m tools.mutants --target backward --generated --triage-cache .gpu/triage_backward.json \
  --record tools/records/generated_backward.jsonl --deadline 540 > $OUT/mutants_backward.log 2>&1
echo "mutants rc=$? $((SECONDS-t0)) s"; tail -15 $OUT/mutants_backward.log; cp tools/records/generated_backward.jsonl $OUT/ 2>/dev/null
