"""Which tests judge a mutant and in what order (its own tests, the smoke tier per changed build,
the whole GPU suite), what each tier costs, and the unmutated package's baseline of them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tools.equivalent_mutants import BITWISE, EQUIVALENT, GPU_CHECKS, GUARDED, ROUNDING
from tools.mutants import PACKAGE, ROOT
from tools.mutants.catalogue import (
    BACKWARD_SOFTCAP,
    BACKWARD_WINDOWS,
    FIRST_BY_FILE,
    VARLEN_DETERMINISTIC,
    VARLEN_PLAIN,
    VARLEN_VARIANTS,
    changed_build_tests,
)

# pytest-xdist workers of a mutant's suite (or selected tests), all on its one GPU: four per
# GPU, as `nox -s gpu` runs (eight were slower on one H200: the CUDA contexts take turns).
SUITE_WORKERS = 4

# What a tier costs, for --deadline's estimates: each kernel it compiles, with its tests, takes
# about BUILD_SECONDS with 16 mutants at once on 16 cores (one H200 host, 2026-12-01: one-build
# kills in 32-65 s, twelve-build checks in 220-446 s), and any tier TIER_SECONDS more (pytest's
# start, the tests of kernels already built).
BUILD_SECONDS = 40
TIER_SECONDS = 20

# Which tests judge a mutant: the smoke tier first (the boundary sweep), then the GPU suite, for
# the kernel; the property suite and the boundary sweep on the emulator for the emulator.
SMOKE_ARGS = ["tests/test_boundary_sweep.py", "tests/test_guard_regions.py", "-m", "smoke"]
# The smoke tier's test of writes outside out and lse, per sweep build: a GUARDED reason's check.
GUARD_TEST = "tests/test_guard_regions.py::test_sweep_builds_write_only_out_and_lse"
# Before any GPU tier, for mutants outside kernel.py: the dispatch and the API's checks, on the CPU.
CPU_TESTS = ("tests/test_configs.py", "tests/test_api.py")
# CPU tests of a kernel file's pure conditions, run before any GPU tier of its mutants: a
# mutant of one of them dies in seconds, without a compile.
CPU_BY_FILE = {"gradient_parts.py": ("tests/test_backward_tiles.py",), "mask.py": ("tests/test_mask.py",)}


# A gradient or split-KV mutant's tier of the tests that launch its changed builds (catalogue.changed_build_tests).
CHANGED_BUILDS_TIER = "changed builds' tests"


def cpu_args(file: str) -> list[str]:
    """The CPU tier's pytest arguments for a mutant of `file` (not kernel.py's: the smoke tier)."""
    return [*CPU_TESTS, *CPU_BY_FILE.get(file, ()), "-m", "not gpu"]


PYTEST_ARGS = {
    "kernel": ["tests", "-m", "gpu", "-k", "not emulator"],
    # Every branch triage builds has its tests here (the variants', the ragged batches', the
    # pages'): a mutant of a branch whose tests the suite leaves out could only survive.
    # Of test_variants_kernel.py and test_varlen.py, the tests that launch the gradient kernels:
    # their forward sweeps compile and run kernels no gradient mutant changes.
    "backward": [
        "tests/test_backward_kernel.py",
        BACKWARD_WINDOWS,
        "tests/test_variants_kernel.py::test_a_split_gqa_group_keeps_the_window_the_cap_and_the_sinks",
        BACKWARD_SOFTCAP,
        "tests/test_variants_kernel.py::test_autograd_with_every_variant_gives_dsinks",
        VARLEN_PLAIN,
        *VARLEN_VARIANTS,
        VARLEN_DETERMINISTIC,
        *(
            f"tests/test_varlen.py::{name}"
            for name in (
                "test_the_sinks_gradient_sums_each_sequences",
                "test_the_lse_gradient_reaches_each_sequence",
                "test_no_sequences_gradients_read_another",
                "test_torch_compile_traces_forward_and_gradient_without_graph_breaks",
                "test_the_custom_ops_pass_opcheck",
            )
        ),
        "-m",
        "gpu",
    ],
    # test_variants_kernel.py's split-KV tests alone: its others never launch those kernels.
    "decode": [
        "tests/test_decode.py",
        "tests/test_paged.py",
        "tests/test_variants_kernel.py::test_split_kv_variants_within_the_bound",
        "tests/test_variants_kernel.py::test_flash_attn_func_with_variants",
        "-m",
        "gpu",
    ],
    # The boundary cases and the named non-finite ones first: under -x a kill there costs
    # seconds, where the property draws before them took minutes to reach it.
    "emulator": [
        "tests/test_boundary_sweep.py",
        "tests/test_nonfinite.py",
        "tests/test_variants.py",
        "tests/test_properties.py",
        "tests/test_backward.py",
        "-k",
        "emulat or tiled_backward",
    ],
}


def tilelang_cache() -> Path:
    """TileLang's kernel cache, as TileLang itself resolves it (TILELANG_CACHE_DIR or its default)."""
    from tilelang import env

    return Path(env.TILELANG_CACHE_DIR).expanduser()


