"""Mutation testing: apply each kernel bug to a copy of the source, run the suite against it,
and fail unless every mutant is killed (or, for generated mutants, shown equivalent).

    python tools/mutants.py                          # the hand-written mutants, on the GPU
    python tools/mutants.py --generated --list       # the generated mutants, one line each (no GPU)
    python tools/mutants.py --generated              # triage on the CPU, then the GPU
    python tools/mutants.py --target emulator        # the hand-written bugs in the CPU emulator
    python -m tools.mutants --only rescale_after_gemm --select tests/test_kernel.py::test_every_consumer_schedule
        # one test, every parameter (no -x): which of its cases catch the mutant

Two kinds of mutant:
- hand-written (KERNEL_MUTANTS, EMULATOR_MUTANTS): the semantic bugs a kernel author makes
  (a rescale after the GEMM, the last tile's sum). Each patch is anchored on the AST, not on
  whitespace: `old` is a Python fragment (an expression, or one or more statements in a row)
  that must occur exactly once, compared as `ast.unparse` writes it, so a reformat of the
  kernel leaves every mutant applying;
- generated (tools/ast_mutants.py): every relational swap, off-by-one, min/max and or/and swap,
  guard forced, and named constant perturbed in the kernel's tile logic.

Each mutant is judged in tiers, the cheap ones first:
1. triage (CPU, generated kernel.py mutants): the mutant's PrimFunc of every kernel the tables
   ship and the boundary sweep builds is compared with the unmutated one's. Identical for all:
   the mutant is **equivalent** (the compiled kernels are the same, as TileLang's cache key is
   that PrimFunc's script); the reason is that check, recorded with the count. A build that
   raises kills the mutant. Mutants that change the code but not the results are listed in
   tools/equivalent_mutants.py, each with its reason and the test that checks it, which runs
   first;
2. the mutant's own tests (`first`), then the smoke tier (`-m smoke`: the boundary sweep);
3. the whole GPU suite, for the survivors of the smoke tier.
Mutants spread over every GPU of the host (CUDA_VISIBLE_DEVICES per mutant), each with a
TileLang cache of its own seeded from the unmutated build's, so that kernels the mutant does
not change load instead of compiling.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "fa_kernel"

from tools.ast_mutants import GeneratedMutant, apply_patch, generate  # noqa: E402
from tools.codegen_rules import bulk_source_rewritten_in_flight, outstanding_at_exit  # noqa: E402
from tools.equivalent_mutants import BITWISE, EQUIVALENT, GPU_CHECKS, GUARDED, ROUNDING  # noqa: E402


@dataclass(frozen=True)
class Mutant:
    """A hand-written bug: `old` -> `new` in `file`, where `old` is a Python fragment found once
    (within the function `within`, if named) by its AST, whatever its formatting."""

    name: str
    file: str  # relative to src/fa_kernel
    old: str
    new: str
    more: tuple[tuple[str, str], ...] = ()  # further (old, new) patches in the same file
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

    @property
    def id(self) -> str:
        return self.name


JUMPS = ("tests/test_kernel.py::test_scores_that_jump_between_key_tiles",)
PERSISTENT = ("tests/test_kernel.py::test_persistent_thread_blocks_walk_several_tiles",)
NONFINITE = ("tests/test_nonfinite.py",)
GUARD_REGIONS = ("tests/test_guard_regions.py",)
WARPGROUP_TILES = ("tests/test_kernel.py::test_warpgroups_visit_only_the_key_tiles_their_rows_see",)
BACKWARD_SWEEP = ("tests/test_backward_kernel.py::test_backward_boundary_sweep",)
DETERMINISTIC_SWEEP = ("tests/test_backward_kernel.py::test_deterministic_backward_boundary_sweep",)
DETERMINISTIC_RUNS = ("tests/test_backward_kernel.py::test_deterministic_gradients_are_the_same_bits_in_every_run",)
DECODE = ("tests/test_decode.py::test_split_kv_kernels_within_the_bound",)
ROUTING = ("tests/test_decode.py::test_flash_attn_func_gives_decode_steps_to_the_split_kv_kernels",)


def _rows_without_keys() -> tuple[str, ...]:
    """The one-key test on the first causal sweep build: only a causal row can see no key, so a
    non-causal build (the first changed one, often) passes whatever the epilogue does with them."""
    from suite.boundaries import build_id, sweep_builds

    build = next(build for build in sweep_builds() if build["causal"])
    return (f"tests/test_boundary_sweep.py::test_rows_that_see_one_key_or_none[{build_id(build)}]",)


ROWS_WITHOUT_KEYS = _rows_without_keys()
# The generated mutants of a file whose code the smoke tier never runs (it calls the kernels
# directly): the GPU tests of the launch (empty inputs, one key, strided inputs) first.
FIRST_BY_FILE = {
    "backward.py": BACKWARD_SWEEP + DETERMINISTIC_SWEEP,
    "decode.py": DECODE,
    "interface.py": (
        "tests/test_kernel.py::test_empty_inputs",
        "tests/test_kernel.py::test_matches_reference_head_dim_128",
        "tests/test_kernel.py::test_packed_qkv_slices_give_the_same_result",
        *ROUTING,
    ),
}


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
        "issue_scores(pipe.Q, ring_stage(pipe.K, stage), acc_s, kv_start, q_start)\nT.wait_wgmma(0)",
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
        "return key >= self.seqlen_k",
        "return key < 0",
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
        "return row + (self.seqlen_k - self.seqlen_q)",
        "return row",
        more=(
            ("return row_end + (self.seqlen_k - self.seqlen_q)", "return row_end"),
            ("return key - (self.seqlen_k - self.seqlen_q)", "return key"),
        ),
    ),
    Mutant(
        "causal_loop_one_short",
        "kernel.py",
        "T.ceildiv(visibility.keys_before(q_start + block_m), block_n)",
        "T.ceildiv(visibility.keys_before(q_start), block_n)",
    ),
    Mutant(
        # Every warpgroup stops a K/V tile short of its rows' last (the block's last tile, too).
        "warpgroup_kv_blocks_one_short",
        "kernel.py",
        "return T.if_then_else(first_row < seqlen_q, T.max(1, visible), 1)",
        "return T.if_then_else(first_row < seqlen_q, T.max(1, visible - 1), 1)",
        first=WARPGROUP_TILES,
    ),
    Mutant(
        # Causal: a warpgroup visits the keys its first row sees, not its last (a tile short
        # where its rows straddle a K/V tile boundary).
        "warpgroup_stops_at_its_first_row",
        "kernel.py",
        "last_rows_end = T.min(first_row + rows_per_warpgroup, seqlen_q)",
        "last_rows_end = T.min(first_row, seqlen_q)",
        first=WARPGROUP_TILES,
    ),
    Mutant(
        # Heaviest-first order off by one: one query block is never computed.
        "causal_block_order_off_by_one",
        "kernel.py",
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
        "write_mask(acc_s, 0, next_q_start)",
        "q_start = tile.q_start\nwrite_mask(acc_s, 0, q_start)",
        first=PERSISTENT,
    ),
    Mutant(
        # With O in a buffer of its own, every warpgroup stores the first warpgroup's rows.
        "output_rows_of_the_first_warpgroup_only",
        "kernel.py",
        "first_row = thread // 128 * rows_per_warpgroup",
        "first_row = 0",
    ),
    Mutant(
        # O's TMA store covers the first 64 columns only (head_dim 128 and 256 lose the rest).
        "output_stored_in_one_panel",
        "kernel.py",
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
        "interface.py",
        "softmax_scale * LOG2E",
        "softmax_scale",
        within="forward_kernel_attention",
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
        "T.if_then_else(row_sum[i] == 0, 0, acc_o[i, d] / row_sum[i])",
        "acc_o[i, d] / row_sum[i]",
        first=ROWS_WITHOUT_KEYS,
    ),
    Mutant(
        # A NaN row sum read as "no key": a corrupted input becomes a plausible 0 (docs/nonfinite.md).
        "nan_row_made_finite",
        "softmax.py",
        "T.if_then_else(row_sum[i] == 0, 0, acc_o[i, d] / row_sum[i])",
        "T.if_then_else(row_sum[i] > 0, acc_o[i, d] / row_sum[i], 0)",
        first=NONFINITE,
    ),
    Mutant(
        # One LSE row past seqlen_q, with TileLang's own bounds guard switched off: the write lands
        # past the end of lse (with the guard on, this mutant is equivalent; docs/testing.md).
        "lse_row_past_the_end_unguarded",
        "kernel.py",
        "q_start + i < seqlen_q",
        "q_start + i <= seqlen_q",
        more=(
            (
                "PASS_CONFIGS = OWN_SYNCS",
                "PASS_CONFIGS = {**OWN_SYNCS, "
                "__import__('tilelang').PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True}",
            ),
        ),
        first=GUARD_REGIONS,
    ),
    Mutant("gqa_wrong_kv_head", "kernel.py", "kv_head = head // (heads // heads_kv)", "kv_head = head % heads_kv"),
    Mutant(
        "lse_in_log2",
        "kernel.py",
        "softmax.log2_sum(regs.rows, i) * LN2",
        "softmax.log2_sum(regs.rows, i)",
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
        "T.max(visibility.first_row(kv_start), 0) // block_m",
        "T.max(visibility.first_row(kv_start), 0) // block_m + 1",
        first=BACKWARD_SWEEP,
    ),
    Mutant(
        "backward_dk_without_scale",
        "backward.py",
        "acc_dk[i, j] = acc_dk[i, j] * softmax_scale",
        "acc_dk[i, j] = acc_dk[i, j]",
        first=BACKWARD_SWEEP,
    ),
    # ---- the backward's front (interface.py)
    Mutant(
        "backward_lse_gradient_sign",
        "interface.py",
        "delta[:, :, :seqlen_q] -= grad_lse",
        "delta[:, :, :seqlen_q] += grad_lse",
        first=("tests/test_backward_kernel.py::test_lse_gradient",),
    ),
    Mutant(
        "backward_dq_without_scale",
        "interface.py",
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
    # ---- the deterministic dQ (backward.py's dq_program)
    Mutant(
        # The walk stops one K/V tile before the last its rows see.
        "deterministic_dq_last_tile_dropped",
        "backward.py",
        "T.ceildiv(visibility.keys_before(q_start + block_m), block_n)",
        "T.ceildiv(visibility.keys_before(q_start + block_m), block_n) - 1",
        within="dq_program",
        first=DETERMINISTIC_SWEEP,
    ),
    Mutant(
        # deterministic=True quietly served by the atomic dQ (its bits vary with the order the
        # reduce-adds land in): only the repeated runs can tell.
        "deterministic_served_by_atomics",
        "interface.py",
        "compiled_gradient_kernels(head_dim=head_dim, causal=causal, dtype=dtype, arch=arch, "
        "deterministic=deterministic)",
        "compiled_gradient_kernels(head_dim=head_dim, causal=causal, dtype=dtype, arch=arch, deterministic=False)",
        first=DETERMINISTIC_RUNS,
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
        "softmax.rescale_output(acc_o, alpha)",
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
        "last_key[r] = visibility.last_key((first_row + r) // group_size)",
        "last_key[r] = visibility.last_key((first_row + r) // group_size) - 1",
        first=DECODE,
    ),
    Mutant(
        # The last split stops one tile short of the last key.
        "decode_split_one_tile_short",
        "decode.py",
        "T.ceildiv(seqlen_k, block_n) - first_tile",
        "T.ceildiv(seqlen_k, block_n) - first_tile - 1",
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
        "row_max = torch.where(stale_sum > STALE_SUM_LIMIT, row_max, row_max_prev)",
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
    Mutant("no_boundary_mask", "emulator.py", "masked = k_idx >= seqlen_k", "masked = k_idx < 0"),
    Mutant(
        "mask_only_past_the_end",
        "emulator.py",
        "needs_mask = needs_mask or kv_start + block_n - 1 > q_start + diagonal_offset",
        "needs_mask = needs_mask",
    ),
    Mutant(
        "causal_off_by_one",
        "emulator.py",
        "(k_idx > q_idx + diagonal_offset)",
        "(k_idx >= q_idx + diagonal_offset)",
        within="_attend_one_head",
    ),
    Mutant(
        "causal_loop_one_short",
        "emulator.py",
        "last_visible = q_start + block_m + diagonal_offset",
        "last_visible = q_start + diagonal_offset",
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
]

# Seconds of silence after which a sweep tier is stopped and counted as a hang (a kill): with 16
# mutants at once on one H200, a passing one-build tier took 24-44 s (2026-12-01), a kernel
# compile and well under a second of launches, printing as each test ends; silent for 120 s it
# is waiting on a barrier.
HANG_SECONDS = 120
# A killed tier whose processes are still there after this long is reported, not waited for.
KILL_SECONDS = 60
# pytest-xdist workers of a mutant's suite (or selected tests), all on its one GPU: four per
# GPU, as `nox -s gpu` runs (eight were slower on one H200: the CUDA contexts take turns).
SUITE_WORKERS = 4

# What a tier costs, for --deadline's estimates: each kernel it compiles, with its tests, takes
# about BUILD_SECONDS with 16 mutants at once on 16 cores (one H200 host, 2026-12-01: one-build
# kills in 32-65 s, twelve-build checks in 220-446 s), and any tier TIER_SECONDS more (pytest's
# start, the tests of kernels already built).
BUILD_SECONDS = 40
TIER_SECONDS = 20

# Which tests judge a mutant: the smoke tier first (the boundary sweep), then the GPU suite, for
# the kernel; the property suite and the boundary sweep on the emulator for the emulator.
SMOKE_ARGS = ["tests/test_boundary_sweep.py", "tests/test_guard_regions.py", "-m", "smoke"]
# The smoke tier's test of writes outside out and lse, per sweep build: a GUARDED reason's check.
GUARD_TEST = "tests/test_guard_regions.py::test_sweep_builds_write_only_out_and_lse"
# Before any GPU tier, for mutants outside kernel.py: the dispatch and the API's checks, on the CPU.
CPU_TESTS = ("tests/test_configs.py", "tests/test_api.py")
# CPU tests of a kernel file's pure conditions, run before any GPU tier of its mutants: a
# mutant of one of them dies in seconds, without a compile.
CPU_BY_FILE = {"backward.py": ("tests/test_backward_tiles.py",), "mask.py": ("tests/test_mask.py",)}


def cpu_args(file: str) -> list[str]:
    """The CPU tier's pytest arguments for a mutant of `file` (not kernel.py's: the smoke tier)."""
    return [*CPU_TESTS, *CPU_BY_FILE.get(file, ()), "-m", "not gpu"]


PYTEST_ARGS = {
    "kernel": ["tests", "-m", "gpu", "-k", "not emulator"],
    "backward": ["tests/test_backward_kernel.py", "-m", "gpu"],
    "decode": ["tests/test_decode.py", "-m", "gpu"],
    # The boundary cases and the named non-finite ones first: under -x a kill there costs
    # seconds, where the property draws before them took minutes to reach it.
    "emulator": [
        "tests/test_boundary_sweep.py",
        "tests/test_nonfinite.py",
        "tests/test_properties.py",
        "tests/test_backward.py",
        "-k",
        "emulator or tiled_backward",
    ],
}


# The files whose generated mutants each target judges (tools/ast_mutants.py's scopes), and the
# targets that run on a GPU. The gradient and split-KV kernels are targets of their own: their
# tests are their own GPU tests, and their campaigns apart from the forward's.
GENERATED_FILES = {
    "kernel": None,  # ast_mutants.FILES: the forward kernel, its launch, dispatch and constants
    "emulator": ("emulator.py",),
    "backward": ("backward.py",),
    "decode": ("decode.py",),
}
GPU_TARGETS = ("kernel", "backward", "decode")
# Per file of a kernel other than the forward: its module-level builder of every kernel a launch
# runs, and the builds its GPU tests launch (fp16 alone: the dtype enters a kernel only as its
# element type, which no operator mutates).
PROGRAM_BUILDERS = {"backward.py": "compiled_gradient_kernels", "decode.py": "compiled_decode_kernels"}
# What of those files the host runs too, where an identical PrimFunc proves nothing: split_plan
# chooses the launch's splits, and a module constant may size a buffer the launch allocates
# (PREPROCESS_ROWS) as well as a kernel's tile.
HOST_SIDE = ("split_plan", "<module>")


def program_builds(file: str) -> list[dict]:
    """The builder's arguments (PROGRAM_BUILDERS) of every kernel `file`'s GPU tests launch."""
    if file == "backward.py":
        from fa_kernel.backward import BACKWARD_TILES

        return [
            dict(head_dim=head_dim, causal=causal, dtype="float16", arch="sm_90a", deterministic=deterministic)
            for head_dim in sorted(BACKWARD_TILES)
            for causal in (False, True)
            for deterministic in (False, True)
        ]
    from fa_kernel.decode import SPLIT_TILES

    return [
        dict(head_dim=head_dim, causal=causal, dtype="float16", arch="sm_90a", block_m=block_m)
        for head_dim, block_m in sorted(SPLIT_TILES)
        for causal in (False, True)
    ]


def program_digests(source: str, file: str, builds: list[dict]) -> list[str]:
    """sha256 of the PrimFunc scripts and pass configs (TileLang's cache key) of the kernels each
    build's builder compiles, with `file`'s text replaced by `source`, read by standing in for the
    module's `compile_program`; 'error: ...' where building a program raises."""
    digests = []
    try:
        with _kernel_module(source) as module:
            # The kernels' one compile call (fa_kernel.toolchain), as the module imported it.
            from fa_kernel.toolchain import FAST_MATH

            module.compile_program = lambda program, arch, pass_configs=FAST_MATH: (
                program.script(show_meta=True) + repr(pass_configs)
            )
            builder = getattr(module, PROGRAM_BUILDERS[file])
            for build in builds:
                try:
                    scripts = [script for script in builder(**build) if script is not None]
                    digests.append(short_digest("\n".join(scripts)))
                except Exception as error:  # a mutant may break the Python that builds a kernel
                    digests.append(f"error: {type(error).__name__}: {error}")
    except Exception as error:  # the mutated module itself does not import
        digests = [f"error: {type(error).__name__}: {error}"]
    return digests


def triage_programs(mutants: list, jobs: int, cache: Path | None = None) -> dict[str, tuple[str, str]]:
    """For mutants of backward.py and decode.py: 'equivalent' where every kernel their GPU tests
    launch has the unmutated PrimFunc (so the compiled kernels are the same) and the host runs
    none of the mutated code (HOST_SIDE), 'killed' where building one raises (every test that
    launches it fails there); the rest are left to run. Digests are kept in `cache` by mutated
    source, as triage's are."""
    try:
        stored = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    except json.JSONDecodeError:
        stored = {}
    verdicts: dict[str, tuple[str, str]] = {}
    for file in sorted({m.file for m in mutants} & set(PROGRAM_BUILDERS)):
        builds = program_builds(file)
        context = hashlib.sha256(f"{file} {builds!r}".encode()).hexdigest()

        def key(source: str, context: str = context) -> str:
            return short_digest(f"{context}\n{source}")

        original_source = (PACKAGE / file).read_text()
        if key(original_source) not in stored:
            stored[key(original_source)] = program_digests(original_source, file, builds)
        original = stored[key(original_source)]
        ours = [m for m in mutants if m.file == file]
        sources = {m.id: m.mutated_source() for m in ours}
        missing = [source for source in dict.fromkeys(sources.values()) if key(source) not in stored]
        with ProcessPoolExecutor(max(1, jobs)) as pool:
            computed = pool.map(program_digests, missing, itertools.repeat(file), itertools.repeat(builds))
            for source, digests in zip(missing, computed, strict=True):
                stored[key(source)] = digests
                _save_triage(cache, stored)  # as each comes: a triage cut short keeps what it did
        for mutant in ours:
            mutated = stored[key(sources[mutant.id])]
            if mutated == original and mutant.function not in HOST_SIDE:
                reason = f"identical PrimFuncs for all {len(builds)} builds its tests launch"
                verdicts[mutant.id] = ("equivalent", reason)
            elif any(digest.startswith("error: ") for digest in mutated):
                error = next(digest for digest in mutated if digest.startswith("error: "))
                verdicts[mutant.id] = ("killed", f"triage: building the kernel raises ({error[7:80]})")
    _save_triage(cache, stored)
    return verdicts


def triage_builds(sm_count: int) -> list[dict]:
    """The kernels triage compares: every build of the boundary sweep, then every config the
    full grid's tables ship at `sm_count` (as flash_attn_func builds them), fp16 (the dtype
    enters the kernel only as the element type, which no operator mutates). The small grids'
    bands (configs.TUNED_GRIDS) are not among them yet: their configs join the triage with the
    next triage run of every mutant (docs/testing.md)."""
    from suite.boundaries import sweep_builds

    from fa_kernel.workbench.builds import shipped_builds, unique

    full = shipped_builds(sm_count=sm_count, small_grids=False)
    shipped = [build for build in full if build["dtype"] == "float16"]
    return unique([*sweep_builds(), *shipped])


def short_digest(text: str) -> str:
    """64 bits of text's sha256: what the triage cache (tools/records/triage.json) keeps of each
    program and source, enough to tell a few thousand apart, and a quarter of the full digest's size."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def primfunc_digests(
    kernel_source: str, builds: list[dict], original: list[str] | None = None, always: int = 0
) -> list[str]:
    """sha256 of the PrimFunc script and pass configs (TileLang's cache key) of each build, with kernel.py's text
    replaced by `kernel_source`; 'error: ...' where building the program raises. Given the
    unmutated `original` digests, it stops at the first build past the first `always` whose
    digest differs (the mutant is then known to change the kernel)."""

    digests: list[str] = []
    try:
        with _kernel_module(kernel_source) as module:
            for index, build in enumerate(builds):
                # forward_program takes what compiled_forward does, but the target (arch).
                arguments = {name: value for name, value in build.items() if name not in ("dtype", "arch")}
                try:
                    program = module.forward_program(dtype=build["dtype"], **arguments)
                    # The pass configs enter TileLang's cache key too (a mutant may switch a pass off).
                    compiled = program.script(show_meta=True) + repr(getattr(module, "PASS_CONFIGS", None))
                    digests.append(short_digest(compiled))
                except Exception as error:  # a mutant may break the Python that builds the kernel
                    digests.append(f"error: {type(error).__name__}: {error}")
                if original is not None and index >= always and digests[-1] != original[index]:
                    break
    except Exception as error:  # the mutated module itself does not import
        digests = [f"error: {type(error).__name__}: {error}"]
    return digests


def generated_code_digests(
    kernel_source: str, builds: list[dict], indices: list[int], original: dict[int, str] | None = None
) -> dict[int, str]:
    """{index: sha256 of what TileLang generates for builds[index]}, kernel.py's text replaced
    by `kernel_source`: the CUDA source, the host module (launch configuration, TMA
    descriptors, argument checks), the kernel's parameters and the pass configs, which is all
    nvcc and the runtime wrapper are given, so equal digests mean the same compiled kernel.
    'breaks: ...' where the CUDA source breaks a rule of tools/codegen_rules.py. Given the
    unmutated digests `original`, it stops at the first build whose digest differs."""

    import tilelang
    from tilelang import tvm
    from tilelang.engine.lower import lower

    tilelang.set_log_level("WARNING")
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    digests: dict[int, str] = {}
    with _kernel_module(kernel_source) as module:
        for index in indices:
            build = builds[index]
            arguments = {name: value for name, value in build.items() if name not in ("dtype", "arch")}
            try:
                program = module.forward_program(dtype=build["dtype"], **arguments)
                with tvm.transform.PassContext(opt_level=3, config=module.PASS_CONFIGS), target:
                    artifact = lower(program, target=target)
                # Without the names TileLang gives its scratch buffers in no fixed order (same_kernels).
                named = re.sub(r"\bworkspace(_\d+)?\b", "workspace_N", artifact.kernel_source)
                generated = f"{named}\n{artifact.host_mod}\n{artifact.params}\n{module.PASS_CONFIGS!r}"
                digests[index] = short_digest(generated)
                source = artifact.kernel_source
                if problems := outstanding_at_exit(source) + bulk_source_rewritten_in_flight(source):
                    digests[index] = f"breaks: {problems[0]}"
            except Exception as error:  # a build that lowers in one source and not in the other differs
                digests[index] = f"error: {type(error).__name__}: {error}"
            if original is not None and digests[index] != original[index]:
                break
    return digests


@contextlib.contextmanager
def _kernel_module(kernel_source: str):
    """kernel.py's text replaced by `kernel_source`, imported as a module of its own (TileLang
    reads a prim_func's source from its file)."""
    import importlib.util

    with tempfile.NamedTemporaryFile("w", suffix="_kernel.py", delete=False) as file:
        file.write(kernel_source)
    try:
        spec = importlib.util.spec_from_file_location(f"mutated_kernel_{Path(file.name).stem}", file.name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        os.unlink(file.name)


@dataclass
class Triage:
    """What triage settled on the CPU, and for the rest, which of the boundary sweep's builds
    each mutant changes: only those can fail on it, so its smoke tier runs those alone."""

    verdicts: dict[str, tuple[str, str]]
    changed_sweep_builds: dict[str, list[dict]]


def triage(mutants: list, jobs: int, sm_count: int, cache: Path | None = None, compute: bool = True) -> Triage:
    """For the kernel.py mutants: 'equivalent' where every triage build has the unmutated
    PrimFunc (so the compiled kernels are the same), 'killed' where building the kernel raises
    (every test that launches it fails there); for the others, the sweep builds whose PrimFunc
    the mutant changes. `cache` (JSON) keeps each mutated source's digests, so that a run on
    the GPU host reuses a triage made on another machine. `compute` False: the cache alone; a
    mutant it does not hold is left out."""
    import hashlib

    from suite.boundaries import sweep_builds

    sweep = sweep_builds()
    builds = triage_builds(sm_count)
    assert builds[: len(sweep)] == sweep  # the sweep's builds first: each mutant's are all computed
    kernel_mutants = [m for m in mutants if m.file == "kernel.py"]
    context = hashlib.sha256(repr(builds).encode()).hexdigest()

    def key(source: str) -> str:
        return short_digest(f"{context}\n{source}")

    try:
        stored = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    except json.JSONDecodeError:  # a copy taken mid-write: computed again
        stored = {}
    original_source = (PACKAGE / "kernel.py").read_text()
    original = stored.get(key(original_source)) or (primfunc_digests(original_source, builds) if compute else None)
    if original is None:
        return Triage({}, {})
    stored[key(original_source)] = original
    sources = [m.mutated_source() for m in kernel_mutants]
    missing = [source for source in dict.fromkeys(sources) if key(source) not in stored] if compute else []
    with ProcessPoolExecutor(max(1, jobs)) as pool:
        computed = pool.map(
            primfunc_digests,
            missing,
            itertools.repeat(builds),
            itertools.repeat(original),
            itertools.repeat(len(sweep)),
        )
        for source, digests in zip(missing, computed, strict=True):
            stored[key(source)] = digests
            _save_triage(cache, stored)  # as each comes: a triage cut short keeps what it did
    result = Triage({}, {})
    changed_at: dict[str, list[int]] = {}  # source: the builds whose PrimFunc differs or was not computed
    for mutant, source in zip(kernel_mutants, sources, strict=True):
        mutated = stored.get(key(source))
        if mutated is None:  # not in the cache, and not computed
            continue
        if mutated == original:
            reason = f"identical PrimFunc for all {len(builds)} shipped and swept kernels"
            result.verdicts[mutant.id] = ("equivalent", reason)
        elif any(digest.startswith("error: ") for digest in mutated):
            error = next(digest for digest in mutated if digest.startswith("error: "))
            result.verdicts[mutant.id] = ("killed", f"triage: building the kernel raises ({error[7:80]})")
        else:
            result.changed_sweep_builds[mutant.id] = [
                build for build, before, after in zip(sweep, original, mutated, strict=False) if before != after
            ]
            changed_at[source] = [i for i in range(len(builds)) if i >= len(mutated) or mutated[i] != original[i]]
    # A PrimFunc that differs may still lower to the same code (TileLang's simplifier proves a
    # bound, a copy takes its source's extent): where every build that differs does, the
    # compiled kernels are the unmutated ones.
    same_code, broken = _same_generated_code(original_source, changed_at, builds, jobs, stored, key, cache, compute)
    for mutant, source in zip(kernel_mutants, sources, strict=True):
        if source in broken:
            result.verdicts[mutant.id] = ("killed", f"triage: {CODEGEN_TEST} fails on its code: {broken[source]}")
            del result.changed_sweep_builds[mutant.id]
        elif same_code.get(source):
            lowered = len(changed_at[source])
            reason = f"the same generated code for all {len(builds)} shipped and swept kernels ({lowered} lowered)"
            result.verdicts[mutant.id] = ("equivalent", reason)
            del result.changed_sweep_builds[mutant.id]
    return result


# The test that checks tools/codegen_rules.py on the shipped builds, which triage applies to a
# mutant's. Triage cache entries name the rules' digest: a changed rule lowers the builds again.
CODEGEN_TEST = "tests/test_codegen.py::test_nothing_asynchronous_outlives_the_block"
GENERATED = f"generated {hashlib.sha256((ROOT / 'tools' / 'codegen_rules.py').read_bytes()).hexdigest()[:12]} "


def _save_triage(cache: Path | None, stored: dict) -> None:
    """Write the triage cache whole, by a rename: a copy taken meanwhile is never half written."""
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.with_suffix(".tmp").write_text(json.dumps(stored))
        cache.with_suffix(".tmp").replace(cache)


def _same_generated_code(
    original_source, changed_at, builds, jobs, stored, key, cache, compute
) -> tuple[dict[str, bool], dict[str, str]]:
    """({mutated source: whether each build in changed_at[source] lowers to the unmutated code},
    {mutated source: the rule of tools/codegen_rules.py a build it lowered breaks}), from
    generated_code_digests, kept in the triage cache beside the PrimFunc digests; `compute`
    False: from the cache alone (a build it does not hold counts as differing)."""

    def save() -> None:  # as each comes: a triage cut short keeps what it did
        if compute:
            _save_triage(cache, stored)

    def generated(source: str) -> dict[int, str]:
        return {int(index): digest for index, digest in stored.get(GENERATED + key(source), {}).items()}

    original = generated(original_source)
    needed = sorted({index for indices in changed_at.values() for index in indices} - set(original))
    missing = [source for source in changed_at if GENERATED + key(source) not in stored]
    if not compute:
        needed, missing = [], []
    with ProcessPoolExecutor(max(1, jobs)) as pool:
        # The unmutated builds first, one task each: every mutant is compared with them.
        unmutated = pool.map(
            generated_code_digests, itertools.repeat(original_source), itertools.repeat(builds), [[i] for i in needed]
        )
        for digests in unmutated:
            original.update(digests)
        stored[GENERATED + key(original_source)] = original
        save()
        computed = pool.map(
            generated_code_digests,
            missing,
            itertools.repeat(builds),
            [changed_at[source] for source in missing],
            itertools.repeat(original),
        )
        for source, digests in zip(missing, computed, strict=True):
            stored[GENERATED + key(source)] = digests
            save()

    def same(source: str, index: int) -> bool:  # an unmutated build that does not lower proves nothing
        return not original.get(index, "error: not lowered").startswith(("error: ", "breaks: ")) and (
            generated(source).get(index) == original[index]
        )

    broken = {}  # where the unmutated build keeps the rules and the mutated one breaks one
    for source, indices in changed_at.items():
        for index in indices:
            digest = generated(source).get(index, "")
            unmutated = original.get(index, "error: not lowered")
            if digest.startswith("breaks: ") and not unmutated.startswith(("error: ", "breaks: ")):
                broken[source] = digest.removeprefix("breaks: ")
                break
    same_code = {source: all(same(source, index) for index in indices) for source, indices in changed_at.items()}
    return same_code, broken


def recorded_equivalents(mutants: list[GeneratedMutant]) -> dict[str, tuple[str, str]]:
    """{mutant id: ('equivalent', reason)} for the mutants tools/equivalent_mutants.py records,
    once the tests that check their reasons pass (on the CPU); none if one fails. The BITWISE
    and ROUNDING ones are checked per mutant on the GPU (mutant_tiers)."""
    recorded = [m for m in mutants if m.key in EQUIVALENT and EQUIVALENT[m.key].check not in GPU_CHECKS]
    checks = sorted({EQUIVALENT[m.key].check for m in recorded})
    if not checks:
        return {}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *checks]
    if subprocess.run(command, cwd=ROOT, capture_output=True).returncode != 0:
        print(f"the checks of the recorded equivalent mutants fail ({' '.join(checks)}): those mutants run")
        return {}
    return {m.id: ("equivalent", f"{EQUIVALENT[m.key].why} (checked: {EQUIVALENT[m.key].check})") for m in recorded}


def _tilelang_cache() -> Path:
    """TileLang's kernel cache, as TileLang itself resolves it (TILELANG_CACHE_DIR or its default)."""
    from tilelang import env

    return Path(env.TILELANG_CACHE_DIR).expanduser()


def gpu_count() -> int:
    """GPUs of this host, without initialising CUDA in this process (its children use them)."""
    probe = "import torch; print(torch.cuda.device_count())"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return int(result.stdout.strip() or 0)


def host_cache(name: str, files: list[Path], extra: str = "") -> Path:
    """~/.cache/fa-kernel/NAME/DIGEST: where this host keeps what was made from the unmutated
    package's sources, the `files` and `extra` alone (DIGEST is theirs, so an edit starts anew)."""
    import hashlib

    sources = [*sorted(PACKAGE.glob("*.py")), *files]
    digest = hashlib.sha256(extra.encode() + b"".join(path.read_bytes() for path in sources)).hexdigest()[:16]
    return Path("~/.cache/fa-kernel").expanduser() / name / digest


def run_script(path: str) -> list[str]:
    """The command that runs a tool of tools/ named by its path, as a module of the repository
    (`python -m tools.name`, from ROOT), so that it imports tests.* and tools.* as packages."""
    return [sys.executable, "-m", path.split()[0].removesuffix(".py").replace("/", ".")]


def bitwise_seed_folder() -> Path:
    """Where this host keeps the unmutated kernel's digests (tools/bitwise_sweep.py record): by
    the package, the sweep script and the modules of tests/ and tools/ it imports. A seed left
    stale by a new toolchain can only make a mutant's bits differ, which sends it to the tests."""
    sweep = ROOT / BITWISE
    return host_cache("bitwise-seeds", [sweep, *sorted(_local_imports(sweep))])


def _seed_readable(folder: Path, build: str) -> bool:
    """Whether `folder` holds a whole seed of `build` (a record stopped mid-write leaves half a
    file, which goes). The file name is tools/bitwise_sweep.py's: the build id, slashes as _."""
    path = folder / (build.replace("/", "_") + ".json")
    try:
        json.loads(path.read_text())
    except FileNotFoundError:
        return False
    except ValueError:
        path.unlink()
        return False
    return True


def unmutated_env(**variables: str) -> dict[str, str]:
    """This process's environment with the unmutated package first on PYTHONPATH (from src/,
    where it is not installed: nox --no-venv does the same), and `variables`."""
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **variables)


def smoke_nodes_by_build() -> dict[str, list[str]]:
    """{sweep build id: the smoke tier's test node ids on that build}, from pytest's collection
    (no GPU needed)."""
    from suite.boundaries import build_id, sweep_builds

    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *SMOKE_ARGS]
    # The tests import fa_kernel: from src/ where it is not installed (nox --no-venv does the same).
    listed = subprocess.run(command, cwd=ROOT, env=unmutated_env(), capture_output=True, text=True, check=True)
    listed = listed.stdout.splitlines()
    nodes = [line.strip() for line in listed if "::" in line]

    def on(build: dict, node: str) -> bool:  # the build is a node's first parameter, or its only one
        return f"[{build_id(build)}-" in node or node.endswith(f"[{build_id(build)}]")

    by_build = {build_id(build): [node for node in nodes if on(build, node)] for build in sweep_builds()}
    if not all(by_build.values()):
        raise RuntimeError(f"no smoke test found for the sweep builds {[b for b, n in by_build.items() if not n]}")
    return by_build


