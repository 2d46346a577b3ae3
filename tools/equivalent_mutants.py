"""Generated mutants that compute what the kernel computes, each with the reason and the test
that checks that reason.

A generated mutant that survives the suite is a defect of the suite unless it is equivalent. The
CPU triage (tools/mutants.py) settles the mutants whose compiled kernels are identical. The ones
here change the kernel's code but not its results; each names the argument why, and a test
(`check`) that fails if the argument stops holding. Entries are keyed by GeneratedMutant.key
(what the rewrite changes, not where), and tests/test_equivalent_mutants.py fails on a key no
longer generated, so the list cannot go stale silently.
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

EMULATOR_CHECK = "tests/test_equivalent_mutants.py::test_recorded_emulator_mutants_are_bitwise_the_same"
EMULATOR_MASKS_MORE_TILES = Reason(
    "the emulator's needs_mask holds for a superset of the tiles; the mask of a tile whose keys are all "
    "visible is all zeros",
    EMULATOR_CHECK,
)
ROW_COMPUTED_TWICE = Reason(
    "each query block also computes the next block's first row, which the next block writes again, "
    "and the last block's slice ends at seqlen_q",
    EMULATOR_CHECK,
)

EQUIVALENT: dict[str, Reason] = {
    # ---- the emulator's tile loop (tools/mutants.py --generated --target emulator)
    "emulator.py:_attend_one_head:off_by_one:q[q_start:q_start + block_m]->q[q_start:q_start + block_m + 1]": (
        ROW_COMPUTED_TWICE
    ),
    "emulator.py:_attend_one_head:off_by_one:kv_start + block_n > seqlen_k->kv_start + block_n + 1 > seqlen_k": (
        EMULATOR_MASKS_MORE_TILES
    ),
    "emulator.py:_attend_one_head:relational:kv_start + block_n > seqlen_k->kv_start + block_n >= seqlen_k": (
        EMULATOR_MASKS_MORE_TILES
    ),
    "emulator.py:_attend_one_head:off_by_one:kv_start + block_n > seqlen_k->kv_start + block_n > seqlen_k - 1": (
        EMULATOR_MASKS_MORE_TILES
    ),
    "emulator.py:_attend_one_head:off_by_one:kv_start + block_n - 1 > q_start + diagonal_offset->"
    "kv_start + block_n - 1 + 1 > q_start + diagonal_offset": EMULATOR_MASKS_MORE_TILES,
    "emulator.py:_attend_one_head:relational:kv_start + block_n - 1 > q_start + diagonal_offset->"
    "kv_start + block_n - 1 >= q_start + diagonal_offset": EMULATOR_MASKS_MORE_TILES,
    "emulator.py:_attend_one_head:off_by_one:kv_start + block_n - 1 > q_start + diagonal_offset->"
    "kv_start + block_n - 1 > q_start + diagonal_offset - 1": EMULATOR_MASKS_MORE_TILES,
    # ---- the kernel
    # past the end: tiles ending one key earlier (or at seqlen_k) get the mask too
    "kernel.py:needs_mask:off_by_one:kv_start + block_n > seqlen_k->kv_start + block_n + 1 > seqlen_k": (
        MASKS_MORE_TILES
    ),
    "kernel.py:needs_mask:relational:kv_start + block_n > seqlen_k->kv_start + block_n >= seqlen_k": (MASKS_MORE_TILES),
    "kernel.py:needs_mask:off_by_one:kv_start + block_n > seqlen_k->kv_start + block_n > seqlen_k - 1": (
        MASKS_MORE_TILES
    ),
    # non-causal launches test the diagonal too, and write_mask writes only the seqlen_k mask
    "kernel.py:needs_mask:guard_always:causal->True": MASKS_MORE_TILES,
    # the diagonal: tiles whose last key is the first row's last visible one get the mask too
    "kernel.py:needs_mask:off_by_one:kv_start + block_n - 1 > q_start + diagonal_offset->"
    "kv_start + block_n - 1 + 1 > q_start + diagonal_offset": MASKS_MORE_TILES,
    "kernel.py:needs_mask:relational:kv_start + block_n - 1 > q_start + diagonal_offset->"
    "kv_start + block_n - 1 >= q_start + diagonal_offset": MASKS_MORE_TILES,
    "kernel.py:needs_mask:off_by_one:kv_start + block_n - 1 > q_start + diagonal_offset->"
    "kv_start + block_n - 1 > q_start + diagonal_offset - 1": MASKS_MORE_TILES,
}