def gpu_count() -> int:
    """GPUs of this host, without initialising CUDA in this process (its children use them)."""
    probe = "import torch; print(torch.cuda.device_count())"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return int(result.stdout.strip() or 0)


def host_cache(name: str, files: list[Path], extra: str = "") -> Path:
    """~/.cache/fa-kernel/NAME/DIGEST: where this host keeps what was made from the unmutated
    package's sources, the `files` and `extra` alone (DIGEST is theirs, so an edit starts anew)."""

    sources = [*sorted(PACKAGE.glob("*.py")), *files]
    digest = hashlib.sha256(extra.encode() + b"".join(path.read_bytes() for path in sources)).hexdigest()[:16]
    return Path("~/.cache/fa-kernel").expanduser() / name / digest


def run_script(path: str) -> list[str]:
    """The command that runs a tool of tools/ named by its path, as a module of the repository
    (`python -m tools.name`, from ROOT), so that it imports tests.* and tools.* as packages."""
    return [sys.executable, "-m", path.split()[0].removesuffix(".py").replace("/", ".")]


def bitwise_seed_folder() -> Path:
    """Where this host keeps the unmutated kernel's digests (tools/bitwise_sweep.py record): by
    the package, the sweep script and the modules of tests/ and tools/ it imports. A seed left
    stale by a new toolchain can only make a mutant's bits differ, which sends it to the tests."""
    sweep = ROOT / BITWISE
    return host_cache("bitwise-seeds", [sweep, *sorted(local_imports(sweep))])


def seed_readable(folder: Path, build: str) -> bool:
    """Whether `folder` holds a whole seed of `build` (a record stopped mid-write leaves half a
    file, which goes). The file name is tools/bitwise_sweep.py's: the build id, slashes as _."""
    path = folder / (build.replace("/", "_") + ".json")
    try:
        json.loads(path.read_text())
    except FileNotFoundError:
        return False
    except ValueError:
        path.unlink()
        return False
    return True


def unmutated_env(**variables: str) -> dict[str, str]:
    """This process's environment with the unmutated package first on PYTHONPATH (from src/,
    where it is not installed: nox --no-venv does the same), and `variables`."""
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **variables)


def smoke_nodes_by_build() -> dict[str, list[str]]:
    """{sweep build id: the smoke tier's test node ids on that build}, from pytest's collection
    (no GPU needed)."""
    from suite.boundaries import build_id, sweep_builds

    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *SMOKE_ARGS]
    # The tests import fa_kernel: from src/ where it is not installed (nox --no-venv does the same).
    listed = subprocess.run(command, cwd=ROOT, env=unmutated_env(), capture_output=True, text=True, check=True)
    listed = listed.stdout.splitlines()
    nodes = [line.strip() for line in listed if "::" in line]

    def on(build: dict, node: str) -> bool:  # the build is a node's first parameter, or its only one
        return f"[{build_id(build)}-" in node or node.endswith(f"[{build_id(build)}]")

    by_build = {build_id(build): [node for node in nodes if on(build, node)] for build in sweep_builds()}
    if not all(by_build.values()):
        raise RuntimeError(f"no smoke test found for the sweep builds {[b for b, n in by_build.items() if not n]}")
    return by_build


