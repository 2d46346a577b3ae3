"""Whether an edit of kernel.py changes any kernel: every build's PrimFunc script and pass
configs (TileLang's cache key, so the compiled code) against those of kernel.py at a git ref.

    python tools/same_kernels.py [REF]      # default HEAD; exit 1 naming the builds that differ

The builds: every kernel the GPU suite, the tables and mutant triage build (on a 132-SM GPU,
sm_90a), both dtypes. A refactor that leaves them all identical needs no new measurement of
speed or accuracy; one that changes any must be measured on the GPU. No GPU needed here.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tools"), str(ROOT / "tests"), str(ROOT / "src")]


def compared_builds(sm_count: int = 132) -> list[dict]:
    """forward_program's arguments (compiled_forward's without the arch) of every build compared."""
    import mutants
    import precompile

    builds = []
    for build in [*precompile.suite_builds(sm_count, "sm_90a"), *mutants.triage_builds(sm_count)]:
        build = {name: value for name, value in build.items() if name != "arch"}
        if build not in builds:
            builds.append(build)
    return builds


def differing_builds(before: str, after: str, builds: list[dict]) -> list[dict]:
    """The builds whose PrimFunc (and pass configs) differ between two kernel.py sources."""
    from mutants import primfunc_digests

    pairs = zip(primfunc_digests(before, builds), primfunc_digests(after, builds), strict=True)
    return [build for build, (old, new) in zip(builds, pairs, strict=True) if old != new]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ref", nargs="?", default="HEAD", help="git ref of the kernel.py to compare with")
    args = parser.parse_args()
    show = ["git", "show", f"{args.ref}:src/fa_kernel/kernel.py"]
    before = subprocess.run(show, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    after = (ROOT / "src" / "fa_kernel" / "kernel.py").read_text()
    builds = compared_builds()
    differ = differing_builds(before, after, builds)
    print(f"{len(builds) - len(differ)} of {len(builds)} kernels identical to {args.ref}'s")
    for build in differ:
        print(f"  differs: {build}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
