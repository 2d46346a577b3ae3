"""`fa-kernel tune`: time the tile configs over a ladder of key counts and grid sizes, and print
configs.py's tables from the winners (fa_kernel.workbench.tune does the work)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

import torch

from fa_kernel.configs import TileConfig, arch_of, grid_bands, select_config
from fa_kernel.device import device_target
from fa_kernel.workbench import tune
from fa_kernel.workbench.builds import quiet_tilelang
from fa_kernel.workbench.console import EXIT_FAILED, EXIT_NO_GPU, make_console, print_table


def run(args) -> int:
    console = make_console()
    cases = list(itertools.product(args.head_dim, (False, True)))
    if args.compile_only:
        arch, sms = args.compile_only
        if not (arch.startswith("sm_") and sms.isdigit() and int(sms) > 0):
            console.print(f"--compile-only: expected an nvcc arch and an SM count, like sm_90a 132, got {arch} {sms}")
            return EXIT_FAILED
        quiet_tilelang()
        by_case = tune.precompile(cases, args.jobs, target=(int(sms), arch), candidates=_tune_candidates(args, "sm_90"))
        errors = [error for case in by_case.values() for error in case.values()]
        counts = f"{errors.count(None)} of {len(errors)} candidate kernels"
        console.print(f"{counts} compiled for {arch} with {sms} SMs into TileLang's cache")
        return 0
    if not torch.cuda.is_available():
        console.print("fa-kernel tune needs a CUDA GPU; torch.cuda.is_available() is False here.")
        return EXIT_NO_GPU
    arch = arch_of(torch.cuda.get_device_capability())
    sm_count = device_target()[0]
    ladder = sorted(set(args.keys))
    candidates = _tune_candidates(args, arch)
    built: dict[tuple[int, bool], list] = {}
    if args.jobs > 1:
        console.print(f"compiling every candidate kernel, {args.jobs} at a time")
        tried = 0
        for (head_dim, causal), outcomes in tune.precompile(cases, args.jobs, candidates=candidates).items():
            tried += len(outcomes)
            built[head_dim, causal] = [config for config, error in outcomes.items() if error is None]
            for config, error in outcomes.items():
                if error is not None:
                    mask = " causal" if causal else ""
                    console.print(f"  d{head_dim}{mask} {config}: does not compile ({type(error).__name__})")
        console.print(f"{sum(map(len, built.values()))} of {tried} candidate kernels built (the others do not fit)")
    elif candidates is not None:
        built = {case: candidates(*case) for case in cases}
    by_grid: dict[tuple[int, bool], dict[float, tune.Measurements]] = {case: {} for case in cases}
    record = []
    for (head_dim, causal), heads in itertools.product(cases, sorted(set(args.heads))):
        mask = " causal" if causal else ""
        grid = round(tune.sweep_tiles(heads) / sm_count, 2)
        console.print(
            f"d{head_dim}{mask}, {heads} heads ({grid} work tiles an SM): timing every candidate at {ladder} keys"
        )
        shipped = {keys: select_config(arch, head_dim, causal, keys, grid) for keys in ladder}
        sweep, tflops = tune.measure_case(
            head_dim, causal, ladder, args.rounds, console.print, shipped.values(), heads, built.get((head_dim, causal))
        )
        by_grid[head_dim, causal][grid] = tflops
        entries = tune.choose_entries(tflops)
        record.append(
            {
                "head_dim": head_dim,
                "causal": causal,
                "heads": heads,
                "tiles_per_sm": grid,
                **{name: _by_name(measured) for name, measured in (("sweep", sweep), ("alternated", tflops))},
                "entries": [[most, str(config)] for most, config in entries],
            }
        )
        rows = []
        for keys, measured in tflops.items():
            fastest = max(measured, key=measured.__getitem__)
            entry = next(config for most, config in entries if most is None or keys <= most)
            cells = [
                f"{c} {measured[c]:.0f}" if c in measured else f"{c} (no build)"
                for c in (fastest, entry, shipped[keys])
            ]
            rows.append([str(keys), *cells])
        headers = ["keys", "fastest (TFLOP/s)", "entry derived", "configs.py now"]
        print_table(console, headers, rows, False, title=f"d{head_dim}{mask}, {heads} heads, {grid} tiles an SM (fp16)")
    chosen = {case: tune.choose_bands(grids) for case, grids in by_grid.items()}
    console.print(tune.table_text(arch, chosen), highlight=False, soft_wrap=True)
    if args.json:
        bands = [
            {
                "head_dim": d,
                "causal": c,
                "bands": [[most, [[keys, str(config)] for keys, config in entries]] for most, entries in b],
            }
            for (d, c), b in chosen.items()
        ]
        with open(args.json, "w") as file:
            json.dump(
                {
                    "device": torch.cuda.get_device_name(),
                    "arch": arch,
                    "sm_count": sm_count,
                    "cases": record,
                    "bands": bands,
                },
                file,
                indent=1,
            )
    return 0


def _tune_candidates(args, arch: str) -> Callable[[int, bool], list[TileConfig]] | None:
    """The candidates `--configs` names, with the configs the tables run for each case now (None: the
    whole search space)."""
    if not args.configs:
        return None

    def candidates(head_dim: int, causal: bool) -> list[TileConfig]:
        shipped = [config for _, ranges in grid_bands(arch, head_dim, causal) for _, _, config in ranges]
        return list(dict.fromkeys([*args.configs, *shipped]))

    return candidates


def _by_name(measured: tune.Measurements) -> dict[int, dict[str, float]]:
    return {keys: {str(config): value for config, value in row.items()} for keys, row in measured.items()}
