"""Whether an edit of the package changes any kernel: every shipped and tested build's programs
(forward, gradient and split-KV), compared with those of the package at a git ref.

    python -m tools.same_kernels [REF]   # from the repository root; REF default HEAD; exit 1 if any differs

A build is one call of a kernel family's compile entry (`ENTRIES`) with the arguments
tools/precompile.py builds for a 132-SM GPU at sm_90a, plus mutant triage's forward builds.
Each call's `tilelang.compile` is recorded, not run: the PrimFunc's script and the pass configs
(TileLang's cache key, so the compiled code) and the target. A build whose every program has the
same script as at REF is identical; one whose programs differ only in names (structurally equal
PrimFuncs, which lower to the same code) is reported as such and passes. A refactor that leaves
every build so needs no new measurement; one that changes any must be measured on the GPU. No GPU
or nvcc needed: a minute on two cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Family -> "module:function" of the function that compiles its kernels from a build's arguments.
ENTRIES = {
    "forward": "fa_kernel.kernel:compiled_forward",
    "gradient": "fa_kernel.backward:compiled_gradient_kernels",
    "decode": "fa_kernel.decode:compiled_decode_kernels",
}


def compared_builds(sm_count: int = 132, arch: str = "sm_90a") -> list[tuple[str, dict]]:
    """(family, arguments) of every build compared, without repeats; a forward build's config as
    its text (TileConfig.parse reads it back)."""
    from tools import precompile
    from tools.mutants import triage

    families = {None: "forward"}
    builds, builders = precompile.every_build(sm_count, arch)
    forward = [dict(build, arch=arch) for build in triage.triage_builds(sm_count)]
    compared: list[tuple[str, dict]] = []
    for builder, build in [*zip(builders, builds, strict=True), *((None, build) for build in forward)]:
        family = families.get(builder) or next(
            name for name, entry in ENTRIES.items() if entry.endswith(builder.__name__)
        )
        if "config" in build:
            build = dict(build, config=str(build["config"]))
        if "variants" in build:
            build = dict(build, variants=str(build["variants"]))
        if (family, build) not in compared:
            compared.append((family, build))
    return compared


def program_digests(src: Path, builds: list[tuple[str, dict]], lowered: bool = False) -> list[list[list[str]]]:
    """For each build, [script digest, structure digest, pass configs and target] of each program
    it compiles, with the package imported from `src` (a checkout's src/), in a process of its own;
    `lowered`: [digest of the generated code] instead (TileLang's lowering, no nvcc: seconds a
    program)."""
    return _collect(_start(src, builds, lowered))


def _start(src: Path, builds: list[tuple[str, dict]], lowered: bool) -> subprocess.Popen:
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), str(ROOT)]))
    command = [sys.executable, "-m", "tools.same_kernels", "--lowered" if lowered else "--record"]
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment,
        cwd=ROOT,
        text=True,
    )
    process.stdin.write(json.dumps(builds))  # small: the pipe holds it, so both workers run at once
    process.stdin.close()
    process.stdin = None  # written: communicate() only reads
    return process


def _collect(process: subprocess.Popen) -> list[list[list[str]]]:
    out, err = process.communicate()
    if process.returncode:
        raise RuntimeError(f"recording the programs failed:\n{err[-4000:]}")
    return json.loads(out.splitlines()[-1])


def both_digests(before: Path, after: Path, builds: list[tuple[str, dict]], lowered: bool = False) -> list[str]:
    """verdicts of the builds between two src/ folders, both recorded at once (a process each)."""
    started = [_start(src, builds, lowered) for src in (before, after)]
    return verdicts(*(_collect(each) for each in started))


def record(builds: list[tuple[str, dict]], lowered: bool = False) -> list[list[list[str]]]:
    """program_digests' worker: each build's compile calls, recorded instead of compiled."""
    import importlib

    import tilelang
    import tvm
    from tilelang.engine.lower import lower

    from fa_kernel.configs import TileConfig

    tilelang.set_log_level("WARNING")
    calls: list[list[str]] = []

    def recorder(program, target=None, pass_configs=None, **options):
        configs = sorted((str(key), repr(value)) for key, value in (pass_configs or {}).items())
        setting = repr((configs, target, sorted(options.items())))
        if lowered:
            # What nvcc and the runtime wrapper are given: the CUDA source, the host module
            # (launch, TMA descriptors, argument checks) and the kernel's parameters.
            target = tvm.target.Target(target)
            with tvm.transform.PassContext(opt_level=3, config=pass_configs or {}), target:
                artifact = lower(program, target=target)
            # TileLang names the scratch buffers of its reductions in no fixed order (a source
            # lowered twice can swap `workspace` and `workspace_2`), so their names are not compared.
            source = re.sub(r"\bworkspace(_\d+)?\b", "workspace_N", artifact.kernel_source)
            calls.append([_sha(f"{source}\n{artifact.host_mod}\n{artifact.params}\n{setting}")])
            return None
        script = program.script(show_meta=True)
        structure = str(tvm.ir.structural_hash(program))
        calls.append([_sha(script), _sha(structure), setting])
        return None

    tilelang.compile = recorder
    recorded = []
    for family, build in builds:
        module, function = ENTRIES[family].split(":")
        entry = getattr(importlib.import_module(module), function)
        if "config" in build:
            build = dict(build, config=TileConfig.parse(build["config"]))
        if "variants" in build:
            try:
                from fa_kernel.variants import Variants
            except ImportError:  # a package from before the variants: no such build there
                recorded.append(NEW)
                continue
            build = dict(build, variants=Variants.parse(build["variants"]))
        calls.clear()
        try:
            entry(**build)
        except TypeError:
            if not {"variants", "varlen", "head_splits"} & build.keys():
                raise
            recorded.append(NEW)  # a kernel family that took no such option at the ref
            continue
        except KeyError:
            recorded.append(NEW)  # a head dim the ref's tile table has no entry for
            continue
        recorded.append(list(calls))
    return recorded


NEW = [["a build the package at the ref does not have"]]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def verdicts(before: list, after: list) -> list[str]:
    """Per build: 'identical', 'names' (structurally equal programs), 'new' (none at the ref) or
    'differs' (the lowered code's digests: 'identical' or 'differs')."""
    out = []
    for old, new in zip(before, after, strict=True):
        if old == NEW:
            out.append("new")
        elif old == new:
            out.append("identical")
        elif len(old) == len(new) and all(a[1:] == b[1:] for a, b in zip(old, new, strict=True)):
            out.append("names")
        else:
            out.append("differs")
    return out


def _lowered(verdict: str) -> str:
    return "same code" if verdict == "identical" else "differs"


def checkout_src(ref: str, into: Path) -> Path:
    """src/ of the commit `ref`, written under `into`."""
    archive = subprocess.run(["git", "archive", ref, "src"], cwd=ROOT, capture_output=True, check=True).stdout
    path = into / "archive.tar"
    path.write_bytes(archive)
    with tarfile.open(path) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ref", nargs="?", default="HEAD", help="git ref of the package to compare with")
    parser.add_argument("--programs-only", action="store_true", help="compare the programs, lower none")
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the src/ folder compared with REF's")
    parser.add_argument("--record", action="store_true", help=argparse.SUPPRESS)  # the worker's side
    parser.add_argument("--lowered", action="store_true", help=argparse.SUPPRESS)  # the worker's side
    args = parser.parse_args()
    if args.record or args.lowered:
        print(json.dumps(record(json.loads(sys.stdin.read()), lowered=args.lowered)))
        return 0
    builds = compared_builds()
    with tempfile.TemporaryDirectory() as folder:
        before = checkout_src(args.ref, Path(folder))
        found = both_digests(before, args.src, builds)
        # Programs that differ may still lower to the same code (an expression regrouped that the
        # simplifier folds): lowered on both sides, the generated code decides.
        differing = [build for build, verdict in zip(builds, found, strict=True) if verdict == "differs"]
        builds_new = [build for build, verdict in zip(builds, found, strict=True) if verdict == "new"]
        if builds_new:
            print(f"{len(builds_new)} builds are new (none at {args.ref}): not compared")
        if differing and not args.programs_only:
            print(f"{len(differing)} builds' programs differ; lowering them on both sides")
            settled = iter(both_digests(before, args.src, differing, lowered=True))
            found = [(verdict if verdict != "differs" else _lowered(next(settled))) for verdict in found]
    counts = {family: [0, 0] for family in ENTRIES}
    for (family, _), verdict in zip(builds, found, strict=True):
        counts[family][0] += verdict not in ("differs", "new")
        counts[family][1] += verdict != "new"
    summary = ", ".join(f"{family} {same} of {total}" for family, (same, total) in counts.items())
    print(f"builds with the programs of {args.ref}: {summary}")
    for (family, build), verdict in zip(builds, found, strict=True):
        if verdict not in ("identical", "new"):
            print(f"  {verdict}: {family} {build}")
    return 1 if "differs" in found else 0


if __name__ == "__main__":
    sys.exit(main())
