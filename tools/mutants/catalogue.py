"""The hand-written mutants, as data: each a bug a kernel author makes, anchored on the AST of
the file it patches, with the tests written to catch it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tools.ast_mutants import apply_patch
from tools.mutants import PACKAGE


@dataclass(frozen=True)
class Mutant:
    """A hand-written bug: `old` -> `new` in `file`, where `old` is a Python fragment found once
    (within the function `within`, if named) by its AST, whatever its formatting."""

    name: str
    file: str  # relative to src/fa_kernel
    old: str
    new: str
    more: tuple[tuple[str, str], ...] = ()  # further (old, new) patches in the same file
    # (file, old, new) patches of other files: a setting elsewhere that would hide the bug.
    elsewhere: tuple[tuple[str, str, str], ...] = ()
    # Tests written to catch this bug, run before the smoke tier: otherwise a mutant that only
    # they kill compiles the smoke tier's kernels first.
    first: tuple[str, ...] = ()
    within: str | None = None

    def mutated_source(self) -> str:
        """The mutant's file with its patches applied; ValueError if a fragment is not found
        exactly once (the list has fallen out of step with the source)."""
        text = (PACKAGE / self.file).read_text()
        for old, new in ((self.old, self.new), *self.more):
            text = apply_patch(text, old, new, self.within)
        return text

    def other_sources(self) -> dict[str, str]:
        """{file: its text with the patches applied} of the other files `elsewhere` patches."""
        texts: dict[str, str] = {}
        for file, old, new in self.elsewhere:
            texts[file] = apply_patch(texts.get(file) or (PACKAGE / file).read_text(), old, new)
        return texts

    @property
    def id(self) -> str:
        return self.name


JUMPS = ("tests/test_kernel.py::test_scores_that_jump_between_key_tiles",)
PERSISTENT = ("tests/test_kernel.py::test_persistent_thread_blocks_walk_several_tiles",)
NONFINITE = ("tests/test_nonfinite.py",)
WINDOW_SWEEP = ("tests/test_variants_kernel.py::test_window_sweep_with_sinks",)
SPLIT_KV_VARIANTS = ("tests/test_variants_kernel.py::test_split_kv_variants_within_the_bound",)
BACKWARD_VARIANTS = (
    "tests/test_variants_kernel.py::test_backward_window_sweep_with_sinks",
    "tests/test_variants_kernel.py::test_backward_softcap",
    "tests/test_variants_kernel.py::test_autograd_with_every_variant_gives_dsinks",
)
SOFTCAP_TESTS = (
    "tests/test_variants_kernel.py::test_softcap_with_a_left_edge",
    "tests/test_variants_kernel.py::test_softcap_on_hard_scores",
)
ROW_WITHOUT_MAX = ("tests/test_nonfinite.py::test_a_row_whose_first_tile_is_all_minus_inf_keeps_every_later_tile",)
GUARD_REGIONS = ("tests/test_guard_regions.py",)
VARLEN = ("tests/test_varlen.py",)
PAGED = ("tests/test_paged.py",)
WARPGROUP_TILES = ("tests/test_kernel.py::test_warpgroups_visit_only_the_key_tiles_their_rows_see",)
BACKWARD_SWEEP = ("tests/test_backward_kernel.py::test_backward_boundary_sweep",)
DETERMINISTIC_SWEEP = ("tests/test_backward_kernel.py::test_deterministic_backward_boundary_sweep",)
HEAD_SPLITS = ("tests/test_backward_kernel.py::test_a_gqa_group_split_between_blocks_gives_each_key_its_gradients",)
HEAVY_FIRST = ("tests/test_backward_kernel.py::test_heavy_first_groups_end_on_a_short_one",)
DETERMINISTIC_RUNS = ("tests/test_backward_kernel.py::test_deterministic_gradients_are_the_same_bits_in_every_run",)
BACKWARD_SOFTCAP = "tests/test_variants_kernel.py::test_backward_softcap"
BACKWARD_WINDOWS = "tests/test_variants_kernel.py::test_backward_window_sweep_with_sinks"
VARLEN_PLAIN = "tests/test_varlen.py::test_each_sequences_gradients_within_the_bound"
VARLEN_VARIANTS = ("tests/test_varlen.py::test_each_sequences_gradients_within_the_bound_with_the_variants",)
VARLEN_DETERMINISTIC = (
    "tests/test_varlen.py::test_deterministic_gradients_are_within_the_bound_and_the_same_bits_every_run"
)
DECODE = ("tests/test_decode.py::test_split_kv_kernels_within_the_bound",)
SPLIT_KV_VARIANTS = "tests/test_variants_kernel.py::test_split_kv_variants_within_the_bound"
PAGED_PLAIN = "tests/test_paged.py::test_each_request_within_the_bound"
PAGED_VARIANTS = "tests/test_paged.py::test_each_request_within_the_bound_with_the_variants"
ROUTING = ("tests/test_decode.py::test_flash_attn_func_gives_decode_steps_to_the_split_kv_kernels",)


def _rows_without_keys() -> tuple[str, ...]:
    """The one-key test on the first causal sweep build: only a causal row can see no key, so a
    non-causal build (the first changed one, often) passes whatever the epilogue does with them."""
    from suite.boundaries import build_id, sweep_builds

    build = next(build for build in sweep_builds() if build["causal"])
    return (f"tests/test_boundary_sweep.py::test_rows_that_see_one_key_or_none[{build_id(build)}]",)


ROWS_WITHOUT_KEYS = _rows_without_keys()


def _fp16_cases(test: str) -> tuple[str, ...]:
    """`test`'s fp16 cases at each head_dim, causal and not: a generated mutant changes no element
    type (triage.program_builds is fp16 alone too), so its bf16 cases would compile as many
    kernels again to find nothing more."""
    from fa_kernel.configs import BACKWARD_TILES

    return tuple(f"{test}[{d}-{mask}-fp16]" for d in sorted(BACKWARD_TILES) for mask in ("full", "causal"))


BACKWARD_SWEEP_FP16 = _fp16_cases(BACKWARD_SWEEP[0])
# The generated mutants of a file whose code the smoke tier never runs (it calls the kernels
# directly): the GPU tests of the launch (empty inputs, one key, strided inputs) first.
FIRST_BY_FILE = {
    "backward.py": BACKWARD_SWEEP_FP16 + DETERMINISTIC_SWEEP,
    "backward_dq.py": DETERMINISTIC_SWEEP,
    "gradient_parts.py": BACKWARD_SWEEP_FP16 + DETERMINISTIC_SWEEP,
    "backward_preprocess.py": BACKWARD_SWEEP_FP16 + DETERMINISTIC_SWEEP,
    "decode.py": DECODE,
    "interface.py": (
        "tests/test_kernel.py::test_empty_inputs",
        "tests/test_kernel.py::test_matches_reference_head_dim_128",
        "tests/test_kernel.py::test_packed_qkv_slices_give_the_same_result",
        *ROUTING,
    ),
}


# At most this many of the tests that launch a gradient mutant's changed builds run before its
# own tests: under -x the first failing one ends the tier, and each compiles its builds.
CHANGED_BUILD_TESTS = 3


def gradient_build_tests(file: str, build: dict) -> tuple[str, ...]:
    """The GPU tests that launch a build of triage.program_builds(file): () for a plain batched
    build, which the file's own tests (the boundary sweeps) launch."""
    from fa_kernel.variants import PLAIN

    head_dim, variants = build["head_dim"], build.get("variants", PLAIN)
    mask = "causal" if build.get("causal") else "full"
    deterministic = build.get("deterministic", file == "backward_dq.py")  # the dQ kernel: fixed order only
    kind = "softcap" if variants.softcap else "plain" if variants == PLAIN else "window"
    if build.get("head_splits"):
        return (f"{HEAD_SPLITS[0]}[{head_dim}-{mask}-{'fixed_order' if deterministic else 'atomic'}]",)
    if build.get("varlen"):
        if deterministic:
            return (f"{VARLEN_DETERMINISTIC}[{kind}-{head_dim}]",)
        return (f"{VARLEN_PLAIN}[{mask}-{head_dim}-lengths_q0-lengths_k0]",) if kind == "plain" else VARLEN_VARIANTS
    if kind == "plain":
        return ()
    test = BACKWARD_SOFTCAP if kind == "softcap" else BACKWARD_WINDOWS
    return (f"{test}[{head_dim}-{mask}-{'fixed-order-dq' if deterministic else 'atomic-dq'}]",)


