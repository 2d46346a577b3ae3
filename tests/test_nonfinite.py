"""NaN and Inf inputs, on the tile emulator (CPU) and the kernel (GPU): which rows of the
output and LSE they reach (docs/nonfinite.md).

A NaN put into one element of q, K or V must reach exactly the rows the rules name, and leave
every other element bitwise as the clean run has it. Which rows a key reaches depends on the
K/V tiles each row's scores are computed for, since the kernel writes the mask into the score
accumulator before Q.K^T adds to it: `kv_tiles_computed` restates the kernel's rules for that
(and the emulator's, which computes a whole query block's tiles for each of its rows). NaN and
Inf inputs placed where those rules and the fp32 reference agree are judged against the
reference (`reference.judge`), which defines what they give.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fa_kernel import flash_attn_func
from fa_kernel.configs import TileConfig, select_config
from fa_kernel.emulator import attention_tiled
from fa_kernel.interface import tile_config_for
from fa_kernel.numerics import STALE_SUM_LIMIT
from fa_kernel.reference import judge, visible_keys
from tests.properties import assert_same
from tests.shards import shard_examples, shard_params

# Neither a multiple of any block size the kernel runs with (64, 128, 176, 192) nor, paired,
# equal: partial query blocks, partial K/V tiles and causal diagonals off the tile grid.
LENGTHS = (1, 3, 63, 65, 100, 129, 150, 200, 257)
NHEADS, NHEADS_KV = 4, 2  # GQA: query heads 2h and 2h + 1 read K/V head h


@dataclass(frozen=True)
class Target:
    """An implementation under test, and whether each consumer warpgroup computes scores only
    for its own rows' K/V tiles (the kernel) or every row for its query block's (the emulator)."""

    attend: Callable[..., tuple[torch.Tensor, torch.Tensor]]  # (q, k, v, causal) -> (out, lse)
    device: str
    per_warpgroup: bool

    def config(self, head_dim: int, causal: bool, seqlen_k: int) -> TileConfig:
        if self.device == "cpu":
            return select_config("sm_90", head_dim, causal, seqlen_k)  # attention_tiled's default
        return tile_config_for(torch.device(self.device), head_dim, causal, seqlen_k)


TARGETS = {
    "emulator": Target(lambda q, k, v, causal: attention_tiled(q, k, v, causal=causal), "cpu", per_warpgroup=False),
    "kernel": Target(
        lambda q, k, v, causal: flash_attn_func(q, k, v, causal=causal, return_lse=True), "cuda", per_warpgroup=True
    ),
}
TARGET_PARAMS = [pytest.param("emulator"), pytest.param("kernel", marks=pytest.mark.gpu)]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def kv_tiles_computed(
    config: TileConfig, seqlen_q: int, seqlen_k: int, causal: bool, per_warpgroup: bool
) -> torch.Tensor:
    """[seqlen_q]: how many K/V tiles, from the first, each row's scores are computed for.

    The query block's tiles (kernel.work_tile): causal, up to the one holding the last visible
    key of the block's last row, at least one. In the kernel each consumer warpgroup computes
    only those its own rows see (kernel.warpgroup_kv_blocks), except under the overlapped
    epilogue; the emulator computes the block's for every row."""
    block_m, block_n = config.block_m, config.block_n
    offset = seqlen_k - seqlen_q
    all_tiles = ceil_div(seqlen_k, block_n)
    group = block_m
    if per_warpgroup and not config.overlap_epilogue:
        group = block_m // (config.threads // 128)
    tiles = []
    for row in range(seqlen_q):
        if not causal:
            tiles.append(all_tiles)
            continue
        q_start = row // block_m * block_m
        block_tiles = max(1, min(all_tiles, ceil_div(q_start + block_m + offset, block_n)))
        if group == block_m:
            tiles.append(block_tiles)
            continue
        first_row = row // group * group
        last_visible = min(first_row + group, seqlen_q) + offset
        tiles.append(max(1, min(block_tiles, ceil_div(last_visible, block_n))))
    return torch.tensor(tiles)


def rows_reached(key: int, config: TileConfig, seqlen_q: int, seqlen_k: int, causal: bool, per_warpgroup: bool):
    """[seqlen_q] bool: the rows a NaN score at `key` reaches. Those that see the key, and those
    for which it is hidden but in a tile their scores are computed for: the mask there is -inf,
    to which Q.K^T adds the NaN."""
    computed = kv_tiles_computed(config, seqlen_q, seqlen_k, causal, per_warpgroup) > key // config.block_n
    return visible_keys(seqlen_q, seqlen_k, causal)[:, key] | computed


