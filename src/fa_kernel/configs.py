"""Tile configurations: which block sizes, pipeline depth and thread count each case runs.

The table is keyed by (GPU architecture, head_dim, causal) and was filled by measurement
(`fa-kernel tune` regenerates it; PERF.md keeps the numbers behind each entry). Attention
over few keys has a second table, TUNED_SHORT: per case, configs each up to a number of keys
(seqlen_k); past the last, TUNED's. The kernel is written for Hopper (TMA, wgmma, setmaxnreg),
so the tables have sm_90 rows only; a case not in them gets the smallest configuration, which
is correct and slow.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class TileConfig:
    """One point of the kernel's tuning space."""

    block_m: int  # query rows per thread block (the resident Q tile)
    block_n: int  # key/value rows per loop iteration
    num_stages: int  # depth of the K/V software pipeline
    threads: int  # consumer threads: 128, 256 or 384 (1-3 warpgroups); the kernel adds a
    # 128-thread producer warpgroup
    take_turns: bool = True  # 2-3 consumer warpgroups issue their GEMMs in a fixed order
    # (ping-pong / ring) so their softmaxes stagger; False lets them run free
    persistent: bool = False  # one thread block per SM walks the work tiles, instead of one
    # thread block per tile
    blocks_per_sm: int = 1  # 2: registers halved so that two thread blocks share an SM, one
    # block's prologue and epilogue beside the other's loop (short sequences)
    overlap_epilogue: bool = False  # persistent: the next work tile's first Q.K^T is issued
    # before this tile's epilogue (LSE, O out), which then runs under it

    def as_dict(self) -> dict[str, int | bool]:
        return asdict(self)

    def __str__(self) -> str:
        """The config in one word, e.g. 128x176/2st/256thr/persistent/overlap; `parse` reads it back."""
        free = "" if self.take_turns else "/free"
        persistent = "/persistent" if self.persistent else ""
        persistent += "/overlap" if self.overlap_epilogue else ""
        shared = f"/{self.blocks_per_sm}persm" if self.blocks_per_sm > 1 else ""
        return f"{self.block_m}x{self.block_n}/{self.num_stages}st/{self.threads}thr{free}{persistent}{shared}"

    @classmethod
    def parse(cls, text: str) -> TileConfig:
        """The config `str(config)` printed; ValueError naming what does not fit that form."""
        match = _CONFIG_TEXT.fullmatch(text.strip())
        if match is None:
            raise ValueError(
                f"config: expected BMxBN/Sst/Tthr[/free][/persistent][/overlap][/Npersm], "
                f"like 128x176/2st/256thr/persistent, got {text!r}"
            )
        return cls(
            int(match["block_m"]),
            int(match["block_n"]),
            int(match["stages"]),
            int(match["threads"]),
            take_turns=match["free"] is None,
            persistent=match["persistent"] is not None,
            blocks_per_sm=int(match["blocks_per_sm"] or 1),
            overlap_epilogue=match["overlap"] is not None,
        )


_CONFIG_TEXT = re.compile(
    r"(?P<block_m>\d+)x(?P<block_n>\d+)/(?P<stages>\d+)st/(?P<threads>\d+)thr"
    r"(?P<free>/free)?(?P<persistent>/persistent)?(?P<overlap>/overlap)?(?:/(?P<blocks_per_sm>\d+)persm)?"
)


