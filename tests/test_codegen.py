"""Compile-only checks: the kernel builds for Hopper (sm_90a) with nvcc alone, no GPU needed,
and the generated CUDA takes the Hopper paths the design depends on."""

from __future__ import annotations

import itertools
import re

import pytest
from tools.codegen_rules import (  # noqa: E402
    broken_rules,
    bulk_source_rewritten_in_flight,
    misaligned_tma_destinations,
    outstanding_at_exit,
)

from fa_kernel.configs import TileConfig, key_ranges, select_config
from fa_kernel.interface import SUPPORTED_HEAD_DIMS
from fa_kernel.kernel import PRODUCER_THREADS, compiled_forward, own_output_buffer

pytestmark = pytest.mark.compile


# Every config the table ships, each at the most keys it serves (None: the long entry), with
# the dtypes taking turns so that both are compiled for every head_dim.
SHIPPED_CASES = pytest.mark.parametrize(
    ("head_dim", "causal", "dtype", "seqlen_k"),
    [
        (head_dim, causal, ("float16", "bfloat16")[(index + entry) % 2], most)
        for index, (head_dim, causal) in enumerate(itertools.product(SUPPORTED_HEAD_DIMS, (False, True)))
        for entry, (_, most, _) in enumerate(key_ranges("sm_90", head_dim, causal))
    ],
)


CUDA_SM90A = {"kind": "cuda", "arch": "sm_90a"}


def shipped_source(head_dim, causal, dtype, seqlen_k):
    """The tuned config of this case and its generated CUDA."""
    config = select_config("sm_90", head_dim, causal, seqlen_k)
    kernel = compiled_forward(head_dim=head_dim, causal=causal, dtype=dtype, config=config, arch="sm_90a")
    return config, kernel.get_kernel_source()


@SHIPPED_CASES
def test_compiles_for_sm90a_with_hopper_instructions(head_dim, causal, dtype, seqlen_k):
    config, source = shipped_source(head_dim, causal, dtype, seqlen_k)
    threads = config.threads + PRODUCER_THREADS
    assert f"__launch_bounds__({threads}, {config.blocks_per_sm})" in source, "registers for blocks_per_sm blocks"
    assert "wgmma" in source, "Q.K^T and P.V should be warpgroup MMAs on Hopper"
    assert "tma_load" in source or "cp.async" in source, "K/V tiles should arrive by TMA or cp.async"
    assert "exp2" in source, "softmax should use exp2 with log2(e) folded into the scale"
    # Lengths, batch and head counts are kernel arguments, not constants: one build serves all.
    signature = re.search(r"__global__ void __launch_bounds__\([^)]*\) (\w+)\(([^)]*)\)", source)
    assert signature, "kernel signature not found"
    for name in ("batch", "seqlen_q", "seqlen_k", "heads", "heads_kv", "scale_log2"):
        assert re.search(rf"\b{name}\b", signature.group(2)), f"{name} should be a runtime argument"


@SHIPPED_CASES
def test_nothing_asynchronous_outlives_the_block(head_dim, causal, dtype, seqlen_k):
    # A wgmma or TMA store still reading shared memory when the block exits reads the memory
    # of the block the SM runs next: no output shows it, so the code is checked
    # (tools/codegen_rules.py). The mutant runner's triage applies the same rule to each mutant.
    # Nor is O's shared tile written again while a TMA store still reads it, and every TMA
    # tensor copy's shared side stays 128-byte aligned (codegen_rules.BUILD_RULES).
    _, source = shipped_source(head_dim, causal, dtype, seqlen_k)
    assert broken_rules(source) == []


