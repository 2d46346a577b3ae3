"""The TileLang kernel on a GPU, against the fp32 reference, on a fixed grid of shapes.

The bound is flash-attn's: at most twice the error of the same computation done by PyTorch
in the input dtype, plus one rounding of the output (see fa_kernel.reference). The
property suite (test_properties.py) draws hundreds more cases; these are the named ones.
"""

from __future__ import annotations

import math

import pytest
import torch
from suite.builds import CONSUMER_SCHEDULES, PERSISTENT_GRID, PERSISTENT_SCHEDULES, WARPGROUP_SCHEDULES
from suite.launch import device_arch, run_config
from suite.strategies import Case

from fa_kernel import flash_attn_func
from fa_kernel.configs import grid_bands, key_ranges, tiles_per_sm
from fa_kernel.interface import serving_build, tile_config_for
from fa_kernel.kernel import compiled_forward
from fa_kernel.reference import judge, random_qkv

pytestmark = pytest.mark.gpu


def assert_matches_reference(q, k, v, causal, softmax_scale=None):
    out, lse = flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal, return_lse=True)
    verdict = judge(q, k, v, out, lse, causal, softmax_scale)
    assert verdict.passed, str(verdict)
    return out, lse


def assert_matches_reference_by_batch(q, k, v, causal, scores_per_judge=2**26):
    """assert_matches_reference with the judge given a few batch elements at a time (each its
    own attention problem): its fp32 [b, h, q, k] temporaries for a whole grid band's batch
    would outgrow a test worker's share of the GPU (conftest's memory fraction)."""
    out, lse = flash_attn_func(q, k, v, causal=causal, return_lse=True)
    step = max(1, scores_per_judge // (q.shape[1] * q.shape[2] * k.shape[1]))
    for start in range(0, q.shape[0], step):
        part = slice(start, start + step)
        verdict = judge(q[part], k[part], v[part], out[part], lse[part], causal)
        assert verdict.passed, f"batch elements {start} to {min(start + step, q.shape[0]) - 1}: {verdict}"


# (batch, seqlen_q, seqlen_k, nheads, nheads_kv) that reach every branch of the loop: ragged
# lengths, GQA, Sq > Sk rows that see no key (causal), a single row and key.
LOOP_SHAPES = [(2, 257, 300, 4, 2), (1, 300, 77, 2, 1), (1, 1, 1, 1, 1)]


def assert_kernel_matches_reference(kernel, head_dim, causal, label, shapes=LOOP_SHAPES):
    """A compiled kernel, called directly, on `shapes` (batch, seqlen_q, seqlen_k, nheads, nheads_kv)."""
    for batch, seqlen_q, seqlen_k, nheads, nheads_kv in shapes:
        q, k, v = random_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, torch.float16, seed=seqlen_q)
        out, lse = run_config(q, k, v, 1 / math.sqrt(head_dim), causal, config=None, kernel=kernel)
        verdict = judge(q, k, v, out, lse, causal)
        assert verdict.passed, f"{label}, {batch}x{seqlen_q}x{seqlen_k}x{nheads}/{nheads_kv}: {verdict}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen", [1, 127, 129, 1000, 4097])
def test_matches_reference_head_dim_128(seqlen, causal, dtype):
    batch, nheads = (2, 4) if seqlen < 4096 else (1, 2)
    assert_matches_reference(*random_qkv(batch, seqlen, seqlen, nheads, nheads, 128, dtype, seed=seqlen), causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 256])
@pytest.mark.parametrize("seqlen", [65, 1000])
def test_matches_reference_other_head_dims(seqlen, head_dim, causal, dtype):
    assert_matches_reference(*random_qkv(2, seqlen, seqlen, 4, 4, head_dim, dtype, seed=head_dim), causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("group", [1, 2, 4, 8, 16], ids=lambda g: f"group{g}")
@pytest.mark.parametrize(
    ("seqlen_q", "seqlen_k"), [(113, 203), (128, 217), (1, 239), (799, 3), (1023, 1024), (1024, 1023), (300, 2000)]
)
def test_gqa_and_unequal_lengths(seqlen_q, seqlen_k, group, causal):
    nheads_kv = 16 // group
    q, k, v = random_qkv(2, seqlen_q, seqlen_k, 16, nheads_kv, 128, torch.bfloat16, seed=seqlen_q + group)
    assert_matches_reference(q, k, v, causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("head_dim", "config"), CONSUMER_SCHEDULES)
def test_every_consumer_schedule(head_dim, config, causal):
    # The tuned table runs two warpgroups in ping-pong (d128, d256) and three, in a ring or
    # free (d64); these configs cover the one-warpgroup path, ping-pong on power-of-two tiles,
    # the ring with a single K/V stage (producer and consumers share each buffer), both
    # free-running counts, the short-sequence configs (two blocks per SM, halved registers),
    # and Sq > Sk rows with no key.
    kernel = compiled_forward(head_dim=head_dim, causal=causal, dtype="float16", config=config, arch=device_arch())
    assert_kernel_matches_reference(kernel, head_dim, causal, label=str(config))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("head_dim", "config"), PERSISTENT_SCHEDULES)
