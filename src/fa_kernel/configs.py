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


# Measured on the H200 (sm_90), fp16 and bf16 alike, B*H*N sized to fill the GPU.
# See PERF.md for the sweep each entry comes from.
TUNED: dict[tuple[str, int, bool], TileConfig] = {
    ("sm_90", 64, False): TileConfig(128, 128, 2, 256),
    ("sm_90", 64, True): TileConfig(128, 128, 2, 256),
    ("sm_90", 128, False): TileConfig(128, 128, 2, 256),
    ("sm_90", 128, True): TileConfig(128, 128, 2, 256),
    ("sm_90", 256, False): TileConfig(128, 64, 2, 256),
    ("sm_90", 256, True): TileConfig(128, 64, 2, 256),
}

# Fits 100 KB of shared memory at head_dim 256 (Q 32 KB + K, V 32 KB each + O 32 KB is
# reused), so it compiles for every sm_80+ part; slower than tuned, never wrong.
FALLBACK = TileConfig(64, 64, 1, 128)


def arch_of(compute_capability: tuple[int, int]) -> str:
    """'sm_90' for (9, 0): the key the table uses."""
    major, minor = compute_capability
    return f"sm_{major}{minor}"


def select_config(arch: str, head_dim: int, causal: bool) -> TileConfig:
    """The measured configuration for this case, or the fallback."""
    return TUNED.get((arch, head_dim, causal), FALLBACK)
