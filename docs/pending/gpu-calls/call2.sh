# The whole GPU suite, timed per test, with the time to finish (session 20: 969 passed in 446 s
# on an H100, compiling 109 kernels beyond tools.precompile's; the tests session 20 added compile
# some 30 more, so it may near the call's limit: split it with -k then), and the kernels it
# compiled beyond .gpu/kernels.tar.xz's, packed into $OUT/suite_kernels.tar.xz: merge them into
# that archive next time (prelude.sh).
set -u
source "$(dirname "$0")/prelude.sh"
t0=$SECONDS
touch /tmp/before_suite
timeout 580 python3 -m nox --no-venv -s gpu -- --durations 40 --timeout 300 > $OUT/nox_gpu.log 2>&1; echo "nox gpu rc=$? $((SECONDS-t0)) s"
grep -E "passed|failed|FAILED" $OUT/nox_gpu.log | tail -5; grep -A42 "slowest 40" $OUT/nox_gpu.log | head -44
cd ~/.tilelang && find cache -newer /tmp/before_suite -type f | tar -cf - -T - | xz -T16 -1 > $OUT/suite_kernels.tar.xz; ls -la $OUT/suite_kernels.tar.xz