# sm_90 (H100/H200), measured on the H200 at B=8 H=32 N=4096 (PERF.md, one section per
# session; the bench of 2026-11-30, ninth session): d128 610 TFLOP/s fp16 (1.07x cuDNN),
# d128 causal 511 (1.00x), d64 493 (1.10x), d64 causal 409 (1.01x). Ninth session (the
# stale-max softmax), re-checked in one process: d128 128x176 592 vs 128x128 584 vs 128x192
# 577; d128 causal per tile 505 vs 519 for 128x128 persistent + overlap at 4096, but 592 vs
# 565 at 16384; d64 causal per tile 475 vs 421 persistent + overlap at 16384.
# - d128: 128x176, two consumer warpgroups in ping-pong; block_n 176 (not a power of two:
#   wgmma's N may be any multiple of 8) takes 1-3% over 128 with fewer loop trips and no
#   register spills. Eighth session: non-causal overlaps the epilogue with the next work
#   tile's first Q.K^T, alternated in one process against the same kernel without it:
#   4096 570-575 vs 548-563, 16384 590-606 vs 573-581 (at 1024 slower: TUNED_SHORT);
#   at d64 the overlap measured 335 vs 379 (1024) and level at 4096, so d64 goes without;
# - d64: 192x128, three consumer warpgroups: at d64 the softmax's FP32 work, not the GEMMs,
#   limits, and a third warpgroup gives it more issue slots than the ping-pong does. Taking
#   turns (a ring) measured +10% non-causal (436 vs 397 TFLOP/s fp16, 451 vs 405 bf16) and
#   -9% causal (354 vs 386) in the fourth session. Seventh session (Q released after the
#   tile's last Q.K^T, O staged in the V ring): the ring wins causal too (4096: 413-415 vs
#   402-403 free; 16384: 467 vs 420-460), and non-causal runs persistent (1024: 400 vs 371
#   per tile, 4096: 473-510 vs 451-489, 16384: 494 vs 497);
# - persistent (one thread block per SM walking the work tiles, fifth session): d128
#   non-causal 573.6 vs 560.3 per tile at 4096 (+2.4%), 602.5 vs 593.0 at 16384, 518.9 vs
#   523.5 at 1024. The others stay per tile: d64 causal gained 7% at 4096 but lost 12% at
#   16384 (390.7 vs 442.4: the static order balances causal tiles worse than the hardware's
#   block scheduler there), d128 causal +2.5% at 4096, -2.5% at 1024 and -2% at 16384
#   (571.7 vs 582.4), d64 level. Sixth session: with the causal tiles handed out by a global
#   counter (balanced like the hardware's order) persistent causal was still level with one
#   block per tile (d64 16k 449.8 vs 452.3, 4k 385.4 vs 386.7), and the 4096 gain above did
#   not repeat (snake 391.0 vs 386.8). Seventh session: d128 non-causal persistent with
#   the new Q/O hand-over 552-577 vs 567-589 before at 4096 (-2%), 557-560 vs 541 at 1024
#   (+3.5%); causal persistent against per tile, alternated in one process: level at 4096,
#   -3% (d128) and -1.5% (d64) at 8192, so causal stays per tile;
# - eleventh session, O in a buffer of its own (kernel.own_output_buffer) for every entry but the
#   d128 128x176 ones: d64 causal per tile 455-459 vs persistent 430-446 at 8192, 476-481 vs
#   421-425 at 16384 (per tile stays); d128 causal per-tile 128x176 vs persistent 128x128 level at
#   8192, 573-593 vs 547-566 at 16384, 476-501 vs 496-535 at 4096 (4096 keys went to the
#   short entry, TUNED_SHORT);
# - twelfth session, each warpgroup visiting only its rows' K/V tiles (kernel.warpgroup_kv_blocks;
#   +4.6% d64 causal at 4096, the 192-row blocks' waste): d64 causal per tile 478 vs persistent
#   458 at 8192 (per tile stays past 4096 keys; up to there, TUNED_SHORT);
# - thirteenth session, `fa-kernel tune` (two runs over 1024-16384 keys, 16 heads) against these
#   and TUNED_SHORT's entries: 1-3% apart at single lengths (d64 per tile ahead at 4096-8192,
#   d128 persistent without the overlap ahead at 4096); at the bench's shapes (32 heads),
#   alternated: d64 4096 persistent 490.7 vs per tile 481.7, d128 4096 overlap 588.6 vs 595.2
#   without (inside the tuner's 2% margin), prefill (8192 keys) overlap 612.5 vs 601.1. Kept;
#   PERF.md has both runs;
# - d256: 128x64 is what fits shared memory with two K/V stages (Q 64 KB + K, V 2 x 2 x 32 KB);
#   correct on the H200, its speed not tuned.
TUNED: dict[tuple[str, int, bool], TileConfig] = {
    ("sm_90", 64, False): TileConfig(192, 128, 2, 384, persistent=True),
    ("sm_90", 64, True): TileConfig(192, 128, 2, 384),
    ("sm_90", 128, False): TileConfig(128, 176, 2, 256, persistent=True, overlap_epilogue=True),
    ("sm_90", 128, True): TileConfig(128, 176, 2, 256),
    ("sm_90", 256, False): TileConfig(128, 64, 2, 256),
    ("sm_90", 256, True): TileConfig(128, 64, 2, 256),
}

