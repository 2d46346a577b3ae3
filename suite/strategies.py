"""Hypothesis strategies for attention problems: shapes that hit the kernel's edges and
input distributions that hit its numerics.

A drawn `Case` is plain data; its tensors are made from its own seed with a private
generator, never from global RNG state, so the repr hypothesis prints on a failure is a
complete reproduction: `Case(...).inputs("cuda")` gives back the same q, k, v.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from fa_kernel.configs import FALLBACK, TileConfig, select_config, tiles_per_sm
from fa_kernel.kernel import H100_SM_COUNT
from suite.boundaries import (
    FALLBACK_ENTRIES,
    SIDE,
    SWEEP_HEADS,
    SWEEP_HEADS_KV,
    Entry,
    boundary_offsets,
    factor_pairs,
    lengths_near_multiples,
    shipped_entries,
    sweep_limit,
    sweep_seqlens_q,
    tile_counts_near_grid,
)

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}

# Lengths around one and two multiples of every block size the kernel runs with (64, 128,
# 176, 192), primes, 1, and the flash-attn test pairs exercise partial tiles, the tiles that
# need a mask and those that do not, the causal diagonal and the loop bounds; every
# short-sequence entry's reach +-1 the switch from one config to the next.
CONFIGS = (*dict.fromkeys(entry.config for entry in shipped_entries()), FALLBACK)
# The most keys each entry serves, the small grids' bands' too.
REACHES = tuple(sorted({entry.most for entry in shipped_entries() if entry.most is not None}))
BLOCK_SIZES = sorted({size for config in CONFIGS for size in (config.block_m, config.block_n)})
EDGE_LENGTHS = tuple(
    sorted(
        {1, 2, 3, 17, 113, 203, 217, 239, 509, 799, 1021, 1023, 1024, 1025}
        | {multiple * size + step for size in BLOCK_SIZES for multiple in (1, 2) for step in (-1, 0, 1)}
        | {reach + step for reach in REACHES for step in (-1, 0, 1)}
    )
)
FLASH_ATTN_PAIRS = ((113, 203), (128, 217), (1, 239), (799, 3), (1023, 1024), (1024, 1023), (3, 799), (108, 256))
DISTRIBUTIONS = ("normal", "large_logits", "equal_scores", "dominant_key", "tiny", "jumping_scores")
# jumping_scores: every JUMP_EVERY keys each row's scores rise by JUMP_LOG2 in log2 units
# (score * softmax_scale * log2(e)): past log2(STALE_SUM_LIMIT) = 12, so a K/V tile holding a jump
# must leave the max it started from, and past fp16's 2^16, so keeping it would overflow P~;
# the tiles between jumps may keep theirs.
JUMP_EVERY, JUMP_LOG2 = 250, 16.5


@dataclass(frozen=True)
class Case:
    batch: int
    seqlen_q: int
    seqlen_k: int
    nheads: int
    nheads_kv: int
    head_dim: int
    dtype: str
    causal: bool
    softmax_scale: float | None
    distribution: str
    seed: int
    # The tile config to run, called directly; None: the one flash_attn_func picks for seqlen_k.
    config: TileConfig | None = None

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def scale(self) -> float:
        return self.softmax_scale if self.softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)

    def inputs(self, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v for this case, identical on every device (drawn on the CPU from `seed`)."""
        gen = torch.Generator().manual_seed(self.seed)
        q_shape = (self.batch, self.seqlen_q, self.nheads, self.head_dim)
        kv_shape = (self.batch, self.seqlen_k, self.nheads_kv, self.head_dim)
        q, k, v = (
            torch.randn(q_shape, generator=gen),
            torch.randn(kv_shape, generator=gen),
            torch.randn(kv_shape, generator=gen),
        )
        if self.distribution == "large_logits":
            # Typical |score| ~ 3e3 after scaling, extremes past 1e4: exp without max
            # subtraction overflows fp32 here, and the scores themselves do not fit fp16.
            sigma = math.sqrt(3e3 / (math.sqrt(self.head_dim) * self.scale))
            q, k = q * sigma, k * sigma
        elif self.distribution == "equal_scores":
            k = k[:, :1].expand_as(k).clone()  # every key the same: each row's scores are all equal
        elif self.distribution == "dominant_key":
            # Each query is a multiple of one random key: that key's score dominates its row.
            pick = torch.randint(0, self.seqlen_k, (self.seqlen_q,), generator=gen) if self.seqlen_k else None
            if pick is not None:
                group = self.nheads // self.nheads_kv
                q = 4.0 * k[:, pick].repeat_interleave(group, dim=2)
        elif self.distribution == "jumping_scores":
            q[..., 0] = 1.0
            steps = torch.arange(self.seqlen_k) // JUMP_EVERY
            k[..., 0] += (JUMP_LOG2 / (self.scale * math.log2(math.e))) * steps[None, :, None]
        elif self.distribution == "unit_steps":
            # Integer scores (q = e_0, k's first coordinate the step count) that rise by exactly
            # 1.0 every JUMP_EVERY keys: a tile's max is exactly one above the tile's before, where
            # an equality on the max that is off by one holds. Named cases only: with a
            # softmax_scale past 12 / log2(e) (STALE_SUM_LIMIT) a tile holding a step must leave
            # the max it started from.
            q = torch.zeros_like(q)
            q[..., 0] = 1.0
            k[..., 0] = (torch.arange(self.seqlen_k) // JUMP_EVERY).to(k.dtype)[None, :, None]
        elif self.distribution == "tiny":
            # Four times the smallest normal of the dtype: many inputs become subnormal.
            tiny = 4 * torch.finfo(self.torch_dtype).tiny
            q, k, v = q * tiny, k * tiny, v * tiny
        return tuple(t.to(self.torch_dtype).to(device) for t in (q, k, v))


def seqlens(max_len: int) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from([n for n in EDGE_LENGTHS if n <= max_len]), st.integers(1, max_len))


