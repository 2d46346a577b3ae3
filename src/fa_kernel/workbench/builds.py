"""Building kernels ahead of use: every compile a task needs, over all CPU cores at once.

A build (TileLang's lowering, then nvcc) takes seconds of one core, and a process that builds
a task's kernels as it meets them leaves the other cores idle. `build_all` builds them in a
pool of processes, which fill TileLang's disk cache; the caller's own `compiled_forward` then
loads each from there in a fraction of a second. A build is compiled_forward's arguments:
`fa_kernel.interface.kernel_build` gives those of the kernel a call will launch. Once a set
of builds has all built, a stamp in TileLang's cache (`built_stamp`) says so, and a caller
that checks it skips even the pool's start (its processes' imports are most of a warm run).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING

from fa_kernel.configs import TileConfig, grid_bands, key_ranges

if TYPE_CHECKING:
    import torch

    from fa_kernel.workbench.bench import Shape


def shipped_builds(
    arch: str = "sm_90",
    head_dims: Sequence[int] = (64, 128, 256),
    sm_count: int | None = None,
    small_grids: bool = True,
) -> list[dict]:
    """Every config the tables ship for `arch` (the small grids' bands too, unless
    `small_grids` is False), in both dtypes, compiled for it (no GPU needed); for a grid of
    `sm_count` thread blocks where given (compiled_forward's default otherwise)."""
    grid = {} if sm_count is None else {"sm_count": sm_count}

    def configs(head_dim: int, causal: bool) -> dict[TileConfig, None]:
        full = (config for _, _, config in key_ranges(arch, head_dim, causal))
        bands = (config for _, ranges in grid_bands(arch, head_dim, causal) for _, _, config in ranges)
        return dict.fromkeys(bands if small_grids else full)

    return [
        dict(head_dim=head_dim, causal=causal, dtype=dtype, config=config, arch=f"{arch}a", **grid)
        for head_dim in head_dims
        for causal in (False, True)
        for dtype in ("float16", "bfloat16")
        for config in configs(head_dim, causal)
    ]


def split_kv_builds(arch: str, head_dims: Sequence[int] = (64, 128, 256)) -> list[dict]:
    """compiled_decode_kernels' arguments of every split-KV build flash_attn_func runs, causal and
    not, in both dtypes, on each of a head dim's tiles (decode.SPLIT_TILES), for the nvcc `arch`
    ("sm_90a")."""
    from fa_kernel.decode import SPLIT_TILES  # here: the kernels' modules import TileLang
    from fa_kernel.interface import split_kv_build

    return [
        split_kv_build(head_dim, causal, dtype, arch, block_m)
        for head_dim, block_m in sorted(SPLIT_TILES)
        if head_dim in head_dims
        for causal in (False, True)
        for dtype in ("float16", "bfloat16")
    ]


def served_build(device: torch.device, shape: Shape) -> tuple[Callable[..., object] | None, dict]:
    """The builder and build of the kernels flash_attn_func runs for `shape` (serving_build)."""
    from fa_kernel.interface import serving_build

    return serving_build(
        device,
        shape.head_dim,
        shape.causal,
        shape.dtype,
        shape.batch,
        shape.seqlen_q,
        shape.keys,
        shape.nheads,
        shape.heads_kv,
    )


def kernels_build(shape: Shape, arch: str | None) -> dict:
    """The split-KV and gradient kernels' build for a shape: (head_dim, causal, dtype, arch)."""
    return dict(head_dim=shape.head_dim, causal=shape.causal, dtype=str(shape.dtype).removeprefix("torch."), arch=arch)


def unique(builds: Sequence[dict]) -> list[dict]:
    """The builds without repeats, in their order (a build is a dict, so not hashable)."""
    return [build for index, build in enumerate(builds) if build not in builds[:index]]


def quiet_tilelang(verbose: bool = False) -> None:
    """TileLang's log lines of each build shown only when asked: `verbose` sets FA_KERNEL_VERBOSE
    for this process and the workers it starts (fa_kernel.toolchain reads it at each compile)."""
    if verbose:
        os.environ["FA_KERNEL_VERBOSE"] = "1"


Builder = Callable[..., object]


def _build(build: dict, builder: Builder | None = None) -> float:
    from fa_kernel.kernel import compiled_forward

    start = time.perf_counter()
    try:
        (builder or compiled_forward)(**build)
    except Exception as error:
        # TileLang's errors (tvm_ffi.Error) do not pickle: raised as they are, one kills its
        # worker process and with it the pool, and every build still queued fails unbuilt.
        raise RuntimeError(f"{type(error).__name__}: {error}") from None
    return time.perf_counter() - start


def distinct_tasks(builds: Sequence[dict], builder: Builder | Sequence[Builder | None] | None) -> list[tuple]:
    """(builder, build) of each build, without repeats: `builder` one for all, or one per build."""
    builders = list(builder) if isinstance(builder, Sequence) else [builder] * len(builds)
    if len(builders) != len(builds):
        raise ValueError(f"builder: expected one per build ({len(builds)}), got {len(builders)}")
    tasks = list(zip(builders, builds, strict=True))
    return [task for index, task in enumerate(tasks) if task not in tasks[:index]]


def build_all(
    builds: Sequence[dict],
    jobs: int | None = None,
    on_done: Callable[[dict, float | None, BaseException | None], None] | None = None,
    verbose: bool = False,
    builder: Builder | Sequence[Builder | None] | None = None,
) -> list[BaseException | None]:
    """Build every kernel of `builds` (compiled_forward's arguments), `jobs` at a time (default:
    every core), in the order given; `on_done(build, seconds, error)` as each finishes. Returns
    each build's error (one per build without repeats), None where it built: a build that fails
    is the caller's to report. `builder` (module-level functions, for the worker processes)
    builds other kernels from `builds`' arguments instead of compiled_forward: one for all, or
    one per build, so that kernels of several kinds share one pool (a pool per kind ends each on
    a round of idle cores)."""
    tasks = distinct_tasks(builds, builder)
    errors: list[BaseException | None] = [None] * len(tasks)
    if not tasks:
        return errors
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks)))
    # spawn: a worker must not inherit its parent's CUDA state.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=quiet_tilelang, initargs=(verbose,)) as pool:
        futures = {pool.submit(_build, build, task_builder): index for index, (task_builder, build) in enumerate(tasks)}
        for future in as_completed(futures):
            index = futures[future]
            error = future.exception()
            errors[index] = error
            if on_done is not None:
                on_done(tasks[index][1], None if error else future.result(), error)
    return errors


