"""Tile configurations: which block sizes, pipeline depth and thread count each case runs.

The table is keyed by (GPU architecture, head_dim, causal) and was filled by measurement
(`fa-kernel tune` regenerates it; PERF.md keeps the numbers behind each entry). A GPU or
head_dim not in the table falls back to a conservative configuration that fits the shared
memory of any sm_80+ part, so the kernel stays correct everywhere and fast where measured.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class TileConfig:
    """One point of the kernel's tuning space."""

    block_m: int  # query rows per thread block (the resident Q tile)
    block_n: int  # key/value rows per loop iteration
    num_stages: int  # depth of the K/V software pipeline
    threads: int  # threads per block: 128 = one warpgroup, 256 = two

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.block_m}x{self.block_n}/{self.num_stages}st/{self.threads}thr"


# sm_90 (H100/H200). d64 and d128: 128x128/2 stages/256 threads, measured on the H200 at
# 2.1x the TileLang example's 128x128/1/128 (PERF.md, "Seed to shipped"); the sweep in
# PERF.md found faster configs that are not adopted until the GPU suite has passed on them.
# d256: 128x64/2/256 fits shared memory with two K/V stages (192 KB); correct on the H200, its
# speed not yet tuned.
TUNED: dict[tuple[str, int, bool], TileConfig] = {
    ("sm_90", 64, False): TileConfig(128, 128, 2, 256),
    ("sm_90", 64, True): TileConfig(128, 128, 2, 256),
    ("sm_90", 128, False): TileConfig(128, 128, 2, 256),
    ("sm_90", 128, True): TileConfig(128, 128, 2, 256),
    ("sm_90", 256, False): TileConfig(128, 64, 2, 256),
    ("sm_90", 256, True): TileConfig(128, 64, 2, 256),
}

# Small enough for any sm_80+ part's shared memory at head_dim 256 (Q, K, V tiles of 32 KB
# each; O reuses Q's space). It compiles for sm_80 (cp.async + mma.sync) but has run only
# where the tests ran: on the H200. Slower than tuned, never wrong.
FALLBACK = TileConfig(64, 64, 1, 128)


def arch_of(compute_capability: tuple[int, int]) -> str:
    """'sm_90' for (9, 0): the key the table uses."""
    major, minor = compute_capability
    return f"sm_{major}{minor}"


def select_config(arch: str, head_dim: int, causal: bool) -> TileConfig:
    """The measured configuration for this case, or the fallback."""
    return TUNED.get((arch, head_dim, causal), FALLBACK)
