"""Running one mutant: its copy of the package, its tiers as processes (stopped on a time-out,
a deadline or silence), and what a failure means; and building the mutants' kernels ahead.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tools.equivalent_mutants import EQUIVALENT
from tools.mutants import PACKAGE, ROOT
from tools.mutants.tiers import BUILD_SECONDS, CHECK_TIERS, SUITE_WORKERS, first_tier_seconds, run_script, sweeps
from tools.mutants.triage import GENERATED_FILES, GPU_TARGETS, PROGRAM_BUILDERS

# Seconds of silence after which a sweep tier is stopped and counted as a hang (a kill): with 16
# mutants at once on one H200, a passing one-build tier took 24-44 s (2026-12-01), a kernel
# compile and well under a second of launches, printing as each test ends; silent for 120 s it
# is waiting on a barrier.
HANG_SECONDS = 120
# A killed tier whose processes are still there after this long is reported, not waited for.
KILL_SECONDS = 60


# The process groups of the tiers running now. Each runs in a session of its own (a time-out
# kills its compilers with it), so a signal to the runner does not reach them: it stops them.
RUNNING: set[int] = set()


def stop_running_tiers(signum, frame) -> None:
    for group in list(RUNNING):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    os._exit(128 + signum)  # the pool's threads would start the next mutants otherwise


def seconds_since(start: float) -> float:
    return time.perf_counter() - start


def _wait(process: subprocess.Popen, limit: float | None, silence: float | None) -> tuple[str, str, str | None]:
    """(stdout, stderr, why it was stopped) of a tier's `process`: None where it ended by itself,
    'limit' past `limit` seconds, 'silence' after `silence` seconds without a byte on either pipe,
    both with its whole process group killed, and 'stuck' where that group is still there
    KILL_SECONDS later."""
    received: dict[str, list[bytes]] = {"out": [], "err": []}
    last_output = [time.monotonic()]

    def read(stream, into: list[bytes]) -> None:
        while chunk := stream.read1(1 << 16):
            into.append(chunk)
            last_output[0] = time.monotonic()

    readers = [
        threading.Thread(target=read, args=(stream, received[name]), daemon=True)
        for name, stream in (("out", process.stdout), ("err", process.stderr))
    ]
    for reader in readers:
        reader.start()
    started, stopped = time.monotonic(), None
    while stopped is None:
        try:
            process.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if limit is not None and now - started > limit:
                stopped = "limit"
            elif silence is not None and now - last_output[0] > silence:
                stopped = "silence"
    if stopped is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        try:
            process.wait(timeout=KILL_SECONDS)
        except subprocess.TimeoutExpired:
            stopped = "stuck"
    for reader in readers:
        reader.join(timeout=5)
    text = [b"".join(received[name]).decode(errors="replace") for name in ("out", "err")]
    return text[0], text[1], stopped


def mutant_package(mutant, text: str, workdir: Path, cache: Path) -> dict[str, str]:
    """A copy of src/ in workdir/<mutant id> with `text` for the mutant's file and its other
    files' patches (Mutant.elsewhere), and the environment that imports it (FA_KERNEL_EXPECT_SRC,
    which the tools check) and builds its kernels into the TileLang cache `cache`."""
    src = workdir / mutant.id / "src"
    shutil.copytree(ROOT / "src", src)
    (src / "fa_kernel" / mutant.file).write_text(text)
    for file, other in mutant.other_sources().items():
        (src / "fa_kernel" / file).write_text(other)
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
        TILELANG_CACHE_DIR=str(cache),
        FA_KERNEL_EXPECT_SRC=str(src),
    )


def run_mutant(
    mutant,
    target: str,
    workdir: Path,
    tiers: list[tuple[str, list[str]]],
    timeout: float | None = None,
    gpu: int | None = None,
    seed_cache: Path | None = None,
    selected: bool = False,
    bitwise_seed: Path | None = None,
    stop_at: float | None = None,
    build_seconds: float = BUILD_SECONDS,
) -> tuple[str, str, float]:
    """('killed' | 'equivalent' | 'SURVIVED' | 'TIMEOUT' | 'ERROR', detail, seconds), running
    `tiers` in turn until one fails (the bitwise tier: until it passes; `bitwise_seed` holds the
    unmutated kernel's digests). `selected`: the tiers are tests the caller chose, run whole (no -x), and the
    detail lists every case that failed. A run past `timeout` seconds in all is stopped: a
    mutant that hangs the kernel is reported, not waited for. Before the whole suite or chosen tests, every
    kernel it needs is built over all cores (tools/precompile.py), as `nox -s gpu` does.
    `stop_at` (a time.perf_counter() value, --deadline): a mutant whose first compiling tier is not
    expected to end by then is not started, and one still running then is stopped; both are
    NOT RUN, which a record does not keep."""
    start = time.perf_counter()
    if not tiers:  # --smoke-only, for a mutant that changes no sweep build
        return "NOT RUN", "no tier left to run it (the suite judges it)", 0.0
    estimate = first_tier_seconds(tiers, build_seconds)
    if stop_at is not None and start + estimate > stop_at:
        return "NOT RUN", f"its first tier (about {estimate:.0f} s) would end past --deadline", 0.0
    try:
        text = mutant.mutated_source()
    except ValueError as error:
        return "ERROR", str(error), 0.0
    tree = workdir / mutant.id
    cache = tree / "tilelang-cache"
    env = mutant_package(mutant, text, workdir, cache)
    if seed_cache is not None and seed_cache.is_dir():
        # Hard links: the mutant's builds go into its own folder, the seed stays as it was.
        shutil.copytree(seed_cache, cache, copy_function=os.link)
    env.update(HYPOTHESIS_PROFILE="mutants", FA_KERNEL_REQUIRE_GPU="1" if target in GPU_TARGETS else "0")
    env["PYTHONUNBUFFERED"] = "1"  # each test's dot as it ends: the silence rule (_wait) reads them
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        env["FA_KERNEL_GPUS"] = "1"  # its workers share that one GPU's memory (tests/conftest.py)
    log, check_hung = "", False
    for tier, pytest_args in tiers:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header", *pytest_args]
        if tier == "bitwise":
            command = [*run_script(pytest_args[0]), "compare", str(bitwise_seed), *pytest_args[1:]]
        if tier == "close":  # the unmutated kernel.py, built beside the mutant's
            command = [*run_script(pytest_args[0]), "close", str(PACKAGE / "kernel.py"), *pytest_args[1:]]
        if tier in ("suite", "selected") and target in GPU_TARGETS:
            # Many kernels: built over all cores first; then the tests shared by workers on the
            # mutant's GPU, as `nox -s gpu` shares them (the suite is work-bound).
            command = ["sh", "-c", '"$0" -m tools.precompile && exec "$0" "$@"', *command]
            command += ["-n", str(SUITE_WORKERS), "--dist", "worksteal"]
        # A session of its own: on a time-out the whole group goes (pytest and its compilers),
        # or their open pipes would keep this call waiting.
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
        RUNNING.add(process.pid)
        # A sweep tier prints as it goes (a build's line, a test's dot): one silent for
        # HANG_SECONDS is waiting on a kernel (or a build) that never finishes (sweeps).
        limit = None if timeout is None else max(1.0, timeout - (time.perf_counter() - start))
        deadline = None if stop_at is None else max(1.0, stop_at - time.perf_counter())
        stopped_by_deadline = deadline is not None and (limit is None or deadline < limit)
        if stopped_by_deadline:
            limit = deadline
        stdout, stderr, stopped = _wait(process, limit, HANG_SECONDS if sweeps(tier) else None)
        RUNNING.discard(process.pid)
        if stopped == "stuck":
            # Stuck in the driver: its GPU context may be what holds the other mutants'
            # kernels back, so neither this one nor theirs reads as a hang.
            return (
                "ERROR",
                f"the {tier} tier's processes did not exit {KILL_SECONDS} s after SIGKILL",
                seconds_since(start),
            )
        if stopped is not None:
            log += f"==== {tier} (stopped: {stopped})\n{stdout}{stderr}"
            if stopped == "silence" and tier in CHECK_TIERS:
                # A kernel that never returns shows nothing of the outputs: the tests judge it, as
                # any mutant whose check fails (and a hung context slows every other mutant's).
                check_hung = True
                continue
            (workdir / f"{mutant.id}.log").write_text(log)  # how far it got
            shutil.rmtree(tree, ignore_errors=True)
            seconds = seconds_since(start)
            if stopped == "silence":
                return "killed", f"hang: the {tier} tier printed nothing for {HANG_SECONDS} s and was stopped", seconds
            if stopped_by_deadline:
                return "NOT RUN", f"stopped at --deadline in the {tier} tier", seconds
            return "TIMEOUT", f"the {tier} tier ran past the {timeout:.0f} s limit and was stopped", seconds
        result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
        log += f"==== {tier}\n{result.stdout}{result.stderr}"
        if tier in ("bitwise", "close"):
            if result.returncode == 0:
                seconds = time.perf_counter() - start
                (workdir / f"{mutant.id}.log").write_text(log)
                shutil.rmtree(tree, ignore_errors=True)
                why, check = EQUIVALENT[mutant.key].why, EQUIVALENT[mutant.key].check
                what = "bitwise the unmutated kernel's outputs" if tier == "bitwise" else "within rounding of them"
                if "==== guard regions" in log:
                    what += ", and nothing written outside out and lse"
                return "equivalent", f"{why} (checked: {what}, {check})", seconds
            continue  # not the same outputs: judged by the tests, as any mutant
        if result.returncode != 0:
            break
    seconds = time.perf_counter() - start
    (workdir / f"{mutant.id}.log").write_text(log)
    shutil.rmtree(tree, ignore_errors=True)  # the mutated copy and its cache: GBs over a whole run
    if "FA_KERNEL_EXPECT_SRC mismatch" in log:
        return "ERROR", "the tests imported the shipped package, not the mutant", seconds
    if result.returncode == 0:
        claimed = ""
        if check_hung:
            claimed = " (recorded as equivalent, but its check's kernel never returned)"
        elif "==== bitwise" in log or "==== close" in log:
            claimed = " (recorded as equivalent, but its outputs are not the unmutated kernel's)"
        return "SURVIVED", f"every test of the {tier} tier passed{claimed}", seconds
    failed = re.findall(r"^FAILED (\S+)", log, re.MULTILINE)
    refused = failure_not_a_kill(result.returncode, log, failed)
    if refused:
        return "ERROR", f"{refused} in the {tier} tier", seconds
    if (
        tier in ("suite", "selected")
        and not failed
        and re.search(r"^precompile: .*\n  \{", result.stdout, re.MULTILINE)
    ):
        return "killed", "suite: a kernel fails to build (tools/precompile.py)", seconds
    if selected:
        return "killed", f"selected: {len(failed)} failed: " + " ".join(failed), seconds
    return "killed", f"{tier}: {failed[0] if failed else 'a test failed'}", seconds


# A test that failed for want of GPU memory failed for what ran beside it, not for the mutant.
OUT_OF_MEMORY = re.compile(r"CUDA out of memory|OutOfMemoryError|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY")


def failure_not_a_kill(returncode: int, log: str, failed: list[str]) -> str | None:
    """Why a tier that did not pass is no kill ('' where it is one): pytest exits 1 on a failed
    test, and 2 where pytest-xdist stops the session at the first failure under -x
    (xdist.dsession.Interrupted), a failure all the same; any other exit, or a failure for want
    of GPU memory, says nothing of the mutant (ERROR: run it again)."""
    if OUT_OF_MEMORY.search(log):
        return "a test ran out of GPU memory"
    if returncode == 1 or (returncode == 2 and failed and "xdist.dsession.Interrupted" in log):
        return ""
    last = log.strip().splitlines()[-1] if log.strip() else ""
    return f"pytest exited {returncode}: {last}"


# Compiles for sm_90a, with the package PYTHONPATH gives (a mutant's copy), into
# TILELANG_CACHE_DIR: for kernel.py the sweep builds named in argv[2] (JSON ids); for the gradient
# and split-KV kernels every build their GPU tests launch (a build the mutant leaves alone is the
# unmutated kernel's, compiled once for all).
PREBUILD_SCRIPT = (
    f"GRADIENT_FILES = {GENERATED_FILES['backward']!r}\n"
    + """
import json, os, sys
import fa_kernel
from fa_kernel.workbench.builds import quiet_tilelang
expected = os.environ["FA_KERNEL_EXPECT_SRC"]
assert fa_kernel.__file__.startswith(expected), f"imported {fa_kernel.__file__}, not from {expected}"
quiet_tilelang()
file, wanted = sys.argv[1], set(json.loads(sys.argv[2]))
if file == "kernel.py":
    from suite.boundaries import build_id, sweep_builds
    from fa_kernel.kernel import compiled_forward
    for build in sweep_builds():
        if build_id(build) in wanted:
            compiled_forward(**build, arch="sm_90a")
elif file in GRADIENT_FILES:
    from suite.builds import deterministic_builds, gradient_builds, head_split_builds
    from fa_kernel.backward import compiled_gradient_kernels
    for build in gradient_builds("sm_90a") + deterministic_builds("sm_90a") + head_split_builds("sm_90a"):
        compiled_gradient_kernels(**build)
else:
    from suite.builds import split_kv_test_builds
    from fa_kernel.decode import compiled_decode_kernels
    for build in split_kv_test_builds("sm_90a"):
        compiled_decode_kernels(**build)
"""
)


def prebuild(mutants: list, changed: dict[str, list[str]], folder: Path, jobs: int | None) -> int:
    """--prebuild: for sm_90a, into the TileLang cache `folder`, each kernel.py mutant's changed
    sweep builds and every build the GPU tests of a backward.py or decode.py mutant launch, a
    mutant per process (`jobs` at once, default every core). A compiled kernel is some 30 KB
    packed: a GPU host is sent them and spends its time running them. (The unmutated sweep
    builds, which a close check builds beside the mutant's, the host's own precompile builds in
    seconds.)"""
    folder = folder.resolve()
    workdir = Path(tempfile.mkdtemp(prefix="fa-prebuild-"))
    # A gradient or split-KV mutant's changed builds are triage's dicts; it builds all its tests' anyway.
    work = [
        (m, [] if m.file in PROGRAM_BUILDERS else changed.get(m.id, []))
        for m in mutants
        if m.file in PROGRAM_BUILDERS or changed.get(m.id)
    ]

    def build(mutant, builds: list[str]) -> tuple[str, int, float]:
        start = time.perf_counter()
        env = mutant_package(mutant, mutant.mutated_source(), workdir, folder)
        command = [sys.executable, "-c", PREBUILD_SCRIPT, mutant.file, json.dumps(builds)]
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        if result.returncode:
            print(result.stderr[-2000:], flush=True)
        return mutant.id, result.returncode, time.perf_counter() - start

    failed = 0
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        for name, code, seconds in pool.map(lambda item: build(*item), work):
            failed += code != 0
            print(f"{name:<48}  {'built' if code == 0 else 'FAILED'}  {seconds:6.0f} s", flush=True)
    shutil.rmtree(workdir, ignore_errors=True)
    sweep = sum(len(builds) for _, builds in work)
    others = sum(mutant.file in PROGRAM_BUILDERS for mutant, _ in work)
    print(f"prebuilt into {folder}: {sweep} sweep builds of {len(work) - others} mutants, own tests' of {others}")
    return 1 if failed else 0