def mutant_tiers(
    mutant, target: str, changed: list[str] | None, smoke_nodes: dict[str, list[str]], smoke_only: bool, cpu_only: bool
) -> list[tuple[str, list[str]]]:
    """(name, pytest arguments) of the tiers that judge `mutant`, the cheapest first; each runs
    only if the ones before it passed. `changed`: the sweep builds (ids) whose kernel the mutant
    changes, where triage knows them: the smoke tier then runs on those alone, the first one
    before the rest (one compile settles most mutants). A mutant recorded as equivalent by a
    BITWISE (ROUNDING) reason is compared with the unmutated kernel over those builds first: the
    same bits (outputs within rounding) settle it, anything else sends it on to the tiers after.
    A GUARDED one first runs those builds' guard-region tests: a write outside out and lse kills it."""
    if target == "emulator":
        return [("suite", ["-x", *PYTEST_ARGS[target]])]
    if target in ("backward", "decode"):  # their own GPU tests; the forward's smoke tier never runs them
        cpu = [("cpu", ["-x", *CPU_BY_FILE[mutant.file]])] if mutant.file in CPU_BY_FILE else []
        if cpu_only:
            return cpu
        own = [*cpu, ("own tests", ["-x", *FIRST_BY_FILE[mutant.file]])]
        return own if smoke_only else [*own, ("suite", ["-x", *PYTEST_ARGS[target]])]
    tiers = []
    reason = EQUIVALENT.get(getattr(mutant, "key", None))
    if reason is not None and reason.check in GPU_CHECKS and changed:
        if reason.check == GUARDED:
            guard_nodes = [node for build in changed for node in smoke_nodes[build] if node.startswith(GUARD_TEST)]
            tiers.append(("guard regions", ["-x", *guard_nodes]))
        tiers.append(("close" if reason.check == ROUNDING else "bitwise", [BITWISE, *changed]))
    if mutant.file != "kernel.py":
        tiers.append(("cpu", ["-x", *cpu_args(mutant.file)]))
    first = getattr(mutant, "first", ()) or FIRST_BY_FILE.get(mutant.file, ())
    if first:
        tiers.append(("own tests", ["-x", *first]))
    if changed is None:
        tiers.append(("smoke", ["-x", *SMOKE_ARGS]))
    elif changed:
        tiers.append((f"smoke on {changed[0]}", ["-x", *smoke_nodes[changed[0]]]))
        if len(changed) > 1:
            rest = [node for build in changed[1:] for node in smoke_nodes[build]]
            tiers.append((f"smoke on {len(changed) - 1} more changed builds", ["-x", *rest]))
    if cpu_only:
        return [tier for tier in tiers if tier[0] == "cpu"]
    if not smoke_only:
        tiers.append(("suite", ["-x", *PYTEST_ARGS[target]]))
    return tiers


