# Makes .gpu/ (git-ignored, so a new checkout starts without it), which every call of this folder
# carries to the GPU machine: `bash docs/pending/gpu-calls/make-gpu-dir.sh [PART...]` from the
# repository root, on the 2-core CPU box. PARTs, in the order a session wants them (default: all):
#   site     the bundle's TileLang, asv and nox (../shared/gpu), which every call needs: seconds
#   triage   .gpu/triage_backward.json, which call4.sh needs: about 45 minutes
#   triage-decode  .gpu/triage_decode.json, for the split-KV kernels' campaign after the
#            backward's (call4.sh's command with --target decode): about 20 minutes
#   ab       .gpu/abcache.tar.xz, call5.sh's A/B builds (optional: the GPU compiles them too)
#   kernels  .gpu/kernels.tar.xz, the suite's builds (optional, about an hour here; spares call2.sh's
#            compiles, which the GPU host does in about 2 minutes over 16 cores)
# Start it in the background at a session's start: the triage holds both cores for most of its time.
set -euo pipefail
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(site triage ab kernels triage-decode)
mkdir -p .gpu
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
for part in "${parts[@]}"; do
  start=$SECONDS
  case $part in
    site)
      cp ../shared/gpu/site.tar.xz ../shared/gpu/env.sh .gpu/ ;;
    triage)  # keyed by the mutated files' text: remake it after any edit of the gradient's files
      python -m tools.mutants --target backward --generated --triage-only \
        --triage-cache .gpu/triage_backward.json > .gpu/triage_backward.log 2>&1 ;;
    triage-decode)  # keyed by decode.py's text, as the backward's by its files'
      python -m tools.mutants --target decode --generated --triage-only \
        --triage-cache .gpu/triage_decode.json > .gpu/triage_decode.log 2>&1 ;;
    ab)
      rm -rf /tmp/ab && mkdir -p /tmp/ab
      TILELANG_CACHE_DIR=/tmp/ab/cache python -m perf.backward_ab --compile-only sm_90a --head-dims 64 128 \
        --variants no_dq kv_pairs dq_writer dq_writer_ordered dq_writer_ordered_shifted
      TILELANG_CACHE_DIR=/tmp/ab/cache python -m perf.backward_ab --compile-only sm_90a --head-dims 64 128 \
        --dq --variants keys_64 keys_64_three_stages
      tar -C /tmp/ab -cf - cache | xz -9e > .gpu/abcache.tar.xz ;;
    kernels)
      rm -rf /tmp/k && mkdir -p /tmp/k
      TILELANG_CACHE_DIR=/tmp/k/cache python -m tools.precompile --arch sm_90a --sm-count 132
      tar -C /tmp/k -cf - cache | xz -9e > .gpu/kernels.tar.xz ;;
    *)
      echo "make-gpu-dir: unknown part '$part' (expected site, triage, triage-decode, ab or kernels)" >&2; exit 2 ;;
  esac
  echo "make-gpu-dir: $part in $((SECONDS - start)) s"
done
du -sh .gpu  # the travelling tree must stay under 64 MiB