def mutant_tiers(
    mutant, target: str, changed: list | None, smoke_nodes: dict[str, list[str]], smoke_only: bool, cpu_only: bool
) -> list[tuple[str, list[str]]]:
    """(name, pytest arguments) of the tiers that judge `mutant`, the cheapest first; each runs
    only if the ones before it passed. `changed`: for a gradient or split-KV mutant, the builds
    (triage.program_builds') whose programs it changes, whose tests run before its own where
    those launch none of them; for the forward, the sweep builds (ids) whose kernel the mutant
    changes, where triage knows them: the smoke tier then runs on those alone, the first one
    before the rest (one compile settles most mutants). A mutant recorded as equivalent by a
    BITWISE (ROUNDING) reason is compared with the unmutated kernel over those builds first: the
    same bits (outputs within rounding) settle it, anything else sends it on to the tiers after.
    A GUARDED one first runs those builds' guard-region tests: a write outside out and lse kills it."""
    if target == "emulator":
        return [("suite", ["-x", *PYTEST_ARGS[target]])]
    if target in ("backward", "decode"):  # their own GPU tests; the forward's smoke tier never runs them
        cpu = [("cpu", ["-x", *CPU_BY_FILE[mutant.file]])] if mutant.file in CPU_BY_FILE else []
        if cpu_only:
            return cpu
        first = changed_build_tests(mutant.file, changed) if changed else ()
        launching = [(CHANGED_BUILDS_TIER, ["-x", *first])] if first else []
        own = [*cpu, *launching, ("own tests", ["-x", *FIRST_BY_FILE[mutant.file]])]
        return own if smoke_only else [*own, ("suite", ["-x", *PYTEST_ARGS[target]])]
    tiers = []
    reason = EQUIVALENT.get(getattr(mutant, "key", None))
    if reason is not None and reason.check in GPU_CHECKS and changed:
        if reason.check == GUARDED:
            guard_nodes = [node for build in changed for node in smoke_nodes[build] if node.startswith(GUARD_TEST)]
            tiers.append(("guard regions", ["-x", *guard_nodes]))
        tiers.append(("close" if reason.check == ROUNDING else "bitwise", [BITWISE, *changed]))
    if mutant.file != "kernel.py":
        tiers.append(("cpu", ["-x", *cpu_args(mutant.file)]))
    first = getattr(mutant, "first", ()) or FIRST_BY_FILE.get(mutant.file, ())
    if first:
        tiers.append(("own tests", ["-x", *first]))
    if changed is None:
        tiers.append(("smoke", ["-x", *SMOKE_ARGS]))
    elif changed:
        tiers.append((f"smoke on {changed[0]}", ["-x", *smoke_nodes[changed[0]]]))
        if len(changed) > 1:
            rest = [node for build in changed[1:] for node in smoke_nodes[build]]
            tiers.append((f"smoke on {len(changed) - 1} more changed builds", ["-x", *rest]))
    if cpu_only:
        return [tier for tier in tiers if tier[0] == "cpu"]
    if not smoke_only:
        tiers.append(("suite", ["-x", *PYTEST_ARGS[target]]))
    return tiers


def tier_builds(name: str, pytest_args: list[str]) -> int:
    """How many kernels the tier `name` (as mutant_tiers names them) compiles for a mutant: a
    check's builds, or a smoke tier's changed builds. The CPU tier, the mutant's own tests and
    the smoke tier of a mutant that changes no kernel load the seeded cache; the suite's count is
    its precompile's, unknown here, so it counts as one."""
    if name in ("bitwise", "close"):
        return len(pytest_args) - 1
    if name == "guard regions":  # its builds, which the bitwise tier after it then loads
        return len(pytest_args) - 1
    if match := re.fullmatch(r"smoke on (\d+) more changed builds", name):
        return int(match.group(1))
    return 1 if name.startswith("smoke on ") or name == "suite" else 0


def first_tier_seconds(tiers: list[tuple[str, list[str]]], build_seconds: float = BUILD_SECONDS) -> float:
    """The estimated seconds until a mutant's first compiling tier ends (all its tiers if none
    compiles): what it must be given to reach its likeliest verdict."""
    seconds = 0.0
    for name, pytest_args in tiers:
        builds = tier_builds(name, pytest_args)
        seconds += TIER_SECONDS + builds * build_seconds
        if builds:
            break
    return seconds


# The tiers that check a recorded reason on the GPU (mutant_tiers), before any test of the mutant.
CHECK_TIERS = ("guard regions", "bitwise", "close")


def first_build_tiers(whole_tiers: dict[str, list]) -> tuple[dict[str, list], dict[str, str]]:
    """--first-build-only: ({id: the tiers of its first changed build's compile alone, after the
    CPU tier and its own tests}, {id: why it is left for a whole run}). Left: a mutant recorded
    as equivalent, settled by its GPU check (its first build's smoke tier, which it passes, would
    only take a slot), and one that changes no sweep build (its first GPU tier is the suite)."""
    tiers = {
        key: [tier for tier in whole if tier[0] in ("cpu", "own tests") or one_build(tier[0])]
        for key, whole in whole_tiers.items()
    }
    checked_first = {key for key, whole in whole_tiers.items() if whole and whole[0][0] in CHECK_TIERS}
    deferred = {
        key: "its recorded reason's GPU check runs in a whole run"
        if key in checked_first
        else "it changes no sweep build: the suite judges it"
        for key, first in tiers.items()
        if not first or key in checked_first
    }
    return {key: first for key, first in tiers.items() if key not in deferred}, deferred


