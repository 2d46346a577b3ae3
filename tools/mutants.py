"""Mutation testing: apply each known kernel bug to a copy of the source, run the suite
against it, and fail unless every mutant is killed.

    python tests/mutants.py                     # the TileLang kernel (needs a GPU)
    python tests/mutants.py --target emulator   # the same bugs in the CPU tile emulator
    python tests/mutants.py --only rescale_after_gemm
    python tests/mutants.py --only last_tile_sum --select tests/test_kernel.py::test_every_consumer_schedule
        # one test, every parameter (no -x): which of its cases catch the mutant

A mutant is a text patch applied to a temporary copy of src/, never a switch inside the
shipped code. A patch whose text is no longer found exactly once is an error (the list
must be kept in step with the kernel), not a kill.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to src/fa_kernel
    old: str
    new: str
    more: tuple[tuple[str, str], ...] = ()  # further (old, new) patches in the same file
    # Tests written to catch this bug, run before the suite (which runs only if they pass):
    # otherwise a mutant that only they kill compiles most of the suite's kernels first.
    first: tuple[str, ...] = ()


JUMPS = ("tests/test_kernel.py::test_scores_that_jump_between_key_tiles",)
PERSISTENT = ("tests/test_kernel.py::test_persistent_thread_blocks_walk_several_tiles",)
WARPGROUP_TILES = ("tests/test_kernel.py::test_warpgroups_visit_only_the_key_tiles_their_rows_see",)


KERNEL_MUTANTS = [
    Mutant(
        # The tile that replaced its max leaves acc_o at the old one.
        "new_max_without_rescale",
        "kernel.py",
        """                                stale_sum=tile_sum,
                            )
                            rescale_output(acc_o, alpha)""",
        """                                stale_sum=tile_sum,
                            )""",
        first=JUMPS,
    ),
    Mutant(
        # acc_o = (acc_o + P.V) * alpha: the rescale moved after the P.V GEMM it should precede
        # (and, on tiles that kept their max, by the alpha of the last tile that did not).
        "rescale_after_gemm",
        "kernel.py",
        """                            rescale_output(acc_o, alpha)
                        else:""",
        """                        else:""",
        more=(
            (
                """                        T.warpgroup_fence_operand(acc_o, num_regs=o_regs)
                        T.mbarrier_arrive(v_empty[prev_stage])""",
                """                        T.warpgroup_fence_operand(acc_o, num_regs=o_regs)
                        rescale_output(acc_o, alpha)
                        T.mbarrier_arrive(v_empty[prev_stage])""",
            ),
        ),
        first=JUMPS,
    ),
    Mutant(
        # The exponentials stay against the max before the tile whatever their sum: P~ overflows.
        "stale_max_never_replaced",
        "kernel.py",
        "                                row_over = 1",
        "                                row_over = 0",
        first=JUMPS,
    ),
    Mutant(
        # A limit past fp16's range: P~ up to 2^17 is kept, and its down-cast overflows.
        "stale_sum_limit_past_fp16",
        "kernel.py",
        "STALE_SUM_LIMIT = 4096.0",
        "STALE_SUM_LIMIT = 131072.0",
        first=JUMPS,
    ),
    Mutant(
        # The max is replaced, but the exponentials come from acc_s as the first pass left it
        # (P~, not S): the recomputation of S forgotten.
        "new_max_from_stale_exponentials",
        "kernel.py",
        """                            issue_scores(
                                Q_shared,
                                ring_stage(K_shared, stage),
                                acc_s,
                                kv_start,
                                q_start,
                                diagonal_offset,
                                seqlen_k,
                            )
