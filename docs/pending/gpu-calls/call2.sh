# The whole GPU suite, timed per test, with the time to finish (session 18: 966 of 967 passed,
# none failed, when its 300 s ran out on a warm H100), and the kernels it compiled beyond
# tools.precompile's, packed into $OUT/suite_kernels.tar.xz: unpack it beside
# .gpu/kernels.tar.xz's cache next time.
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
touch /tmp/before_suite
timeout 540 python3 -m nox --no-venv -s gpu -- --durations 40 --timeout 300 > $OUT/nox_gpu.log 2>&1; echo "nox gpu rc=$? $((SECONDS-t0)) s"
grep -E "passed|failed|FAILED" $OUT/nox_gpu.log | tail -5; grep -A42 "slowest 40" $OUT/nox_gpu.log | head -44
cd ~/.tilelang && find cache -newer /tmp/before_suite -type f | tar -cf - -T - | xz -T16 -1 > $OUT/suite_kernels.tar.xz; ls -la $OUT/suite_kernels.tar.xz