def test_persistent_thread_blocks_walk_several_tiles(head_dim, config, causal):
    # A grid of 5 thread blocks over 1..24 work tiles: each block carries its K/V ring,
    # mbarrier phases and turn order from one tile into the next (an odd number of K/V tiles
    # per work tile flips the phases), reloads Q only after its last Q.K^T of the tile,
    # takes its place in the odd rounds from the other end (snake order), and the tiles do not
    # divide evenly over 5 blocks (a last, partial round). With overlap_epilogue the next
    # tile's first Q.K^T, and its mask (causal: another q_start), are issued under this
    # tile's epilogue. O leaves through the V ring (128x176 at d128, the overlapped epilogue) or
    # a buffer of its own, from which each warpgroup stores its rows without waiting for the
    # others (kernel.own_output_buffer), so one may start the next tile while another finishes.
    kernel = compiled_forward(
        head_dim=head_dim, causal=causal, dtype="float16", config=config, arch=device_arch(), sm_count=PERSISTENT_GRID
    )
    assert_kernel_matches_reference(kernel, head_dim, causal, label=f"{config}, grid of 5")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("head_dim", "config", "sm_count"), WARPGROUP_SCHEDULES)
def test_warpgroups_visit_only_the_key_tiles_their_rows_see(head_dim, config, sm_count, causal):
    # Causal, a consumer warpgroup's rows see fewer K/V tiles than the block's last rows, and
    # the last query block's warpgroups whose rows are all past seqlen_q see none: each visits
    # its own (kernel.warpgroup_kv_blocks) and releases the block's other tiles unread, passing
    # its turn on. 704 rows in blocks of 192 (128) leave the last block's third (second)
    # warpgroup past the end with five K/V tiles to release, more than the ring has stages, so
    # their phases wrap; against 704 and 1000 keys the warpgroups' rows straddle K/V tile
    # boundaries at two diagonal offsets; a grid of 5 carries all of it across work tiles.
    kernel = compiled_forward(
        head_dim=head_dim, causal=causal, dtype="float16", config=config, arch=device_arch(), sm_count=sm_count
    )
    shapes = [(1, 704, 704, 2, 2), (2, 704, 1000, 4, 1)]
    assert_kernel_matches_reference(kernel, head_dim, causal, label=f"{config}, grid of {sm_count}", shapes=shapes)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("table", ["short_table", "long_table"])
def test_scores_that_jump_between_key_tiles(table, head_dim, causal, dtype):
    # A tile's exponentials start from the max before it. The tiles that hold a jump must
    # recompute S against their own max and rescale acc_o; the ones after them may keep the new
    # max (strategies.JUMP_LOG2): both paths, in one row, one after the other. Every config
    # of the case (configs.key_ranges), each at a length it serves: their schedules differ
    # (persistent, the overlapped epilogue, the ring of three warpgroups).
    *short_ranges, (long_fewest, _, _) = key_ranges("sm_90", head_dim, causal)
    if table == "short_table":  # 1000 keys into each short-sequence entry's range (none: 1000)
        lengths = [fewest + 1000 for fewest, _, _ in short_ranges] or [1000]
        assert all(fewest + 1000 <= most for fewest, most, _ in short_ranges)
    else:  # 952 keys past the last short-sequence entry (none: past 2048)
        lengths = [max(long_fewest - 1, 2048) + 952]
    for seqlen in lengths:
        case = Case(2, seqlen, seqlen, 4, 2, head_dim, dtype, causal, None, "jumping_scores", seed=head_dim)
        assert_matches_reference(*case.inputs("cuda"), causal)


# Each small-grid band's limit and the next band's first grid (configs.TUNED_GRIDS), each with
# the band's shortest keys and the longest entry's: (head_dim, causal, band, side).
GRID_LIMITS = [
    (head_dim, causal, band, side)
    for head_dim, causal in ((64, True), (128, True), (64, False), (128, False))
    for band in range(len(grid_bands("sm_90", head_dim, causal)) - 1)
    for side in ("at", "past")
]