""",
        "",
        first=JUMPS,
    ),
    Mutant(
        # A tile that kept its max replaces the running sum instead of adding to it.
        "kept_max_sum_replaced",
        "kernel.py",
        "row_sum[i] += tile_sum[i]",
        "row_sum[i] = tile_sum[i]",
    ),
    Mutant(
        # A tile that replaced its max divides by its own sum only.
        "last_tile_sum",
        "kernel.py",
        "row_sum[i] = row_sum[i] * alpha[i] + tile_sum[i]",
        "row_sum[i] = tile_sum[i]",
        first=JUMPS,
    ),
    Mutant(
        "alpha_from_new_max",
        "kernel.py",
        "T.exp2(row_max_prev[i] * scale_log2 - row_max_scaled[i])",
        "T.exp2(row_max[i] * scale_log2 - row_max_scaled[i])",
        first=JUMPS,
    ),
    Mutant(
        "max_order_swapped",
        "kernel.py",
        """        T.copy(row_max, row_max_prev)
        T.reduce_max(acc_s, row_max, dim=1, clear=False)""",
        """        T.reduce_max(acc_s, row_max, dim=1, clear=False)
        T.copy(row_max, row_max_prev)""",
        first=JUMPS,
    ),
    Mutant(
        "no_boundary_mask",
        "kernel.py",
        "acc_s[i, j] = T.if_then_else(kv_start + j >= seqlen_k, neg_inf, 0)",
        "acc_s[i, j] = 0",
    ),
    Mutant(
        "causal_off_by_one",
        "kernel.py",
        "kv_start + j > q_start + i + diagonal_offset",
        "kv_start + j >= q_start + i + diagonal_offset",
    ),
    Mutant(
        # The diagonal tiles lose their mask: only tiles past seqlen_k get one.
        "mask_only_past_the_end",
        "kernel.py",
        "return T.Or(past_the_end, kv_start + block_n - 1 > q_start + diagonal_offset)",
        "return past_the_end",
    ),
    Mutant("causal_top_left", "kernel.py", "diagonal_offset = seqlen_k - seqlen_q", "diagonal_offset = 0"),
    Mutant(
        "causal_loop_one_short",
        "kernel.py",
        "last_visible = q_start + block_m + diagonal_offset",
        "last_visible = q_start + diagonal_offset",
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
        "last_visible = T.min(first_row + rows_per_warpgroup, seqlen_q) + diagonal_offset",
        "last_visible = T.min(first_row, seqlen_q) + diagonal_offset",
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
        "place_in_last < num_tiles % workers, 1, 0)",
        "place_in_last < 0, 1, 0)",
        first=PERSISTENT,
    ),
    Mutant(
        # Q's buffer handed to the next work tile after the second Q.K^T, not the last: the
        # next tile's Q lands under the current one's remaining tiles (persistent grid).
        "q_released_after_second_tile",
        "kernel.py",
        "if kv_block == own_kv_blocks - 1:",
        "if kv_block == 1:",
        first=PERSISTENT,
    ),
    Mutant(
        # The producer loads the next work tile's V over O before O has left the V ring.
        "v_loaded_over_unsent_output",
        "kernel.py",
        "if not o_buffer and kv_block == 0:",
        "if not o_buffer and kv_block < 0:",
        first=PERSISTENT,
    ),
    Mutant(
        # overlap_epilogue: the next work tile's first mask is computed for the current tile.
        "next_tile_masked_as_current",
        "kernel.py",
        "write_mask(acc_s, 0, next_q_start, diagonal_offset, seqlen_k)",
        "write_mask(acc_s, 0, q_start, diagonal_offset, seqlen_k)",
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
        "        for panel in T.unroll(head_dim // TMA_PANEL):\n            T.tma_copy(\n                O_tile",
        "        for panel in T.unroll(1):\n            T.tma_copy(\n                O_tile",
    ),
    Mutant(
        "normalise_inside_loop",
        "kernel.py",
        "                        T.mbarrier_arrive(v_empty[prev_stage])\n",
        """                        T.mbarrier_arrive(v_empty[prev_stage])
                        for i, d in T.Parallel(block_m, head_dim):
                            acc_o[i, d] /= row_sum[i]