# The other kernels, each head dim once, causal or not in turn (the rule is about their structure).
@pytest.mark.parametrize(
    ("family", "head_dim", "causal"),
    [
        ("backward", 64, True),
        ("backward", 128, False),
        ("deterministic backward", 128, True),
        ("backward", 256, True),
        ("deterministic backward", 256, False),
        ("decode", 64, False),
        ("decode", 128, True),
        ("decode", 256, False),
        ("decode 16 rows", 64, True),
        ("decode 16 rows", 128, False),
    ],
)
def test_nothing_asynchronous_outlives_the_backward_and_decode_blocks(family, head_dim, causal):
    from fa_kernel.backward import compiled_gradient_kernels
    from fa_kernel.decode import compiled_decode_kernels

    arguments = dict(head_dim=head_dim, causal=causal, dtype="bfloat16", arch="sm_90a")
    if family.startswith("decode"):
        kernels = compiled_decode_kernels(**arguments, block_m=16 if family.endswith("rows") else 64)
    else:
        kernels = compiled_gradient_kernels(**arguments, deterministic=family.startswith("deterministic"))
    for compiled in filter(None, kernels):
        # The backward's dQ tile: added by a bulk store whose read is waited for a step later...
        assert broken_rules(compiled.get_kernel_source()) == []
        # ...by a thread that computes no integer division on the way (the step's head and row
        # are registers): recomputed there, they held both warpgroups' next step.
        source = compiled.get_kernel_source()
        if "tma_store_add" in source:
            add = source.index("tl::tma_store_add")
            issue = source[source.rindex("tl_shuffle_elect", 0, add) : add]
            assert not re.search(r"[/%]", issue), issue


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_the_rewrite_rule_sees_the_backwards_deferred_wait_dropped(head_dim):
    # dQ's tile is staged in shared memory and added by a bulk reduce-add, whose read of it is
    # waited for just before the next step writes it: without that wait the write races the
    # copy, which no gradient shows (a step's work lies between them).
    from fa_kernel.backward import compiled_backward

    source = compiled_backward(head_dim=head_dim, causal=False, dtype="bfloat16", arch="sm_90a").get_kernel_source()
    wait = "tl::tma_store_wait<0, true>();"
    first = source.index(wait)
    assert first < source.rindex(wait), "a wait in the walk and one after it"
    (problem,) = bulk_source_rewritten_in_flight(source[:first] + source[first + len(wait) :])
    assert "dQ_shared" in problem and "before a wait" in problem


@pytest.mark.parametrize("head_dim", [128, 256])
def test_the_gradient_operands_pass_through_shared_memory_where_a_warpgroup_holds_part_of_a_row(head_dim):
    # Pᵀ and dSᵀ enter dV's and dK's GEMMs from registers where each warpgroup holds whole rows of
    # them (128 keys on two warpgroups); on head_dim 256's 64 keys, from shared memory.
    from fa_kernel.backward import BACKWARD_TILES, compiled_gradient_kernels
    from fa_kernel.gradient_parts import WGMMA_ROWS

    kernels = compiled_gradient_kernels(head_dim=head_dim, causal=True, dtype="bfloat16", arch="sm_90a")
    source = kernels[1].get_kernel_source()
    in_shared = BACKWARD_TILES[head_dim][1] < 2 * WGMMA_ROWS
    assert ("P_shared" in source) == in_shared and "dS_shared" in source
    assert in_shared == (head_dim == 256), "each side of the condition at one shipped head_dim"


def test_a_left_window_without_causal_lowers_where_the_gradient_operands_pass_through_shared_memory():
    # The walk's last query tile (a left window's edge) once left TileLang's ThreadSync a thread
    # range of 225 at head_dim 256 ("cannot lower a required shared-memory sync inside a divergent
    # region"): every such build, with or without dQ, failed to compile; later the softcap's mask
    # on the step's row register did so again. Lowered alone (no nvcc).
    import tvm
    from tilelang.engine.lower import lower

    from fa_kernel.backward import BACKWARD_TILES, backward_program
    from fa_kernel.toolchain import FAST_MATH
    from fa_kernel.variants import Variants

    block_m, block_n, stages = BACKWARD_TILES[256]
    program = backward_program(
        head_dim=256, causal=False, dtype="bfloat16", block_m=block_m, block_n=block_n, num_stages=stages,
        variants=Variants(window_left=True, softcap=True),
    )  # fmt: skip
    with tvm.transform.PassContext(opt_level=3, config=FAST_MATH), tvm.target.Target(CUDA_SM90A):
        assert "P_shared" in lower(program, target=tvm.target.Target(CUDA_SM90A)).kernel_source