# The batch element that holds each tensor's NaN: one launch checks all three rules, each in an
# element of its own, which no other element's NaN can reach (work tiles never mix batches).
POISONED = ("q", "k", "v")


@dataclass(frozen=True)
class Poison:
    """One problem and one element each of q, K and V to poison (q in batch element 0, K in 1, V
    in 2); reproducible from its fields."""

    head_dim: int
    causal: bool
    seqlen_q: int
    seqlen_k: int
    row: int
    head: int  # a K/V head; q is poisoned in the first query head of its group, 2 * head
    key: int
    column: int
    seed: int

    def inputs(self, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Standard-normal fp16 q, k, v, drawn on the CPU: the same on every device."""
        gen = torch.Generator().manual_seed(self.seed)
        batch = len(POISONED)
        q = torch.randn(batch, self.seqlen_q, NHEADS, self.head_dim, generator=gen)
        k = torch.randn(batch, self.seqlen_k, NHEADS_KV, self.head_dim, generator=gen)
        v = torch.randn(batch, self.seqlen_k, NHEADS_KV, self.head_dim, generator=gen)
        return tuple(t.half().to(device) for t in (q, k, v))


@st.composite
def poisons(draw, head_dims: tuple[int, ...] = (64, 128)) -> Poison:
    seqlen_q = draw(st.sampled_from(LENGTHS))
    seqlen_k = draw(st.sampled_from([n for n in LENGTHS if n != seqlen_q]))
    head_dim = draw(st.sampled_from(head_dims))
    return Poison(
        head_dim=head_dim,
        causal=draw(st.booleans()),
        seqlen_q=seqlen_q,
        seqlen_k=seqlen_k,
        row=draw(st.integers(0, seqlen_q - 1)),
        head=draw(st.integers(0, NHEADS_KV - 1)),
        key=draw(st.integers(0, seqlen_k - 1)),
        column=draw(st.integers(0, head_dim - 1)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def rows_text(rows: torch.Tensor) -> str:
    """'0-63, 100' for a bool mask over rows."""
    picked = rows.nonzero().flatten().tolist()
    spans: list[list[int]] = []
    for row in picked:
        if spans and spans[-1][1] == row - 1:
            spans[-1][1] = row
        else:
            spans.append([row, row])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans) or "none"


def assert_nan_exactly(actual: torch.Tensor, clean: torch.Tensor, expected_nan: torch.Tensor, what: str) -> None:
    """NaN where `expected_nan`, and bitwise the clean run's value everywhere else."""
    got_nan = torch.isnan(actual)
    if not torch.equal(got_nan, expected_nan):
        wrong = got_nan != expected_nan
        raise AssertionError(
            f"{what}: NaN at {int(got_nan.sum())} elements, expected {int(expected_nan.sum())}; "
            f"{int(wrong.sum())} differ, first at {tuple(wrong.nonzero()[0].tolist())}"
        )
    assert_same(actual[~expected_nan], clean[~expected_nan], f"{what}, elements the NaN must not reach")


def clean_and_poisoned(target: Target, case: Poison):
    """(clean (out, lse), poisoned (out, lse)) on the CPU: a NaN put into q, K and V at the case's
    elements, each in its batch element (POISONED). Both runs' results are read back with one
    wait for the GPU: under pytest-xdist each wait also waits for the other workers' turns on
    the GPU, and an example is small."""
    q, k, v = case.inputs(target.device)
    clean_out, clean_lse = target.attend(q, k, v, case.causal)
    inputs = {"q": q.clone(), "k": k.clone(), "v": v.clone()}
    for batch, tensor in enumerate(POISONED):
        if tensor == "q":
            inputs["q"][batch, case.row, case.head * 2, case.column] = math.nan
        else:
            inputs[tensor][batch, case.key, case.head, case.column] = math.nan
    out, lse = target.attend(inputs["q"], inputs["k"], inputs["v"], case.causal)
    clean_out, clean_lse, out, lse = (t.to("cpu", non_blocking=True) for t in (clean_out, clean_lse, out, lse))
    if target.device != "cpu":
        torch.cuda.synchronize()  # the copies above are asynchronous
    assert torch.isfinite(clean_out).all(), "the clean run must be finite"
    return (clean_out, clean_lse), (out, lse)


# Named examples: a key hidden from some rows, in a tile the emulator computes for all of them
# and the kernel's first warpgroup skips (150 queries, 200 keys: warpgroup 0 of 64 rows sees
# keys up to 113, within the first tile of 128); a key in the first tile of rows that see no key.
HIDDEN_IN_A_COMPUTED_TILE = Poison(128, True, 150, 200, row=70, head=1, key=150, column=5, seed=1)
IN_THE_FIRST_TILE_OF_ROWS_WITHOUT_KEYS = Poison(64, True, 150, 65, row=10, head=0, key=10, column=63, seed=2)


def rows_computing_the_key(target, case):
    """(the config the target runs for the case, the rows whose scores include the poisoned key)."""
    config = target.config(case.head_dim, case.causal, case.seqlen_k)
    return config, rows_reached(case.key, config, case.seqlen_q, case.seqlen_k, case.causal, target.per_warpgroup)


def check_nan_reach(target: str, case: Poison) -> None:
    """The case's NaNs in q, K and V each reach exactly the elements its rule names, and leave
    every other element bitwise the clean run's:
    - q: its row only, also a row that sees no key (causal, Sq > Sk), which the reference leaves
      0: its scores in the first K/V tile, all hidden, are -inf + NaN;
    - K: the rows whose scores include its key, in both query heads of its K/V head;
    - V: P.V multiplies the key's weight, 0 where it is hidden, by the NaN, so its column of the
      same rows, less those that see no key (0 whatever acc_o holds); the LSE does not read V."""
    target_ = TARGETS[target]
    config, reached = rows_computing_the_key(target_, case)
    (clean_out, clean_lse), (out, lse) = clean_and_poisoned(target_, case)
    expected_out = torch.zeros_like(out, dtype=torch.bool)
    expected_lse = torch.zeros_like(lse, dtype=torch.bool)
    q_batch, k_batch, v_batch = (POISONED.index(tensor) for tensor in ("q", "k", "v"))
    expected_out[q_batch, case.row, case.head * 2] = True
    expected_lse[q_batch, case.head * 2, case.row] = True
    sees_a_key = visible_keys(case.seqlen_q, case.seqlen_k, case.causal).any(dim=1)
    for head in (case.head * 2, case.head * 2 + 1):  # the query heads of the poisoned K/V head
        expected_out[k_batch, reached, head] = True
        expected_lse[k_batch, head, reached] = True
        expected_out[v_batch, reached & sees_a_key, head, case.column] = True
    where = {
        "q": f"q[{case.row}, head {case.head * 2}]",
        "k": f"K at key {case.key} ({config}; expected rows {rows_text(reached)})",
        "v": f"V at key {case.key} ({config}; expected rows {rows_text(reached & sees_a_key)})",
    }
    for batch, tensor in enumerate(POISONED):
        what = f"NaN in {where[tensor]}, batch element {batch}"
        assert_nan_exactly(out[batch], clean_out[batch], expected_out[batch], f"output, {what}")
        assert_nan_exactly(lse[batch], clean_lse[batch], expected_lse[batch], f"LSE, {what}")


# On the GPU one test per head dim (shards.py); the kernel's d256 too, whose tiles are narrower.
NAN_SHARDS = {"emulator": [(64, 128)], "kernel": [(64,), (128,), (256,)]}


@pytest.mark.examples
@pytest.mark.parametrize(("target", "head_dims"), shard_params(NAN_SHARDS))
def test_a_nan_in_q_k_or_v_reaches_exactly_the_rows_its_rule_names(target, head_dims):
    @settings(max_examples=shard_examples(NAN_SHARDS, target))
    @given(case=poisons(head_dims))
    def holds(case):
        check_nan_reach(target, case)

    holds()


@pytest.mark.parametrize("target", TARGET_PARAMS)
@pytest.mark.parametrize(
    "case",
    [HIDDEN_IN_A_COMPUTED_TILE, IN_THE_FIRST_TILE_OF_ROWS_WITHOUT_KEYS],
    ids=["hidden-in-a-computed-tile", "in-the-first-tile-of-rows-without-keys"],
)
def test_named_nan_cases(target, case):
    check_nan_reach(target, case)


@pytest.mark.parametrize("target", TARGET_PARAMS)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rows_that_see_no_key_stay_zero(target, head_dim):
    # Causal, 300 queries over 200 keys: rows 0-99 see no key. Their output stays exactly 0 and
    # their LSE -inf with V NaN everywhere, q NaN in every other row, and K NaN past the tiles
    # their scores are computed for.
    target_ = TARGETS[target]
    seqlen_q, seqlen_k = 300, 200
    case = Poison(head_dim, True, seqlen_q, seqlen_k, row=0, head=0, key=0, column=0, seed=3)
    q, k, v = case.inputs(target_.device)
    dead = ~visible_keys(seqlen_q, seqlen_k, causal=True).any(dim=1)
    config = target_.config(head_dim, True, seqlen_k)
    first_free_key = int(kv_tiles_computed(config, seqlen_q, seqlen_k, True, target_.per_warpgroup)[dead].max())
    first_free_key *= config.block_n
    assert first_free_key < seqlen_k, "no key outside the tiles of the rows that see none: pick other lengths"
    q[:, ~dead.to(q.device)] = math.nan
    k[:, first_free_key:] = math.nan
    v.fill_(math.nan)
    out, lse = target_.attend(q, k, v, True)
    assert torch.all(out[:, dead.to(out.device)] == 0), "output of rows that see no key"
    assert torch.all(lse[:, :, dead.to(lse.device)] == -math.inf), "LSE of rows that see no key"


def place(tensor: torch.Tensor, value: float, index: tuple[int, ...]) -> torch.Tensor:
    tensor = tensor.clone()
    tensor[index] = value
    return tensor


@pytest.mark.parametrize("target", TARGET_PARAMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("tensor", ["q", "k", "v"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "+inf", "-inf"])
def test_nonfinite_inputs_follow_the_reference(target, value, tensor, head_dim, causal):
    # Where the kernel's rules and the reference's agree: q in the last row, which sees every
    # key (an Inf there meets K of both signs: +inf scores, a NaN row); K and V at key 0, which
    # every row sees. (A non-finite K at a hidden key, or V at one, reaches rows the reference
    # keeps finite or makes NaN: the NaN tests above cover those.)
    target_ = TARGETS[target]
    seqlen_q, seqlen_k = 150, 200
    q, k, v = Poison(head_dim, causal, seqlen_q, seqlen_k, 0, 0, 0, 0, seed=4).inputs(target_.device)
    if tensor == "q":
        q = place(q, value, (0, seqlen_q - 1, 1, 7))
    elif tensor == "k":
        k = place(k, value, (0, 0, 1, 7))
    else:
        v = place(v, value, (0, 0, 1, 7))
    out, lse = target_.attend(q, k, v, causal)
    verdict = judge(q, k, v, out, lse, causal)
    assert verdict.passed, str(verdict)
    assert not torch.isfinite(out).all(), "the non-finite input should reach the output"


@pytest.mark.parametrize("target", TARGET_PARAMS)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_a_row_whose_first_tile_is_all_minus_inf_keeps_every_later_tile(target, head_dim):
    # Row 0's scores are -inf on the whole first K/V tile (q > 0 against keys of -inf in one
    # dimension); on the second their sum stays within STALE_SUM_LIMIT (so the row keeps its
    # max, -inf, with 0 standing in for it); on the third it passes the limit (the max moves),
    # with about as much weight as the second. Moving the max must rescale what the second tile
    # added against the stand-in, not drop it.
    impl = TARGETS[target]
    config = impl.config(head_dim, False, 600)
    block_n = config.block_n
    seqlen_k = 3 * block_n
    q = torch.zeros(1, 1, NHEADS, head_dim)
    k = torch.zeros(1, seqlen_k, NHEADS_KV, head_dim)
    v = torch.randn(1, seqlen_k, NHEADS_KV, head_dim, generator=torch.Generator().manual_seed(0))
    q[..., 0], q[..., 1] = 1.0, 1.0
    k[:, :block_n, :, 0] = -math.inf
    limit = math.log(STALE_SUM_LIMIT / block_n)  # a tile of equal scores at this sums to the limit
    k[:, block_n : 2 * block_n, :, 1] = (limit - 0.2) * math.sqrt(head_dim)
    k[:, 2 * block_n :, :, 1] = (limit + 0.2) * math.sqrt(head_dim)
    q, k, v = (t.to(torch.bfloat16).to(impl.device) for t in (q, k, v))
    out, lse = impl.attend(q, k, v, False)
    verdict = judge(q, k, v, out, lse, False)
    assert verdict.passed, str(verdict)


# ---- the variants' arguments (docs/nonfinite.md, "Windows, softcap and sinks") ----

ATTEND_WITH = {
    "emulator": lambda q, k, v, causal, **variants: attention_tiled(q, k, v, causal=causal, **variants),
    "kernel": lambda q, k, v, causal, **variants: flash_attn_func(q, k, v, causal=causal, return_lse=True, **variants),
}


def variant_inputs(target: str, seqlen_q: int = 100, seqlen_k: int = 200, head_dim: int = 64):
    generator = torch.Generator().manual_seed(seqlen_q)
    q = torch.randn(1, seqlen_q, NHEADS, head_dim, generator=generator)
    k = torch.randn(1, seqlen_k, NHEADS_KV, head_dim, generator=generator)
    v = torch.randn(1, seqlen_k, NHEADS_KV, head_dim, generator=generator)
    return (t.to(torch.bfloat16).to(TARGETS[target].device) for t in (q, k, v))


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_a_sink_of_minus_inf_is_no_sink_bitwise(target):
    q, k, v = variant_inputs(target)
    attend = ATTEND_WITH[target]
    sinks = torch.full((NHEADS,), -math.inf, device=q.device)
    out, lse = attend(q, k, v, False, window_size=(50, -1), sinks=sinks)
    plain_out, plain_lse = attend(q, k, v, False, window_size=(50, -1))
    assert_same(out, plain_out, "out")
    assert_same(lse, plain_lse, "lse")


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_a_sink_of_inf_or_nan_makes_its_heads_rows_nan_and_leaves_the_others(target):
    q, k, v = variant_inputs(target)
    attend = ATTEND_WITH[target]
    out, lse = attend(q, k, v, False, sinks=torch.tensor([0.5, math.inf, math.nan, -1.0], device=q.device))
    clean_out, clean_lse = attend(q, k, v, False, sinks=torch.tensor([0.5, 0.0, 0.0, -1.0], device=q.device))
    assert out[:, :, 1:3].isnan().all() and lse[:, 1:3].isnan().all()
    for head in (0, 3):
        assert torch.equal(out[:, :, head], clean_out[:, :, head]) and torch.equal(lse[:, head], clean_lse[:, head])


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_under_a_softcap_an_infinite_score_is_capped_and_the_row_stays_finite(target):
    # k[60, 0] = +inf gives every row a score of +-inf at key 60 (q[..., 0] is never 0): the cap
    # makes it +-softcap, as the reference does, and the row is judged like any other.
    q, k, v = variant_inputs(target)
    k[:, 60, :, 0] = math.inf
    q[..., 0] = torch.where(q[..., 0] == 0, 1.0, q[..., 0].float()).to(q.dtype)
    out, lse = ATTEND_WITH[target](q, k, v, True, softcap=5.0)
    assert out.isfinite().all() and lse.isfinite().all()
    verdict = judge(q, k, v, out, lse, True, softcap=5.0)
    assert verdict.passed, str(verdict)


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_under_a_softcap_a_nan_key_reaches_only_the_rows_that_see_it(target):
    # The mask is a select after the cap: a NaN at a key hidden from a row stays out of it, even
    # in a tile the row computes (without a cap the additive mask lets it in, rule 2).
    q, k, v = variant_inputs(target)
    attend = ATTEND_WITH[target]
    clean_out, clean_lse = attend(q, k, v, True, softcap=30.0, window_size=(20, -1))
    k[:, 150, 1, 3] = math.nan
    out, lse = attend(q, k, v, True, softcap=30.0, window_size=(20, -1))
    sees = visible_keys(100, 200, True, device=q.device, window_size=(20, -1))[:, 150]  # rows 50..70
    for head in range(NHEADS):
        rows = sees if head // (NHEADS // NHEADS_KV) == 1 else torch.zeros_like(sees)
        assert out[0, rows, head].isnan().all() and lse[0, head, rows].isnan().all()
        assert torch.equal(out[0, ~rows, head], clean_out[0, ~rows, head])
        assert torch.equal(lse[0, head, ~rows], clean_lse[0, head, ~rows])