def cases(
    *,
    head_dims=(64, 128),
    max_len: int = 1100,
    max_score_elements: int = 2_000_000,
    sm_count: int | None = None,
) -> st.SearchStrategy[Case]:
    """One attention problem: half of them free draws of lengths and heads, half drawn on both
    sides of one of the kernel's boundaries (`boundary_cases`). batch*nheads*seqlen_q*seqlen_k
    stays under max_score_elements so the reference (which materialises the score matrix) stays
    fast. `sm_count`: the persistent grid's size on the device under test (None: no draws of
    tile counts against it)."""
    return st.one_of(
        free_cases(head_dims=head_dims, max_len=max_len, max_score_elements=max_score_elements),
        boundary_cases(head_dims=head_dims, max_len=max_len, max_score_elements=max_score_elements, sm_count=sm_count),
    )


def _numerics(draw, head_dim: int) -> dict:
    """The parts of a case that do not shape the tiles."""
    return dict(
        head_dim=head_dim,
        dtype=draw(st.sampled_from(sorted(DTYPES))),
        softmax_scale=draw(st.one_of(st.none(), st.floats(0.02, 2.0))),
        distribution=draw(st.sampled_from(DISTRIBUTIONS)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@st.composite
def free_cases(draw, *, head_dims=(64, 128), max_len: int = 1100, max_score_elements: int = 2_000_000) -> Case:
    """Lengths drawn on their own (edge lengths, flash-attn's pairs, anything), heads and GQA."""
    if draw(st.booleans()):
        seqlen_q, seqlen_k = draw(st.sampled_from(FLASH_ATTN_PAIRS))
    else:
        seqlen_q = draw(seqlens(max_len))
        seqlen_k = seqlen_q if draw(st.booleans()) else draw(seqlens(max_len))
    nheads_kv = draw(st.sampled_from([1, 1, 2, 3]))
    group = draw(st.sampled_from([1, 2, 4, 8]))
    budget = max(1, max_score_elements // (seqlen_q * seqlen_k * nheads_kv * group))
    batch = draw(st.integers(1, min(3, budget)))
    if batch * nheads_kv * group * seqlen_q * seqlen_k > max_score_elements:
        nheads_kv, group = 1, 1
    return Case(
        batch=batch,
        seqlen_q=seqlen_q,
        seqlen_k=seqlen_k,
        nheads=nheads_kv * group,
        nheads_kv=nheads_kv,
        causal=draw(st.booleans()),
        **_numerics(draw, draw(st.sampled_from(head_dims))),
    )


@st.composite
def boundary_cases(
    draw, *, head_dims=(64, 128), max_len: int = 1100, max_score_elements: int = 2_000_000, sm_count=None
) -> Case:
    """A case on one side of a boundary of one config the tables ship (or the fallback), drawn
    from that config's block sizes (boundaries.py): seqlen_k in the config's key range near a
    block multiple or the range's ends (the table's switch points), and a causal offset
    seqlen_k - seqlen_q within SIDE of where a warpgroup's diagonal meets a K/V tile's end; or,
    for a persistent config, a number of work tiles next to a multiple of the SM count.

    Where the config's keys lie beyond max_len (or it is the fallback), the case names the
    config and runs it directly at shorter lengths."""
    entries = [entry for entry in shipped_entries() if entry.head_dim in head_dims]
    entries += [entry for entry in FALLBACK_ENTRIES if entry.head_dim in head_dims]
    entry = draw(st.sampled_from(entries))
    fewest, most = entry.fewest, min(entry.most or max_len, max_len)
    direct = entry in FALLBACK_ENTRIES or fewest > most
    if direct:
        fewest, most = 1, max_len
    config = entry.config
    numerics = _numerics(draw, entry.head_dim)
    # Both sides of the key range's ends: the switch to the next entry is the first key past it.
    near_k = sorted({*lengths_near_multiples(config, fewest, most), *range(fewest, min(most, fewest + SIDE) + 1)})
    near_k += [n for n in range(max(fewest, most - SIDE), most + 1) if n not in near_k]

    if sm_count and config.persistent and draw(st.booleans()):
        shape = _tile_count_shape(draw, entry, near_k, sm_count, max_score_elements)
        if shape is not None:
            batch, seqlen_q, seqlen_k, nheads, nheads_kv = shape
            named = _named_config(entry, direct, batch, seqlen_q, seqlen_k, nheads, sm_count)
            return Case(
                batch, seqlen_q, seqlen_k, nheads, nheads_kv, causal=entry.causal, config=named, **numerics,
            )  # fmt: skip

    limit = sweep_limit(config)
    offsets = boundary_offsets(config, limit)
    budget = max_score_elements
    if draw(st.booleans()):  # anchor seqlen_k on a boundary, then the offset
        seqlen_k = draw(st.sampled_from([n for n in near_k if n * (n + limit) <= budget] or [fewest]))
        offset = draw(st.sampled_from([o for o in offsets if 1 <= seqlen_k - o <= max_len] or [0]))
        seqlen_q = max(1, seqlen_k - offset)
    else:  # anchor seqlen_q on a boundary (last query block, dead warpgroups), then the offset
        near_q = [n for n in lengths_near_multiples(config, 1, max_len) if n * (n + limit) <= budget]
        seqlen_q = draw(st.sampled_from(near_q or [1]))
        fitting = [o for o in offsets if fewest <= seqlen_q + o <= most]
        if fitting:
            seqlen_k = seqlen_q + draw(st.sampled_from(fitting))
        else:
            seqlen_k = draw(st.sampled_from([n for n in near_k if seqlen_q * n <= budget] or [fewest]))
    nheads_kv = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 3]))
    room = max(1, budget // (seqlen_q * seqlen_k * nheads_kv * group))
    batch = draw(st.integers(1, min(2, room)))
    if batch * nheads_kv * group * seqlen_q * seqlen_k > budget:
        nheads_kv, group = 1, 1
    named = _named_config(entry, direct, batch, seqlen_q, seqlen_k, nheads_kv * group, sm_count)
    return Case(
        batch, seqlen_q, seqlen_k, nheads_kv * group, nheads_kv, causal=entry.causal, config=named, **numerics,
    )  # fmt: skip


def _named_config(
    entry: Entry, direct: bool, batch: int, seqlen_q: int, seqlen_k: int, nheads: int, sm_count: int | None
) -> TileConfig | None:
    """The config a case names: None where flash_attn_func runs the entry's own config for its
    shape (its keys and its grid, on `sm_count` SMs, an H200's 132 where not told), the entry's
    config otherwise (the small shapes a score budget allows sit in the small grids' band, so a
    full grid's entry is called directly)."""
    grid = tiles_per_sm(batch, nheads, seqlen_q, sm_count or H100_SM_COUNT)
    dispatched = select_config("sm_90", entry.head_dim, entry.causal, seqlen_k, grid) == entry.config
    return None if dispatched and not direct else entry.config


def _tile_count_shape(draw, entry: Entry, near_k: list[int], sm_count: int, budget: int):
    """(batch, seqlen_q, seqlen_k, nheads, nheads_kv) whose work tiles number one less than, as
    many as, or one more than a whole number of the persistent grid's rounds; None if no such
    shape fits the score budget."""
    block_m = entry.config.block_m
    tiles = draw(st.sampled_from(tile_counts_near_grid(sm_count)))
    q_blocks, heads_times_batch = draw(st.sampled_from(factor_pairs(tiles, most_first=4)))
    keys = [n for n in near_k if heads_times_batch * n <= budget]
    if not keys:
        return None
    seqlen_k = draw(st.sampled_from(keys))
    # The last query block full, or holding one row, or cut SIDE short.
    rows = [q_blocks * block_m - step for step in range(SIDE + 1)] + [(q_blocks - 1) * block_m + 1]
    rows = [n for n in rows if n >= 1 and heads_times_batch * n * seqlen_k <= budget]
    if not rows:
        return None
    seqlen_q = draw(st.sampled_from(rows))
    batch, nheads = draw(st.sampled_from(factor_pairs(heads_times_batch, most_first=3)))
    nheads_kv = draw(st.sampled_from(sorted({1, nheads})))
    return batch, seqlen_q, seqlen_k, nheads, nheads_kv


# {distribution: softmax_scale (None: head_dim^-0.5)}. unit_steps' steps of 1.0 are 23 in log2
# units at 16, past STALE_SUM_LIMIT's 12: each leaves the stale max, through the rescale.
HARD_SCORES = {"jumping_scores": None, "large_logits": None, "unit_steps": 16.0}


def hard_score_cases(build: dict, distribution: str) -> list[Case]:
    """The hard-scores cases of a sweep build: 600 x 600, and its longer query length against
    three K/V tiles and a key (test_boundary_sweep.py's smoke tier and tools/bitwise_sweep.py)."""
    config, causal, head_dim = build["config"], build["causal"], build["head_dim"]
    shapes = ((600, 600), (sweep_seqlens_q(config)[-1], 3 * config.block_n + 1))
    scale = HARD_SCORES[distribution]
    return [
        Case(1, seqlen_q, seqlen_k, SWEEP_HEADS, SWEEP_HEADS_KV, head_dim, "float16", causal, scale, distribution, 7)
        for seqlen_q, seqlen_k in shapes
    ]


def sinks_for(nheads: int, seed: int, device: str = "cuda") -> torch.Tensor:
    """Sinks of either sign, some far above every score (the sink takes most of the row)."""
    sinks = torch.randn(nheads, generator=torch.Generator().manual_seed(seed)) * 3
    sinks[0] = 20.0
    return sinks.to(device)