def own_split_kv_build(build: dict) -> bool:
    """Whether decode.py's own tests (DECODE) launch the build: a plain one without pages."""
    from fa_kernel.variants import PLAIN

    return not build.get("page_size") and build.get("variants", PLAIN) == PLAIN


def split_kv_build_tests(build: dict) -> tuple[str, ...]:
    """The GPU tests that launch a build of triage.program_builds("decode.py"): () for a plain
    build without pages, which the file's own tests launch, and for a paged build no test
    launches (the paged tests' steps are causal; their group of 4 rows takes the narrowest tile)."""
    from fa_kernel.decode import SPLIT_TILES
    from fa_kernel.variants import PLAIN

    head_dim, block_m, causal = build["head_dim"], build["block_m"], build["causal"]
    variants, page_size = build.get("variants", PLAIN), build.get("page_size", 0)
    if own_split_kv_build(build):
        return ()
    if not page_size:
        return (f"{SPLIT_KV_VARIANTS}[d{head_dim}-rows{block_m}-{'causal' if causal else 'full'}]",)
    narrowest = min(rows for dim, rows in SPLIT_TILES if dim == head_dim)
    if not causal or (variants == PLAIN and (page_size != 16 or block_m != narrowest)):
        return ()
    if variants == PLAIN:
        return (f"{PAGED_PLAIN}[{head_dim}-{page_size}]",)
    return (f"{PAGED_VARIANTS}[{head_dim}-group{4 if block_m == narrowest else 64}]",) if page_size == 64 else ()


def changed_build_tests(file: str, builds: list[dict]) -> tuple[str, ...]:
    """The first GPU tests of a gradient or split-KV mutant that changes `builds` (triage's): none
    where a build its own tests launch is among them (a plain batched one), else the tests that
    launch them, CHANGED_BUILD_TESTS at most. Its own tests would launch only kernels it leaves
    alone, and the suite tier after them costs minutes a mutant (session 20: six were still
    there after 410-430 s)."""
    if file == "decode.py":
        tests = [] if any(map(own_split_kv_build, builds)) else [split_kv_build_tests(build) for build in builds]
    else:
        tests = [gradient_build_tests(file, build) for build in builds]
        tests = tests if all(tests) else []
    return tuple(dict.fromkeys(node for nodes in tests for node in nodes))[:CHANGED_BUILD_TESTS]


