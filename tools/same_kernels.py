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
    from tools import mutants, precompile

    families = {None: "forward"}
    builds, builders = precompile.every_build(sm_count, arch)
    forward = [dict(build, arch=arch) for build in mutants.triage_builds(sm_count)]
    compared: list[tuple[str, dict]] = []
    for builder, build in [*zip(builders, builds, strict=True), *((None, build) for build in forward)]:
        family = families.get(builder) or next(
            name for name, entry in ENTRIES.items() if entry.endswith(builder.__name__)
        )
        if "config" in build:
            build = dict(build, config=str(build["config"]))
        if (family, build) not in compared:
            compared.append((family, build))
    return compared


def program_digests(src: Path, builds: list[tuple[str, dict]]) -> list[list[list[str]]]:
    """For each build, [script digest, structure digest, pass configs and target] of each program
    it compiles, with the package imported from `src` (a checkout's src/), in a process of its own."""
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), str(ROOT)]))
    command = [sys.executable, "-m", "tools.same_kernels", "--record"]
    done = subprocess.run(
        command, input=json.dumps(builds), env=environment, cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(f"recording the programs of {src} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def record(builds: list[tuple[str, dict]]) -> list[list[list[str]]]:
    """program_digests' worker: each build's compile calls, recorded instead of compiled."""
    import importlib

    import tilelang
    import tvm

    from fa_kernel.configs import TileConfig

    calls: list[list[str]] = []

    def recorder(program, target=None, pass_configs=None, **options):
        script = program.script(show_meta=True)
        configs = sorted((str(key), repr(value)) for key, value in (pass_configs or {}).items())
        structure = str(tvm.ir.structural_hash(program))
        calls.append([_sha(script), _sha(structure), repr((configs, target, sorted(options.items())))])
        return None

    tilelang.compile = recorder
    recorded = []
    for family, build in builds:
        module, function = ENTRIES[family].split(":")
        entry = getattr(importlib.import_module(module), function)
        if "config" in build:
            build = dict(build, config=TileConfig.parse(build["config"]))
        calls.clear()
        entry(**build)
        recorded.append(list(calls))
    return recorded


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def verdicts(before: list, after: list) -> list[str]:
    """Per build: 'identical', 'names' (structurally equal programs) or 'differs'."""
    out = []
    for old, new in zip(before, after, strict=True):
        if old == new:
            out.append("identical")
        elif len(old) == len(new) and all(a[1:] == b[1:] for a, b in zip(old, new, strict=True)):
            out.append("names")
        else:
            out.append("differs")
    return out


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
    parser.add_argument("--record", action="store_true", help=argparse.SUPPRESS)  # the worker's side
    args = parser.parse_args()
    if args.record:
        print(json.dumps(record(json.loads(sys.stdin.read()))))
        return 0
    builds = compared_builds()
    with tempfile.TemporaryDirectory() as folder:
        before = program_digests(checkout_src(args.ref, Path(folder)), builds)
    after = program_digests(ROOT / "src", builds)
    found = verdicts(before, after)
    counts = {family: [0, 0] for family in ENTRIES}
    for (family, _), verdict in zip(builds, found, strict=True):
        counts[family][0] += verdict != "differs"
        counts[family][1] += 1
    summary = ", ".join(f"{family} {same} of {total}" for family, (same, total) in counts.items())
    print(f"builds with the programs of {args.ref}: {summary}")
    for (family, build), verdict in zip(builds, found, strict=True):
        if verdict != "identical":
            print(f"  {verdict}: {family} {build}")
    return 1 if "differs" in found else 0


if __name__ == "__main__":
    sys.exit(main())