def tier_builds(name: str, pytest_args: list[str]) -> int:
    """How many kernels the tier `name` (as mutant_tiers names them) compiles for a mutant: a
    check's builds, or a smoke tier's changed builds. The CPU tier, the mutant's own tests and
    the smoke tier of a mutant that changes no kernel load the seeded cache; the suite's count is
    its precompile's, unknown here, so it counts as one."""
    if name in ("bitwise", "close"):
        return len(pytest_args) - 1
    if name == "guard regions":  # its builds, which the bitwise tier after it then loads
        return len(pytest_args) - 1
    if match := re.fullmatch(r"smoke on (\d+) more changed builds", name):
        return int(match.group(1))
    return 1 if name.startswith("smoke on ") or name == "suite" else 0


def first_tier_seconds(tiers: list[tuple[str, list[str]]], build_seconds: float = BUILD_SECONDS) -> float:
    """The estimated seconds until a mutant's first compiling tier ends (all its tiers if none
    compiles): what it must be given to reach its likeliest verdict."""
    seconds = 0.0
    for name, pytest_args in tiers:
        builds = tier_builds(name, pytest_args)
        seconds += TIER_SECONDS + builds * build_seconds
        if builds:
            break
    return seconds


# The tiers that check a recorded reason on the GPU (mutant_tiers), before any test of the mutant.
CHECK_TIERS = ("guard regions", "bitwise", "close")