KERNEL_MUTANTS = [
    Mutant(
        # The tile that replaced its max leaves acc_o at the old one.
        "new_max_without_rescale",
        "kernel.py",
        "softmax.rescale_output(acc_o, rows.alpha)",
        "",
        first=JUMPS,
    ),
    Mutant(
        # acc_o = (acc_o + P.V) * alpha: the rescale moved after the P.V GEMM it should precede
        # (and, on tiles that kept their max, by the alpha of the last tile that did not).
        "rescale_after_gemm",
        "kernel.py",
        "softmax.rescale_output(acc_o, rows.alpha)",
        "",
        more=(
            (
                "T.warpgroup_fence_operand(acc_o, num_regs=o_regs)\nT.mbarrier_arrive(pipe.v_empty[prev_stage])",
                "T.warpgroup_fence_operand(acc_o, num_regs=o_regs)\nsoftmax.rescale_output(acc_o, rows.alpha)\n"
                "T.mbarrier_arrive(pipe.v_empty[prev_stage])",
            ),
        ),
        first=JUMPS,
    ),
    Mutant(
        # The exponentials stay against the max before the tile whatever their sum: P~ overflows.
        "stale_max_never_replaced",
        "kernel.py",
        "row_over = 1",
        "row_over = 0",
        first=JUMPS,
    ),
    Mutant(
        # A row with no max yet is not voted over: its next tile stays against the stand-in 0, and
        # the tile that moves its max drops it (alpha from -inf).
        "row_without_max_not_voted",
        "kernel.py",
        "T.Or(rows.tile_sum[i] > STALE_SUM_LIMIT, without_max(tile.rule, rows.row_max[i], kv_start, q_start + i))",
        "rows.tile_sum[i] > STALE_SUM_LIMIT",
        first=ROW_WITHOUT_MAX,
    ),
    Mutant(
        # The vote passes, but fold_tile keeps the stand-in for a row with no max yet.
        "row_without_max_keeps_stand_in",
        "softmax.py",
        "T.Or(stale_sum[i] > STALE_SUM_LIMIT, row_max_prev[i] == neg_inf)",
        "stale_sum[i] > STALE_SUM_LIMIT",
        first=ROW_WITHOUT_MAX,
    ),
    Mutant(
        # A limit past fp16's range: P~ up to 2^17 is kept, and its down-cast overflows.
        "stale_sum_limit_past_fp16",
        "numerics.py",
        "STALE_SUM_LIMIT = 4096.0",
        "STALE_SUM_LIMIT = 131072.0",
        first=JUMPS,
    ),
    Mutant(
        # The max is replaced, but the exponentials come from acc_s as the first pass left it
        # (P~, not S): the recomputation of S forgotten.
        "new_max_from_stale_exponentials",
        "kernel.py",
        "issue_scores(tile.rule, pipe.Q, ring_stage(pipe.K, stage), acc_s, kv_start, q_start)\nT.wait_wgmma(0)",
        "T.wait_wgmma(0)",
        first=JUMPS,
    ),
    Mutant(
        # A tile that kept its max replaces the running sum instead of adding to it.
        "kept_max_sum_replaced",
        "kernel.py",
        "rows.row_sum[i] += rows.tile_sum[i]",
        "rows.row_sum[i] = rows.tile_sum[i]",
    ),
    Mutant(
        # A tile that replaced its max divides by its own sum only.
        "last_tile_sum",
        "softmax.py",
        "row_sum[i] = row_sum[i] * alpha[i] + tile_sum[i]",
        "row_sum[i] = tile_sum[i]",
        first=JUMPS,
    ),
    Mutant(
        "alpha_from_new_max",
        "softmax.py",
        "T.exp2(row_max_prev[i] * scale_log2 - row_max_scaled[i])",
        "T.exp2(row_max[i] * scale_log2 - row_max_scaled[i])",
        first=JUMPS,
    ),
    Mutant(
        "max_order_swapped",
        "softmax.py",
        "T.copy(row_max, row_max_prev)\nT.reduce_max(acc_s, row_max, dim=1, clear=False)",
        "T.reduce_max(acc_s, row_max, dim=1, clear=False)\nT.copy(row_max, row_max_prev)",
        first=JUMPS,
    ),
    # The visibility rule (mask.py), which every kernel applies: its CPU test runs first.
    Mutant(
        # The forward's additive mask hides no key past seqlen_k (without causal).
        "no_boundary_mask",
        "mask.py",
        "hidden = key >= self.seqlen_k",
        "hidden = key < 0",
        within="hides",
    ),
    Mutant("causal_off_by_one", "mask.py", "key > self.last_key(row)", "key >= self.last_key(row)", within="hides"),
    Mutant(
        # The diagonal tiles lose their mask: only tiles past seqlen_k (or the last row) get one.
        "mask_only_past_the_end",
        "mask.py",
        "needs_mask = T.Or(needs_mask, kv_start + block_n - 1 > self.last_key(q_start))",
        "needs_mask = needs_mask",
    ),
    Mutant(
        "causal_top_left",
        "mask.py",
        "return row + (self.seqlen_k - self.seqlen_q) + self.right_edge",
        "return row + self.right_edge",
        more=(("return key - (self.seqlen_k - self.seqlen_q) - self.right_edge", "return key - self.right_edge"),),
    ),
    Mutant(
        "causal_loop_one_short",
        "scheduler.py",
        "T.ceildiv(rule.keys_before(q_start + block_m), block_n)",
        "T.ceildiv(rule.keys_before(q_start), block_n)",
    ),
    Mutant(
        # Every warpgroup stops a K/V tile short of its rows' last (the block's last tile, too).
        "warpgroup_kv_blocks_one_short",
        "scheduler.py",
        "return T.if_then_else(first_row < rule.seqlen_q, T.max(1, visible), 1)",
        "return T.if_then_else(first_row < rule.seqlen_q, T.max(1, visible - 1), 1)",
        first=WARPGROUP_TILES,
    ),
    Mutant(
        # Causal: a warpgroup visits the keys its first row sees, not its last (a tile short
        # where its rows straddle a K/V tile boundary).
        "warpgroup_stops_at_its_first_row",
        "scheduler.py",
        "last_rows_end = T.min(first_row + rows_per_warpgroup, rule.seqlen_q)",
        "last_rows_end = T.min(first_row, rule.seqlen_q)",
        first=WARPGROUP_TILES,
    ),
    Mutant(
        # Heaviest-first order off by one: one query block is never computed.
        "causal_block_order_off_by_one",
        "scheduler.py",
        "q_block = q_blocks - 1 - q_block",
        "q_block = q_blocks - q_block",
    ),
    Mutant(
        # Persistent thread blocks skip the last, partial round of work tiles.
        "persistent_rounds_one_short",
        "kernel.py",
        "place_in_last < num_tiles % workers",
        "place_in_last < 0",
        first=PERSISTENT,
    ),
    Mutant(
        # Q's buffer handed to the next work tile after the second Q.K^T, not the last: the
        # next tile's Q lands under the current one's remaining tiles (persistent grid).
        "q_released_after_second_tile",
        "kernel.py",
        "kv_block == own_kv_blocks - 1",
        "kv_block == 1",
        first=PERSISTENT,
    ),
    Mutant(
        # The producer loads the next work tile's V over O before O has left the V ring.
        "v_loaded_over_unsent_output",
        "kernel.py",
        "not o_buffer and kv_block == 0",
        "not o_buffer and kv_block < 0",
        first=PERSISTENT,
    ),
    Mutant(
        # overlap_epilogue: the next work tile's first mask is computed for the current tile.
        # Only a causal mask reads the rows, and no table ships the overlapped epilogue with
        # causal: test_kernel's schedules build one.
        "next_tile_masked_as_current",
        "kernel.py",
        "write_mask(next_tile.rule, acc_s, next_start, next_q_start)",
        "q_start = tile.q_start\nwrite_mask(next_tile.rule, acc_s, next_start, q_start)",
        first=PERSISTENT,
    ),
    Mutant(
        # With O in a buffer of its own, every warpgroup stores the first warpgroup's rows.
        "output_rows_of_the_first_warpgroup_only",
        "epilogue.py",
        "first_row = thread // 128 * rows_per_warpgroup",
        "first_row = 0",
    ),
    Mutant(
        # O's TMA store covers the first 64 columns only (head_dim 128 and 256 lose the rest).
        "output_stored_in_one_panel",
        "pipeline.py",
        "T.unroll(head_dim // TMA_PANEL)",
        "T.unroll(1)",
        within="store_output",
    ),
    Mutant(
        "normalise_inside_loop",
        "kernel.py",
        "T.mbarrier_arrive(pipe.v_empty[prev_stage])",
        "T.mbarrier_arrive(pipe.v_empty[prev_stage])\n"
        "for i, d in T.Parallel(block_m, head_dim):\n"
        "    acc_o[i, d] /= rows.row_sum[i]",
    ),
    Mutant(
        "scale_without_log2e",
        "variants.py",
        "(softcap if softcap > 0 else softmax_scale) * LOG2E",
        "(softcap if softcap > 0 else softmax_scale)",
        within="exponent_scale",
    ),
    Mutant(
        "no_max_subtraction",
        "softmax.py",
        "acc_s[i, j] = T.exp2(acc_s[i, j] * scale_log2 - row_max_scaled[i])",
        "acc_s[i, j] = T.exp2(acc_s[i, j] * scale_log2)",
    ),
    Mutant(
        # (both normalisation paths, with and without overlap_epilogue)
        "nan_for_rows_without_keys",
        "softmax.py",
        "T.if_then_else(row_sum[i] == 0, 0, weighted / row_sum[i])",
        "weighted / row_sum[i]",
        first=ROWS_WITHOUT_KEYS,
    ),
    Mutant(
        # A NaN row sum read as "no key": a corrupted input becomes a plausible 0 (docs/nonfinite.md).
        "nan_row_made_finite",
        "softmax.py",
        "T.if_then_else(row_sum[i] == 0, 0, weighted / row_sum[i])",
        "T.if_then_else(row_sum[i] > 0, weighted / row_sum[i], 0)",
        first=NONFINITE,
    ),
    Mutant(
        # One LSE row past seqlen_q, with TileLang's own bounds guard switched off: the write lands
        # past the end of lse (with the guard on, this mutant is equivalent; docs/testing.md).
        "lse_row_past_the_end_unguarded",
        "epilogue.py",
        "q_start + i < tile.rule.seqlen_q",
        "q_start + i <= tile.rule.seqlen_q",
        elsewhere=(
            (
                "kernel.py",
                "PASS_CONFIGS = OWN_SYNCS",
                "PASS_CONFIGS = {**OWN_SYNCS, "
                "__import__('tilelang').PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True}",
            ),
        ),
        first=GUARD_REGIONS,
    ),
    Mutant("gqa_wrong_kv_head", "scheduler.py", "kv_head = head // (heads // heads_kv)", "kv_head = head % heads_kv"),
    Mutant(
        "lse_in_log2",
        "epilogue.py",
        "softmax.log2_sum(rows, i) * LN2",
        "softmax.log2_sum(rows, i)",
    ),
    # ---- the forward's variants (windows, softcap, sinks): tests/test_variants_kernel.py first
    Mutant(
        # The walk starts a K/V tile after the one with the block's first row's first key.
        "window_walk_starts_a_tile_late",
        "scheduler.py",
        "T.max(0, rule.first_key(q_start)) // block_n",
        "T.max(0, rule.first_key(q_start)) // block_n + 1",
        first=WINDOW_SWEEP,
    ),
    Mutant(
        # The walk starts at the block's last row's first key: its first rows lose keys.
        "window_walk_from_the_last_row",
        "scheduler.py",
        "T.max(0, rule.first_key(q_start)) // block_n",
        "T.max(0, rule.first_key(q_start + block_m - 1)) // block_n",
        first=WINDOW_SWEEP,
    ),
    Mutant(
        # A warpgroup's tiles counted from the first K/V tile, not from the walk's start.
        "warpgroup_window_from_key_zero",
        "scheduler.py",
        "visible_end if kv_first is None else visible_end - kv_first",
        "visible_end",
        first=WINDOW_SWEEP,
    ),
    Mutant(
        "window_left_edge_off_by_one",
        "mask.py",
        "hidden = T.Or(hidden, key < self.first_key(row))",
        "hidden = T.Or(hidden, key <= self.first_key(row))",
        within="hides",
        first=WINDOW_SWEEP,
    ),
    Mutant(
        # A tile cut by the left edge of its last row only, not its first: taken as unmasked.
        "left_edge_mask_from_the_first_row",
        "mask.py",
        "kv_start < self.first_key(q_start + block_m - 1)",
        "kv_start < self.first_key(q_start)",
        within="tile_needs_mask",
        first=WINDOW_SWEEP,
    ),
    Mutant(
        # The right edge of a window without causal one key wide.
        "window_right_edge_off_by_one",
        "mask.py",
        "return 0 if self.causal else self.right",
        "return 0 if self.causal else self.right + 1",
        first=WINDOW_SWEEP,
    ),
    Mutant(
        # The cap's argument without the softmax scale: tanh(x / c).
        "softcap_before_the_scale",
        "variants.py",
        "2 * LOG2E * softmax_scale / softcap",
        "2 * LOG2E / softcap",
        first=SOFTCAP_TESTS,
    ),
    Mutant(
        # Under a softcap the mask is dropped: the cap's select keeps every key.
        "softcap_mask_dropped",
        "mask.py",
        "T.if_then_else(rule.hides(kv_start + j, q_start + i), neg_inf, capped(acc_s[i, j]))",
        "capped(acc_s[i, j])",
        first=SOFTCAP_TESTS,
    ),
    Mutant(
        "sink_left_out_of_the_lse",
        "softmax.py",
        "rows.row_max_scaled[i] = joint_max",
        "rows.row_max_scaled[i] = rows.row_max_scaled[i]",
        first=WINDOW_SWEEP,
    ),
    Mutant(
        "sink_left_out_of_the_sum",
        "softmax.py",
        "rows.row_sum[i] * rows.alpha[i] + T.exp2(sink_log2 - joint_max)",
        "rows.row_sum[i] * rows.alpha[i]",
        first=WINDOW_SWEEP,
    ),
    Mutant(
        # The output's weights left at the row's own max once the sink moved it.
        "sink_weights_not_rescaled",
        "softmax.py",
        "acc_o[i, d] if kept is None else acc_o[i, d] * kept[i]",
        "acc_o[i, d]",
        first=WINDOW_SWEEP,
    ),
    # ---- the gradients' variants: tests/test_variants_kernel.py's gradient tests first
    Mutant(
        # dsinks = −Σ P_sink·D without D: the sink's weight alone.
        "dsinks_missing_the_delta_term",
        "gradient.py",
        "-(sink_weights * delta).sum(dim=(0, 2))",
        "-sink_weights.sum(dim=(0, 2))",
        first=BACKWARD_VARIANTS,
    ),
    Mutant(
        # The dK/dV kernel's query range stops a row short of the last whose window reaches the tile.
        "backward_window_rows_one_short",
        "backward.py",
        "rule.rows_before(kv_start + block_n)",
        "rule.rows_before(kv_start + block_n - 1)",
        first=BACKWARD_VARIANTS,
    ),
    Mutant(
        # The fixed-order dQ's walk starts a K/V tile late.
        "dq_window_walk_a_tile_late",
        "backward_dq.py",
        "kv_first = T.max(0, rule.first_key(q_start)) // block_n",
        "kv_first = T.max(0, rule.first_key(q_start)) // block_n + 1",
        first=BACKWARD_VARIANTS,
    ),
    Mutant(
        # dS without the cap's slope 1 − t², in the fixed-order dQ kernel.
        "dq_softcap_slope_dropped",
        "backward_dq.py",
        "ds_cast[i, j] = p * (acc_dp[i, j] - delta[i]) * (1 - t * t)",
        "ds_cast[i, j] = p * (acc_dp[i, j] - delta[i])",
        first=BACKWARD_VARIANTS,
    ),
    Mutant(
        # The same in the dK/dV kernel, in the tiles that need no mask.
        "backward_dkdv_softcap_slope_dropped",
        "backward.py",
        "acc_s[i, j] = T.exp2(t * scale_log2 - lse[j])\n"
        "ds_cast[i, j] = acc_s[i, j] * (acc_dp[i, j] - delta[j]) * (1 - t * t)",
        "acc_s[i, j] = T.exp2(t * scale_log2 - lse[j])\nds_cast[i, j] = acc_s[i, j] * (acc_dp[i, j] - delta[j])",
        within="capped_probabilities_and_ds",
        first=BACKWARD_VARIANTS,
    ),
    Mutant(
        # A row without a max whose window starts inside the tile is not voted over: the tile's
        # weights stay against the stand-in, and the next tile's rescale drops them.
        "window_vote_a_tile_late",
        "kernel.py",
        "rule.first_key(row) < kv_start + block_n",
        "rule.first_key(row) < kv_start",
        first=WINDOW_SWEEP,
    ),
    Mutant(
        # The split-KV launch's splits start a K/V tile after the window's first.
        "split_kv_window_starts_a_tile_late",
        "decode.py",
        "T.min(T.max(0, rule.first_key(0)) // block_n, last_tile)",
        "T.min(T.max(0, rule.first_key(0)) // block_n + 1, last_tile)",
        first=SPLIT_KV_VARIANTS,
    ),
    Mutant(
        # The combine leaves the sink out of the sum (its max still taken).
        "split_kv_sink_left_out_of_the_sum",
        "decode.py",
        "weights = weights + T.exp2(Sinks[head] * LOG2E - reference)",
        "weights = weights",
        first=SPLIT_KV_VARIANTS,
    ),
    # ---- ragged batches (the forward's varlen build): tests/test_varlen.py
    Mutant(
        # Each sequence's queries read from one row late (a cu_seqlens offset off by one; the
        # forward's and the gradient's read).
        "varlen_query_offset_off_by_one",
        "scheduler.py",
        "cu_seqlens_q[sequence]",
        "cu_seqlens_q[sequence] + 1",
        first=VARLEN,
    ),
    Mutant(
        # Each sequence sees one key too few (the next entry of cu_seqlens_k read as exclusive twice).
        "varlen_keys_one_short",
        "scheduler.py",
        "cu_seqlens_k[sequence + 1] - k_offset",
        "cu_seqlens_k[sequence + 1] - k_offset - 1",
        first=VARLEN,
    ),
    Mutant(
        # Each sequence sees the next one's first key (the end of its keys read one late): the
        # cross-talk the isolation test perturbs each sequence to catch.
        "varlen_keys_one_long",
        "scheduler.py",
        "cu_seqlens_k[sequence + 1] - k_offset",
        "cu_seqlens_k[sequence + 1] - k_offset + 1",
        first=VARLEN,
    ),
    Mutant(
        # The forward's K/V tiles read from the packed keys' start, not their sequence's.
        "varlen_forward_keys_without_offset",
        "kernel.py",
        "key_row = at_offset(tile.k_offset, kv_start)",
        "key_row = kv_start",
        first=VARLEN,
    ),
    Mutant(
        # A sequence's last, partial block stored by a whole TMA box: rows of the next sequence overwritten.
        "varlen_partial_block_by_tma",
        "epilogue.py",
        "q_start + block_m <= seqlen",
        "q_start < seqlen",
        within="store_sequence_rows",
        first=VARLEN,
    ),
    Mutant(
        # Each tile of the order runs its sequence's next query block: the first block of each
        # sequence is never run, and its last runs past the end.
        "varlen_tile_order_block_off_by_one",
        "kernel.py",
        "block = (ragged[5], block[1], sequence)",
        "block = (ragged[5] + 1, block[1], sequence)",
        first=VARLEN,
    ),
    Mutant(
        # The tile order's sequence read from its tile column (every ragged kernel reads it there).
        "varlen_tile_order_columns_swapped",
        "scheduler.py",
        "sequence = tile_order[block, 0]",
        "sequence = tile_order[block, 1]",
        first=VARLEN,
    ),
    Mutant(
        # The gradient's query tiles read from the packed rows' start, not their sequence's.
        "varlen_backward_rows_without_offset",
        "backward.py",
        "at_offset(q_offset, q_start)",
        "q_start",
        within="backward_program",
        first=VARLEN,
    ),
    Mutant(
        # The gradient's query tiles read Delta and LSE₂ at their packed rows, not their sequence's own start.
        "varlen_backward_statistics_rows_unpadded",
        "backward.py",
        "first = statistics_row(q_start, q_offset, sequence)",
        "first = at_offset(q_offset, q_start)",
        within="backward_program",
        first=VARLEN,
    ),
    Mutant(
        # The fixed-order dQ's query tiles read them there too.
        "varlen_dq_statistics_rows_unpadded",
        "backward_dq.py",
        "first = statistics_row(q_start, q_offset, sequence)",
        "first = at_offset(q_offset, q_start)",
        within="dq_program",
        first=VARLEN,
    ),
    Mutant(
        # The preprocess writes a sequence's Delta and LSE₂ at its packed rows; the gradients read its own start.
        "varlen_preprocess_statistics_rows_unpadded",
        "backward_preprocess.py",
        "first = statistics_row(q_start, q_offset, sequence)",
        "first = at_offset(q_offset, q_start)",
        first=VARLEN,
    ),
    Mutant(
        # The fixed-order dQ's query tiles read and written from the packed rows' start.
        "varlen_dq_rows_without_offset",
        "backward_dq.py",
        "at_offset(q_offset, q_start)",
        "q_start",
        within="dq_program",
        first=VARLEN,
    ),
    Mutant(
        # The fixed-order dQ's partial last query tile stored whole: the next sequence's first rows overwritten.
        "varlen_dq_partial_query_tile_stored_whole",
        "backward_dq.py",
        "varlen and q_start + block_m > rule.seqlen_q",
        "varlen and q_start >= rule.seqlen_q",
        first=VARLEN,
    ),
    Mutant(
        # A sequence's last, partial K/V tile stores dK and dV whole: the next sequence's first rows overwritten.
        "varlen_backward_partial_key_tile_stored_whole",
        "backward.py",
        "kv_start + block_n <= tile.rule.seqlen_k",
        "kv_start < tile.rule.seqlen_k",
        first=VARLEN,
    ),
    # ---- the paged KV cache (the split kernel's paged build): tests/test_paged.py
    Mutant(
        # The block table read with a 16-key page stride whatever the page size.
        "paged_block_table_wrong_stride",
        "decode.py",
        "key // page_size",
        "key // 16",
        first=PAGED,
    ),
    Mutant(
        # cache_seqlens taken as the last key's index, not the count: each request one key short.
        "paged_cache_seqlens_exclusive",
        "decode.py",
        "T.min(CacheSeqlens[b], max_pages * page_size)",
        "T.min(CacheSeqlens[b] - 1, max_pages * page_size)",
        first=PAGED,
    ),
    # ---- the backward (backward.py): its boundary sweep is its smoke tier
    Mutant(
        # The select's causal part dropped (the gradient kernels and the split-KV kernel).
        "backward_causal_mask_dropped",
        "mask.py",
        "visible = T.And(visible, key <= (self.last_key(row) if last_key is None else last_key))",
        "visible = visible",
        within="sees",
        first=BACKWARD_SWEEP,
    ),
    Mutant(
        # A tile whose last key is one right of its first row's diagonal taken for a tile every
        # row sees whole: that row sees one key too many (both gradient kernels).
        "backward_diagonal_tile_unmasked",
        "mask.py",
        "kv_start + block_n - 1 > self.last_key(q_start)",
        "kv_start + block_n - 1 > self.last_key(q_start) + 1",
        within="tile_needs_mask",
        first=BACKWARD_SWEEP,
    ),
    Mutant(
        # The causal walk starts one query tile after the first that sees the K/V tile.
        "backward_first_query_tile_late",
        "backward.py",
        "T.max(rule.first_row(kv_start), 0) // block_m",
        "T.max(rule.first_row(kv_start), 0) // block_m + 1",
        first=BACKWARD_SWEEP,
    ),
    Mutant(
        # A split block walks the group's first heads, not its own share: the other heads' keys
        # get no gradient from them, and the first heads' count several times.
        "head_split_walks_the_first_heads",
        "backward.py",
        "head = kv_head * group_size + split + step // q_blocks * splits",
        "head = kv_head * group_size + step // q_blocks * splits",
        within="backward_program",
        first=HEAD_SPLITS,
    ),
    Mutant(
        # Every split walks the group's floor share: where the splits do not divide the group,
        # the heads past the floor's get no gradient.
        "head_split_uneven_share_dropped",
        "backward.py",
        "walk_heads = T.max(T.ceildiv(group_size - split, splits), 1)",
        "walk_heads = T.max(group_size // splits, 1)",
        within="backward_program",
        first=HEAD_SPLITS,
    ),
    Mutant(
        # The splits' heads taken one apart, not `splits` apart: they overlap, and the group's
        # last heads get no gradient.
        "head_split_heads_adjacent",
        "backward.py",
        "head = kv_head * group_size + split + step // q_blocks * splits",
        "head = kv_head * group_size + split + step // q_blocks",
        within="backward_program",
        first=HEAD_SPLITS,
    ),
    Mutant(
        # Every heavy-first group taken as long as the first: the last, shorter group's blocks
        # walk pairs past the launch's and leave some of its K/V tiles without gradients.
        "heavy_first_last_group_full",
        "scheduler.py",
        "pairs = T.min(group, kv_slots * batch - first_pair)",
        "pairs = T.min(group, kv_slots * batch)",
        within="heavy_first_block",
        first=HEAVY_FIRST,
    ),
    Mutant(
        # The caller sums only the first split's partial dK and dV.
        "head_split_partials_not_summed",
        "gradient.py",
        "dk.copy_(dk_part.sum(dim=0))",
        "dk.copy_(dk_part[0])",
        first=HEAD_SPLITS,
    ),
    Mutant(
        "backward_dk_without_scale",
        "backward.py",
        "acc_dk[i, j] = acc_dk[i, j] * softmax_scale",
        "acc_dk[i, j] = acc_dk[i, j]",
        first=BACKWARD_SWEEP,
    ),
    # ---- the backward's launch (gradient.py) and autograd formula (interface.py)
    Mutant(
        "backward_lse_gradient_sign",
        "gradient.py",
        "delta[:, :, :seqlen_q] -= grad_lse",
        "delta[:, :, :seqlen_q] += grad_lse",
        first=("tests/test_backward_kernel.py::test_lse_gradient",),
    ),
    Mutant(
        "backward_dq_without_scale",
        "gradient.py",
        "torch.mul(dq_accum[:, :, :seqlen_q, :head_dim].transpose(1, 2), softmax_scale, out=dq)",
        "dq.copy_(dq_accum[:, :, :seqlen_q, :head_dim].transpose(1, 2))",
        first=BACKWARD_SWEEP,
    ),
    Mutant(
        # flash_attn_func's eager autograd drops the LSE's upstream gradient, which the ops'
        # formula (what torch.compile runs) passes on.
        "eager_lse_gradient_dropped",
        "interface.py",
        "_saved_gradients(ctx, grad_out, grad_lse, _gradients)",
        "_saved_gradients(ctx, grad_out, None, _gradients)",
        first=("tests/test_backward_kernel.py::test_lse_gradient",),
    ),
    # ---- the deterministic dQ (backward_dq.py)
    Mutant(
        # The walk stops one K/V tile before the last its rows see.
        "deterministic_dq_last_tile_dropped",
        "backward_dq.py",
        "T.ceildiv(rule.keys_before(q_start + block_m), block_n)",
        "T.ceildiv(rule.keys_before(q_start + block_m), block_n) - 1",
        within="dq_program",
        first=DETERMINISTIC_SWEEP,
    ),
    Mutant(
        # deterministic=True quietly served by the atomic dQ (its bits vary with the order the
        # reduce-adds land in): only the repeated runs can tell.
        "deterministic_served_by_atomics",
        "gradient.py",
        "compiled_gradient_kernels(\n        head_dim=head_dim, causal=causal, dtype=dtype, arch=arch,"
        " deterministic=fixed_order, variants=variants,\n        head_splits=splits > 1,\n    )",
        "compiled_gradient_kernels(\n        head_dim=head_dim, causal=causal, dtype=dtype, arch=arch,"
        " deterministic=False, variants=variants,\n        head_splits=splits > 1,\n    )",
        first=DETERMINISTIC_RUNS,
    ),
    Mutant(
        # The default gradient's route to the fixed-order path ignored (configs.gradient_plan's
        # table tested on the CPU, its use here only by the test that watches the kernels built).
        "fixed_order_route_ignored",
        "gradient.py",
        "gradient_plan(batch, rule, nheads_kv, group, head_dim, sm_count, deterministic, route)",
        "gradient_plan(batch, rule, nheads_kv, group, head_dim, sm_count, deterministic, False)",
        first=(
            "tests/test_backward_kernel.py::"
            "test_the_default_gradient_takes_the_fixed_order_path_where_the_table_routes_it",
        ),
    ),
    # ---- flash_attn_func's route to the split-KV kernels (interface.py): the routing tests
    Mutant(
        # A step of several queries sent the other way from the rule: only a test that watches
        # which kernels ran can tell, both paths being correct.
        "route_inverted_past_one_query",
        "interface.py",
        "serves_launch(batch, seqlen_q, k.shape[1], heads, k.shape[2], sm_count)",
        "serves_launch(batch, seqlen_q, k.shape[1], heads, k.shape[2], sm_count) is (seqlen_q == 1)",
        first=ROUTING,
    ),
    Mutant(
        # The rule asked about one query fewer: 9 queries routed as 8.
        "route_one_query_fewer",
        "interface.py",
        "serves_launch(batch, seqlen_q, k.shape[1], heads, k.shape[2], sm_count)",
        "serves_launch(batch, max(1, seqlen_q - 1), k.shape[1], heads, k.shape[2], sm_count)",
        first=ROUTING,
    ),
    Mutant(
        # The rule asked about one key fewer: a step at exactly its keys limit stays on the forward.
        "route_one_key_fewer",
        "interface.py",
        "serves_launch(batch, seqlen_q, k.shape[1], heads, k.shape[2], sm_count)",
        "serves_launch(batch, seqlen_q, k.shape[1] - 1, heads, k.shape[2], sm_count)",
        first=ROUTING,
    ),
    # ---- the split-KV kernels (decode.py): their GPU tests, split and tile ends next to each other
    Mutant(
        # Each split's weight 2^(lse_s - max) without the division by their sum.
        "decode_combine_unnormalised",
        "decode.py",
        "T.exp2(LSE_partial[b, split, head, i] - lse)",
        "T.exp2(LSE_partial[b, split, head, i] - reference)",
        first=DECODE,
    ),
    Mutant(
        "decode_rescale_dropped",
        "decode.py",
        "softmax.rescale_output(acc_o, row_state.alpha)",
        "",
        first=DECODE,
    ),
    Mutant(
        # The key one past seqlen_k (loaded as zeros) counted as seen.
        "decode_mask_one_key_wide",
        "mask.py",
        "visible = key < self.seqlen_k",
        "visible = key <= self.seqlen_k",
        first=DECODE,
    ),
    Mutant(
        "decode_causal_off_by_one",
        "decode.py",
        "rule.last_key((first_row + r) // group_size)",
        "rule.last_key((first_row + r) // group_size) - 1",
        first=DECODE,
    ),
    Mutant(
        # The last split stops one tile short of the last key.
        "decode_split_one_tile_short",
        "decode.py",
        "T.ceildiv(rule.seqlen_k, block_n) - first_tile",
        "T.ceildiv(rule.seqlen_k, block_n) - first_tile - 1",
        first=DECODE,
    ),
    Mutant(
        # A GQA group's rows read the wrong query head: head h of K/V head g is g * group + h.
        "decode_group_heads_swapped",
        "decode.py",
        "Q[b, row // group_size, kv_head * group_size + row % group_size, d]",
        "Q[b, row // group_size, kv_head + row % group_size * heads_kv, d]",
        first=DECODE,
    ),
]