def precompile_args(all_tiers, target: str = "kernel") -> list[str]:
    """tools/precompile.py's arguments for the seed cache: the whole suite's kernels only where
    a mutant may reach a suite tier, or its own tests launch the gradient or split-KV kernels
    (which the suite's precompile alone builds); else the smoke tier's (a minute and a half less,
    cold)."""
    if target in ("backward", "decode"):
        return []
    suite = any(name in ("suite", "selected") for mutant_tiers in all_tiers for name, _ in mutant_tiers)
    return [] if suite else ["--smoke"]


def unmutated_failures(all_tiers) -> list[str]:
    """The tests of the mutants' GPU tiers (the smoke tier and the tests run first; not the
    suite, which `nox -s gpu` runs) that fail on the unmutated package: none, or nothing the
    runner says is a kill."""
    smoke, first = False, set()
    for mutant_tiers in all_tiers:
        for name, pytest_args in mutant_tiers:
            smoke |= name.startswith("smoke")
            if name in ("own tests", CHANGED_BUILDS_TIER, "selected"):
                first.update(arg for arg in pytest_args if not arg.startswith("-"))
    # Passed once on this host for these sources and tests: a stamp, so that each call of a run
    # resumed over several device calls does not pay for it again.
    runs = [(run, selection) for run, selection in ((smoke, SMOKE_ARGS), (bool(first), sorted(first))) if run]
    stamp = host_cache("baseline-passed", tier_files([("", selection) for _, selection in runs]), json.dumps(runs))
    if stamp.is_file():
        print(f"unmutated kernel: passed these tiers' tests before on this host ({stamp})", flush=True)
        return []
    env = unmutated_env(HYPOTHESIS_PROFILE="mutants", FA_KERNEL_REQUIRE_GPU="1")
    failed = []
    for run, selection in runs:
        if not run:
            continue
        start = time.perf_counter()
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(SUITE_WORKERS), *selection]
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        failed += re.findall(r"^FAILED (\S+)", result.stdout, re.MULTILINE)
        if result.returncode != 0 and not failed:
            failed.append(f"pytest exited {result.returncode} on {' '.join(selection)}")
        seconds = time.perf_counter() - start
        print(f"unmutated kernel: {' '.join(selection)[:80]}: exit {result.returncode} ({seconds:.0f} s)", flush=True)
    if not failed:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.touch()
    return failed


def sweeps(tier: str) -> bool:
    """Whether `tier` runs the sweep's shapes, printing as it goes (a build's line, a test's dot):
    one silent for HANG_SECONDS is waiting on a kernel that never returns (run_mutant)."""
    return tier in CHECK_TIERS or tier.startswith("smoke")


def one_build(tier: str) -> bool:
    """Whether `tier` is the smoke tier of a mutant's first changed build (mutant_tiers)."""
    return tier.startswith("smoke on ") and "more changed builds" not in tier


# The tiers that run a tool of their own rather than pytest (mutant_tiers).
TOOL_TIERS = ("bitwise", "close")


def tier_files(tiers: list[tuple[str, list[str]]]) -> list[Path]:
    """The files `tiers` run: the test files and tools they name (a node id's file; every file of
    tests/ for the tests/ folder), with the modules of tests/, suite/ and tools/ those import, and theirs
    (`local_imports`); for a tier pytest runs, conftest.py with its imports and pyproject.toml
    (pytest's configuration). A helper no tier imports (sanitize_cases.py, say) is not among them."""
    tests, tools = ROOT / "tests", ROOT / "tools"
    files: set[Path] = set()
    for name, args in tiers:
        for arg in args:
            target = ROOT / arg.split("::")[0]
            if target == tests:
                files.update(tests.glob("*.py"))
            elif target.suffix == ".py" and target.parent in (tests, tools):
                files.add(target)
        if name not in TOOL_TIERS:
            files.update({tests / "conftest.py", ROOT / "pyproject.toml"})
    for path in [path for path in files if path.suffix == ".py"]:
        files |= local_imports(path)
    return sorted(files)


def local_imports(path: Path) -> set[Path]:
    """The modules of tests/, suite/ and tools/ that `path` imports (as `tests.name`, `suite.name`
    or `tools.name`, wherever the import stands), and the ones those import."""
    import ast

    folders = (ROOT / "tests", ROOT / "suite", ROOT / "tools")
    found: set[Path] = set()
    pending = [path]
    while pending:
        tree = ast.parse(pending.pop().read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            for name in names:
                package, _, module_name = name.partition(".")
                module = ROOT / package / f"{module_name.split('.')[0]}.py"
                if module.parent in folders and module.is_file() and module not in found:
                    found.add(module)
                    pending.append(module)
    return found