def first_build_tiers(whole_tiers: dict[str, list]) -> tuple[dict[str, list], dict[str, str]]:
    """--first-build-only: ({id: the tiers of its first changed build's compile alone, after the
    CPU tier and its own tests}, {id: why it is left for a whole run}). Left: a mutant recorded
    as equivalent, settled by its GPU check (its first build's smoke tier, which it passes, would
    only take a slot), and one that changes no sweep build (its first GPU tier is the suite)."""
    tiers = {
        key: [tier for tier in whole if tier[0] in ("cpu", "own tests") or _one_build(tier[0])]
        for key, whole in whole_tiers.items()
    }
    checked_first = {key for key, whole in whole_tiers.items() if whole and whole[0][0] in CHECK_TIERS}
    deferred = {
        key: "its recorded reason's GPU check runs in a whole run"
        if key in checked_first
        else "it changes no sweep build: the suite judges it"
        for key, first in tiers.items()
        if not first or key in checked_first
    }
    return {key: first for key, first in tiers.items() if key not in deferred}, deferred


def precompile_args(all_tiers, target: str = "kernel") -> list[str]:
    """tools/precompile.py's arguments for the seed cache: the whole suite's kernels only where
    a mutant may reach a suite tier, or its own tests launch the gradient or split-KV kernels
    (which the suite's precompile alone builds); else the smoke tier's (a minute and a half less,
    cold)."""
    if target in ("backward", "decode"):
        return []
    suite = any(name in ("suite", "selected") for mutant_tiers in all_tiers for name, _ in mutant_tiers)
    return [] if suite else ["--smoke"]


