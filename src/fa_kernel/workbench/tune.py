"""`fa-kernel tune`: measure tile configs over a ladder of key counts and derive configs.py's tables.

Each (head_dim, causal) case times every candidate config once at every length of the ladder
(the sweep), on the plot's shapes (32k tokens, 16 heads unless told). One timing drifts with
the GPU's clock and temperature by more than the configs at the top differ, so the sweep only
shortlists; the shortlisted configs, and those configs.py runs now, are then timed again,
alternated over rounds in this one process, at every length. From those medians alone
`choose_entries` derives the entries: each starts with the fastest config at its first length
and serves on while that config stays within MARGIN of the fastest. The last entry becomes
TUNED's (every longer length too), the ones before it TUNED_SHORT's, each serving up to the
longest length it was measured to serve.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import statistics
from collections.abc import Callable, Iterable

import torch

from fa_kernel.configs import TileConfig
from fa_kernel.device import device_target
from fa_kernel.kernel import compiled_forward
from fa_kernel.numerics import LOG2E
from fa_kernel.workbench.bench import Key, alternated, cuda_median_ms, sweep_shape
from fa_kernel.workbench.builds import build_all

LADDER = (1024, 2048, 4096, 8192, 16384)
# The run-to-run spread of one config alternated against itself in one process (docs/perf-log.md
# has the measurement): a config within it of the fastest is not measurably slower, so a
# difference within it never splits an entry.
MARGIN = 0.02
# One timing of a config reads high when the GPU has just been idle (a power-capped GPU boosts,
# then settles; docs/perf-log.md). So the sweep only shortlists: at each length the configs
# within FINALIST_SPREAD of its fastest (at most FINALISTS); the shortlists of all lengths
# together are alternated at every length, and only alternated numbers decide.
FINALIST_SPREAD = 0.10
FINALISTS = 6

Measurements = dict[int, dict[TileConfig, float]]  # keys -> config -> TFLOP/s


def candidate_configs(causal: bool) -> list[TileConfig]:
    """The search space. block_m is 64 rows per consumer warpgroup (one wgmma M): one, two or
    three warpgroups, and two or three either take turns issuing their GEMMs or run free; one
    thread block per work tile or one per SM (persistent), which may issue the next tile's first
    Q.K^T before the epilogue. Where O is staged in the V ring (kernel.own_output_buffer) the
    ring must hold block_m rows; the search keeps to configs where it does. Causal also tries two
    thread blocks per SM of one consumer warpgroup each (over few keys, one block's prologue and
    epilogue run beside the other's loop; two or three warpgroups would leave each too few
    registers for its accumulators)."""
    grids = ((False, False), (True, False), (True, True))  # (persistent, overlap_epilogue)
    configs = [
        TileConfig(block_m, block_n, stages, threads, take_turns, persistent, overlap_epilogue=overlap)
        for (block_m, threads), block_n, stages, take_turns, (persistent, overlap) in itertools.product(
            ((64, 128), (128, 256), (192, 384)), (64, 128, 176), (1, 2), (True, False), grids
        )
        if (take_turns or threads > 128) and block_m <= stages * block_n
    ]
    if causal:
        configs += [TileConfig(64, block_n, 2, 128, blocks_per_sm=2) for block_n in (64, 128)]
    return configs


def finalists(timings: dict[TileConfig, float]) -> list[TileConfig]:
    """The configs worth alternating at one length: the fastest of a sweep, and those close
    enough behind it that one timing each cannot tell them apart."""
    ranked = sorted(timings, key=timings.__getitem__, reverse=True)
    best = timings[ranked[0]]
    return [config for config in ranked[:FINALISTS] if timings[config] >= (1 - FINALIST_SPREAD) * best]


def choose_entries(tflops: Measurements, margin: float = MARGIN) -> list[tuple[int | None, TileConfig]]:
    """(most_keys, config) entries, in increasing order of keys, that serve every length of the
    ladder; the last entry's most_keys is None (it serves every longer length too).

    From the shortest length up: an entry starts with the fastest config at its first length and
    serves on while that config stays within `margin` of the fastest; at the first length where
    it does not, the fastest there starts the next entry. So every length runs its fastest config
    or one no measurably slower, and a difference within the margin never splits an entry.
    """
    ladder = sorted(tflops)
    if not ladder:
        raise ValueError("tflops: expected measurements at one key count at least, got none")
    fastest = {keys: max(tflops[keys], key=tflops[keys].__getitem__) for keys in ladder}
    entries = [(ladder[0], fastest[ladder[0]])]
    for keys in ladder[1:]:
        config = entries[-1][1]
        if tflops[keys].get(config, 0.0) >= (1 - margin) * tflops[keys][fastest[keys]]:
            entries[-1] = (keys, config)
        else:
            entries.append((keys, fastest[keys]))
    return [*entries[:-1], (None, entries[-1][1])]


Entries = list[tuple[int | None, TileConfig]]


def serves(entries: Entries, tflops: Measurements, margin: float = MARGIN) -> bool:
    """Whether `entries` run every length of these measurements at its fastest config or one
    within `margin` of it."""
    for keys, row in tflops.items():
        config = next(config for most, config in entries if most is None or keys <= most)
        if row.get(config, 0.0) < (1 - margin) * max(row.values()):
            return False
    return True


def choose_bands(by_grid: dict[float, Measurements], margin: float = MARGIN) -> list[tuple[float | None, Entries]]:
    """(most work tiles per SM, entries) bands, in increasing order of tiles, from the ladders
    measured on grids of these many work tiles per SM; the last band's most is None (it serves
    every larger grid too).

    From the largest grid down, as choose_entries walks its lengths up: a band starts with the
    entries derived on its largest grid and serves on down while they run every length of the
    next grid within `margin` of its fastest (`serves`); at the first grid where they do not,
    that grid's own entries start the next band, which serves up to that grid's tiles."""
    grids = sorted(by_grid, reverse=True)
    if not grids:
        raise ValueError("by_grid: expected the measurements of one grid at least, got none")
    bands: list[tuple[float | None, Entries]] = [(None, choose_entries(by_grid[grids[0]], margin))]
    for grid in grids[1:]:
        if not serves(bands[-1][1], by_grid[grid], margin):
            bands.append((grid, choose_entries(by_grid[grid], margin)))
    return bands[::-1]


def config_source(config: TileConfig) -> str:
    """`config` as configs.py writes it: the four sizes, then the switches not at their default."""
    defaults = TileConfig(config.block_m, config.block_n, config.num_stages, config.threads)
    switches = [
        f"{field.name}={getattr(config, field.name)!r}"
        for field in dataclasses.fields(TileConfig)[4:]
        if getattr(config, field.name) != getattr(defaults, field.name)
    ]
    sizes = f"{config.block_m}, {config.block_n}, {config.num_stages}, {config.threads}"
    return f"TileConfig({', '.join([sizes, *switches])})"


def table_text(arch: str, chosen: dict[tuple[int, bool], list[tuple[float | None, Entries]]]) -> str:
    """configs.py's TUNED, TUNED_SHORT and TUNED_GRIDS entries for these cases (each a list of
    choose_bands' bands; one band: TUNED and TUNED_SHORT alone), as Python to paste."""
    long_lines, short_lines, grid_lines = [], [], []

    def entries_source(entries: Entries) -> str:
        return ", ".join(f"({most_keys}, {config_source(config)})" for most_keys, config in entries)

    for (head_dim, causal), bands in chosen.items():
        key = (arch, head_dim, causal)
        entries = bands[-1][1]
        long_lines.append(f"    {key!r}: {config_source(entries[-1][1])},")
        if len(entries) > 1:
            short_lines.append(f"    {key!r}: ({entries_source(entries[:-1])},),")
        if len(bands) > 1:
            grids = ", ".join(f"({most}, ({entries_source(band)},))" for most, band in bands[:-1])
            grid_lines.append(f"    {key!r}: ({grids},),")
    return "\n".join(
        [
            "# Paste into TUNED in src/fa_kernel/configs.py:",
            *long_lines,
            "# Paste into TUNED_SHORT (cases without an entry there run TUNED's at every length):",
            *short_lines,
            "# Paste into TUNED_GRIDS (cases without an entry there run the two above on every grid):",
            *grid_lines,
        ]
    )


