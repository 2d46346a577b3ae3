"""Whether a mutant's outputs are the unmutated kernel's over the boundary sweep: the GPU checks
of the generated mutants recorded as equivalent for a reason no CPU test can check
(tools/equivalent_mutants.py).

    python -m tools.bitwise_sweep record DIR [BUILD_ID ...]    # the unmutated package
    python -m tools.bitwise_sweep compare DIR [BUILD_ID ...]   # a mutant's copy; exit 1 if any bit differs
    python -m tools.bitwise_sweep close KERNEL_PY [BUILD_ID ...]
        # a mutant's copy against the unmutated kernel.py, run beside it; exit 1 past the rounding allowed

Each build (suite/boundaries.py's sweep builds, all of them where none is named) runs every
shape of its sweep, both parts, and the smoke tier's hard score distributions
(strategies.hard_score_cases), on fixed inputs.

- `record` keeps a digest of each shape's out and lse in DIR; `compare` runs the package
  PYTHONPATH gives and names the shapes whose digests differ. A digest, not the tensors: the
  sweep's outputs are GBs. The forward kernel has no atomics and a fixed tile order, so the
  unmutated kernel gives the same bits on every run. For mutants that change only the schedule.
- `close` builds the unmutated kernel from KERNEL_PY beside the mutant's, runs both on each
  shape, and requires the two within rounding of each other (reference.rounding_apart: out
  within the judge's allowance for that shape, LSE within its bound, the same non-finite
  elements). For mutants that compute the same attention in exact arithmetic and differ in
  rounding only (a choice of reference max); one that computes something else moves some
  output by far more.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sweep_inputs(build: dict) -> Iterator[tuple[str, tuple, float]]:
    """(shape name, (q, k, v), softmax_scale) of every shape of one build's sweep and hard scores."""
    import torch
    from suite.boundaries import SWEEP_HEADS, SWEEP_HEADS_KV, sweep_seqlens_q, sweep_shapes
    from suite.strategies import HARD_SCORES, hard_score_cases

    from fa_kernel.reference import random_qkv

    config, head_dim = build["config"], build["head_dim"]
    shapes = sweep_shapes(config)
    for seqlen_q in sweep_seqlens_q(config):  # prefixes of one draw, as test_boundary_sweep runs them
        lengths = [k for q, k in shapes if q == seqlen_q]
        q_all, k_all, v_all = random_qkv(
            1, seqlen_q, max(lengths), SWEEP_HEADS, SWEEP_HEADS_KV, head_dim, torch.float16
        )
        for seqlen_k in lengths:
            yield f"{seqlen_q}x{seqlen_k}", (q_all, k_all[:, :seqlen_k], v_all[:, :seqlen_k]), head_dim**-0.5
    for distribution in HARD_SCORES:
        for case in hard_score_cases(build, distribution):
            yield f"{distribution}-{case.seqlen_q}x{case.seqlen_k}", case.inputs("cuda"), case.scale


def digests(build: dict) -> dict[str, str]:
    """{shape: sha256 of out's and lse's bytes} of one build over its sweep and hard scores."""
    from suite.launch import device_arch, run_config

    from fa_kernel.kernel import compiled_forward

    kernel = compiled_forward(**build, arch=device_arch())
    found = {}
    for name, (q, k, v), scale in sweep_inputs(build):
        out, lse = run_config(q, k, v, scale, build["causal"], build["config"], kernel=kernel)
        found[name] = hashlib.sha256(out.cpu().numpy().tobytes() + lse.cpu().numpy().tobytes()).hexdigest()
    return found


def load_kernel_module(path: Path, name: str = "unmutated_kernel"):
    """kernel.py at `path` as a module of its own name, beside the package's (it imports the rest
    of fa_kernel, unmutated, from the package)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def not_close(build: dict, unmutated, shapes: str = "") -> list[str]:
    """The shapes of one build where the package's kernel is further from `unmutated`'s (a
    kernel.py module) than rounding (reference.rounding_apart), each with its figures; only the
    shapes whose names start with `shapes`, if given."""
    from suite.launch import device_arch, run_config

    from fa_kernel.kernel import compiled_forward
    from fa_kernel.reference import rounding_apart

    kernels = [compiled(**build, arch=device_arch()) for compiled in (compiled_forward, unmutated.compiled_forward)]
    far = []
    for name, (q, k, v), scale in sweep_inputs(build):
        if not name.startswith(shapes):
            continue
        (out, lse), (out_unmutated, lse_unmutated) = (
            run_config(q, k, v, scale, build["causal"], build["config"], kernel=kernel) for kernel in kernels
        )
        apart = rounding_apart(q, k, v, out, lse, out_unmutated, lse_unmutated, build["causal"], scale)
        if apart is not None:
            far.append(f"{name}: {apart}")
    return far


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["record", "compare", "close"])
    parser.add_argument(
        "path", type=Path, help="record/compare: where the unmutated kernel's digests are kept; close: its kernel.py"
    )
    parser.add_argument("builds", nargs="*", metavar="BUILD_ID", help="suite/boundaries.py build ids (default: all)")
    args = parser.parse_args()
    from suite.boundaries import build_id, sweep_builds

    import fa_kernel

    expected = os.environ.get("FA_KERNEL_EXPECT_SRC")  # the mutant runner's: the mutant's copy must be what loaded
    if expected and not Path(fa_kernel.__file__).resolve().is_relative_to(Path(expected).resolve()):
        print(f"FA_KERNEL_EXPECT_SRC mismatch: imported {fa_kernel.__file__}")
        return 3
    by_id = {build_id(build): build for build in sweep_builds()}
    unknown = sorted(set(args.builds) - set(by_id))
    if unknown:
        parser.error(f"builds: expected sweep build ids (suite/boundaries.py), got {unknown}")
    differing = []
    if args.action == "close":
        if not args.path.is_file():
            parser.error(f"path: expected the unmutated kernel.py, got {args.path}")
        unmutated = load_kernel_module(args.path)
        for name in args.builds or list(by_id):
            far = not_close(by_id[name], unmutated)
            print(f"{name}: {len(far)} shapes past the rounding allowed", flush=True)
            differing += [f"{name} {line}" for line in far]
        if differing:
            print(f"{len(differing)} shapes further from the unmutated kernel than rounding, first:")
            print("\n".join(differing[:5]))
        return 1 if differing else 0
    args.path.mkdir(parents=True, exist_ok=True)
    for name in args.builds or list(by_id):
        found = digests(by_id[name])
        path = args.path / (name.replace("/", "_") + ".json")  # build ids hold slashes
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