def unmutated_failures(all_tiers) -> list[str]:
    """The tests of the mutants' GPU tiers (the smoke tier and the tests run first; not the
    suite, which `nox -s gpu` runs) that fail on the unmutated package: none, or nothing the
    runner says is a kill."""
    smoke, first = False, set()
    for mutant_tiers in all_tiers:
        for name, pytest_args in mutant_tiers:
            smoke |= name.startswith("smoke")
            if name in ("own tests", "selected"):
                first.update(arg for arg in pytest_args if not arg.startswith("-"))
    # Passed once on this host for these sources and tests: a stamp, so that each call of a run
    # resumed over several device calls does not pay for it again.
    runs = [(run, selection) for run, selection in ((smoke, SMOKE_ARGS), (bool(first), sorted(first))) if run]
    stamp = host_cache("baseline-passed", _tier_files([("", selection) for _, selection in runs]), json.dumps(runs))
    if stamp.is_file():
        print(f"unmutated kernel: passed these tiers' tests before on this host ({stamp})", flush=True)
        return []
    env = unmutated_env(HYPOTHESIS_PROFILE="mutants", FA_KERNEL_REQUIRE_GPU="1")
    failed = []
    for run, selection in runs:
        if not run:
            continue
        start = time.perf_counter()
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(SUITE_WORKERS), *selection]
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        failed += re.findall(r"^FAILED (\S+)", result.stdout, re.MULTILINE)
        if result.returncode != 0 and not failed:
            failed.append(f"pytest exited {result.returncode} on {' '.join(selection)}")
        seconds = time.perf_counter() - start
        print(f"unmutated kernel: {' '.join(selection)[:80]}: exit {result.returncode} ({seconds:.0f} s)", flush=True)
    if not failed:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.touch()
    return failed


def _sweeps(tier: str) -> bool:
    """Whether `tier` runs the sweep's shapes, printing as it goes (a build's line, a test's dot):
    one silent for HANG_SECONDS is waiting on a kernel that never returns (run_mutant)."""
    return tier in CHECK_TIERS or tier.startswith("smoke")


def _one_build(tier: str) -> bool:
    """Whether `tier` is the smoke tier of a mutant's first changed build (mutant_tiers)."""
    return tier.startswith("smoke on ") and "more changed builds" not in tier


# The process groups of the tiers running now. Each runs in a session of its own (a time-out
# kills its compilers with it), so a signal to the runner does not reach them: it stops them.
RUNNING: set[int] = set()


def _stop_running_tiers(signum, frame) -> None:
    for group in list(RUNNING):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    os._exit(128 + signum)  # the pool's threads would start the next mutants otherwise


def seconds_since(start: float) -> float:
    return time.perf_counter() - start


def _wait(process: subprocess.Popen, limit: float | None, silence: float | None) -> tuple[str, str, str | None]:
    """(stdout, stderr, why it was stopped) of a tier's `process`: None where it ended by itself,
    'limit' past `limit` seconds, 'silence' after `silence` seconds without a byte on either pipe,
    both with its whole process group killed, and 'stuck' where that group is still there
    KILL_SECONDS later."""
    received: dict[str, list[bytes]] = {"out": [], "err": []}
    last_output = [time.monotonic()]

    def read(stream, into: list[bytes]) -> None:
        while chunk := stream.read1(1 << 16):
            into.append(chunk)
            last_output[0] = time.monotonic()

    readers = [
        threading.Thread(target=read, args=(stream, received[name]), daemon=True)
        for name, stream in (("out", process.stdout), ("err", process.stderr))
    ]
    for reader in readers:
        reader.start()
    started, stopped = time.monotonic(), None
    while stopped is None:
        try:
            process.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if limit is not None and now - started > limit:
                stopped = "limit"
            elif silence is not None and now - last_output[0] > silence:
                stopped = "silence"
    if stopped is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        try:
            process.wait(timeout=KILL_SECONDS)
        except subprocess.TimeoutExpired:
            stopped = "stuck"
    for reader in readers:
        reader.join(timeout=5)
    text = [b"".join(received[name]).decode(errors="replace") for name in ("out", "err")]
    return text[0], text[1], stopped


def mutant_package(mutant, text: str, workdir: Path, cache: Path) -> dict[str, str]:
    """A copy of src/ in workdir/<mutant id> with `text` for the mutant's file, and the
    environment that imports it (FA_KERNEL_EXPECT_SRC, which the tools check) and builds its
    kernels into the TileLang cache `cache`."""
    src = workdir / mutant.id / "src"
    shutil.copytree(ROOT / "src", src)
    (src / "fa_kernel" / mutant.file).write_text(text)
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
        TILELANG_CACHE_DIR=str(cache),
        FA_KERNEL_EXPECT_SRC=str(src),
    )