def kernel_build(head_dim: int, causal: bool, config: TileConfig, sm_count: int, arch: str) -> dict:
    """compiled_forward's arguments for a candidate, for the nvcc `arch` (sm_90a) as
    flash_attn_func builds it. The compile pool and the timing loop both build from here: the
    disk cache serves the second only for the very same arguments."""
    return dict(head_dim=head_dim, causal=causal, dtype="float16", config=config, sm_count=sm_count, arch=arch)


def sweep_tiles(nheads: int) -> int:
    """Work tiles of 128 query rows in each of the sweep's launches (bench.sweep_shape: 32k tokens
    of `nheads` heads), whatever their length: the heads alone set the grid."""
    return 32768 // 128 * nheads


def precompile(
    cases: Iterable[tuple[int, bool]],
    jobs: int,
    target: tuple[int, str] | None = None,
    candidates: Callable[[int, bool], list[TileConfig]] | None = None,
) -> dict[tuple[int, bool], dict[TileConfig, BaseException | None]]:
    """Fill TileLang's disk cache with every candidate of these (head_dim, causal) cases
    (`candidates(head_dim, causal)`, or candidate_configs), `jobs` at a time (the timing loop
    then loads each one from the cache), for `target` (SMs, nvcc arch; None: this GPU's; given,
    no GPU is needed, and the GPU host loads a copy of the cache). Returns each case's
    candidates with their build's error (None: built); the timing loop takes the built ones
    only (a build that does not fit takes as long to fail again)."""
    sm_count, arch = target or device_target()
    chosen = candidates or (lambda head_dim, causal: candidate_configs(causal))
    candidates_of = {(head_dim, causal): chosen(head_dim, causal) for head_dim, causal in cases}
    builds = [
        kernel_build(head_dim, causal, config, sm_count, arch)
        for (head_dim, causal), configs in candidates_of.items()
        for config in configs
    ]
    errors = iter(build_all(builds, jobs))
    return {case: {config: next(errors) for config in configs} for case, configs in candidates_of.items()}