def test_a_ragged_gradient_reads_its_row_statistics_as_a_batched_one_and_budgets_its_registers():
    # Each sequence's Delta and LSE₂ rows start aligned (backward_preprocess.statistics_start), so
    # a query tile's TMA box starts 16-byte aligned (an unaligned one faults: "illegal
    # instruction") and the consumers read the rows two floats at a time, as a batched launch's
    # do (from a box at the packed rows, shifted per tile, they were read one at a time).
    # Its warpgroups get setmaxnreg budgets, which TileLang leaves out of this build by itself.
    from fa_kernel.backward import compiled_backward

    pairs = re.compile(r"\*\(float2\*\)\(\(\(float\*\)(lse|delta)\) \+")
    for varlen in (False, True):
        source = compiled_backward(
            head_dim=64, causal=False, dtype="bfloat16", arch="sm_90a", varlen=varlen
        ).get_kernel_source()
        assert {match.group(1) for match in pairs.finditer(source)} == {"lse", "delta"}, varlen
    assert "warpgroup_reg_dealloc<24>" in source and "warpgroup_reg_alloc<240>" in source


@pytest.mark.parametrize(
    ("family", "wait"),
    [
        ("forward", "tl::wait_wgmma<0>();"),
        ("forward", "tl::tma_store_wait<0, true>();"),
        ("decode", "tl::warpgroup_wait<0>();"),
    ],
)
def test_the_exit_rule_sees_the_last_wait_dropped(family, wait):
    # The forward's overlapped epilogue: its last wgmma wait ends the next tile's S_0, in flight
    # after the last round; its last TMA store wait ends O's store. The split-KV kernel's last
    # wait ends its last P.V (T.gemm's spelling of the wait).
    if family == "forward":
        _, source = shipped_source(128, False, "float16", None)
    else:
        from fa_kernel.decode import compiled_decode_kernels

        split, _ = compiled_decode_kernels(head_dim=128, causal=True, dtype="bfloat16", arch="sm_90a")
        source = split.get_kernel_source()
    assert outstanding_at_exit(source) == []
    last = source.rindex(wait)
    (problem,) = outstanding_at_exit(source[:last] + source[last + len(wait) :])
    assert "not waited for before the exit" in problem
    # A wait inside a branch opened after the operation does not count: it may not run.
    guarded = source[:last] + "if (threadIdx.x == 0) { " + wait + " }" + source[last + len(wait) :]
    assert outstanding_at_exit(guarded) == [problem]


def test_a_config_whose_output_tile_outgrows_the_v_ring_is_refused():
    # Where O has no room of its own (head_dim 256: Q and O alone take 192 KB), it is staged in
    # the V ring (num_stages * block_n rows) on its way out.
    config = TileConfig(192, 64, 1, 384)
    assert not own_output_buffer(256, config)
    with pytest.raises(ValueError, match=r"output tile \(192 rows\).*num_stages \* block_n = 64 rows"):
        compiled_forward(head_dim=256, causal=False, dtype="float16", config=config, arch="sm_90a")


def in_order(text: str, *patterns: str) -> bool:
    """Whether the patterns occur in `text` one after another."""
    position = 0
    for pattern in patterns:
        found = re.compile(pattern).search(text, position)
        if not found:
            return False
        position = found.end()
    return True