def run_mutant(
    mutant,
    target: str,
    workdir: Path,
    tiers: list[tuple[str, list[str]]],
    timeout: float | None = None,
    gpu: int | None = None,
    seed_cache: Path | None = None,
    selected: bool = False,
    bitwise_seed: Path | None = None,
    stop_at: float | None = None,
    build_seconds: float = BUILD_SECONDS,
) -> tuple[str, str, float]:
    """('killed' | 'equivalent' | 'SURVIVED' | 'TIMEOUT' | 'ERROR', detail, seconds), running
    `tiers` in turn until one fails (the bitwise tier: until it passes; `bitwise_seed` holds the
    unmutated kernel's digests). `selected`: the tiers are tests the caller chose, run whole (no -x), and the
    detail lists every case that failed. A run past `timeout` seconds in all is stopped: a
    mutant that hangs the kernel is reported, not waited for. Before the whole suite or chosen tests, every
    kernel it needs is built over all cores (tools/precompile.py), as `nox -s gpu` does.
    `stop_at` (a time.perf_counter() value, --deadline): a mutant whose first compiling tier is not
    expected to end by then is not started, and one still running then is stopped; both are
    NOT RUN, which a record does not keep."""
    start = time.perf_counter()
    if not tiers:  # --smoke-only, for a mutant that changes no sweep build
        return "NOT RUN", "no tier left to run it (the suite judges it)", 0.0
    estimate = first_tier_seconds(tiers, build_seconds)
    if stop_at is not None and start + estimate > stop_at:
        return "NOT RUN", f"its first tier (about {estimate:.0f} s) would end past --deadline", 0.0
    try:
        text = mutant.mutated_source()
    except ValueError as error:
        return "ERROR", str(error), 0.0
    tree = workdir / mutant.id
    cache = tree / "tilelang-cache"
    env = mutant_package(mutant, text, workdir, cache)
    if seed_cache is not None and seed_cache.is_dir():
        # Hard links: the mutant's builds go into its own folder, the seed stays as it was.
        shutil.copytree(seed_cache, cache, copy_function=os.link)
    env.update(HYPOTHESIS_PROFILE="mutants", FA_KERNEL_REQUIRE_GPU="1" if target in GPU_TARGETS else "0")
    env["PYTHONUNBUFFERED"] = "1"  # each test's dot as it ends: the silence rule (_wait) reads them
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    log, check_hung = "", False
    for tier, pytest_args in tiers:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header", *pytest_args]
        if tier == "bitwise":
            command = [*run_script(pytest_args[0]), "compare", str(bitwise_seed), *pytest_args[1:]]
        if tier == "close":  # the unmutated kernel.py, built beside the mutant's
            command = [*run_script(pytest_args[0]), "close", str(PACKAGE / "kernel.py"), *pytest_args[1:]]
        if tier in ("suite", "selected") and target in GPU_TARGETS:
            # Many kernels: built over all cores first; then the tests shared by workers on the
            # mutant's GPU, as `nox -s gpu` shares them (the suite is work-bound).
            command = ["sh", "-c", '"$0" -m tools.precompile && exec "$0" "$@"', *command]
            command += ["-n", str(SUITE_WORKERS), "--dist", "worksteal"]
        # A session of its own: on a time-out the whole group goes (pytest and its compilers),
        # or their open pipes would keep this call waiting.
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
        RUNNING.add(process.pid)
        # A sweep tier prints as it goes (a build's line, a test's dot): one silent for
        # HANG_SECONDS is waiting on a kernel (or a build) that never finishes (_sweeps).
        limit = None if timeout is None else max(1.0, timeout - (time.perf_counter() - start))
        deadline = None if stop_at is None else max(1.0, stop_at - time.perf_counter())
        stopped_by_deadline = deadline is not None and (limit is None or deadline < limit)
        if stopped_by_deadline:
            limit = deadline
        stdout, stderr, stopped = _wait(process, limit, HANG_SECONDS if _sweeps(tier) else None)
        RUNNING.discard(process.pid)
        if stopped == "stuck":
            # Stuck in the driver: its GPU context may be what holds the other mutants'
            # kernels back, so neither this one nor theirs reads as a hang.
            return (
                "ERROR",
                f"the {tier} tier's processes did not exit {KILL_SECONDS} s after SIGKILL",
                seconds_since(start),
            )
        if stopped is not None:
            log += f"==== {tier} (stopped: {stopped})\n{stdout}{stderr}"
            if stopped == "silence" and tier in CHECK_TIERS:
                # A kernel that never returns shows nothing of the outputs: the tests judge it, as
                # any mutant whose check fails (and a hung context slows every other mutant's).
                check_hung = True
                continue
            (workdir / f"{mutant.id}.log").write_text(log)  # how far it got
            shutil.rmtree(tree, ignore_errors=True)
            seconds = seconds_since(start)
            if stopped == "silence":
                return "killed", f"hang: the {tier} tier printed nothing for {HANG_SECONDS} s and was stopped", seconds
            if stopped_by_deadline:
                return "NOT RUN", f"stopped at --deadline in the {tier} tier", seconds
            return "TIMEOUT", f"the {tier} tier ran past the {timeout:.0f} s limit and was stopped", seconds
        result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
        log += f"==== {tier}\n{result.stdout}{result.stderr}"
        if tier in ("bitwise", "close"):
            if result.returncode == 0:
                seconds = time.perf_counter() - start
                (workdir / f"{mutant.id}.log").write_text(log)
                shutil.rmtree(tree, ignore_errors=True)
                why, check = EQUIVALENT[mutant.key].why, EQUIVALENT[mutant.key].check
                what = "bitwise the unmutated kernel's outputs" if tier == "bitwise" else "within rounding of them"
                if "==== guard regions" in log:
                    what += ", and nothing written outside out and lse"
                return "equivalent", f"{why} (checked: {what}, {check})", seconds
            continue  # not the same outputs: judged by the tests, as any mutant
        if result.returncode != 0:
            break
    seconds = time.perf_counter() - start
    (workdir / f"{mutant.id}.log").write_text(log)
    shutil.rmtree(tree, ignore_errors=True)  # the mutated copy and its cache: GBs over a whole run
    if "FA_KERNEL_EXPECT_SRC mismatch" in log:
        return "ERROR", "the tests imported the shipped package, not the mutant", seconds
    if result.returncode == 0:
        claimed = ""
        if check_hung:
            claimed = " (recorded as equivalent, but its check's kernel never returned)"
        elif "==== bitwise" in log or "==== close" in log:
            claimed = " (recorded as equivalent, but its outputs are not the unmutated kernel's)"
        return "SURVIVED", f"every test of the {tier} tier passed{claimed}", seconds
    failed = re.findall(r"^FAILED (\S+)", log, re.MULTILINE)
    refused = failure_not_a_kill(result.returncode, log, failed)
    if refused:
        return "ERROR", f"{refused} in the {tier} tier", seconds
    if (
        tier in ("suite", "selected")
        and not failed
        and re.search(r"^precompile: .*\n  \{", result.stdout, re.MULTILINE)
    ):
        return "killed", "suite: a kernel fails to build (tools/precompile.py)", seconds
    if selected:
        return "killed", f"selected: {len(failed)} failed: " + " ".join(failed), seconds
    return "killed", f"{tier}: {failed[0] if failed else 'a test failed'}", seconds


# A test that failed for want of GPU memory failed for what ran beside it, not for the mutant.
OUT_OF_MEMORY = re.compile(r"CUDA out of memory|OutOfMemoryError|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY")


def failure_not_a_kill(returncode: int, log: str, failed: list[str]) -> str | None:
    """Why a tier that did not pass is no kill ('' where it is one): pytest exits 1 on a failed
    test, and 2 where pytest-xdist stops the session at the first failure under -x
    (xdist.dsession.Interrupted), a failure all the same; any other exit, or a failure for want
    of GPU memory, says nothing of the mutant (ERROR: run it again)."""
    if OUT_OF_MEMORY.search(log):
        return "a test ran out of GPU memory"
    if returncode == 1 or (returncode == 2 and failed and "xdist.dsession.Interrupted" in log):
        return ""
    last = log.strip().splitlines()[-1] if log.strip() else ""
    return f"pytest exited {returncode}: {last}"


# Compiles for sm_90a, with the package PYTHONPATH gives (a mutant's copy), into
# TILELANG_CACHE_DIR: for kernel.py the sweep builds named in argv[2] (JSON ids); for the gradient
# and split-KV kernels every build their GPU tests launch (a build the mutant leaves alone is the
# unmutated kernel's, compiled once for all).
PREBUILD_SCRIPT = """
import json, os, sys
import fa_kernel
from fa_kernel.workbench.builds import quiet_tilelang
expected = os.environ["FA_KERNEL_EXPECT_SRC"]
assert fa_kernel.__file__.startswith(expected), f"imported {fa_kernel.__file__}, not from {expected}"
quiet_tilelang()
file, wanted = sys.argv[1], set(json.loads(sys.argv[2]))
if file == "kernel.py":
    from suite.boundaries import build_id, sweep_builds
    from fa_kernel.kernel import compiled_forward
    for build in sweep_builds():
        if build_id(build) in wanted:
            compiled_forward(**build, arch="sm_90a")
elif file == "backward.py":
    from suite.builds import deterministic_builds
    from fa_kernel.backward import compiled_gradient_kernels, gradient_builds
    for build in gradient_builds("sm_90a") + deterministic_builds("sm_90a"):
        compiled_gradient_kernels(**build)
else:
    from suite.builds import split_kv_test_builds
    from fa_kernel.decode import compiled_decode_kernels
    for build in split_kv_test_builds("sm_90a"):
        compiled_decode_kernels(**build)
"""