EMULATOR_MUTANTS = [
    Mutant(
        "stale_max_never_replaced",
        "emulator.py",
        "row_max = torch.where(moves, row_max, row_max_prev)",
        "row_max = row_max_prev",
    ),
    Mutant(
        "stale_sum_limit_past_fp16",
        "emulator.py",
        "stale_sum > STALE_SUM_LIMIT",
        "stale_sum > 131072.0",
    ),
    Mutant(
        "rescale_after_gemm",
        "emulator.py",
        "acc_o = acc_o * alpha[:, None]\nacc_o = acc_o + acc_p.float() @ v_tile",
        "acc_o = acc_o + acc_p.float() @ v_tile\nacc_o = acc_o * alpha[:, None]",
    ),
    Mutant(
        "last_tile_sum", "emulator.py", "row_sum = row_sum * alpha + acc_s.sum(dim=-1)", "row_sum = acc_s.sum(dim=-1)"
    ),
    Mutant(
        "alpha_from_new_max",
        "emulator.py",
        "torch.exp2(row_max_prev * scale_log2 - row_max_scaled)",
        "torch.exp2(row_max * scale_log2 - row_max_scaled)",
    ),
    Mutant(
        "no_boundary_mask",
        "emulator.py",
        "masked = ((k_idx >= seqlen_k) | edges.hidden(k_idx, all_rows))[:rows]",
        "masked = ((k_idx < 0) | edges.hidden(k_idx, all_rows))[:rows]",
    ),
    Mutant(
        "mask_only_past_the_end",
        "emulator.py",
        "needs_mask = needs_mask or kv_start + block_n - 1 > q_start + diagonal_offset + edges.right",
        "needs_mask = needs_mask",
    ),
    Mutant(
        "causal_off_by_one",
        "emulator.py",
        "hidden |= keys > diagonals + self.right",
        "hidden |= keys >= diagonals + self.right",
        within="hidden",
    ),
    Mutant(
        "causal_loop_one_short",
        "emulator.py",
        "last_visible = q_start + block_m + diagonal_offset + edges.right",
        "last_visible = q_start + diagonal_offset + edges.right",
    ),
    Mutant(
        "scale_without_log2e",
        "emulator.py",
        "scale_log2 = softmax_scale * LOG2E",
        "scale_log2 = softmax_scale",
        within="attention_tiled",
    ),
    Mutant(
        "no_max_subtraction",
        "emulator.py",
        "acc_s = torch.exp2(acc_s * scale_log2 - row_max_scaled[:, None])",
        "acc_s = torch.exp2(acc_s * scale_log2)",
    ),
    Mutant("gqa_wrong_kv_head", "emulator.py", "kv_head = head // group_size", "kv_head = head % nheads_kv"),
    Mutant(
        "lse_in_log2",
        "emulator.py",
        "(row_max_scaled + torch.log2(row_sum)) * LN2",
        "(row_max_scaled + torch.log2(row_sum))",
    ),
    # The backward's specification (attention_backward_tiled, judged by tests/test_backward.py).
    Mutant(
        "backward_without_delta",
        "emulator.py",
        "probs * (do_tile @ v_tile.T - delta[b, rows, head][:, None])",
        "probs * (do_tile @ v_tile.T)",
    ),
    Mutant("backward_dk_unscaled", "emulator.py", "(acc_dk * softmax_scale).to(k.dtype)", "acc_dk.to(k.dtype)"),
    Mutant(
        "backward_one_head_of_the_group",
        "emulator.py",
        "range(kv_head * group_size, (kv_head + 1) * group_size)",
        "range(kv_head * group_size, kv_head * group_size + 1)",
    ),
    # The variants (window, softcap, sinks; judged by tests/test_variants.py), forward and backward.
    Mutant(
        "window_left_edge_off_by_one",
        "emulator.py",
        "hidden |= keys < diagonals - self.left",
        "hidden |= keys <= diagonals - self.left",
        within="hidden",
    ),
    Mutant(
        # The walk starts at the tile of the block's last row's first key, not its first row's.
        "window_walk_starts_late",
        "emulator.py",
        "first_block = min(max(0, q_start + diagonal_offset - edges.left) // block_n, num_kv_blocks - 1)",
        "first_block = min(max(0, q_start + block_m - 1 + diagonal_offset - edges.left) // block_n, num_kv_blocks - 1)",
    ),
    Mutant(
        # The left edge cuts no tile: only the right edge and the end decide the mask.
        "window_left_edge_unmasked",
        "emulator.py",
        "needs_mask = needs_mask or kv_start < q_start + block_m - 1 + diagonal_offset - edges.left",
        "needs_mask = needs_mask",
    ),
    Mutant(
        "softcap_before_the_scale",
        "emulator.py",
        "cls(softmax_scale / softcap, softcap * LOG2E)",
        "cls(1 / softcap, softcap * LOG2E)",
    ),
    Mutant(
        # The cap after an additive mask: a hidden key's -inf comes out of tanh as -softcap.
        "softcap_over_the_mask",
        "emulator.py",
        "acc_s = cap.apply(q_tile @ k_tile.T)\n"
        "if masked is not None:\n    acc_s = acc_s.masked_fill(masked, -math.inf)",
        "if masked is not None:\n    acc_s = acc_s.masked_fill(masked, -math.inf)\n"
        "acc_s = cap.apply(acc_s + q_tile @ k_tile.T)",
    ),
    Mutant(
        "sink_left_out_of_the_sum",
        "emulator.py",
        "row_sum = row_sum * kept + torch.exp2(sink_log2 - joint_max)",
        "row_sum = row_sum * kept",
    ),
    Mutant(
        "backward_window_rows_one_short",
        "emulator.py",
        "end_q = max(0, min(seqlen_q, kv_start + keys - diagonal_offset + edges.left))",
        "end_q = max(0, min(seqlen_q, kv_start + keys - diagonal_offset + edges.left - 1))",
    ),
    Mutant(
        "backward_softcap_without_its_slope", "emulator.py", "grad_s = grad_s * (1 - tanh * tanh)", "grad_s = grad_s"
    ),
    Mutant(
        "dsinks_without_delta",
        "emulator.py",
        "dsinks = -(sink_probs * delta.transpose(1, 2)).sum(dim=(0, 2))",
        "dsinks = -sink_probs.sum(dim=(0, 2))",
    ),
]