def output_store_gaps(source: str, own_buffer: bool, consumers: int) -> list[str]:
    """What the generated CUDA lacks for O's way out through shared memory, [] if nothing.

    These order the threads' writes against readers the threads cannot see: wgmma (the other
    warpgroups' last P.V reads the V ring) and TMA (the store reads the staged tile; the next
    V lands in the ring). compute-sanitizer's racecheck sees neither, and a missing sync there
    fails only on some runs, so the code is checked. With its own buffer each warpgroup syncs
    its own 128 threads; in the V ring every consumer meets.
    """
    epilogue = source[source.rindex("v_empty[") :]  # after the tile's last P.V released its stage
    staging = "O_shared" if own_buffer else "V_shared"
    write = re.search(rf"\(\((?:half_t|bfloat16_t)\*\){staging}\)", epilogue)  # (the first use is the write)
    store = re.search(rf"tl::tma_store\(Output_desc, \(&\(\(\((?:half_t|bfloat16_t)\*\){staging}\)", epilogue)
    if not (write and store and write.end() < store.start()):
        return [f"O's write into {staging} and its TMA store to Output, in that order, not found"]
    before, between, after = epilogue[: write.start()], epilogue[write.end() : store.start()], epilogue[store.end() :]
    wait, fence = r"tma_store_wait<0", r"fence_proxy_async\(\)"
    gaps = []
    if own_buffer:
        sync = r"__sync_thread_partial\(\(\(\(\(int\)threadIdx\.x\) >> 7\) \+ 7\), 128\)"
        if not in_order(before, wait, sync):
            gaps.append("no wait for the warpgroup's last store, then a warpgroup sync, before O's write")
        if not in_order(between, fence, sync):
            gaps.append("no proxy fence, then a warpgroup sync, between O's write and its store")
        if not in_order(after, wait):
            gaps.append("no wait for the last stores before the thread block exits")
    else:
        sync = rf"__sync_thread_partial\(7, {consumers}\)"
        if not in_order(before, sync):
            gaps.append("no sync of every consumer before O's write into the V ring")
        if not in_order(between, fence, sync):
            gaps.append("no proxy fence, then a sync of every consumer, between O's write and its store")
        if not in_order(after, wait, fence, r"o_stored\[0\]\.arrive\(\)"):
            gaps.append("no wait for the store, then a proxy fence, before o_stored lets the next V land")
    return gaps


@SHIPPED_CASES
def test_output_leaves_shared_memory_only_once_written_and_read(head_dim, causal, dtype, seqlen_k):
    config, source = shipped_source(head_dim, causal, dtype, seqlen_k)
    own_buffer = own_output_buffer(head_dim, config)
    assert own_buffer == ("O_shared" in source)
    assert output_store_gaps(source, own_buffer, config.threads) == []
    # The check can fail: without the epilogue's first sync, it says so.
    epilogue_start = source.rindex("v_empty[")
    first_sync = re.compile(r"[^\n]*__sync_thread_partial\([^;]*, (?:128|256|384)\);\n")
    unsynced = source[:epilogue_start] + first_sync.sub("", source[epilogue_start:], count=1)
    assert output_store_gaps(unsynced, own_buffer, config.threads) == [
        "no wait for the warpgroup's last store, then a warpgroup sync, before O's write"
        if own_buffer
        else "no sync of every consumer before O's write into the V ring"
    ]


def test_overlapping_the_epilogue_without_a_persistent_grid_is_refused():
    # Only a persistent thread block has a next work tile whose Q.K^T could run under the epilogue.
    with pytest.raises(ValueError, match=r"config.overlap_epilogue: needs persistent=True"):
        compiled_forward(
            head_dim=128,
            causal=False,
            dtype="float16",
            config=TileConfig(128, 176, 2, 256, overlap_epilogue=True),
            arch="sm_90a",
        )


def test_the_tanh_approx_option_puts_one_tanh_approx_where_the_division_was():
    # The A/B build option (perf/variants.py's tanh table): tanh.approx.f32 replaces ex2 and the
    # division in the cap, and the shipped softcap build keeps its division.
    from fa_kernel.variants import PLAIN, Variants

    config, softcap = TileConfig(128, 128, 2, 256, persistent=True), Variants(softcap=True)
    build = dict(head_dim=64, causal=False, dtype="float16", config=config, arch="sm_90a", variants=softcap)
    approx = compiled_forward(**build, tanh_approx=True).get_kernel_source()
    shipped = compiled_forward(**build).get_kernel_source()
    assert "tanh.approx.f32" in approx and "tanh_approx(" in approx and "2.000000e+00*/ / (exp2f" not in approx
    assert "tanh_approx(" not in shipped and "2.000000e+00*/ / (exp2f" in shipped
    with pytest.raises(ValueError, match=r"tanh_approx: only a softcap build has a tanh"):
        compiled_forward(**{**build, "variants": PLAIN}, tanh_approx=True)