def build_unless_built(
    builds: Sequence[dict],
    jobs: int | None = None,
    on_done: Callable[[dict, float | None, BaseException | None], None] | None = None,
    verbose: bool = False,
    builder: Builder | Sequence[Builder | None] | None = None,
) -> list[BaseException | None] | None:
    """build_all, unless built_stamp says these builds have all built before: None then. The
    stamp is written once every build has built."""
    stamp = built_stamp(builds, builder)
    if stamp.is_file():
        return None
    errors = build_all(builds, jobs, on_done, verbose, builder)
    if all(error is None for error in errors):
        stamp.touch()
    return errors


def built_stamp(builds: Sequence[dict], builder: Builder | Sequence[Builder | None] | None = None) -> Path:
    """A file in TileLang's cache that says these builds are there: named by a digest of the
    builds, the package's source (a mutant's copy included) and TileLang's version. Checking
    the cache itself means loading every kernel; where a kernel has gone since (the cache
    pruned by hand), the call that needs it builds it."""
    import tilelang
    from tilelang import env

    import fa_kernel

    names = [getattr(each, "__qualname__", None) for each, _ in distinct_tasks(builds, builder)]
    digest = hashlib.sha256(f"{list(builds)!r} {names!r} {tilelang.__version__}".encode())
    for path in sorted(Path(fa_kernel.__file__).parent.rglob("*.py")):
        digest.update(path.read_bytes())
    return Path(env.TILELANG_CACHE_DIR) / f"fa_kernel-built-{digest.hexdigest()[:16]}"
