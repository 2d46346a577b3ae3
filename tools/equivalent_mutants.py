"""Generated mutants that compute what the kernel computes, each with the reason and the test
that checks that reason.

A generated mutant that survives the suite is a defect of the suite unless it is equivalent. The
CPU triage (tools/mutants/) settles the mutants whose compiled kernels are identical. The ones
here change the kernel's code but not its results; each names the argument why, and a test
(`check`) that fails if the argument stops holding. Entries are keyed by GeneratedMutant.key
(what the rewrite changes, not where), and tests/test_equivalent_mutants.py fails on a key no
longer generated, so the list cannot go stale silently.

Most checks are CPU tests, run before any mutant. A reason about the schedule or the kernel's
rounding cannot be checked without the GPU; the mutant runner runs its check before the
mutant's tests, over the boundary sweep of every build the mutant changes
(tools/bitwise_sweep.py), and a mutant that fails it is run and judged like any other:
- BITWISE: the mutant's outputs are bitwise the unmutated kernel's;
- ROUNDING: they are within the judge's allowance of the unmutated kernel's (what a
  same-precision computation may round by), with the same non-finite elements: for mutants
  that compute the same attention in exact arithmetic;
- GUARDED: bitwise too, after those builds' guard-region tests (tests/test_guard_regions.py)
  saw nothing written outside out and lse: for mutants that store past the end, where a
  bound outside the kernel's code (the tensor map's, TileLang's) drops the store.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reason:
    why: str
    check: str  # the pytest node id that checks `why`


MASKS_MORE_TILES = Reason(
    "needs_mask holds for a superset of the K/V tiles: write_mask writes the exact mask into any tile it is "
    "given (0 where a key is visible) and the GEMM adds Q.K^T onto it, so a tile that needed no mask gets the "
    "scores a cleared accumulator gives (0 + x = x exactly); only the time of writing the mask is added",
    "tests/test_equivalent_mutants.py::test_masking_tiles_that_need_no_mask_changes_nothing",
)

# Checked on the GPU by the mutant runner, per mutant (see above).
BITWISE = "tools/bitwise_sweep.py"
ROUNDING = "tools/bitwise_sweep.py close"
GUARDED = "tests/test_guard_regions.py, then tools/bitwise_sweep.py"
GPU_CHECKS = (BITWISE, ROUNDING, GUARDED)
SCHEDULE_ONLY = Reason(
    "changes when and by whom the work is done (the warpgroups' turns at the tensor cores, the "
    "producer's thread count, the register split, where O is staged on its way out), not the "
    "arithmetic any row goes through",
    BITWISE,
)
MASK_WRITTEN_AGAIN = Reason(
    "under the overlapped epilogue the next tile's mask is written before the last P.V; writing it "
    "again, with the same arguments, right before its GEMM writes the same values (acc_s is not in "
    "flight then)",
    BITWISE,
)
DIAGONAL_HIDES_THE_END = Reason(
    "causal bottom-right, the diagonal already hides key seqlen_k from every stored row (row < "
    "seqlen_q, so row + seqlen_k - seqlen_q < seqlen_k); only the rows past seqlen_q, never stored, "
    "see it",
    BITWISE,
)

VISITS_MASKED_TILES = Reason(
    "a block or warpgroup that visits K/V tiles past the ones its rows see gets them fully masked "
    "(needs_mask holds past the diagonal and past seqlen_k, and TMA reads zeros past the end): every "
    "score is -inf, P~ is exactly 0, acc_o and row_sum add exact zeros, and neither the row max nor the "
    "stale-max vote moves; only the time of loading and computing them is added",
    BITWISE,
)
ROWS_PAST_THE_END = Reason(
    "the rows it changes are all past seqlen_q (a warpgroup's whose first row is at or past it, or a "
    "query block past the last one), which are never stored: TMA clips O's store to the tensor and the "
    "LSE store is guarded; how many K/V tiles they visit changes only the time",
    BITWISE,
)
OVERLAP_STEPS_AGAIN = Reason(
    "a step of the overlapped epilogue done again, or in the other place (the work tile's registers "
    "computed again, acc_o zeroed earlier, a barrier phase that has completed waited for again, S_0 "
    "issued again from the same Q and K): the same values, at another time",
    BITWISE,
)
LSE_STORE_BOUNDED = Reason(
    "the LSE rows it stores past seqlen_q are dropped: TileLang's LegalizeSafeMemoryAccess bounds each "
    "index of a global store by its dimension (kernel.py's test is a second one, which also skips the "
    "row's arithmetic), so no row of another head is written and nothing past the tensor",
    GUARDED,
)
ROUND_PAST_THE_LAST_TILE = Reason(
    "a thread block whose place in the persistent grid's last round holds no tile runs that round "
    "anyway, producer and consumers alike, on a work tile past the last: its batch index is past the "
    "end, so its loads read zeros (TMA), its O store is clipped by the tensor map and its LSE store "
    "dropped (LSE_STORE_BOUNDED); only the time is added",
    GUARDED,
)
VOTE_TAKEN_ALWAYS = Reason(
    "every warpgroup votes to issue S again after every tile: it gets S again from the same Q and K, "
    "and the online softmax keeps the max of each row within STALE_SUM_LIMIT, with alpha exactly 1, "
    "so those rows get the bits the pass before gave them, and the rows over the limit what a vote "
    "would have given them; only the time of the second GEMM is added",
    BITWISE,
)
NOTHING_TO_WAIT_FOR = Reason(
    "a wait added where nothing is outstanding (no wgmma in flight without the overlapped epilogue; "
    "no TMA store in flight where O leaves through the V ring, whose epilogue waits for its own) "
    "returns at once",
    BITWISE,
)
NO_UNREAD_TILES = Reason(
    "under the overlapped epilogue every warpgroup visits all of the work tile's K/V tiles "
    "(warpgroup_kv_blocks), so the loop that releases the ones past its rows runs no trip",
    BITWISE,
)
ONE_WARPGROUP_READS_EVERY_TILE = Reason(
    "take_turns is off only where one consumer warpgroup holds every row of the work tile (FALLBACK's "
    "128 threads): warpgroup_kv_blocks then gives it all num_kv_blocks tiles, so the loop that releases "
    "the tiles past its rows, where the turn would be taken, runs no trip",
    BITWISE,
)
PER_TILE_ROUNDS_REDO_THE_TILE = Reason(
    "in the per-tile grid a thread block's work tile is its grid index, whatever the round: the rounds "
    "the persistent count adds compute the same tile again, through the same ring and turns, and store "
    "the same values over it; only time is added (which the benchmarks, not the tests, measure)",
    BITWISE,
)
UNUSED_BARRIER = Reason(
    "an mbarrier allocated where O has a buffer of its own, which nothing arrives at or waits on "
    "(the producer waits for o_stored by the config, not by the barrier): 8 bytes of shared memory more",
    BITWISE,
)
LOG2_OF_ZERO = Reason(
    "a row that sees no key has row_sum 0 and row_max_scaled 0 (the stand-in for -inf), and log2(0) "
    "is -inf (lg2.approx too), so the formula gives the -inf the select gives; row sums are never "
    "negative, so a test for -1 holds for no row, as the select taken never does",
    BITWISE,
)
COPY_TAKES_THE_SOURCE_EXTENT = Reason(
    "T.copy from a fragment writes the fragment's extent: a destination region of the V ring one row "
    "longer or shorter gets the same block_m rows at the same addresses (by plain stores where the "
    "region is not stmatrix's shape)",
    BITWISE,
)
WARP_ARRIVES_AS_ONE = Reason(
    "a named barrier counts arrivals by warp: the last warpgroup's first warp arrives at the turn "
    "barrier whether or not its thread 0 executes the arrive, so leaving one thread out changes nothing",
    BITWISE,
)
UNSYNCED_ARRIVE = Reason(
    "where no warpgroup takes turns (one consumer warpgroup, or a config without take_turns) no one syncs "
    "on a turn barrier: the arrives the mutant adds there change no value and no order",
    BITWISE,
)
MINUS_INFINITY_PLUS_ONE = Reason(
    "-inf + 1 and -inf - 1 are -inf, and a finite fp32 row max plus or minus 1 stays finite, so the "
    "test for a row that has seen no key yet holds for exactly the same rows",
    BITWISE,
)
REFERENCE_MAX_IS_FREE = Reason(
    "where a warpgroup issues S again, which rows keep the max from before the tile decides only the "
    "reference max their P~ is taken against: alpha moves acc_o and row_sum with it, and any row that "
    "keeps a stale max has a sum within a few of STALE_SUM_LIMIT, so its P~ stays inside fp16; the "
    "same attention in exact arithmetic, rounded differently",
    ROUNDING,
)
ALPHA_IS_ONE = Reason(
    "where the max stayed, alpha = exp2(max * scale_log2 - max * scale_log2) is 1 up to the FMA's "
    "rounding of one product, and it scales acc_o and row_sum alike; the select (made never true, or "
    "true only where the max stayed) only spares that rounding",
    ROUNDING,
)

VOTE_LIMIT_ONE_OFF = Reason(
    "the warpgroup's vote to issue S again, at a limit one off or inclusive: a warpgroup that votes where "
    "it would not gets S again from the same Q and K, and the online softmax keeps the max of each row "
    "within STALE_SUM_LIMIT, with what the pass before gave it; one that does not vote where it would "
    "keeps the max of rows whose sum is at most STALE_SUM_LIMIT + 1 (REFERENCE_MAX_IS_FREE)",
    ROUNDING,
)
STALE_SUM_LIMIT_IS_FREE = Reason(
    "STALE_SUM_LIMIT decides which rows keep the max from before a tile, that is, only the reference "
    "max of their P~ (REFERENCE_MAX_IS_FREE): halved, doubled or one off, a kept P~ stays far inside "
    "fp16, and the attention is the same within rounding; the emulator shares the constant, so its "
    "check runs the emulator at each mutant's limit",
    "tests/test_equivalent_mutants.py::test_the_stale_sum_limit_only_chooses_the_reference_max",
)
CONTIGUOUS_IS_ITSELF = Reason(
    "Tensor.contiguous() returns a contiguous tensor itself, so calling it on every input copies nothing more",
    "tests/test_equivalent_mutants.py::test_contiguous_is_the_tensor_itself_where_it_already_is",
)
EMULATOR_CHECK = "tests/test_equivalent_mutants.py::test_recorded_emulator_mutants_are_bitwise_the_same"
EMULATOR_MASKS_MORE_TILES = Reason(
    "the emulator's needs_mask holds for a superset of the tiles; the mask of a tile whose keys are all "
    "visible is all zeros",
    EMULATOR_CHECK,
)
EMULATOR_MINUS_INFINITY_PLUS_ONE = Reason(
    "-inf + 1 and -inf - 1 are -inf, and a finite row max plus or minus 1 stays finite, so the "
    "emulator's test for a row that has seen no key yet holds for exactly the same rows",
    EMULATOR_CHECK,
)
EMULATOR_ROUNDING_CHECK = "tests/test_equivalent_mutants.py::test_recorded_emulator_mutants_round_alike"
EMULATOR_EVERY_ROW_TAKES_ITS_MAX = Reason(
    "the emulator without its stale-max path, or with it from the third K/V tile on: every row takes "
    "its new max at those tiles, as FlashAttention-2 does; which max a row's P~ is taken against "
    "decides only the rounding (REFERENCE_MAX_IS_FREE)",
    EMULATOR_ROUNDING_CHECK,
)
EMULATOR_STALE_FROM_THE_FIRST_TILE = Reason(
    "the emulator's stale-max path on the walk's first tile too: every row's max before it is -inf, and "
    "a row without a max takes the tile's, as the path's absence has it: the same values",
    EMULATOR_CHECK,
)
EMULATOR_STALE_LIMIT_ONE_OFF = Reason(
    "the emulator's stale-max test one off or inclusive: a row keeps the max from before a tile while "
    "its sum is within the limit give or take one, as STALE_SUM_LIMIT one off would have it; which max "
    "a row's P~ is taken against decides only the rounding (REFERENCE_MAX_IS_FREE)",
    EMULATOR_ROUNDING_CHECK,
)
EMULATOR_MAX_NEVER_FALLS = Reason(
    "a row's max after a tile is the one before it or larger (the max of both, or the stale max kept), "
    "so max + 1 == max before and max == max before - 1 hold for no finite row, and for a row without "
    "a key both sides are -inf, as they are unmutated: alpha's select is taken for the same rows",
    EMULATOR_CHECK,
)
# The stale-max vote as the mutants' keys spell it.
VOTE = "T.call_extern('int32', 'warpgroup_any', VOTE_BARRIERS[0] + thread // 128, row_over)"

# The forward's walk bounds (keys a block's or a warpgroup's rows see, in tiles) moved out by one.
KEY_BOUND_MUTATIONS = (
    "min_max:T.min(num_kv_blocks, T.ceildiv(BOUND, block_n))->T.max(num_kv_blocks, T.ceildiv(BOUND, block_n))",
    "off_by_one:T.ceildiv(BOUND, block_n)->T.ceildiv(BOUND + 1, block_n)",
    "off_by_one:T.ceildiv(BOUND, block_n)->T.ceildiv(BOUND, block_n - 1)",
)
EQUIVALENT: dict[str, Reason] = {
    # ---- the numbers (numerics.py) and the launch (interface.py)
    **{
        f"numerics.py:<module>:constant:STALE_SUM_LIMIT = 4096.0->STALE_SUM_LIMIT = {limit}": STALE_SUM_LIMIT_IS_FREE
        for limit in ("8192.0", "2048.0", "4097.0", "4095.0")
    },
    "interface.py:_attention:guard_never:t.is_contiguous()->False": CONTIGUOUS_IS_ITSELF,
    # ---- the emulator's tile loop (tools/mutants/ --generated --target emulator)
    "emulator.py:_attend_one_head:off_by_one:kv_start + block_n > seqlen_k->kv_start + block_n + 1 > seqlen_k": (
        EMULATOR_MASKS_MORE_TILES
    ),
    "emulator.py:_attend_one_head:guard_always:needs_mask->True": EMULATOR_MASKS_MORE_TILES,
    **{
        f"emulator.py:_attend_one_head:off_by_one:{name} == -math.inf->{rewrite.format(name)}{site}": (
            EMULATOR_MINUS_INFINITY_PLUS_ONE
        )
        for name, sites in (("row_max_prev", ("",)), ("row_max", ("", "#2")))  # row_max: in the loop, after it
        for site in sites
        for rewrite in ("{} + 1 == -math.inf", "{} - 1 == -math.inf", "{} == -math.inf + 1", "{} == -math.inf - 1")
    },
    "emulator.py:_attend_one_head:off_by_one:row_max == row_max_prev->row_max + 1 == row_max_prev": (
        EMULATOR_MAX_NEVER_FALLS
    ),
    "emulator.py:_attend_one_head:off_by_one:row_max == row_max_prev->row_max == row_max_prev - 1": (
        EMULATOR_MAX_NEVER_FALLS
    ),
    **{
        f"emulator.py:_attend_one_head:{rewrite}": EMULATOR_STALE_LIMIT_ONE_OFF
        for rewrite in (
            "off_by_one:stale_sum > STALE_SUM_LIMIT->stale_sum + 1 > STALE_SUM_LIMIT",
            "off_by_one:stale_sum > STALE_SUM_LIMIT->stale_sum - 1 > STALE_SUM_LIMIT",
            "relational:stale_sum > STALE_SUM_LIMIT->stale_sum >= STALE_SUM_LIMIT",
            "off_by_one:stale_sum > STALE_SUM_LIMIT->stale_sum > STALE_SUM_LIMIT + 1",
            "off_by_one:stale_sum > STALE_SUM_LIMIT->stale_sum > STALE_SUM_LIMIT - 1",
        )
    },
    "emulator.py:_attend_one_head:guard_never:kv_block > first_block->False": EMULATOR_EVERY_ROW_TAKES_ITS_MAX,
    "emulator.py:_attend_one_head:off_by_one:kv_block > first_block->kv_block - 1 > first_block": (
        EMULATOR_EVERY_ROW_TAKES_ITS_MAX
    ),
    "emulator.py:_attend_one_head:off_by_one:kv_block > first_block->kv_block > first_block + 1": (
        EMULATOR_EVERY_ROW_TAKES_ITS_MAX
    ),
    **{
        f"emulator.py:_attend_one_head:{rewrite}": EMULATOR_STALE_FROM_THE_FIRST_TILE
        for rewrite in (
            "guard_always:kv_block > first_block->True",
            "off_by_one:kv_block > first_block->kv_block + 1 > first_block",
            "relational:kv_block > first_block->kv_block >= first_block",
            "off_by_one:kv_block > first_block->kv_block > first_block - 1",
        )
    },
    "emulator.py:_attend_one_head:relational:kv_start + block_n > seqlen_k->kv_start + block_n >= seqlen_k": (
        EMULATOR_MASKS_MORE_TILES
    ),
    "emulator.py:_attend_one_head:off_by_one:kv_start + block_n > seqlen_k->kv_start + block_n > seqlen_k - 1": (
        EMULATOR_MASKS_MORE_TILES
    ),
    "emulator.py:_attend_one_head:off_by_one:kv_start + block_n - 1 > q_start + diagonal_offset + edges.right->"
    "kv_start + block_n - 1 + 1 > q_start + diagonal_offset + edges.right": EMULATOR_MASKS_MORE_TILES,
    "emulator.py:_attend_one_head:relational:kv_start + block_n - 1 > q_start + diagonal_offset + edges.right->"
    "kv_start + block_n - 1 >= q_start + diagonal_offset + edges.right": EMULATOR_MASKS_MORE_TILES,
    "emulator.py:_attend_one_head:off_by_one:kv_start + block_n - 1 > q_start + diagonal_offset + edges.right->"
    "kv_start + block_n - 1 > q_start + diagonal_offset + edges.right - 1": EMULATOR_MASKS_MORE_TILES,
    # ---- the kernel
    # past the end: tiles ending one key earlier (or at seqlen_k) get the mask too
    # non-causal launches test the diagonal too, and write_mask writes only the seqlen_k mask
    # the diagonal: tiles whose last key is the first row's last visible one get the mask too
    # the causal mask's past-the-end term: one key past seqlen_k left to the diagonal
    "mask.py:issue_scores:guard_always:not mask_written->True": MASK_WRITTEN_AGAIN,
    # taking turns: on where the config asks for it with one warpgroup, or for every config; off
    # for two warpgroups
    "kernel.py:forward_program:or_and:config.take_turns and warpgroups > 1->config.take_turns or warpgroups > 1": (
        SCHEDULE_ONLY
    ),
    "kernel.py:forward_program:off_by_one:warpgroups > 1->warpgroups + 1 > 1": SCHEDULE_ONLY,
    "kernel.py:forward_program:off_by_one:warpgroups > 1->warpgroups - 1 > 1": SCHEDULE_ONLY,
    "kernel.py:forward_program:relational:warpgroups > 1->warpgroups >= 1": SCHEDULE_ONLY,
    "kernel.py:forward_program:off_by_one:warpgroups > 1->warpgroups > 2": SCHEDULE_ONLY,
    "kernel.py:forward_program:off_by_one:warpgroups > 1->warpgroups > 0": SCHEDULE_ONLY,
    # the budgets: half the shared memory stages O in the V ring; a producer of 127 threads, or
    # with 48 registers (the consumers get fewer)
    "pipeline.py:<module>:constant:BLOCK_SHARED_BYTES = 232448->BLOCK_SHARED_BYTES = 116224": SCHEDULE_ONLY,
    "pipeline.py:<module>:constant:SM_SHARED_BYTES = 233472->SM_SHARED_BYTES = 116736": SCHEDULE_ONLY,
    "pipeline.py:<module>:constant:PRODUCER_THREADS = 128->PRODUCER_THREADS = 127": SCHEDULE_ONLY,
    "pipeline.py:<module>:constant:PRODUCER_REGISTERS = 24->PRODUCER_REGISTERS = 48": SCHEDULE_ONLY,
    # the tile scheduler: the order of work tiles, the thread blocks a round has
    # causal query blocks in order (a ragged batch's come in the host's order either way; made
    # True, the reversal would take a ragged block past its sequence's end: not equivalent)
    "scheduler.py:work_tile:guard_never:visibility.limits_right and (not ragged)->False": SCHEDULE_ONLY,
    **{
        f"scheduler.py:place_in_round:{rewrite}": SCHEDULE_ONLY
        for rewrite in (
            "guard_always:T.if_then_else(tile_round % 2 == 0, worker, workers - 1 - worker)->worker",
            "guard_never:T.if_then_else(tile_round % 2 == 0, worker, workers - 1 - worker)->workers - 1 - worker",
            "off_by_one:tile_round % 2 == 0->tile_round % 2 + 1 == 0",
            "off_by_one:tile_round % 2 == 0->tile_round % 2 - 1 == 0",
            "off_by_one:tile_round % 2 == 0->tile_round % 2 == 1",
            "off_by_one:tile_round % 2 == 0->tile_round % 2 == -1",
            "relational:tile_round % 2 == 0->tile_round % 2 != 0",
        )
    },
    "scheduler.py:tile_scheduler:min_max:T.min(sm_count, num_tiles)->T.max(sm_count, num_tiles)": SCHEDULE_ONLY,
    # K/V tiles visited past the ones a block's (or a warpgroup's) rows see
    **{
        key: VISITS_MASKED_TILES
        for key in (
            "scheduler.py:kv_end:guard_never:visibility.limits_right->False",
            "scheduler.py:kv_end:off_by_one:T.ceildiv(rule.seqlen_k, block_n)->T.ceildiv(rule.seqlen_k + 1, block_n)",
            "scheduler.py:kv_end:off_by_one:T.ceildiv(rule.seqlen_k, block_n)->T.ceildiv(rule.seqlen_k, block_n - 1)",
            *(
                f"scheduler.py:kv_end:{mutation.replace('BOUND', 'rule.keys_before(q_start + block_m)')}"
                for mutation in KEY_BOUND_MUTATIONS
            ),
            "scheduler.py:warpgroup_kv_blocks:min_max:T.min(first_row + rows_per_warpgroup, rule.seqlen_q)->"
            "T.max(first_row + rows_per_warpgroup, rule.seqlen_q)",
            *(
                f"scheduler.py:warpgroup_kv_blocks:{mutation.replace('BOUND', 'rule.keys_before(last_rows_end)')}"
                for mutation in KEY_BOUND_MUTATIONS[1:]
            ),
            "scheduler.py:warpgroup_kv_blocks:min_max:T.min(num_kv_blocks, visible_end if kv_first is None else "
            "visible_end - kv_first)->"
            "T.max(num_kv_blocks, visible_end if kv_first is None else visible_end - kv_first)",
            "scheduler.py:warpgroup_kv_blocks:guard_never:visibility.limits_right->False",
            "scheduler.py:warpgroup_kv_blocks:guard_always:config.overlap_epilogue->True",
        )
    },
    # rows past seqlen_q: a warpgroup's at or past it, a query block past the last
    **{
        key: ROWS_PAST_THE_END
        for key in (
            "scheduler.py:warpgroup_kv_blocks:guard_always:"
            "T.if_then_else(first_row < rule.seqlen_q, T.max(1, visible), 1)->T.max(1, visible)",
            "scheduler.py:warpgroup_kv_blocks:off_by_one:first_row < rule.seqlen_q->first_row - 1 < rule.seqlen_q",
            "scheduler.py:warpgroup_kv_blocks:off_by_one:first_row < rule.seqlen_q->first_row < rule.seqlen_q + 1",
            "scheduler.py:warpgroup_kv_blocks:relational:first_row < rule.seqlen_q->first_row <= rule.seqlen_q",
            "scheduler.py:tile_scheduler:off_by_one:T.ceildiv(seqlen_q, block_m)->T.ceildiv(seqlen_q + 1, block_m)",
            "scheduler.py:tile_scheduler:off_by_one:T.ceildiv(seqlen_q, block_m)->T.ceildiv(seqlen_q, block_m - 1)",
        )
    },
    # the overlapped epilogue's steps, and the turn barrier's first arrive
    "kernel.py:start_work_tile:guard_always:not overlap_epilogue->True": OVERLAP_STEPS_AGAIN,
    "kernel.py:start_work_tile:guard_always:not overlap_epilogue->True#2": OVERLAP_STEPS_AGAIN,
    "kernel.py:first_kv_tile:guard_always:not overlap_epilogue->True": OVERLAP_STEPS_AGAIN,
    "kernel.py:first_kv_tile:guard_always:overlap_epilogue->True": OVERLAP_STEPS_AGAIN,
    "kernel.py:start_work_tile:guard_always:take_turns->True": UNSYNCED_ARRIVE,
    "kernel.py:kv_step:guard_always:take_turns->True#2": UNSYNCED_ARRIVE,  # pass_turn without take_turns
    "kernel.py:start_work_tile:relational:thread >= consumers - 128->thread > consumers - 128": WARP_ARRIVES_AS_ONE,
    "kernel.py:start_work_tile:off_by_one:thread >= consumers - 128->thread - 1 >= consumers - 128": (
        WARP_ARRIVES_AS_ONE
    ),
    "kernel.py:start_work_tile:off_by_one:thread >= consumers - 128->thread >= consumers - 128 + 1": (
        WARP_ARRIVES_AS_ONE
    ),
    "kernel.py:last_kv_tile:guard_always:overlap_epilogue->True": OVERLAP_STEPS_AGAIN,  # next mask, overwritten
    "kernel.py:flash_attention_forward:guard_always:overlap_epilogue->True": OVERLAP_STEPS_AGAIN,  # S_0 twice
    "kernel.py:flash_attention_forward:guard_always:overlap_epilogue->True#2": OVERLAP_STEPS_AGAIN,  # advance
    "kernel.py:flash_attention_forward:guard_always:overlap_epilogue->True#3": NOTHING_TO_WAIT_FOR,
    "kernel.py:flash_attention_forward:guard_always:o_buffer->True#2": NOTHING_TO_WAIT_FOR,
    "kernel.py:flash_attention_forward:guard_always:not overlap_epilogue->True": NO_UNREAD_TILES,
    "kernel.py:flash_attention_forward:guard_always:not o_buffer->True": UNUSED_BARRIER,
    "kernel.py:flash_attention_forward:guard_always:config.persistent->True#2": PER_TILE_ROUNDS_REDO_THE_TILE,
    "kernel.py:release_unread_tiles:guard_always:take_turns->True": ONE_WARPGROUP_READS_EVERY_TILE,
    "epilogue.py:epilogue:off_by_one:pipe.V[0:block_m, :]->pipe.V[0:block_m + 1, :]": COPY_TAKES_THE_SOURCE_EXTENT,
    "epilogue.py:epilogue:off_by_one:pipe.V[0:block_m, :]->pipe.V[0:block_m - 1, :]": COPY_TAKES_THE_SOURCE_EXTENT,
    # the stores past the end: LSE rows past seqlen_q, a persistent round past the last tile
    **{
        f"epilogue.py:epilogue:{rewrite}": LSE_STORE_BOUNDED
        for rewrite in (
            "guard_always:q_start + i < tile.rule.seqlen_q->True",
            "off_by_one:q_start + i < tile.rule.seqlen_q->q_start + i - 1 < tile.rule.seqlen_q",
            "relational:q_start + i < tile.rule.seqlen_q->q_start + i <= tile.rule.seqlen_q",
            "off_by_one:q_start + i < tile.rule.seqlen_q->q_start + i < tile.rule.seqlen_q + 1",
        )
    },
    **{
        f"kernel.py:flash_attention_forward:{rewrite}": ROUND_PAST_THE_LAST_TILE
        for rewrite in (
            "guard_always:T.if_then_else(place_in_last < num_tiles % workers, 1, 0)->1",
            "off_by_one:place_in_last < num_tiles % workers->place_in_last - 1 < num_tiles % workers",
            "relational:place_in_last < num_tiles % workers->place_in_last <= num_tiles % workers",
            "off_by_one:place_in_last < num_tiles % workers->place_in_last < num_tiles % workers + 1",
        )
    },
    # the LSE of a row that sees no key: log2(0) = -inf gives the select's -inf
    "epilogue.py:lse_of_row:off_by_one:rows.row_sum[i] == 0->rows.row_sum[i] + 1 == 0": LOG2_OF_ZERO,
    "epilogue.py:lse_of_row:off_by_one:rows.row_sum[i] == 0->rows.row_sum[i] == -1": LOG2_OF_ZERO,
    # the causal mask's past-the-end term
    # the online softmax: a row with no visible key yet, at -inf
    # the rows that keep their stale max: every row takes the new one, or the limit moved by one
    # the vote that issues S again, taken by every warpgroup (the vote is 0 or 1)
    **{
        f"kernel.py:kv_step:{rewrite}": VOTE_TAKEN_ALWAYS
        for rewrite in (
            f"guard_always:{VOTE} != 0->True",
            f"off_by_one:{VOTE} != 0->{VOTE} + 1 != 0",
            f"off_by_one:{VOTE} != 0->{VOTE} != -1",
        )
    },
    # the vote that issues S again, one off
    **{
        f"kernel.py:kv_step:{rewrite}": VOTE_LIMIT_ONE_OFF
        for rewrite in (
            "off_by_one:rows.tile_sum[i] > STALE_SUM_LIMIT->rows.tile_sum[i] + 1 > STALE_SUM_LIMIT",
            "off_by_one:rows.tile_sum[i] > STALE_SUM_LIMIT->rows.tile_sum[i] - 1 > STALE_SUM_LIMIT",
            "relational:rows.tile_sum[i] > STALE_SUM_LIMIT->rows.tile_sum[i] >= STALE_SUM_LIMIT",
            "off_by_one:rows.tile_sum[i] > STALE_SUM_LIMIT->rows.tile_sum[i] > STALE_SUM_LIMIT + 1",
            "off_by_one:rows.tile_sum[i] > STALE_SUM_LIMIT->rows.tile_sum[i] > STALE_SUM_LIMIT - 1",
        )
    },
    # alpha's select: never taken, or taken only where the max stayed (the row max is never below
    # the one before; a max past 2^24 absorbs the 1)
}