def test_a_tma_copy_into_shared_memory_off_its_128_byte_alignment_is_found():
    # Two stages of 80 fp32 rows lie 320 bytes apart: the 80-row gradient tile's first GPU launch
    # stopped with "misaligned address" there. On the shipped d128 gradient (64 rows, 256 bytes
    # apart) the rule finds nothing; with its stage stride made 80 floats, both statistics.
    from fa_kernel.backward import compiled_gradient_kernels

    _, dk_dv, _ = compiled_gradient_kernels(head_dim=128, causal=False, dtype="bfloat16", arch="sm_90a")
    source = dk_dv.get_kernel_source()
    assert misaligned_tma_destinations(source) == []
    stride = re.search(r"\(\(float\*\)lse\)\[\(\(\w+ & 1\) \* (\d+)\)\]", source)
    assert stride and stride.group(1) == "64", "LSE₂'s two stages, 64 floats apart"
    eighty = source.replace("& 1) * 64)]", "& 1) * 80)]")
    assert [problem.split("[")[0] for problem in misaligned_tma_destinations(eighty)] == ["lse", "delta"]


def test_ptxas_reports_a_generated_kernels_registers_and_spills(tmp_path):
    # tools/ptxas_report.sh, the recipe the docs' register and spill figures come from.
    import subprocess
    from pathlib import Path

    from fa_kernel.decode import compiled_decode_kernels

    split, _ = compiled_decode_kernels(head_dim=128, causal=True, dtype="bfloat16", arch="sm_90a")
    source = tmp_path / "split.cu"
    source.write_text(split.get_kernel_source())
    script = Path(__file__).resolve().parents[1] / "tools" / "ptxas_report.sh"
    report = subprocess.run([script, source], capture_output=True, text=True, check=True).stdout
    assert re.search(r"Used \d+ registers", report) and "spill stores" in report, report