@pytest.mark.parametrize(("head_dim", "causal", "band", "side"), GRID_LIMITS)
def test_a_grid_bands_limit_and_one_tile_past_it_run_their_own_configs(head_dim, causal, band, side):
    device = torch.device("cuda")
    sm_count = torch.cuda.get_device_properties(device).multi_processor_count
    bands = grid_bands("sm_90", head_dim, causal)
    most, ranges = bands[band]
    tiles = math.floor(most * sm_count) + (side == "past")
    served = ranges if side == "at" else bands[band + 1][1]
    heads = max(h for h in range(1, 17) if tiles % h == 0)
    batch, seqlen_q = tiles // heads, 100  # one work tile of GRID_ROWS rows per (batch, head)
    for fewest, most_keys, config in (served[0], served[-1]):
        seqlen_k = most_keys if most_keys is not None else fewest + 1
        grid = tiles_per_sm(batch, heads, seqlen_q, sm_count)
        assert tile_config_for(device, head_dim, causal, seqlen_k, grid) == config
        # One K/V head (MQA): the grid counts query heads, and the keys of thousands of work
        # tiles would otherwise hold GiBs.
        q, k, v = random_qkv(batch, seqlen_q, seqlen_k, heads, 1, head_dim, torch.bfloat16, seed=tiles)
        assert_matches_reference_by_batch(q, k, v, causal)


def test_rows_that_see_no_key_are_zero_with_lse_minus_inf():
    q, k, v = random_qkv(2, 300, 100, 4, 2, 64, torch.float16)
    out, lse = assert_matches_reference(q, k, v, causal=True)
    assert torch.all(out[:, :200] == 0) and torch.all(lse[:, :, :200] == -math.inf)
    assert torch.isfinite(out).all() and torch.isfinite(lse[:, :, 200:]).all()


@pytest.mark.parametrize("softmax_scale", [0.01, 0.5, 3.0])
def test_softmax_scale(softmax_scale):
    assert_matches_reference(*random_qkv(1, 333, 333, 2, 2, 128, torch.float16), True, softmax_scale)


def test_packed_qkv_slices_give_the_same_result():
    qkv = torch.randn(2, 257, 3, 8, 128, device="cuda", dtype=torch.float16)
    q, k, v = qkv.unbind(dim=2)
    assert not q.is_contiguous()
    out = flash_attn_func(q, k, v, causal=True)
    assert torch.equal(out, flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), causal=True))


@pytest.mark.parametrize(("batch", "seqlen_q", "seqlen_k"), [(0, 10, 10), (2, 0, 10), (2, 10, 0)])
def test_empty_inputs(batch, seqlen_q, seqlen_k):
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, 4, 4, 64, torch.float16)
    out, lse = flash_attn_func(q, k, v, return_lse=True)
    assert out.shape == q.shape and lse.shape == (batch, 4, seqlen_q)
    assert torch.all(out == 0) and torch.all(lse == -math.inf)  # vacuous where empty


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_output_element_is_written(causal):
    # Fill the caching allocator's free memory with NaN: an element the kernel skips stays NaN.
    poison = torch.full((64 << 20,), math.nan, device="cuda")
    del poison
    # 9 query blocks x 8 heads x 3 = 216 work tiles: more than an H100/H200 has SMs, so a
    # persistent config walks two rounds, the second one partial.
    q, k, v = random_qkv(3, 1031, 1031, 8, 4, 128, torch.float16)
    out, lse = flash_attn_func(q, k, v, causal=causal, return_lse=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    verdict = judge(q, k, v, out, lse, causal=causal)
    assert verdict.passed, str(verdict)


def test_one_compile_serves_every_length_batch_and_head_count():
    # Lengths, batch and heads are launch arguments, not compile-time constants: calls that the
    # tables give one config (one grid band, one key range) share one kernel. Every case runs
    # the forward kernel (none is a decode step for the split-KV kernels), the first one included.
    cases = [(1, 200, 10, 2, 2), (1, 129, 1, 1, 1), (3, 999, 17, 8, 2), (2, 4097, 300, 6, 3)]
    builds = [
        serving_build(torch.device("cuda"), 128, False, torch.float16, batch, seqlen_q, seqlen_k, heads, heads_kv)
        for batch, seqlen_q, seqlen_k, heads, heads_kv in cases
    ]
    assert all(builder is None and build == builds[0][1] for builder, build in builds), builds
    flash_attn_func(*random_qkv(*cases[0], 128, torch.float16))
    misses = compiled_forward.cache_info().misses
    for batch, seqlen_q, seqlen_k, nheads, nheads_kv in cases[1:]:
        flash_attn_func(*random_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_kv, 128, torch.float16))
    assert compiled_forward.cache_info().misses == misses


def test_torch_compile_traces_without_graph_breaks():
    q, k, v = random_qkv(2, 257, 300, 8, 2, 128, torch.bfloat16)

    def layer(q, k, v):
        # Only exact arithmetic around the op, so compiled and eager must agree bitwise.
        return flash_attn_func(q * 2, k, v, causal=True) * 4

    explanation = torch._dynamo.explain(layer)(q, k, v)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert torch.equal(torch.compile(layer, fullgraph=True)(q, k, v), layer(q, k, v))


def test_custom_op_passes_opcheck():
    q, k, v = random_qkv(2, 129, 200, 4, 2, 64, torch.float16)
    torch.library.opcheck(torch.ops.fa_kernel.forward.default, (q, k, v, 0.125, True))
