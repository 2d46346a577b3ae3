"""Triage on the CPU: a mutant whose kernels' programs (or generated code) are the unmutated
ones' is equivalent without a GPU; a recorded equivalent mutant is one whose check passes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from tools.ast_mutants import GeneratedMutant
from tools.codegen_rules import broken_rules
from tools.equivalent_mutants import EQUIVALENT, GPU_CHECKS
from tools.mutants import PACKAGE, ROOT

# The files whose generated mutants each target judges (tools/ast_mutants.py's scopes), and the
# targets that run on a GPU. The gradient and split-KV kernels are targets of their own: their
# tests are their own GPU tests, and their campaigns apart from the forward's.
GENERATED_FILES = {
    "kernel": None,  # ast_mutants.FILES: the forward kernel, its launch, dispatch and constants
    "emulator": ("emulator.py",),
    "backward": ("backward.py", "backward_dq.py", "gradient_parts.py", "backward_preprocess.py"),
    "decode": ("decode.py",),
}
GPU_TARGETS = ("kernel", "backward", "decode")
# Per file of a kernel other than the forward: its module-level builder of every kernel a launch
# runs, and the builds its GPU tests launch (fp16 alone: the dtype enters a kernel only as its
# element type, which no operator mutates). gradient_parts.py's parts are both gradient kernels':
# backward.py's builder, whose deterministic builds compile the fixed-order dQ kernel too.
PROGRAM_BUILDERS = {
    "backward.py": "compiled_gradient_kernels",
    "backward_dq.py": "compiled_dq",
    "gradient_parts.py": "compiled_gradient_kernels",
    "backward_preprocess.py": "compiled_preprocess",
    "decode.py": "compiled_decode_kernels",
}
# What of those files the host runs too, where an identical PrimFunc proves nothing: split_plan
# chooses the launch's splits, and a module constant may size a buffer the launch allocates
# (PREPROCESS_ROWS) as well as a kernel's tile.
HOST_SIDE = ("split_plan", "<module>")


def program_builds(file: str) -> list[dict]:
    """The builder's arguments (PROGRAM_BUILDERS) of every kernel `file`'s GPU tests launch: each
    branch a build option takes (the variants, ragged batches, pages) in at least one, since a
    mutant of a branch no build takes would read as equivalent."""
    from fa_kernel.variants import Variants

    if file == "backward_preprocess.py":
        from fa_kernel.configs import BACKWARD_TILES

        return [
            dict(head_dim=head_dim, dtype="float16", arch="sm_90a", varlen=varlen)
            for head_dim in sorted(BACKWARD_TILES)
            for varlen in (False, True)
        ]
    if file in ("backward.py", "backward_dq.py", "gradient_parts.py"):
        from fa_kernel.configs import BACKWARD_TILES, HEAD_SPLIT_DIMS

        def kinds(causal: bool) -> list[dict]:
            # A window's edges without the cap (the select's branch), the cap with them (its own
            # branch), each batched and ragged; the plain kernel both ways, and split between blocks.
            window = Variants(window_left=True, window_right=not causal)
            capped = Variants(window_left=True, window_right=not causal, softcap=True)
            kinds = (Variants(), window, capped)
            return [dict(variants=kind, varlen=ragged) for kind in kinds for ragged in (False, True)]

        if file == "backward_dq.py":  # the fixed-order dQ kernel's builder, compiled_dq
            return [
                dict(head_dim=head_dim, causal=causal, dtype="float16", arch="sm_90a", **kind)
                for head_dim in sorted(BACKWARD_TILES)
                for causal in (False, True)
                for kind in kinds(causal)
            ]
        return [
            dict(head_dim=head_dim, causal=causal, dtype="float16", arch="sm_90a", deterministic=deterministic, **kind)
            for head_dim in sorted(BACKWARD_TILES)
            for causal in (False, True)
            for deterministic in (False, True)
            for kind in [*kinds(causal), *([dict(head_splits=True)] if head_dim in HEAD_SPLIT_DIMS else [])]
        ]
    from fa_kernel.decode import SPLIT_TILES

    def split_kinds(causal: bool) -> list[dict]:
        window = Variants(window_left=True, window_right=not causal, softcap=True, sinks=True)
        return [dict(), dict(variants=window), dict(page_size=16), dict(page_size=64, variants=window)]

    return [
        dict(head_dim=head_dim, causal=causal, dtype="float16", arch="sm_90a", block_m=block_m, **kind)
        for head_dim, block_m in sorted(SPLIT_TILES)
        for causal in (False, True)
        for kind in split_kinds(causal)
    ]


def program_digests(source: str, file: str, builds: list[dict]) -> list[str]:
    """sha256 of the PrimFunc scripts and pass configs (TileLang's cache key) of the kernels each
    build's builder compiles, with `file`'s text replaced by `source`, read by standing in for the
    module's `compile_program`; 'error: ...' where building a program raises."""
    digests = []
    from fa_kernel import backward_dq, backward_preprocess, gradient_parts
    from fa_kernel.toolchain import FAST_MATH

    def script(program, arch, pass_configs=FAST_MATH):
        return program.script(show_meta=True) + repr(pass_configs)

    # The gradient's builder compiles its preprocess, and its fixed-order dQ kernel, from the
    # package's own modules (both gradient kernels through gradient_parts' compile cache): read
    # there too (compiled, they would be kernels, not scripts).
    compiled = backward_preprocess.compile_program, gradient_parts.compile_program
    backward_preprocess.compile_program = gradient_parts.compile_program = script
    for cache in (backward_preprocess.compiled_preprocess, backward_dq.compiled_dq):
        cache.cache_clear()
    try:
        with _kernel_module(source) as module:
            # The kernels' one compile call (fa_kernel.toolchain), as the module imported it.
            module.compile_program = script
            if file == "gradient_parts.py":  # its builder is backward.py's, on the mutated parts
                module = _gradient_kernels_on(module)
            builder = getattr(module, PROGRAM_BUILDERS[file])
            for build in builds:
                try:
                    built = builder(**build)  # a kernel, or a launch's kernels (None: one not run)
                    scripts = [text for text in (built if isinstance(built, tuple) else (built,)) if text]
                    digests.append(short_digest("\n".join(scripts)))
                except Exception as error:  # a mutant may break the Python that builds a kernel
                    digests.append(f"error: {type(error).__name__}: {error}")
    except Exception as error:  # the mutated module itself does not import
        digests = [f"error: {type(error).__name__}: {error}"]
    finally:
        backward_preprocess.compile_program, gradient_parts.compile_program = compiled
        for cache in (backward_preprocess.compiled_preprocess, backward_dq.compiled_dq):
            cache.cache_clear()
    return digests


def _gradient_kernels_on(parts):
    """backward.py, and backward_dq.py as it imports it, imported afresh on the module `parts` in
    place of gradient_parts.py: both gradient kernels built on a mutant of their shared parts."""
    import importlib.util

    def imported(name: str):
        spec = importlib.util.spec_from_file_location(f"on_mutated_parts_{name}", PACKAGE / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    names = ("fa_kernel.gradient_parts", "fa_kernel.backward_dq")
    saved = {name: sys.modules[name] for name in names if name in sys.modules}
    try:
        sys.modules["fa_kernel.gradient_parts"] = parts
        sys.modules["fa_kernel.backward_dq"] = imported("backward_dq")
        return imported("backward")
    finally:
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def triage_programs(mutants: list, jobs: int, cache: Path | None = None) -> Triage:
    """For mutants of backward.py and decode.py: 'equivalent' where every kernel their GPU tests
    launch has the unmutated PrimFunc (so the compiled kernels are the same) and the host runs
    none of the mutated code (HOST_SIDE), 'killed' where building one raises (every test that
    launches it fails there); the rest are left to run, each with the builds (program_builds')
    whose PrimFuncs it changes. Digests are kept in `cache` by mutated source, as triage's are."""
    try:
        stored = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    except json.JSONDecodeError:
        stored = {}
    verdicts: dict[str, tuple[str, str]] = {}
    changed: dict[str, list[dict]] = {}
    for file in sorted({m.file for m in mutants} & set(PROGRAM_BUILDERS)):
        builds = program_builds(file)
        context = hashlib.sha256(f"{file} {builds!r}".encode()).hexdigest()

        def key(source: str, context: str = context) -> str:
            return short_digest(f"{context}\n{source}")

        original_source = (PACKAGE / file).read_text()
        if key(original_source) not in stored:
            stored[key(original_source)] = program_digests(original_source, file, builds)
        original = stored[key(original_source)]
        ours = [m for m in mutants if m.file == file]
        sources = {m.id: m.mutated_source() for m in ours}
        missing = [source for source in dict.fromkeys(sources.values()) if key(source) not in stored]
        for source, digests in crash_safe_map(program_digests, missing, jobs, file, builds):
            stored[key(source)] = digests
            save_triage(cache, stored)  # as each comes: a triage cut short keeps what it did
        for mutant in ours:
            mutated = stored[key(sources[mutant.id])]
            if mutated == original and mutant.function not in HOST_SIDE:
                reason = f"identical PrimFuncs for all {len(builds)} builds its tests launch"
                verdicts[mutant.id] = ("equivalent", reason)
            elif (error := build_error(mutated)) is not None:
                verdicts[mutant.id] = ("killed", f"triage: building the kernel raises ({error})")
            else:
                changed[mutant.id] = [build for build, a, b in zip(builds, original, mutated, strict=True) if a != b]
    save_triage(cache, stored)
    return Triage(verdicts, changed)


def triage_builds(sm_count: int) -> list[dict]:
    """The kernels triage compares: every build of the boundary sweep, then every config the
    full grid's tables ship at `sm_count` (as flash_attn_func builds them), fp16 (the dtype
    enters the kernel only as the element type, which no operator mutates). The small grids'
    bands (configs.TUNED_GRIDS) are not among them yet: their configs join the triage with the
    next triage run of every mutant (docs/testing.md). Then the sweep builds with the variants
    compiled in (suite.builds.variant_sweep_builds): a mutant of code that only a variant runs
    leaves every plain program as it was, and would read as equivalent without them."""
    from suite.boundaries import sweep_builds
    from suite.builds import variant_sweep_builds

    from fa_kernel.workbench.builds import shipped_builds, unique

    full = shipped_builds(sm_count=sm_count, small_grids=False)
    shipped = [build for build in full if build["dtype"] == "float16"]
    return unique([*sweep_builds(), *shipped, *variant_sweep_builds()])


def build_error(digests: list[str]) -> str | None:
    """The first build's error among a mutant's digests (its message, to 73 characters), or None."""
    return next((digest[7:80] for digest in digests if digest.startswith("error: ")), None)


def short_digest(text: str) -> str:
    """64 bits of text's sha256: what the triage cache (tools/records/triage.json) keeps of each
    program and source, enough to tell a few thousand apart, and a quarter of the full digest's size."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def primfunc_digests(
    kernel_source: str, builds: list[dict], original: list[str] | None = None, always: int = 0
) -> list[str]:
    """sha256 of the PrimFunc script and pass configs (TileLang's cache key) of each build, with kernel.py's text
    replaced by `kernel_source`; 'error: ...' where building the program raises. Given the
    unmutated `original` digests, it stops at the first build past the first `always` whose
    digest differs (the mutant is then known to change the kernel)."""

    digests: list[str] = []
    try:
        with _kernel_module(kernel_source) as module:
            for index, build in enumerate(builds):
                # forward_program takes what compiled_forward does, but the target (arch).
                arguments = {name: value for name, value in build.items() if name not in ("dtype", "arch")}
                try:
                    program = module.forward_program(dtype=build["dtype"], **arguments)
                    # The pass configs enter TileLang's cache key too (a mutant may switch a pass off).
                    compiled = program.script(show_meta=True) + repr(getattr(module, "PASS_CONFIGS", None))
                    digests.append(short_digest(compiled))
                except Exception as error:  # a mutant may break the Python that builds the kernel
                    digests.append(f"error: {type(error).__name__}: {error}")
                if original is not None and index >= always and digests[-1] != original[index]:
                    break
    except Exception as error:  # the mutated module itself does not import
        digests = [f"error: {type(error).__name__}: {error}"]
    return digests


def generated_code_digests(
    kernel_source: str, builds: list[dict], indices: list[int], original: dict[int, str] | None = None
) -> dict[int, str]:
    """{index: sha256 of what TileLang generates for builds[index]}, kernel.py's text replaced
    by `kernel_source`: the CUDA source, the host module (launch configuration, TMA
    descriptors, argument checks), the kernel's parameters and the pass configs, which is all
    nvcc and the runtime wrapper are given, so equal digests mean the same compiled kernel.
    'breaks: ...' where the CUDA source breaks a rule of tools/codegen_rules.py. Given the
    unmutated digests `original`, it stops at the first build whose digest differs."""

    import tilelang
    from tilelang import tvm
    from tilelang.engine.lower import lower

    tilelang.set_log_level("WARNING")
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    digests: dict[int, str] = {}
    with _kernel_module(kernel_source) as module:
        for index in indices:
            build = builds[index]
            arguments = {name: value for name, value in build.items() if name not in ("dtype", "arch")}
            try:
                program = module.forward_program(dtype=build["dtype"], **arguments)
                with tvm.transform.PassContext(opt_level=3, config=module.PASS_CONFIGS), target:
                    artifact = lower(program, target=target)
                # Without the names TileLang gives its scratch buffers in no fixed order (same_kernels).
                named = re.sub(r"\bworkspace(_\d+)?\b", "workspace_N", artifact.kernel_source)
                generated = f"{named}\n{artifact.host_mod}\n{artifact.params}\n{module.PASS_CONFIGS!r}"
                digests[index] = short_digest(generated)
                source = artifact.kernel_source
                if problems := broken_rules(source):
                    digests[index] = f"breaks: {problems[0]}"
            except Exception as error:  # a build that lowers in one source and not in the other differs
                digests[index] = f"error: {type(error).__name__}: {error}"
            if original is not None and digests[index] != original[index]:
                break
    return digests


@contextlib.contextmanager
def _kernel_module(kernel_source: str):
    """kernel.py's text replaced by `kernel_source`, imported as a module of its own (TileLang
    reads a prim_func's source from its file)."""
    import importlib.util

    with tempfile.NamedTemporaryFile("w", suffix="_kernel.py", delete=False) as file:
        file.write(kernel_source)
    try:
        spec = importlib.util.spec_from_file_location(f"mutated_kernel_{Path(file.name).stem}", file.name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        os.unlink(file.name)


@dataclass
class Triage:
    """What triage settled on the CPU, and for the rest, which builds each mutant changes (the
    boundary sweep's for the forward, program_builds' for the others): only those can fail on it,
    so its first GPU tests are those that launch them."""

    verdicts: dict[str, tuple[str, str]]
    changed_builds: dict[str, list[dict]]


def triage(mutants: list, jobs: int, sm_count: int, cache: Path | None = None, compute: bool = True) -> Triage:
    """For the kernel.py mutants: 'equivalent' where every triage build has the unmutated
    PrimFunc (so the compiled kernels are the same), 'killed' where building the kernel raises
    (every test that launches it fails there); for the others, the sweep builds whose PrimFunc
    the mutant changes. `cache` (JSON) keeps each mutated source's digests, so that a run on
    the GPU host reuses a triage made on another machine. `compute` False: the cache alone; a
    mutant it does not hold is left out."""
    import hashlib

    from suite.boundaries import sweep_builds

    sweep = sweep_builds()
    builds = triage_builds(sm_count)
    assert builds[: len(sweep)] == sweep  # the sweep's builds first: each mutant's are all computed
    kernel_mutants = [m for m in mutants if m.file == "kernel.py"]
    context = hashlib.sha256(repr(builds).encode()).hexdigest()

    def key(source: str) -> str:
        return short_digest(f"{context}\n{source}")

    try:
        stored = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    except json.JSONDecodeError:  # a copy taken mid-write: computed again
        stored = {}
    original_source = (PACKAGE / "kernel.py").read_text()
    original = stored.get(key(original_source)) or (primfunc_digests(original_source, builds) if compute else None)
    if original is None:
        return Triage({}, {})
    stored[key(original_source)] = original
    sources = [m.mutated_source() for m in kernel_mutants]
    missing = [source for source in dict.fromkeys(sources) if key(source) not in stored] if compute else []
    for source, digests in crash_safe_map(primfunc_digests, missing, jobs, builds, original, len(sweep)):
        stored[key(source)] = digests
        save_triage(cache, stored)  # as each comes: a triage cut short keeps what it did
    result = Triage({}, {})
    changed_at: dict[str, list[int]] = {}  # source: the builds whose PrimFunc differs or was not computed
    for mutant, source in zip(kernel_mutants, sources, strict=True):
        mutated = stored.get(key(source))
        if mutated is None:  # not in the cache, and not computed
            continue
        if mutated == original:
            reason = f"identical PrimFunc for all {len(builds)} shipped and swept kernels"
            result.verdicts[mutant.id] = ("equivalent", reason)
        elif (error := build_error(mutated)) is not None:
            result.verdicts[mutant.id] = ("killed", f"triage: building the kernel raises ({error})")
        else:
            result.changed_builds[mutant.id] = [
                build for build, before, after in zip(sweep, original, mutated, strict=False) if before != after
            ]
            changed_at[source] = [i for i in range(len(builds)) if i >= len(mutated) or mutated[i] != original[i]]
    # A PrimFunc that differs may still lower to the same code (TileLang's simplifier proves a
    # bound, a copy takes its source's extent): where every build that differs does, the
    # compiled kernels are the unmutated ones.
    same_code, broken = same_generated_code(original_source, changed_at, builds, jobs, stored, key, cache, compute)
    for mutant, source in zip(kernel_mutants, sources, strict=True):
        if source in broken:
            result.verdicts[mutant.id] = ("killed", f"triage: {CODEGEN_TEST} fails on its code: {broken[source]}")
            del result.changed_builds[mutant.id]
        elif same_code.get(source):
            lowered = len(changed_at[source])
            reason = f"the same generated code for all {len(builds)} shipped and swept kernels ({lowered} lowered)"
            result.verdicts[mutant.id] = ("equivalent", reason)
            del result.changed_builds[mutant.id]
    _ragged_check(result, kernel_mutants, sources, original_source, stored, jobs, cache, compute)
    return result


@functools.cache
def _ragged_context() -> str:
    from suite.builds import ragged_sweep_builds

    return hashlib.sha256(repr(ragged_sweep_builds()).encode()).hexdigest()


def ragged_key(source: str) -> str:
    """The triage cache's key of kernel.py's `source` at the ragged builds (_ragged_check)."""
    return short_digest(f"ragged {_ragged_context()}\n{source}")


def _ragged_check(result, mutants, sources, original_source, stored, jobs, cache, compute) -> None:
    """An equivalent verdict holds only if the ragged batch's builds (suite.builds.
    ragged_sweep_builds) keep their programs too: a mutant of code only a ragged batch runs
    changes none of the others. One that changes them goes to its tests (no sweep build changed:
    its own tests, then the suite, whose test_varlen launches them); one whose ragged build raises
    is killed. Keyed apart from the other builds' digests, so that those stay valid."""
    from suite.builds import ragged_sweep_builds

    ragged = ragged_sweep_builds()

    settled = [
        (m, s) for m, s in zip(mutants, sources, strict=True) if result.verdicts.get(m.id, ("",))[0] == "equivalent"
    ]
    if not settled:
        return
    unmutated = ragged_key(original_source)
    original = stored.get(unmutated) or (primfunc_digests(original_source, ragged) if compute else None)
    if original is None:
        return
    stored[unmutated] = original
    sources_left = dict.fromkeys(source for _, source in settled)
    missing = [source for source in sources_left if ragged_key(source) not in stored] if compute else []
    for source, digests in crash_safe_map(primfunc_digests, missing, jobs, ragged, original, 0):
        stored[ragged_key(source)] = digests
        save_triage(cache, stored)
    for mutant, source in settled:
        mutated = stored.get(ragged_key(source))
        if mutated is None or mutated == original:
            continue
        del result.verdicts[mutant.id]
        error = build_error(mutated)
        if error is not None:
            result.verdicts[mutant.id] = ("killed", f"triage: building a ragged kernel raises ({error})")
        else:
            result.changed_builds[mutant.id] = []


# The test that checks tools/codegen_rules.py on the shipped builds, which triage applies to a
# mutant's. Triage cache entries name the rules' digest: a changed rule lowers the builds again.
CODEGEN_TEST = "tests/test_codegen.py::test_nothing_asynchronous_outlives_the_block"
GENERATED = f"generated {hashlib.sha256((ROOT / 'tools' / 'codegen_rules.py').read_bytes()).hexdigest()[:12]} "


def crash_safe_map(function, items: list, jobs: int, *arguments):
    """(item, function(item, *arguments)) for each item in order, `jobs` processes at a time, for a
    function that returns a list of digests. A mutant can crash TileLang's lowering (a segfault in
    tvm::floordiv), which breaks the pool:
    the first item it left unfinished is then computed in a process alone (one that dies there
    gives an error digest: a build that cannot be made, killed), and the rest in a new pool."""
    remaining = list(items)
    while remaining:
        done = 0
        try:
            with ProcessPoolExecutor(max(1, jobs)) as pool:
                for result in pool.map(function, remaining, *(itertools.repeat(a) for a in arguments)):
                    yield remaining[done], result
                    done += 1
            return
        except BrokenProcessPool:
            first, remaining = remaining[done], remaining[done + 1 :]
            try:
                with ProcessPoolExecutor(1) as alone:
                    result = alone.submit(function, first, *arguments).result()
            except BrokenProcessPool:
                result = ["error: the build crashed its process (TileLang's lowering died)"]
            yield first, result


def save_triage(cache: Path | None, stored: dict) -> None:
    """Write the triage cache whole, by a rename: a copy taken meanwhile is never half written."""
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.with_suffix(".tmp").write_text(json.dumps(stored))
        cache.with_suffix(".tmp").replace(cache)


def live_keys(sm_count: int) -> set[str]:
    """The triage cache's keys that the sources as they are use: kernel.py's and its mutants'
    (hand-written and generated) PrimFunc digests and generated code, at `sm_count`'s triage
    builds, and the gradient and split-KV files' program digests, theirs and their mutants'."""
    from tools.ast_mutants import FILES, generate
    from tools.mutants.catalogue import KERNEL_MUTANTS

    forward_context = hashlib.sha256(repr(triage_builds(sm_count)).encode()).hexdigest()
    contexts = {"kernel.py": forward_context}
    for file in PROGRAM_BUILDERS:
        contexts[file] = hashlib.sha256(f"{file} {program_builds(file)!r}".encode()).hexdigest()
    mutants = [*KERNEL_MUTANTS, *generate(files=(*FILES, *PROGRAM_BUILDERS))]
    keys = set()
    for file, context in contexts.items():
        sources = [(PACKAGE / file).read_text(), *(m.mutated_source() for m in mutants if m.file == file)]
        for source in sources:
            keys.add(short_digest(f"{context}\n{source}"))
            if file == "kernel.py":
                keys.add(ragged_key(source))
    return keys | {GENERATED + key for key in keys}


def prune_cache(cache: Path, sm_count: int) -> tuple[int, int]:
    """Drop the entries of `cache` no source uses any more (live_keys): (kept, dropped)."""
    stored = json.loads(cache.read_text())
    live = live_keys(sm_count)
    kept = {key: value for key, value in stored.items() if key in live}
    save_triage(cache, kept)
    return len(kept), len(stored) - len(kept)


def same_generated_code(
    original_source, changed_at, builds, jobs, stored, key, cache, compute
) -> tuple[dict[str, bool], dict[str, str]]:
    """({mutated source: whether each build in changed_at[source] lowers to the unmutated code},
    {mutated source: the rule of tools/codegen_rules.py a build it lowered breaks}), from
    generated_code_digests, kept in the triage cache beside the PrimFunc digests; `compute`
    False: from the cache alone (a build it does not hold counts as differing)."""

    def save() -> None:  # as each comes: a triage cut short keeps what it did
        if compute:
            save_triage(cache, stored)

    def generated(source: str) -> dict[int, str]:
        return {int(index): digest for index, digest in stored.get(GENERATED + key(source), {}).items()}

    original = generated(original_source)
    needed = sorted({index for indices in changed_at.values() for index in indices} - set(original))
    missing = [source for source in changed_at if GENERATED + key(source) not in stored]
    if not compute:
        needed, missing = [], []
    with ProcessPoolExecutor(max(1, jobs)) as pool:
        # The unmutated builds first, one task each: every mutant is compared with them.
        unmutated = pool.map(
            generated_code_digests, itertools.repeat(original_source), itertools.repeat(builds), [[i] for i in needed]
        )
        for digests in unmutated:
            original.update(digests)
        stored[GENERATED + key(original_source)] = original
        save()
        computed = pool.map(
            generated_code_digests,
            missing,
            itertools.repeat(builds),
            [changed_at[source] for source in missing],
            itertools.repeat(original),
        )
        for source, digests in zip(missing, computed, strict=True):
            stored[GENERATED + key(source)] = digests
            save()

    def same(source: str, index: int) -> bool:  # an unmutated build that does not lower proves nothing
        return not original.get(index, "error: not lowered").startswith(("error: ", "breaks: ")) and (
            generated(source).get(index) == original[index]
        )

    broken = {}  # where the unmutated build keeps the rules and the mutated one breaks one
    for source, indices in changed_at.items():
        for index in indices:
            digest = generated(source).get(index, "")
            unmutated = original.get(index, "error: not lowered")
            if digest.startswith("breaks: ") and not unmutated.startswith(("error: ", "breaks: ")):
                broken[source] = digest.removeprefix("breaks: ")
                break
    same_code = {source: all(same(source, index) for index in indices) for source, indices in changed_at.items()}
    return same_code, broken


def recorded_equivalents(mutants: list[GeneratedMutant]) -> dict[str, tuple[str, str]]:
    """{mutant id: ('equivalent', reason)} for the mutants tools/equivalent_mutants.py records,
    once the tests that check their reasons pass (on the CPU); none if one fails. The BITWISE
    and ROUNDING ones are checked per mutant on the GPU (mutant_tiers)."""
    recorded = [m for m in mutants if m.key in EQUIVALENT and EQUIVALENT[m.key].check not in GPU_CHECKS]
    checks = sorted({EQUIVALENT[m.key].check for m in recorded})
    if not checks:
        return {}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *checks]
    if subprocess.run(command, cwd=ROOT, capture_output=True).returncode != 0:
        print(f"the checks of the recorded equivalent mutants fail ({' '.join(checks)}): those mutants run")
        return {}
    return {m.id: ("equivalent", f"{EQUIVALENT[m.key].why} (checked: {EQUIVALENT[m.key].check})") for m in recorded}