@pytest.mark.parametrize("head_splits", [False, True], ids=["whole", "split"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_ds_and_dq_pass_through_shared_memory_in_order_where_the_kernel_places_its_barriers(head_dim, head_splits):
    # Where the dK/dV kernel places its consumers' syncs (backward.syncs_by_hand: TileLang's sync
    # planner off), dS's and dQ's shared buffers are ordered by its two named barriers a step
    # alone, and racecheck sees neither the wgmma's read of dS nor the bulk add's of dQ; a build
    # that splits a GQA group as well. Lowered alone.
    import tvm
    from tilelang.engine.lower import lower
    from tools.codegen_orders import dq_staging_gaps

    from fa_kernel.backward import BACKWARD_TILES, backward_pass_configs, backward_program

    block_m, block_n, stages = BACKWARD_TILES[head_dim]
    build = dict(block_m=block_m, block_n=block_n, num_stages=stages, head_splits=head_splits)
    program = backward_program(head_dim=head_dim, causal=True, dtype="bfloat16", **build)
    with tvm.transform.PassContext(opt_level=3, config=backward_pass_configs(**build)), tvm.target.Target(CUDA_SM90A):
        source = lower(program, target=tvm.target.Target(CUDA_SM90A)).kernel_source
    assert dq_staging_gaps(source) == []
    # The check can fail: without either of the walk's two consumer syncs, it says which order is lost.
    syncs = list(re.finditer(r"[^\n]*__sync_thread_partial\(\d+, 256\);\n", source))
    assert len(syncs) == 2, "two consumer syncs a step"
    without = [source[: sync.start()] + source[sync.end() :] for sync in syncs]
    assert dq_staging_gaps(without[0]) == [
        "no consumer sync and proxy fence between dS's write and dQ's wgmma",
        "no wait for the last bulk add, then a consumer sync, before dQ's write",
    ]
    assert dq_staging_gaps(without[1]) == [
        "no consumer sync between dQ's wgmma and the next step's write of dS",
        "no consumer sync and proxy fence between dQ's write and its bulk add",
    ]


def test_the_dk_dv_kernel_places_its_own_syncs_only_with_operands_in_registers_and_dq_added():
    from fa_kernel.backward import BACKWARD_TILES, backward_pass_configs, syncs_by_hand
    from fa_kernel.gradient_parts import WGMMA_ROWS
    from fa_kernel.toolchain import FAST_MATH, OWN_SYNCS

    assert syncs_by_hand(2 * WGMMA_ROWS) and not syncs_by_hand(2 * WGMMA_ROWS - 1)
    assert not syncs_by_hand(2 * WGMMA_ROWS, with_dq=False) and syncs_by_hand(WGMMA_ROWS, threads=128)
    for head_dim, (block_m, block_n, stages) in BACKWARD_TILES.items():
        build = dict(block_m=block_m, block_n=block_n, num_stages=stages)
        assert backward_pass_configs(**build) == (FAST_MATH if head_dim == 256 else OWN_SYNCS), head_dim
        if head_dim != 256:  # a split build's syncs are placed by hand too
            assert backward_pass_configs(**build, head_splits=True) == OWN_SYNCS, head_dim
        assert backward_pass_configs(**build, with_dq=False) == FAST_MATH


def test_the_heavy_first_map_is_worked_out_once_a_block():
    # backward_program(heavy_first=True): block index -> (K/V tile, K/V slot, batch) divides by a
    # launch value; left as expressions, those divisions were inlined at every address and mask,
    # the kernel several times slower (docs/perf-log.md). In registers: blockIdx is read by the
    # map's three assignments alone. Lowered alone.
    import tvm
    from tilelang.engine.lower import lower

    from fa_kernel.backward import BACKWARD_TILES, backward_pass_configs, backward_program

    block_m, block_n, stages = BACKWARD_TILES[128]
    build = dict(block_m=block_m, block_n=block_n, num_stages=stages)
    program = backward_program(head_dim=128, causal=True, dtype="bfloat16", heavy_first=True, **build)
    with tvm.transform.PassContext(opt_level=3, config=backward_pass_configs(**build)), tvm.target.Target(CUDA_SM90A):
        source = lower(program, target=tvm.target.Target(CUDA_SM90A)).kernel_source
    readers = [line.split("=")[0].strip() for line in source.splitlines() if "blockIdx" in line]
    assert readers == ["block_tile", "block_slot", "block_batch"], readers


@pytest.mark.parametrize(
    ("head_dim", "causal", "options"),
    [(128, True, {}), (64, False, {"ordered_dq": True, "shifted_walk": True})],
    ids=["d128-causal", "d64-ordered-shifted"],
)
def test_the_dq_writer_build_hands_ds_and_dq_over_in_order(head_dim, causal, options):
    # backward_program(dq_writer=True), an A/B build on TileLang's typed warp-specialisation
    # schedule: three roles (MMA warps, a TMA warp, the writer warp that bulk-adds dQ), and the
    # kernel's own fences, consumer sync and read wait around the schedule's barriers. Lowered alone.
    import tvm
    from tilelang.engine.lower import lower
    from tools.codegen_orders import writer_handoff_gaps

    from fa_kernel.backward import BACKWARD_TILES, backward_pass_configs, backward_program, heavy_first_order
    from fa_kernel.variants import PLAIN

    block_m, block_n, stages = BACKWARD_TILES[head_dim]
    build = dict(block_m=block_m, block_n=block_n, num_stages=stages, dq_writer=True, **options)
    ordered = options.get("ordered_dq", False)
    heavy_first = heavy_first_order(causal, PLAIN, varlen=False, head_splits=False) and not ordered
    program = backward_program(head_dim=head_dim, causal=causal, dtype="bfloat16", heavy_first=heavy_first, **build)
    with tvm.transform.PassContext(opt_level=3, config=backward_pass_configs(**build)), tvm.target.Target(CUDA_SM90A):
        source = lower(program, target=tvm.target.Target(CUDA_SM90A)).kernel_source
    assert source.count("warpgroup_reg_alloc<240>") == 1 and source.count("warpgroup_reg_dealloc<24>") == 3
    assert writer_handoff_gaps(source) == []
    # One consumer sync a step on dS's two slots; ordered, two on its one (room for two dQ slots).
    assert len(re.findall(r"__sync_thread_partial\(\d+, 256\)", source)) == (2 if ordered else 1)
    # The check can fail: each of the kernel's own orderings taken out, it says which is lost.
    fences = list(re.finditer(r"tl::fence_proxy_async\(\);\n", source))
    assert writer_handoff_gaps(source[: fences[-1].start()] + source[fences[-1].end() :]) == [
        "no proxy fence between dQ's write and its full barrier's arrival"
    ]
    wait = "tl::tma_store_wait<0, false>();" if ordered else "tl::tma_store_wait<0, true>();"
    assert writer_handoff_gaps(source.replace(wait, "")) == [
        "the writer does not wait for the full slot, add, wait for the add's read, then free the slot"
    ]