def prebuild(mutants: list, changed: dict[str, list[str]], folder: Path, jobs: int | None) -> int:
    """--prebuild: for sm_90a, into the TileLang cache `folder`, each kernel.py mutant's changed
    sweep builds and every build the GPU tests of a backward.py or decode.py mutant launch, a
    mutant per process (`jobs` at once, default every core). A compiled kernel is some 30 KB
    packed: a GPU host is sent them and spends its time running them. (The unmutated sweep
    builds, which a close check builds beside the mutant's, the host's own precompile builds in
    seconds.)"""
    folder = folder.resolve()
    workdir = Path(tempfile.mkdtemp(prefix="fa-prebuild-"))
    work = [(m, changed.get(m.id, [])) for m in mutants if m.file in PROGRAM_BUILDERS or changed.get(m.id)]

    def build(mutant, builds: list[str]) -> tuple[str, int, float]:
        start = time.perf_counter()
        env = mutant_package(mutant, mutant.mutated_source(), workdir, folder)
        command = [sys.executable, "-c", PREBUILD_SCRIPT, mutant.file, json.dumps(builds)]
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        if result.returncode:
            print(result.stderr[-2000:], flush=True)
        return mutant.id, result.returncode, time.perf_counter() - start

    failed = 0
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        for name, code, seconds in pool.map(lambda item: build(*item), work):
            failed += code != 0
            print(f"{name:<48}  {'built' if code == 0 else 'FAILED'}  {seconds:6.0f} s", flush=True)
    shutil.rmtree(workdir, ignore_errors=True)
    sweep = sum(len(builds) for _, builds in work)
    others = sum(mutant.file in PROGRAM_BUILDERS for mutant, _ in work)
    print(f"prebuilt into {folder}: {sweep} sweep builds of {len(work) - others} mutants, own tests' of {others}")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=sorted(PYTEST_ARGS), default="kernel")
    parser.add_argument("--generated", action="store_true", help="the generated mutants (tools/ast_mutants.py)")
    parser.add_argument("--list", action="store_true", help="print the mutants and stop (no GPU)")
    parser.add_argument("--triage-only", action="store_true", help="generated: run the CPU triage and stop")
    parser.add_argument("--only", nargs="+", help="run these mutants only (names or generated ids)")
    parser.add_argument("--functions", nargs="+", help="generated: only mutants inside these functions")
    parser.add_argument(
        "--smoke-only", action="store_true", help="stop after the smoke tier: its survivors are reported, not run"
    )
    parser.add_argument(
        "--first-build-only",
        action="store_true",
        help="the cheapest kills: stop after the smoke tier of each mutant's first changed build (one compile); "
        "its survivors are reported, and run whole later",
    )
    parser.add_argument("--cpu-only", action="store_true", help="run the CPU tier only (no GPU needed)")
    parser.add_argument(
        "--status",
        action="store_true",
        help="print each mutant's verdict so far (triage, the checked equivalents, --record) and stop (no GPU)",
    )
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip running the tiers' tests on the unmutated kernel first (they must pass for a kill to mean anything)",
    )
    parser.add_argument("--jobs", type=int, default=None, help="mutants at once (default: 2 per GPU, at least 4)")
    parser.add_argument("--keep", metavar="DIR", help="keep logs here")
    parser.add_argument("--select", nargs="+", metavar="TEST", help="run only these pytest node ids, every case")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one mutant's tests may run")
    parser.add_argument(
        "--deadline",
        type=float,
        metavar="SECONDS",
        help="end the run this many seconds after it starts (triage and the seeding included): a mutant whose "
        "first compiling tier is not expected to end by then is not started, one still running then is stopped "
        "(neither is recorded)",
    )
    parser.add_argument("--sm-count", type=int, default=132, help="the GPU's SM count, for triage's shipped builds")
    parser.add_argument(
        "--prebuild",
        type=Path,
        metavar="DIR",
        help="no GPU: compile for sm_90a, into the TileLang cache DIR, every sweep build the selected kernel.py "
        "mutants change (for backward.py and decode.py mutants, every build their own tests launch), then stop; a "
        "GPU host that merges DIR into its TileLang cache (the seed) loads them instead of compiling (run it there "
        "with --build-seconds 5)",
    )
    parser.add_argument(
        "--build-seconds",
        type=float,
        default=BUILD_SECONDS,
        help=f"--deadline's estimate of a tier's time per kernel it builds (default {BUILD_SECONDS}: a compile "
        "with a mutant per core)",
    )
    parser.add_argument(
        "--record",
        type=Path,
        metavar="FILE.jsonl",
        help="append each verdict here, and skip mutants this file already judged on the same source and tests "
        "(a run cut short resumes where it stopped)",
    )
    parser.add_argument(
        "--triage-cache",
        type=Path,
        default=Path("~/.cache/fa-kernel/mutant-triage.json").expanduser(),
        help="each mutated kernel's PrimFunc digests, kept between runs (and machines: copy it along)",
    )
    parser.add_argument(
        "--seed-cache",
        type=Path,
        default=None,
        help="TileLang cache of the unmutated build, linked into each mutant's own (TileLang's own cache, "
        "filled by tools/precompile.py first, by default)",
    )
    args = parser.parse_args()
    run_start = time.perf_counter()
    for stop in (signal.SIGTERM, signal.SIGINT):  # a time limit, or Ctrl-C
        signal.signal(stop, _stop_running_tiers)

    if args.generated:
        files = GENERATED_FILES[args.target]
        mutants: list = generate(files=files) if files else generate()
    else:
        if args.target in ("backward", "decode"):
            parser.error("target: the backward's and split-KV kernels' hand-written mutants are the kernel target's")
        mutants = KERNEL_MUTANTS if args.target == "kernel" else EMULATOR_MUTANTS
    if args.only:
        mutants = [m for m in mutants if m.id in args.only]
    if args.functions:
        mutants = [m for m in mutants if m.function in args.functions]
    if args.list:
        for mutant in mutants:
            print(mutant.line_for_list() if args.generated else f"{mutant.name}  {mutant.file}")
        print(f"{len(mutants)} mutants")
        return 0

    settled: dict[str, tuple[str, str]] = {}
    changed: dict[str, list[str]] = {}  # mutant id: the sweep builds (ids) its kernel differs on
    if args.target == "kernel" and not args.select:
        from suite.boundaries import build_id

        start = time.perf_counter()
        found = triage(mutants, os.cpu_count() or 1, args.sm_count, args.triage_cache)
        changed = {key: [build_id(build) for build in builds] for key, builds in found.changed_sweep_builds.items()}
        if args.generated:
            settled = found.verdicts
            settled.update(recorded_equivalents([m for m in mutants if m.id not in settled]))
        else:
            # A hand-written bug that changes no kernel is a defect of the list, not a verdict;
            # one whose own tests build a kernel triage does not (test_kernel's schedules) runs them.
            first = {m.id for m in mutants if m.first}
            settled = {
                key: ("ERROR", "changes no kernel: " + reason) if verdict == "equivalent" else (verdict, reason)
                for key, (verdict, reason) in found.verdicts.items()
                if not (verdict == "equivalent" and key in first)
            }
        counts = Counter(verdict for verdict, _ in settled.values())
        print(
            f"triage: {counts['equivalent']} equivalent (identical kernels, or recorded and checked),"
            f" {counts['killed']} killed at build, of {len(mutants)}; {len(changed)} to run, on"
            f" {sum(map(len, changed.values()))} changed sweep builds ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
        if args.triage_only:
            for mutant in mutants:
                verdict = settled.get(mutant.id, ("to run", ""))[0]
                builds = f"  [{len(changed[mutant.id])} sweep builds]" if mutant.id in changed else ""
                line = mutant.line_for_list() if args.generated else f"{mutant.name}  {mutant.file}"
                print(f"{verdict:<10}  {line}{builds}")
            return 0
    if args.generated and args.target == "emulator":
        settled.update(recorded_equivalents(mutants))
    if args.generated and args.target in ("backward", "decode") and not args.select:
        start = time.perf_counter()
        settled = triage_programs(mutants, os.cpu_count() or 1, args.triage_cache)
        counts = Counter(verdict for verdict, _ in settled.values())
        print(
            f"triage: {counts['equivalent']} equivalent (identical PrimFuncs), {counts['killed']} killed at build,"
            f" of {len(mutants)} ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
        if args.triage_only:
            for mutant in mutants:
                print(f"{settled.get(mutant.id, ('to run', ''))[0]:<10}  {mutant.line_for_list()}")
            return 0
    if args.record is not None:
        # A recorded kill outweighs a recorded reason: that reason is wrong, and is said so.
        for key, (verdict, detail, _) in recorded_kills(args.record, mutants).items():
            if settled.get(key, ("",))[0] == "equivalent":
                print(f"{key}: recorded as equivalent in tools/equivalent_mutants.py, but killed: {detail}")
            settled[key] = (verdict, detail)
    to_run = [m for m in mutants if m.id not in settled]
    smoke_nodes = smoke_nodes_by_build() if args.target == "kernel" and not args.select else {}
    tiers = {
        m.id: [("selected", ["-rf", *args.select])]
        if args.select
        else mutant_tiers(m, args.target, changed.get(m.id), smoke_nodes, args.smoke_only, args.cpu_only)
        for m in to_run
    }
    whole_tiers = tiers
    if args.first_build_only:
        tiers, deferred = first_build_tiers(whole_tiers)
        settled.update({key: ("NOT RUN", why) for key, why in deferred.items()})
        to_run = [m for m in to_run if m.id not in deferred]
    recorded: dict[str, tuple[str, str, float]] = {}
    if args.record is not None:
        recorded = load_record(args.record, to_run, whole_tiers)  # a verdict on every build holds for the first
        recorded.update(load_record(args.record, [m for m in to_run if m.id not in recorded], tiers))
        to_run = [m for m in to_run if m.id not in recorded]
        print(f"{len(recorded)} verdicts taken from {args.record}, {len(to_run)} mutants to run", flush=True)
    if args.status:
        # Where a run stands, without running anything: triage's verdicts, the CPU-checked
        # equivalents and the record's, and the tiers each other mutant would run.
        known = {**{key: (*verdict, 0.0) for key, verdict in settled.items()}, **recorded}
        for mutant in mutants:
            if mutant.id in known:
                verdict, detail, _ = known[mutant.id]
            else:
                verdict, detail = "to run", " > ".join(name for name, _ in tiers[mutant.id])
            print(f"{mutant.id:<48}  {verdict:<10}  {detail[:110]}")
        counts = Counter(verdict for verdict, _, _ in known.values())
        print(
            f"\nkilled / equivalent / survived: {counts['killed']} / {counts['equivalent']} / {counts['SURVIVED']},"
            f" not yet judged {len(mutants) - sum(counts.values()) + counts['NOT RUN']} of {len(mutants)}"
        )
        return 0

    if args.prebuild is not None:
        kernels = ("kernel.py", *PROGRAM_BUILDERS)
        if args.first_build_only:  # the build its first smoke tier compiles (mutant_tiers: changed[0])
            changed = {key: builds[:1] for key, builds in changed.items()}
        return prebuild([m for m in to_run if m.file in kernels], changed, args.prebuild, args.jobs)
    if args.seed_cache is None:  # resolved only here: --list runs where TileLang is not installed
        args.seed_cache = _tilelang_cache()
    gpus = gpu_count() if args.target in GPU_TARGETS and not args.cpu_only else 0
    if args.target in GPU_TARGETS and not args.cpu_only and not gpus:
        # Without one the GPU tiers' tests fail (FA_KERNEL_REQUIRE_GPU), which would read as kills.
        parser.error("the kernel's mutants need a CUDA device (--list, --triage-only and --cpu-only do not)")
    if gpus and args.seed_cache.resolve() == _tilelang_cache().resolve():
        # Seed the mutants' caches with every kernel of the unmutated suite: a kernel a mutant
        # leaves alone then loads instead of compiling in each mutant's own cache.
        command = [*run_script("tools/precompile.py"), *precompile_args(tiers.values(), args.target)]
        subprocess.run(command, cwd=ROOT, check=True)
    if gpus and to_run and not args.no_baseline:
        failing = unmutated_failures(tiers.values())
        if failing:
            # Every mutant would read as killed by these: a kill means something only where the
            # unmutated kernel passes.
            print(f"the unmutated kernel fails tests the mutants' tiers run: {', '.join(failing[:5])}")
            return 2
    bitwise_builds = sorted(
        {build for m in to_run for name, tier_args in tiers[m.id] if name == "bitwise" for build in tier_args[1:]}
    )
    bitwise_seed = None
    if gpus and bitwise_builds:
        # The unmutated kernel's bits, for the mutants whose recorded reason is checked bitwise:
        # recorded once per host and source (a minute and more for the 12 builds).
        bitwise_seed = bitwise_seed_folder()
        missing = [build for build in bitwise_builds if not _seed_readable(bitwise_seed, build)]
        if missing:
            command = [*run_script(BITWISE), "record", str(bitwise_seed), *missing]
            subprocess.run(command, cwd=ROOT, env=unmutated_env(), check=True)
    # A mutant's smoke tier is mostly one kernel's compile, on one core: one mutant per core.
    jobs = args.jobs or max(4, os.cpu_count() or 1)
    # Each mutant's share of the cores for torch's CPU threads (its tests draw inputs and compare
    # there): by default every process starts one per core, mutants x cores threads on the cores.
    running = max(1, min(jobs, len(to_run)))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // running)))
    if gpus:  # each mutant's share of its GPU's memory (tests/conftest.py applies it)
        os.environ.setdefault("FA_KERNEL_GPU_MEMORY_FRACTION", f"{0.9 / -(-running // gpus):.3f}")
    workdir = Path(args.keep or tempfile.mkdtemp(prefix="fa-mutants-"))
    workdir.mkdir(parents=True, exist_ok=True)
    width = max([len(m.id) for m in mutants] + [6])
    # The longest first tiers first: a run cut by --deadline (or a time limit) then ends on short ones.
    to_run.sort(key=lambda m: -first_tier_seconds(tiers[m.id], args.build_seconds))
    started = time.perf_counter()
    stop_at = None if args.deadline is None else run_start + args.deadline
    # Each result is printed as it comes (a run cut short still shows what it finished), then
    # the table in the list's order. Mutant i runs on GPU i mod gpus.
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {
            pool.submit(
                run_mutant,
                mutant,
                args.target,
                workdir,
                tiers[mutant.id],
                args.timeout,
                index % gpus if gpus else None,
                args.seed_cache,
                bool(args.select),
                bitwise_seed,
                stop_at,
                args.build_seconds,
            ): mutant
            for index, mutant in enumerate(to_run)
        }
        outcomes = {}
        for done in as_completed(futures):
            status, detail, seconds = done.result()
            mutant = futures[done]
            if args.cpu_only and args.target in GPU_TARGETS:
                status, detail, seconds = _cpu_tier_passed(status, detail, seconds)
            outcomes[mutant.id] = (status, detail, seconds)
            print(f"{mutant.id:<{width}}  {status:<10}  {seconds:7.1f}  {detail}", flush=True)
            if args.record is not None:
                append_record(args.record, mutant, tiers[mutant.id], (status, detail, seconds))
    outcomes.update(recorded)
    outcomes.update({mutant_id: (verdict, reason, 0.0) for mutant_id, (verdict, reason) in settled.items()})
    print(f"\n{'mutant':<{width}}  result      seconds  first failing test / reason")
    for mutant in mutants:
        status, detail, seconds = outcomes[mutant.id]
        print(f"{mutant.id:<{width}}  {status:<10}  {seconds:7.1f}  {detail}")
    counts = Counter(status for status, _, _ in outcomes.values())
    survived = len(mutants) - counts["killed"] - counts["equivalent"]
    print(f"logs in {workdir}")
    # Which tier killed each: the smoke tier's share is what a mutant costs without the suite.
    tier_of = Counter(
        re.sub(r"^smoke on .*", "smoke", detail.split(":")[0])
        for status, detail, _ in outcomes.values()
        if status == "killed"
    )
    print("killed by: " + ", ".join(f"{tier} {count}" for tier, count in tier_of.most_common()))
    others = ", ".join(f"{status} {count}" for status, count in sorted(counts.items()) if status not in VERDICTS)
    print(
        f"\nkilled / equivalent / survived: {counts['killed']} / {counts['equivalent']} / {counts['SURVIVED']}"
        + (f" (and {others})" if others else "")
        + f" of {len(mutants)} ({args.target}, {gpus} GPU(s), {time.perf_counter() - started:.0f} s)"
    )
    return 0 if survived == 0 else 1


def _cpu_tier_passed(status: str, detail: str, seconds: float) -> tuple[str, str, float]:
    """--cpu-only: a mutant that passes the CPU tier has not survived, its GPU tiers are to judge it."""
    if status == "SURVIVED":
        return "NOT RUN", "passed the CPU tier (--cpu-only): its GPU tiers judge it", seconds
    return status, detail, seconds


# Verdicts a record keeps: a time-out or an error is run again.
VERDICTS = ("killed", "equivalent", "SURVIVED")


def _fingerprint(mutant, tiers: list[tuple[str, list[str]]]) -> str:
    """What a verdict depends on: the mutated file, the tiers run, and the files they run
    (`_tier_files`); an edit elsewhere keeps the record."""
    import hashlib

    digest = hashlib.sha256(f"{json.dumps(tiers)} {mutant.id}\n".encode())
    digest.update(mutant.mutated_source().encode())
    for path in _tier_files(tiers):
        digest.update(f"{path.relative_to(ROOT)}\n".encode() + path.read_bytes())
    return digest.hexdigest()


# The tiers that run a tool of their own rather than pytest (mutant_tiers).
TOOL_TIERS = ("bitwise", "close")


def _tier_files(tiers: list[tuple[str, list[str]]]) -> list[Path]:
    """The files `tiers` run: the test files and tools they name (a node id's file; every file of
    tests/ for the tests/ folder), with the modules of tests/, suite/ and tools/ those import, and theirs
    (`_local_imports`); for a tier pytest runs, conftest.py with its imports and pyproject.toml
    (pytest's configuration). A helper no tier imports (sanitize_cases.py, say) is not among them."""
    tests, tools = ROOT / "tests", ROOT / "tools"
    files: set[Path] = set()
    for name, args in tiers:
        for arg in args:
            target = ROOT / arg.split("::")[0]
            if target == tests:
                files.update(tests.glob("*.py"))
            elif target.suffix == ".py" and target.parent in (tests, tools):
                files.add(target)
        if name not in TOOL_TIERS:
            files.update({tests / "conftest.py", ROOT / "pyproject.toml"})
    for path in [path for path in files if path.suffix == ".py"]:
        files |= _local_imports(path)
    return sorted(files)


def _local_imports(path: Path) -> set[Path]:
    """The modules of tests/, suite/ and tools/ that `path` imports (as `tests.name`, `suite.name`
    or `tools.name`, wherever the import stands), and the ones those import."""
    import ast

    folders = (ROOT / "tests", ROOT / "suite", ROOT / "tools")
    found: set[Path] = set()
    pending = [path]
    while pending:
        tree = ast.parse(pending.pop().read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            for name in names:
                package, _, module_name = name.partition(".")
                module = ROOT / package / f"{module_name.split('.')[0]}.py"
                if module.parent in folders and module.is_file() and module not in found:
                    found.add(module)
                    pending.append(module)
    return found


def _source_digest(mutant) -> str:
    """The mutant itself: its id and mutated file, whatever tests judge it."""
    import hashlib

    return hashlib.sha256(f"{mutant.id}\n{mutant.mutated_source()}".encode()).hexdigest()


def recorded_kills(path: Path, mutants: list) -> dict[str, tuple[str, str, float]]:
    """{id: ('killed', detail, seconds)} of the mutants `path` records a kill of, by mutated source,
    whatever the tests are now: a kill is a fact about the mutant (a test the unmutated kernel
    passes failed on it, or its kernel hung), which a stronger test cannot undo; a survival or an
    equivalence is judged again when the tests change (load_record)."""
    if not path.exists():
        return {}
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    kills = {entry["source"]: entry for entry in entries if entry["status"] == "killed" and "source" in entry}
    found = {mutant.id: kills.get(_source_digest(mutant)) for mutant in mutants}
    return {key: (entry["status"], entry["detail"], entry["seconds"]) for key, entry in found.items() if entry}


def load_record(path: Path, mutants: list, tiers: dict[str, list]) -> dict[str, tuple[str, str, float]]:
    """{id: (status, detail, seconds)} of the mutants `path` judged with the same fingerprint; a
    kill (or the bitwise tier's equivalence) also where it was judged by the first of these tiers
    only (a `--smoke-only` run): a whole run would have stopped at that tier too. (A kill holds
    whatever the tests are now: recorded_kills.)"""
    if not path.exists():
        return {}
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_fingerprint = {entry["fingerprint"]: entry for entry in entries if entry["status"] in VERDICTS}
    found = {}
    for mutant in mutants:
        mutant_tiers = tiers[mutant.id]
        entry = by_fingerprint.get(_fingerprint(mutant, mutant_tiers))
        for first in range(len(mutant_tiers) - 1, 0, -1):
            if entry is not None:
                break
            earlier = by_fingerprint.get(_fingerprint(mutant, mutant_tiers[:first]))
            entry = earlier if earlier is not None and earlier["status"] in ("killed", "equivalent") else None
        if entry is not None:
            found[mutant.id] = (entry["status"], entry["detail"], entry["seconds"])
    return found


def append_record(path: Path, mutant, tiers: list, outcome: tuple[str, str, float]) -> None:
    status, detail, seconds = outcome
    checks = len(list(itertools.takewhile(lambda tier: tier[0] in CHECK_TIERS, tiers)))
    if status == "equivalent" and checks:
        # Settled by its reason's GPU check alone: a change of the tests after it keeps the verdict.
        tiers = tiers[:checks]
    entry = dict(id=mutant.id, fingerprint=_fingerprint(mutant, tiers), source=_source_digest(mutant), status=status)
    with path.open("a") as record:
        record.write(json.dumps({**entry, "detail": detail, "seconds": round(seconds, 1)}) + "\n")


if __name__ == "__main__":
    sys.exit(main())
