"""`fa-kernel info`: versions, the GPU, and the tile config and kernels each case runs."""

from __future__ import annotations

import itertools
import platform

import torch

from fa_kernel import __version__
from fa_kernel.configs import (
    BACKWARD_TILES,
    DK_DV_TILES,
    DQ_TILES,
    FIXED_ORDER_FASTER,
    TUNED,
    arch_of,
    grid_bands,
    split_kv_serves,
)
from fa_kernel.decode import MOST_ROWS as SPLIT_KV_ROWS
from fa_kernel.decode import SPLIT_TILES
from fa_kernel.device import device_target
from fa_kernel.interface import SUPPORTED_HEAD_DIMS
from fa_kernel.kernel import H100_SM_COUNT
from fa_kernel.workbench.console import make_console, print_table


def run(args) -> int:
    console = make_console()
    import tilelang

    console.print(
        f"fa_kernel {__version__}, tilelang {tilelang.__version__}, torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}, Python {platform.python_version()}"
    )
    if torch.cuda.is_available():
        arch = arch_of(torch.cuda.get_device_capability())
        sm_count = device_target()[0]
        console.print(f"GPU: {torch.cuda.get_device_name()} ({arch}, {sm_count} SMs)")
    else:
        arch, sm_count = "sm_90", H100_SM_COUNT
        console.print(
            f"GPU: none (torch.cuda.is_available() is False); showing what an sm_90 GPU of {sm_count} SMs would run"
        )
    rows = []
    for head_dim, causal in itertools.product(SUPPORTED_HEAD_DIMS, (False, True)):
        mask = "causal" if causal else ""
        fewest_tiles = 0.0
        for most_tiles, ranges in grid_bands(arch, head_dim, causal):
            if most_tiles is None:
                grid = f"> {fewest_tiles:g}" if fewest_tiles else "any"
            else:
                grid = f"{fewest_tiles:g}-{most_tiles:g}" if fewest_tiles else f"<= {most_tiles:g}"
            for fewest, most, config in ranges:
                if most_tiles is not None:
                    source = "tuned (grid)"
                elif most is None:
                    source = "tuned" if (arch, head_dim, causal) in TUNED else "fallback"
                else:
                    source = "tuned (short)"
                if most is None:
                    keys = f">= {fewest}" if fewest else "any"
                else:
                    keys = f"{fewest}-{most}" if fewest else f"<= {most}"
                rows.append([str(head_dim), mask, grid, keys, str(config), source])
            fewest_tiles = most_tiles or 0.0
    headers = ["head_dim", "mask", "work tiles / SM", "seqlen_k", "tile config", "source"]
    print_table(console, headers, rows, False, title=f"tile configs for {arch}")

    # The split-KV rule's limits, read off configs.split_kv_serves itself, each with the others
    # far from theirs (keys without end; many waves of forward tiles where keys are probed).
    def serves(seqlen_q=1, heads=2, heads_kv=1, seqlen_k=1 << 30, batch=1) -> bool:
        return split_kv_serves(batch, seqlen_q, seqlen_k, heads, heads_kv, SPLIT_KV_ROWS, sm_count)

    group_rows = max(group for group in range(2, 4 * SPLIT_KV_ROWS) if serves(heads=group))
    mha_heads = max((h for h in range(1, 2 * sm_count) if serves(heads=h, heads_kv=h)), default=0)
    forward_keys = next(keys for keys in range(1, 1 << 16) if serves(heads=1, seqlen_k=keys))
    queries = max(n for n in range(1, SPLIT_KV_ROWS + 1) if serves(seqlen_q=n, heads=1))
    many_queries_keys = next(
        keys for keys in range(1, 1 << 16) if serves(queries + 1, seqlen_k=keys, batch=4 * sm_count)
    )
    tiles = ", ".join(
        f"d{head_dim} {tile.block_m} rows x {tile.block_n} keys, {tile.num_stages} stage(s)"
        f"{' behind a producer warpgroup' if tile.producer else ''}, {tile.blocks_per_sm} block(s)/SM"
        for (head_dim, _), tile in sorted(SPLIT_TILES.items())
    )
    console.print(
        f"decode steps run the split-KV kernels (fa_kernel.decode; tiles by head_dim and rows: {tiles}), "
        f"causal or not: where a group's query rows (group size x seqlen_q) number at most "
        f"{group_rows}; without GQA where the forward kernel's grid, batch x heads at one query, is at most "
        f"{mha_heads} on {sm_count} SMs; where the forward kernel's keys per SM (waves of its tiles x "
        f"seqlen_k) reach {forward_keys}; with at most {queries} queries, or with GQA from {many_queries_keys} keys"
    )

    def gradient_tiles(tiles: dict) -> str:
        return ", ".join(
            f"d{head_dim} {block_m} rows x {block_n} keys, {stages} stage(s)"
            for head_dim, (block_m, block_n, stages) in sorted(tiles.items())
        )

    regions = "; ".join(
        f"d{head_dim} to {keys} keys"
        + (f", groups of {group}+" if group > 1 else "")
        + (", right edge" if edge else "")
        for head_dim, entries in sorted(FIXED_ORDER_FASTER.items())
        for keys, group, edge in entries
    )
    console.print(
        f"gradients run the dK/dV kernel (fa_kernel.backward; tiles by head_dim: {gradient_tiles(BACKWARD_TILES)}), "
        f"dQ by bulk reduce-adds; the fixed-order path (deterministic=True, and the default on a wave of "
        f"blocks or more in configs.FIXED_ORDER_FASTER's regions: {regions}) runs it without dQ "
        f"({gradient_tiles(DK_DV_TILES)}) and the fixed-order dQ kernel (one consumer warpgroup per 64 rows: "
        f"{gradient_tiles(DQ_TILES)})"
    )
    return 0