# Few keys: a work tile visits few K/V tiles (at most 8 of 128 keys at 1024), so what it pays
# once, its Q load, first softmax, last P.V and O store, weighs more than the loop.
# - causal (d64 and d128): 128x128, persistent without the overlapped epilogue: the next tile's
#   Q and K/V load under this tile's loop, which the per-tile grid cannot do. Tenth session,
#   fp16 TFLOP/s alternated in one process (rounds 2-5): d128 406-413 vs 342-345 for 128x128
#   per tile at 1024, 487-488 vs 437-441 at 2048 (cuDNN 402, 458); d64 290-298 vs 271-284 for
#   the sixth session's two-per-SM 64x128 at 1024, 341-343 vs 334-339 at 2048 (cuDNN 335, 377;
#   192x128 persistent 367-371 there, but 246-255 at 1024). Earlier: two blocks per SM of one
#   consumer warpgroup each (+15-24% over the long entry at 1024, sixth session), and for d128
#   128x128 per tile (ninth session);
# - d128 non-causal: persistent without the overlapped epilogue, which at these lengths measured
#   slower and erratic (eighth and ninth sessions): 534-535 vs 480-485 at 1024, 573-578 vs 550
#   at 2048 (the first round of each alternation left out: the first kernel timed after a pause
#   runs on a cooler GPU). Eleventh session: 128x128, whose O has a buffer of its own (kernel.
#   own_output_buffer; 128x176 leaves no room for one): 533-546 vs 498-505 for 128x176 at
#   1024, 537-565 vs 511-557 at 2048.
# Every 128x128 entry leaves O a buffer of its own, so no warpgroup waits for another at the
# end of a work tile (eleventh session: +4-8% at 1024-2048 over the V ring).
# - how far each reaches: 2048 keys (seventh session: at 3072 the d128 causal entry of that time
#   lost 8% to the long one), but d128 causal 4096: persistent 128x128 against the long entry's
#   per-tile 128x176 at 4096 keys, 495-535 vs 476-501 (medians 518 vs 501; tenth session 526
#   vs 505), level at 8192, behind at 16384 (547-566 vs 573-593), eleventh session;
# - d64 causal, twelfth session (each warpgroup visiting only its rows' K/V tiles, which made
#   192-row blocks waste less): 192x128 persistent between the 128x128 entry and the long one.
#   Alternated, fp16, upper medians of 5 rounds, 128x128 persistent / 192x128 persistent /
#   192x128 per tile: 1024 307 / 267 / 272, 1280 320 / 331 / 314, 1536 328 / 360 / 338, 2048
#   355-357 / 378-381 / 366-370, 3072 376 / 426-436 / 396-407, 4096 393 / 422-433 / 424-432,
#   8192 - / 458 / 478 (16384: persistent 12% behind, eleventh session); bf16 3072 443 vs 417,
#   4096 438 vs 443 (persistent vs per tile). At 4096 level in four alternations: either may
#   serve it.
# Per case: (the most keys it serves, config), in increasing order of keys.
TUNED_SHORT: dict[tuple[str, int, bool], tuple[tuple[int, TileConfig], ...]] = {
    ("sm_90", 64, True): (
        (1024, TileConfig(128, 128, 2, 256, persistent=True)),
        (4096, TileConfig(192, 128, 2, 384, persistent=True)),
    ),
    ("sm_90", 128, False): ((2048, TileConfig(128, 128, 2, 256, persistent=True)),),
    ("sm_90", 128, True): ((4096, TileConfig(128, 128, 2, 256, persistent=True)),),
}

# One consumer warpgroup, one stage: fits any head_dim up to 256 in a Hopper SM's shared
# memory and registers. Slower than tuned, never wrong; the GPU tests run it too.
FALLBACK = TileConfig(64, 64, 1, 128)


def arch_of(compute_capability: tuple[int, int]) -> str:
    """'sm_90' for (9, 0): the key the table uses."""
    major, minor = compute_capability
    return f"sm_{major}{minor}"


def select_config(arch: str, head_dim: int, causal: bool, seqlen_k: int | None = None) -> TileConfig:
    """The measured configuration for this case, or the fallback. seqlen_k None: the
    long-sequence entry."""
    if seqlen_k is not None:
        for most_keys, config in TUNED_SHORT.get((arch, head_dim, causal), ()):
            if seqlen_k <= most_keys:
                return config
    return TUNED.get((arch, head_dim, causal), FALLBACK)


def key_ranges(arch: str, head_dim: int, causal: bool) -> list[tuple[int, int | None, TileConfig]]:
    """Every config this case runs and the keys it runs them at: (fewest, most, config), in
    increasing order of keys; `most` is None for the long-sequence entry."""
    ranges, fewest = [], 0
    for most_keys, config in TUNED_SHORT.get((arch, head_dim, causal), ()):
        ranges.append((fewest, most_keys, config))
        fewest = most_keys + 1
    return [*ranges, (fewest, None, select_config(arch, head_dim, causal))]