""",
    ),
    Mutant("scale_without_log2e", "interface.py", "softmax_scale * LOG2E", "softmax_scale"),
    Mutant(
        "no_max_subtraction",
        "kernel.py",
        "acc_s[i, j] = T.exp2(acc_s[i, j] * scale_log2 - row_max_scaled[i])",
        "acc_s[i, j] = T.exp2(acc_s[i, j] * scale_log2)",
    ),
    Mutant(
        # (both normalisation paths, with and without overlap_epilogue)
        "nan_for_rows_without_keys",
        "kernel.py",
        "T.if_then_else(row_sum[i] > 0, acc_o[i, d] / row_sum[i], 0)",
        "acc_o[i, d] / row_sum[i]",
    ),
    Mutant("gqa_wrong_kv_head", "kernel.py", "kv_head = head // (heads // heads_kv)", "kv_head = head % heads_kv"),
    Mutant(
        "lse_in_log2",
        "kernel.py",
        "(row_max_scaled[i] + T.log2(row_sum[i])) * LN2",
        "(row_max_scaled[i] + T.log2(row_sum[i]))",
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
        "torch.where(stale_sum > STALE_SUM_LIMIT,",
        "torch.where(stale_sum > 131072.0,",
    ),
    Mutant(
        "rescale_after_gemm",
        "emulator.py",
        """            acc_o = acc_o * alpha[:, None]  # rescale before P.V adds this tile
            acc_o = acc_o + acc_p.float() @ v_tile""",
        """            acc_o = acc_o + acc_p.float() @ v_tile
            acc_o = acc_o * alpha[:, None]""",
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
        "causal_off_by_one", "emulator.py", "(k_idx > q_idx + diagonal_offset)", "(k_idx >= q_idx + diagonal_offset)"
    ),
    Mutant(
        "causal_loop_one_short",
        "emulator.py",
        "last_visible = q_start + block_m + diagonal_offset",
        "last_visible = q_start + diagonal_offset",
    ),
    Mutant("scale_without_log2e", "emulator.py", "scale_log2 = softmax_scale * LOG2E", "scale_log2 = softmax_scale"),
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
]

# Which tests judge a mutant: the named GPU tests and the property suite for the kernel; the
# property suite on the emulator for the emulator. -x: the first failure kills the mutant.
PYTEST_ARGS = {
    "kernel": ["tests/test_kernel.py", "tests/test_properties.py", "-m", "gpu", "-k", "not emulator"],
    "emulator": ["tests/test_properties.py", "-k", "emulator"],
}


def mutated_source(mutant: Mutant) -> str:
    """The mutant's file with its patches applied; ValueError if a patch text is not found
    exactly once (the list has fallen out of step with the source)."""
    text = (ROOT / "src" / "fa_kernel" / mutant.file).read_text()
    # A text that starts with indentation must start a line (inside a deeper-indented line its
    # replacement would break the nesting, and the mutant would die of a syntax error).
    for old, new in ((mutant.old, mutant.new), *mutant.more):
        old, new = ("\n" + old, "\n" + new) if old.startswith(" ") else (old, new)
        if text.count(old) != 1:
            raise ValueError(f"patch text found {text.count(old)} times in {mutant.file}, not once")
        text = text.replace(old, new)
    return text


def run_mutant(
    mutant: Mutant, target: str, workdir: Path, select: list[str] | None = None, timeout: float | None = None
) -> tuple[str, str, float]:
    """('killed' | 'SURVIVED' | 'TIMEOUT' | 'ERROR', detail, seconds). With `select`, only those
    tests run, all of their cases (no -x), and the detail lists the cases that failed. A run
    past `timeout` seconds in all is stopped: a mutant that hangs the kernel is reported, not
    waited for."""
    start = time.perf_counter()
    try:
        text = mutated_source(mutant)
    except ValueError as error:
        return "ERROR", str(error), 0.0
    tree = workdir / mutant.name
    shutil.copytree(ROOT / "src", tree / "src")
    (tree / "src" / "fa_kernel" / mutant.file).write_text(text)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(tree / "src"), os.environ.get("PYTHONPATH", "")]),
        TILELANG_CACHE_DIR=str(tree / "tilelang-cache"),
        HYPOTHESIS_PROFILE="ci",
        FA_KERNEL_REQUIRE_GPU="1" if target == "kernel" else "0",
        FA_KERNEL_EXPECT_SRC=str(tree / "src"),
    )
    if select:
        runs = [["-rf", *select]]
    else:  # the mutant's own tests first, where it names them; the suite if they pass
        runs = [["-x", *mutant.first]] if mutant.first and target == "kernel" else []
        runs.append(["-x", *PYTEST_ARGS[target]])
    for pytest_args in runs:
        try:
            result = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header", *pytest_args],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=None if timeout is None else max(1.0, timeout - (time.perf_counter() - start)),
            )
        except subprocess.TimeoutExpired:
            seconds = time.perf_counter() - start
            return "TIMEOUT", f"the tests ran past {timeout:.0f} s and were stopped (a hang?)", seconds
        if result.returncode != 0:
            break
    seconds = time.perf_counter() - start
    log = result.stdout + result.stderr
    (workdir / f"{mutant.name}.log").write_text(log)
    if "FA_KERNEL_EXPECT_SRC mismatch" in log:
        return "ERROR", "the tests imported the shipped package, not the mutant", seconds
    if result.returncode == 0:
        return "SURVIVED", "every test passed", seconds
    if result.returncode != 1:
        return (
            "ERROR",
            f"pytest exited {result.returncode}: {log.strip().splitlines()[-1] if log.strip() else ''}",
            seconds,
        )
    failed = re.findall(r"^FAILED (\S+)", log, re.MULTILINE)
    if select:
        return "killed", f"{len(failed)} failed: " + " ".join(failed), seconds
    return "killed", failed[0] if failed else "a test failed", seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=sorted(PYTEST_ARGS), default="kernel")
    parser.add_argument("--only", nargs="+", help="run these mutants only")
    parser.add_argument("--jobs", type=int, default=4, help="mutants run at once (compiles are CPU-bound)")
    parser.add_argument("--keep", metavar="DIR", help="keep mutated trees and logs here")
    parser.add_argument("--select", nargs="+", metavar="TEST", help="run only these pytest node ids, every case")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one mutant's tests may run")
    args = parser.parse_args()
    mutants = KERNEL_MUTANTS if args.target == "kernel" else EMULATOR_MUTANTS
    if args.only:
        mutants = [m for m in mutants if m.name in args.only]
    workdir = Path(args.keep or tempfile.mkdtemp(prefix="fa-mutants-"))
    workdir.mkdir(parents=True, exist_ok=True)
    width = max(len(m.name) for m in mutants)
    # Each result is printed as it comes (a run cut short still shows what it finished), then
    # the table in the list's order.
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_mutant, m, args.target, workdir, args.select, args.timeout): m for m in mutants}
        for done in as_completed(futures):
            status, detail, seconds = done.result()
            print(f"{futures[done].name:<{width}}  {status:<8}  {seconds:7.1f}  {detail}", flush=True)
    outcomes = [future.result() for future in futures]
    print(f"\n{'mutant':<{width}}  result    seconds  first failing test / reason")
    for mutant, (status, detail, seconds) in zip(mutants, outcomes, strict=True):
        print(f"{mutant.name:<{width}}  {status:<8}  {seconds:7.1f}  {detail}")
    killed = sum(status == "killed" for status, _, _ in outcomes)
    if args.keep or killed < len(mutants):
        print(f"logs and mutated trees in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{killed}/{len(mutants)} mutants killed ({args.target})")
    return 0 if killed == len(mutants) else 1


if __name__ == "__main__":
    sys.exit(main())
