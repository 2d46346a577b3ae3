"""Whether the kernel's outputs are bitwise the unmutated kernel's over the boundary sweep: the
check of the generated mutants recorded as changing only the schedule (tools/equivalent_mutants.py,
SCHEDULE_ONLY), which the GPU runs.

    python tools/bitwise_sweep.py record DIR [BUILD_ID ...]    # the unmutated package
    python tools/bitwise_sweep.py compare DIR [BUILD_ID ...]   # a mutant's copy; exit 1 if any bit differs

Each build (tests/boundaries.py's sweep builds, all of them where none is named) runs every
shape of its sweep, both parts, and the two hard score distributions of the smoke tier
(test_boundary_sweep.py), on fixed inputs. `record` keeps a digest of each shape's out and lse
in DIR; `compare` runs the package PYTHONPATH gives and names the shapes whose digests differ.
A digest, not the tensors: the sweep's outputs are GBs. The forward kernel has no atomics and a
fixed tile order, so the unmutated kernel gives the same bits on every run.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
if importlib.util.find_spec("fa_kernel") is None:  # not installed, nor on PYTHONPATH (a mutant's copy)
    sys.path.insert(1, str(ROOT / "src"))


def digests(build: dict) -> dict[str, str]:
    """{shape: sha256 of out's and lse's bytes} of one build over its sweep and hard scores."""
    import torch

    from boundaries import SWEEP_HEADS, SWEEP_HEADS_KV, sweep_seqlens_q, sweep_shapes
    from fa_kernel.kernel import compiled_forward
    from fa_kernel.reference import random_qkv
    from launch import device_arch, run_config
    from strategies import Case

    kernel = compiled_forward(**build, arch=device_arch())
    config, causal, head_dim = build["config"], build["causal"], build["head_dim"]
    shapes = sweep_shapes(config)
    found = {}

    def keep(name, q, k, v, scale):
        out, lse = run_config(q, k, v, scale, causal, config, kernel=kernel)
        found[name] = hashlib.sha256(out.cpu().numpy().tobytes() + lse.cpu().numpy().tobytes()).hexdigest()

    for seqlen_q in sweep_seqlens_q(config):  # prefixes of one draw, as test_boundary_sweep runs them
        lengths = [k for q, k in shapes if q == seqlen_q]
        q_all, k_all, v_all = random_qkv(
            1, seqlen_q, max(lengths), SWEEP_HEADS, SWEEP_HEADS_KV, head_dim, torch.float16
        )
        for seqlen_k in lengths:
            keep(f"{seqlen_q}x{seqlen_k}", q_all, k_all[:, :seqlen_k], v_all[:, :seqlen_k], head_dim**-0.5)
    for distribution in ("jumping_scores", "large_logits"):
        for seqlen_q, seqlen_k in ((600, 600), (sweep_seqlens_q(config)[-1], 3 * config.block_n + 1)):
            case = Case(
                1, seqlen_q, seqlen_k, SWEEP_HEADS, SWEEP_HEADS_KV, head_dim, "float16", causal, None, distribution, 7
            )
            keep(f"{distribution}-{seqlen_q}x{seqlen_k}", *case.inputs("cuda"), case.scale)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["record", "compare"])
    parser.add_argument("folder", type=Path, help="where the unmutated kernel's digests are kept")
    parser.add_argument("builds", nargs="*", metavar="BUILD_ID", help="tests/boundaries.py build ids (default: all)")
    args = parser.parse_args()
    import fa_kernel
    from boundaries import build_id, sweep_builds

    expected = os.environ.get("FA_KERNEL_EXPECT_SRC")  # the mutant runner's: the mutant's copy must be what loaded
    if expected and not Path(fa_kernel.__file__).resolve().is_relative_to(Path(expected).resolve()):
        print(f"FA_KERNEL_EXPECT_SRC mismatch: imported {fa_kernel.__file__}")
        return 3
    by_id = {build_id(build): build for build in sweep_builds()}
    unknown = sorted(set(args.builds) - set(by_id))
    if unknown:
        parser.error(f"builds: expected sweep build ids (tests/boundaries.py), got {unknown}")
    args.folder.mkdir(parents=True, exist_ok=True)
    differing = []
    for name in args.builds or list(by_id):
        found = digests(by_id[name])
        path = args.folder / f"{name}.json"
        if args.action == "record":
            path.write_text(json.dumps(found))
            continue
        seed = json.loads(path.read_text())
        differing += [f"{name} {shape}" for shape, digest in seed.items() if found.get(shape) != digest]
        print(f"{name}: {len(seed)} shapes, {sum(found.get(s) != d for s, d in seed.items())} differ", flush=True)
    if differing:
        print(f"{len(differing)} shapes differ from the unmutated kernel's bits, first: " + ", ".join(differing[:5]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