def alternate(timers: dict[Key, Callable[[], float]], rounds: int) -> dict[Key, float]:
    """Median of each timer (a config's TFLOP/s, say) over `rounds` alternated rounds (bench.alternated)."""
    return {key: statistics.median(values) for key, values in alternated(timers, rounds).items()}


def measure_case(
    head_dim: int,
    causal: bool,
    ladder: Iterable[int],
    rounds: int,
    log: Callable[[str], None],
    also: Iterable[TileConfig] = (),
    nheads: int = 16,
    candidates: Iterable[TileConfig] | None = None,
) -> tuple[Measurements, Measurements]:
    """TFLOP/s (fp16) of every candidate (None: candidate_configs) that compiles and launches, at
    every length of the ladder, one timing each (the sweep); then of the sweep's finalists at
    any length and the configs `also` (those the table runs now, to compare with), alternated
    over `rounds` at every length (medians). Shapes: bench.sweep_shape with `nheads` heads.
    Returns (sweep, alternated)."""
    sm_count, arch = device_target()
    shapes = {keys: sweep_shape(keys, head_dim, causal, nheads=nheads) for keys in ladder}
    log("  shapes: " + ", ".join(shape.label() for shape in shapes.values()))
    arguments = {}
    for keys, shape in shapes.items():
        q, k, v = shape.inputs()
        lse = q.new_empty((shape.batch, shape.nheads, shape.seqlen_q), dtype=torch.float32)
        arguments[keys] = (q, k, v, torch.empty_like(q), lse, LOG2E / head_dim**0.5)

    def timer(kernel, keys: int) -> Callable[[], float]:
        call = functools.partial(kernel, *arguments[keys])
        return lambda: shapes[keys].flops / cuda_median_ms(call, warmup=5, repeats=20) / 1e9

    kernels: dict[TileConfig, Callable] = {}
    for config in candidate_configs(causal) if candidates is None else candidates:
        try:
            kernel = compiled_forward(**kernel_build(head_dim, causal, config, sm_count, arch))
        except Exception as error:  # registers do not fit this head_dim
            log(f"  {config}: does not compile ({type(error).__name__})")
            continue
        try:
            kernel(*arguments[min(shapes)])
        except Exception as error:  # more shared memory than this GPU gives a block (not known at compile)
            log(f"  {config}: does not launch ({type(error).__name__}: {error})")
            continue
        kernels[config] = kernel
    # Every kernel is loaded before any is timed, and one length's timings follow each other
    # without a pause: a pause lets the GPU cool, and the next timing reads high.
    sweep = {keys: {config: timer(kernel, keys)() for config, kernel in kernels.items()} for keys in shapes}
    for config in kernels:
        log(f"  {config}: " + " ".join(f"{sweep[keys][config]:.0f}" for keys in shapes))
    shortlist = set(also).union(*(finalists(row) for row in sweep.values()))
    contenders = [config for config in kernels if config in shortlist]
    alternated = {
        keys: alternate({config: timer(kernels[config], keys) for config in contenders}, rounds) for keys in shapes
    }
    log(f"  alternated ({rounds} rounds, medians; keys " + " ".join(map(str, shapes)) + "):")
    for config in contenders:
        log(f"    {config}: " + " ".join(f"{alternated[keys][config]:.0f}" for keys in shapes))
    return sweep, alternated
